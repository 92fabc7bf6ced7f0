// lanebus — MIT License.
// TopicLog: reads for replay, lane bounds and seek by time.
#include "durable_store.hpp"

#include "durable_store_impl.hpp"
#include "quote.hpp"

namespace lanebus::detail {

Result<std::uint64_t> search_time(LmdbTxn& txn, LmdbDbi log, std::uint32_t tid, std::uint32_t lane,
                                  const LaneState& ls, std::int64_t ts) {
  std::uint64_t lo = ls.first, hi = ls.next;
  while (lo < hi) {
    std::uint64_t mid = lo + (hi - lo) / 2;
    auto v = txn.get(log, log_key(tid, lane, mid).sv());
    if (!v.ok()) {
      if (v.code() == Code::NotFound) return Status(Code::Corruption, "log record missing inside lane bounds");
      return v.status();
    }
    if (v->size() < kRecordOverhead) return Status(Code::Corruption, "log record shorter than its header");
    auto its = static_cast<std::int64_t>(get_le64(v->data() + 16));
    if (its >= ts) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

Result<LaneState> read_lane(LmdbTxn& txn, LmdbDbi dbi, std::uint32_t tid, std::uint32_t lane) {
  LaneState s;
  auto v = txn.get(dbi, lane_key(tid, lane).sv());
  if (!v.ok()) {
    if (v.code() == Code::NotFound) return s;
    return v.status();
  }
  if (!decode_lane(*v, &s)) return Status(Code::Corruption, "lane state record is malformed");
  return s;
}

// ======================================================================
// reads

Result<ReadBatch> TopicLog::read(const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                                     const ReadLimits& limits) {
  ReadBatch b;
  Status s = read_into(topic, lane, from, limits, &b);
  if (!s.ok()) return s;
  return b;
}

Status TopicLog::read_into(const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                               const ReadLimits& limits, ReadBatch* out) {
  ReadBatch& b = *out;
  // Keep the messages' strings (their capacity is reused); only the count resets.
  std::size_t used = 0;
  if (lane >= topic.lanes) {
    return Status(Code::InvalidArgument, "read " + quoted(topic.name) + ": lane " + std::to_string(lane) + " out of range");
  }
  auto view = s_.begin_read();
  if (!view.ok()) return view.status();
  LmdbTxn* txn = &view->txn;
  auto ls = read_lane(*txn, s_.dbi_lanes_, topic.id, lane);
  if (!ls.ok()) return ls.status();
  b.skipped = 0;
  b.end_offset = ls->next;
  std::uint64_t start = from;
  if (start < ls->first) {
    b.skipped = ls->first - start;
    start = ls->first;
    // Relaxed: a statistic.
    s_.counters_.skipped_by_retention.fetch_add(b.skipped, std::memory_order_relaxed);
  }
  b.first_offset = start;
  b.next_offset = start;
  if (start >= ls->next || limits.max_messages == 0) {
    b.messages.clear();
    return Status();
  }
  auto c = LmdbCursor::open(*txn, s_.dbi_log_, s_.options_.directory);
  if (!c.ok()) return c.status();
  Key prefix = lane_key(topic.id, lane);
  auto r = c->seek(log_key(topic.id, lane, start).sv());
  std::uint64_t bytes = 0;
  std::uint64_t expect = start;
  while (r.ok() && *r && used < limits.max_messages && expect < ls->next) {
    auto k = c->key();
    if (k.size() != 16 || k.substr(0, 8) != prefix.sv()) break;
    std::uint64_t off = get_be64(k.data() + 8);
    if (off != expect) {
      b.messages.clear();
      return Status(Code::Corruption, "read " + quoted(topic.name) + " lane " + std::to_string(lane) + ": offset " +
                                          std::to_string(expect) + " is missing from the log");
    }
    if (used > 0 && bytes + c->value().size() > limits.max_bytes) break;
    if (used == b.messages.size()) {
      if (b.spare.empty()) {
        b.messages.emplace_back();
      } else {
        b.messages.push_back(std::move(b.spare.back()));
        b.spare.pop_back();
      }
    }
    Status s = decode_record(c->value(), topic.name, lane, off, &b.messages[used]);
    if (!s.ok()) {
      b.messages.clear();
      return s;
    }
    ++used;
    bytes += c->value().size();
    ++expect;
    r = c->next();
  }
  while (b.messages.size() > used) {  // keep the storage for the next read
    b.spare.push_back(std::move(b.messages.back()));
    b.messages.pop_back();
  }
  if (!r.ok()) return r.status();
  if (b.messages.empty() && expect < ls->next) {
    return Status(Code::Corruption, "read " + quoted(topic.name) + " lane " + std::to_string(lane) + ": offset " +
                                        std::to_string(expect) + " is missing from the log");
  }
  b.next_offset = expect;
  return Status();
}

Result<LaneInfo> TopicLog::lane_info(const TopicRef& topic, std::uint32_t lane) {
  if (lane >= topic.lanes) {
    return Status(Code::InvalidArgument, "lane " + std::to_string(lane) + " of " + quoted(topic.name) + " out of range");
  }
  auto view = s_.begin_read();
  if (!view.ok()) return view.status();
  LmdbTxn* txn = &view->txn;
  auto ls = read_lane(*txn, s_.dbi_lanes_, topic.id, lane);
  if (!ls.ok()) return ls.status();
  return LaneInfo{ls->first, ls->next, ls->bytes, ls->count};
}

Result<std::uint64_t> TopicLog::end_offset(const TopicRef& topic, std::uint32_t lane) {
  auto li = lane_info(topic, lane);
  if (!li.ok()) return li.status();
  return li->end_offset;
}

Status TopicLog::end_offsets(const TopicRef& topic, std::uint64_t* ends) {
  auto view = s_.begin_read();
  if (!view.ok()) return view.status();
  for (std::uint32_t lane = 0; lane < topic.lanes; ++lane) {
    auto ls = read_lane(view->txn, s_.dbi_lanes_, topic.id, lane);
    if (!ls.ok()) return ls.status();
    ends[lane] = ls->next;
  }
  return Status();
}

Result<std::uint64_t> TopicLog::offset_for_time(const TopicRef& topic, std::uint32_t lane, std::int64_t ts_ns) {
  if (lane >= topic.lanes) {
    return Status(Code::InvalidArgument, "lane " + std::to_string(lane) + " of " + quoted(topic.name) + " out of range");
  }
  auto view = s_.begin_read();
  if (!view.ok()) return view.status();
  LmdbTxn* txn = &view->txn;
  auto ls = read_lane(*txn, s_.dbi_lanes_, topic.id, lane);
  if (!ls.ok()) return ls.status();
  return search_time(*txn, s_.dbi_log_, topic.id, lane, *ls, ts_ns);
}

}  // namespace lanebus::detail
