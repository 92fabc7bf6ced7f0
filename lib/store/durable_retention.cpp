// lanebus — MIT License.
// LogRetention: retention by age, bytes and count, in bounded batches.
#include "durable_store.hpp"

#include <algorithm>
#include <limits>
#include <vector>

#include "durable_store_impl.hpp"
#include "quote.hpp"

namespace lanebus::detail {

// ======================================================================
// retention and maintenance

Status LogRetention::apply(WriteCtx& ctx, std::uint32_t budget, bool* more) {
  *more = false;
  std::vector<TopicRef> topics;
  {
    auto c = LmdbCursor::open(*ctx.txn, s_.dbi_topics_, s_.options_.directory);
    if (!c.ok()) return ctx.fail(c.status());
    auto r = c->first();
    while (r.ok() && *r) {
      TopicRef t;
      if (decode_topic(c->key(), c->value(), &t) &&
          (t.retention.max_age.count() > 0 || t.retention.max_bytes > 0 || t.retention.max_count > 0)) {
        topics.push_back(t);
      }
      r = c->next();
    }
    if (!r.ok()) return ctx.fail(r.status());
  }
  for (const TopicRef& t : topics) {
    const std::int64_t age_cut =
        t.retention.max_age.count() > 0
            ? ctx.now_ns - std::chrono::duration_cast<std::chrono::nanoseconds>(t.retention.max_age).count()
            : std::numeric_limits<std::int64_t>::min();
    for (std::uint32_t lane = 0; lane < t.lanes; ++lane) {
      auto ls = ctx.lane(t.id, lane);
      if (!ls.ok()) return ls.status();
      Status ts = trim_lane(ctx, t, lane, **ls, age_cut, &budget, more);
      if (!ts.ok() || *more) return ts;
    }
  }
  return Status();
}

// Delete records from the front of one lane while the topic's retention says
// so, at most *budget. A value is deleted whole once all its records go; a
// record batch the cut goes through is written again without its front,
// keyed by the first record it keeps (doc/storage-format.md, invariant 1).
Status LogRetention::trim_lane(WriteCtx& ctx, const TopicRef& t, std::uint32_t lane, LaneState& s,
                               std::int64_t age_cut, std::uint32_t* budget, bool* more) {
  const bool by_age_set = age_cut != std::numeric_limits<std::int64_t>::min();
  while (s.count > 0) {
    std::uint64_t value_first = 0, drop = 0, drop_bytes = 0, keep = 0;
    bool done = false;  // retention is satisfied (or out of budget) inside this value
    std::string tail;   // the records this value keeps, as a value
    {
      LaneLog log(*ctx.txn, s_.dbi_log_, t.id, lane, t.name);
      auto found = log.seek(s.first);
      if (!found.ok()) return ctx.fail(found.status());
      if (!*found) {
        return ctx.fail(Status(Code::Corruption, "retention of " + quoted(t.name) + ": log record missing inside lane bounds"));
      }
      value_first = log.value_first();
      const std::uint64_t value_end = value_first + log.value_count();
      for (;;) {
        const std::string_view rec = log.record();
        const bool by_count = t.retention.max_count > 0 && s.count - drop > t.retention.max_count;
        const bool by_bytes = t.retention.max_bytes > 0 && s.bytes - std::min(s.bytes, drop_bytes) > t.retention.max_bytes;
        const bool by_age = by_age_set && rec.size() >= kRecordOverhead &&
                            static_cast<std::int64_t>(get_le64(rec.data() + 16)) < age_cut;
        if (!by_count && !by_bytes && !by_age) {
          done = true;
          break;
        }
        if (*budget == 0) {
          *more = true;
          done = true;
          break;
        }
        ++drop;
        drop_bytes += rec.size();
        --*budget;
        if (log.offset() + 1 == value_end) break;
        auto n = log.next();
        if (!n.ok()) return ctx.fail(n.status());
        if (!*n) return ctx.fail(Status(Code::Corruption, "retention of " + quoted(t.name) + ": record batch ends early"));
      }
      if (drop == 0) return Status();
      keep = value_end - (s.first + drop);
      if (keep > 0) {
        const std::string_view v = log.value();
        const std::size_t at = static_cast<std::size_t>(log.record().data() - v.data());
        if (keep == 1) {
          tail.assign(v.substr(at));
        } else {
          tail.assign(v.substr(0, kBatchHeader));
          put_le16(tail.data() + 2, static_cast<std::uint16_t>(keep));
          tail.append(v.substr(at));
        }
      }
    }
    if (Status ds = ctx.del(s_.dbi_log_, log_key(t.id, lane, value_first).sv()); !ds.ok()) {
      return ds.code() == Code::NotFound ? ctx.fail(ds) : ds;
    }
    if (keep > 0) {
      if (Status ps = ctx.put(s_.dbi_log_, log_key(t.id, lane, s.first + drop).sv(), tail); !ps.ok()) return ps;
    }
    s.first += drop;
    s.count -= drop;
    s.bytes -= std::min<std::uint64_t>(s.bytes, drop_bytes);
    ctx.mark(t.id, lane, false);
    ctx.retention_deleted += drop;
    if (done) return Status();
  }
  return Status();
}

Status LogRetention::run() {
  for (;;) {
    bool more = false;
    Status s = s_.writer_->run_write([&](WriteCtx& ctx) { return apply(ctx, s_.options_.retention_batch, &more); }, true);
    if (!s.ok()) return s;
    if (!more) return Status();
  }
}

}  // namespace lanebus::detail
