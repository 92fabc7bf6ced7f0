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
      LaneState& s = **ls;
      while (s.count > 0) {
        bool by_count = t.retention.max_count > 0 && s.count > t.retention.max_count;
        bool by_bytes = t.retention.max_bytes > 0 && s.bytes > t.retention.max_bytes;
        Key k = log_key(t.id, lane, s.first);
        std::size_t size = 0;
        bool by_age = false;
        {
          auto v = ctx.get(s_.dbi_log_, k.sv());
          if (!v.ok()) {
            if (v.code() == Code::NotFound) return ctx.fail(Status(Code::Corruption, "retention of " + quoted(t.name) + ": log record missing inside lane bounds"));
            return v.status();
          }
          size = v->size();
          if (age_cut != std::numeric_limits<std::int64_t>::min() && size >= kRecordOverhead) {
            by_age = static_cast<std::int64_t>(get_le64(v->data() + 16)) < age_cut;
          }
        }
        if (!by_count && !by_bytes && !by_age) break;
        if (budget == 0) {
          *more = true;
          return Status();
        }
        Status ds = ctx.del(s_.dbi_log_, k.sv());
        if (!ds.ok()) return ds.code() == Code::NotFound ? ctx.fail(ds) : ds;
        s.first += 1;
        s.count -= 1;
        s.bytes -= std::min<std::uint64_t>(s.bytes, size);
        ctx.mark(t.id, lane, false);
        ctx.retention_deleted += 1;
        --budget;
      }
    }
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
