// lanebus — MIT License.
// TopicLog: reads for replay, lane bounds and seek by time.
#include "durable_store.hpp"

#include "durable_store_impl.hpp"
#include "quote.hpp"

namespace lanebus::detail {

std::size_t stored_record_size(const char* p, std::size_t avail) {
  if (avail < kRecordOverhead || (p[0] != 1 && p[0] != 2 && p[0] != 3)) return 0;
  const std::size_t size = kRecordOverhead + get_le16(p + 2) + get_le16(p + 4) + get_le32(p + 8) +
                           (p[0] != 1 ? get_le16(p + 6) : 0);
  return size <= avail ? size : 0;
}

Status LaneLog::bad(std::uint64_t off, const char* why) const {
  return Status(Code::Corruption, "read topic " + quoted(topic_) + " lane " + std::to_string(lane_) + " offset " +
                                      std::to_string(off) + ": " + why);
}

Status LaneLog::load() {
  auto k = c_->key();
  value_ = c_->value();
  first_ = get_be64(k.data() + 8);
  pos_ = 0;
  count_ = 1;
  if (!value_.empty() && value_[0] == kBatchFormat) {
    if (value_.size() < kBatchHeader + kRecordOverhead) return bad(first_, "record batch shorter than its header");
    count_ = get_le16(value_.data() + 2);
    if (count_ < 2) return bad(first_, "record batch holds fewer than 2 records");
    pos_ = kBatchHeader;
  }
  off_ = first_;
  return step_in_value();
}

// rec_ := the record at pos_ (its size from its length fields; decode_record
// checks the rest, and that the batch's records fill it exactly).
Status LaneLog::step_in_value() {
  const bool batch = count_ > 1;
  const std::size_t avail = value_.size() - pos_;
  if (!batch && avail < kRecordOverhead) return bad(off_, "record shorter than its header");
  const std::size_t size = batch ? stored_record_size(value_.data() + pos_, avail) : avail;
  if (size == 0) return bad(off_, "record batch is malformed");
  const bool last = off_ - first_ + 1 == count_;
  if (batch && last != (size == avail)) return bad(off_, "record batch lengths do not add up");
  rec_ = value_.substr(pos_, size);
  return Status();
}

Result<bool> LaneLog::seek(std::uint64_t off) {
  if (c_ && !value_.empty() && off >= first_ && off - first_ < count_) {
    if (off < off_) {  // back to the value's first record, then forward
      off_ = first_;
      pos_ = count_ > 1 ? kBatchHeader : 0;
      if (Status s = step_in_value(); !s.ok()) return s;
    }
    while (off_ < off) {
      pos_ += rec_.size();
      ++off_;
      if (Status s = step_in_value(); !s.ok()) return s;
    }
    return true;
  }
  if (!c_) {
    auto c = LmdbCursor::open(txn_, log_, {});
    if (!c.ok()) return c.status();
    c_.emplace(std::move(*c));
  }
  value_ = {};
  const Key key = log_key(tid_, lane_, off);
  auto r = c_->seek(key.sv());
  if (!r.ok()) return r.status();
  if (!*r || c_->key() != key.sv()) {
    // Not the first record of a value: the value before may be a batch holding it.
    r = *r ? c_->prev() : c_->last();
    if (!r.ok()) return r.status();
    if (!*r) return false;
  }
  auto k = c_->key();
  if (k.size() != 16 || k.substr(0, 8) != key.sv().substr(0, 8)) return false;
  if (Status s = load(); !s.ok()) return s;
  if (off - first_ >= count_) {
    value_ = {};
    return false;
  }
  return seek(off);
}

Result<bool> LaneLog::next() {
  if (value_.empty()) return false;
  if (off_ - first_ + 1 < count_) {
    pos_ += rec_.size();
    ++off_;
    if (Status s = step_in_value(); !s.ok()) return s;
    return true;
  }
  auto r = c_->next();
  if (!r.ok()) return r.status();
  auto k = r.ok() && *r ? c_->key() : std::string_view();
  if (!*r || k.size() != 16 || get_be32(k.data()) != tid_ || get_be32(k.data() + 4) != lane_) {
    value_ = {};
    return false;
  }
  if (Status s = load(); !s.ok()) return s;
  return true;
}

Result<std::uint64_t> search_time(LmdbTxn& txn, LmdbDbi log, std::uint32_t tid, std::uint32_t lane,
                                  const LaneState& ls, std::int64_t ts) {
  LaneLog l(txn, log, tid, lane, {});
  std::uint64_t lo = ls.first, hi = ls.next;
  while (lo < hi) {
    std::uint64_t mid = lo + (hi - lo) / 2;
    auto found = l.seek(mid);
    if (!found.ok()) return found.status();
    if (!*found) return Status(Code::Corruption, "log record missing inside lane bounds");
    auto its = static_cast<std::int64_t>(get_le64(l.record().data() + 16));
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

template <class Visit>
Status TopicLog::walk_lane(LmdbTxn& txn, const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                           const ReadLimits& limits, LaneRange* range, Visit&& visit) {
  auto ls = read_lane(txn, s_.dbi_lanes_, topic.id, lane);
  if (!ls.ok()) return ls.status();
  range->skipped = 0;
  range->end = ls->next;
  std::uint64_t start = from;
  if (start < ls->first) {
    range->skipped = ls->first - start;
    start = ls->first;
    // Relaxed: a statistic.
    s_.counters_.skipped_by_retention.fetch_add(range->skipped, std::memory_order_relaxed);
  }
  range->first = range->next = start;
  if (start >= ls->next || limits.max_messages == 0) return Status();
  LaneLog log(txn, s_.dbi_log_, topic.id, lane, topic.name);
  auto r = log.seek(start);
  std::uint64_t bytes = 0;
  std::uint64_t expect = start;
  std::uint32_t used = 0;
  while (r.ok() && *r && used < limits.max_messages && expect < ls->next) {
    if (log.offset() != expect) break;
    const std::string_view rec = log.record();
    if (used > 0 && bytes + rec.size() > limits.max_bytes) break;
    if (Status s = visit(rec, expect); !s.ok()) return s;
    ++used;
    bytes += rec.size();
    ++expect;
    r = log.next();
  }
  if (!r.ok()) return r.status();
  if (used == 0 && expect < ls->next) {
    return Status(Code::Corruption, "read " + quoted(topic.name) + " lane " + std::to_string(lane) + ": offset " +
                                        std::to_string(expect) + " is missing from the log");
  }
  range->next = expect;
  return Status();
}

Status TopicLog::read_into(const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                               const ReadLimits& limits, ReadBatch* out) {
  ReadBatch& b = *out;
  if (lane >= topic.lanes) {
    b.messages.clear();
    return Status(Code::InvalidArgument, "read " + quoted(topic.name) + ": lane " + std::to_string(lane) + " out of range");
  }
  auto view = s_.begin_read();
  if (!view.ok()) return view.status();
  // Keep the messages' strings (their capacity is reused); only the count resets.
  std::size_t used = 0;
  LaneRange range;
  Status s = walk_lane(view->txn, topic, lane, from, limits, &range, [&](std::string_view rec, std::uint64_t off) {
    if (used == b.messages.size()) {
      if (b.spare.empty()) {
        b.messages.emplace_back();
      } else {
        b.messages.push_back(std::move(b.spare.back()));
        b.spare.pop_back();
      }
    }
    Status d = decode_record(rec, topic.name, lane, off, &b.messages[used]);
    if (d.ok()) ++used;
    return d;
  });
  if (!s.ok()) used = 0;  // on error no message
  while (b.messages.size() > used) {  // keep the storage for the next read
    b.spare.push_back(std::move(b.messages.back()));
    b.messages.pop_back();
  }
  b.first_offset = range.first;
  b.next_offset = range.next;
  b.end_offset = range.end;
  b.skipped = range.skipped;
  return s;
}

Status TopicLog::read_in_place(const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                               const ReadLimits& limits, InPlaceBatch* out) {
  out->release();
  out->messages.clear();
  if (lane >= topic.lanes) {
    return Status(Code::InvalidArgument, "read " + quoted(topic.name) + ": lane " + std::to_string(lane) + " out of range");
  }
  auto view = s_.begin_read();
  if (!view.ok()) return view.status();
  LaneRange range;
  Status s = walk_lane(view->txn, topic, lane, from, limits, &range, [&](std::string_view rec, std::uint64_t off) {
    out->messages.emplace_back();
    return decode_record_in_place(rec, topic.name, lane, off, &out->messages.back());
  });
  out->first_offset = range.first;
  out->next_offset = range.next;
  out->end_offset = range.end;
  out->skipped = range.skipped;
  if (!s.ok()) {
    out->messages.clear();
    return s;
  }
  if (!out->messages.empty()) {  // hold the read: the views point into its pages
    view->txn.hold();
    out->txn_ = std::move(view->txn);
  }
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
