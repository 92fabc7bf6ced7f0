// lanebus — MIT License.
// DurableStore: layout, record encoding, the group-commit writer, reads,
// consumer-group offsets, queue claims and retention.
#include "durable_store.hpp"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

#include "coding.hpp"
#include "crc32c.hpp"
#include "names.hpp"
#include "quote.hpp"
#include "store_codec.hpp"
#include "verify.hpp"

// Design notes
//
// Invariants (checked by tests/durable_store_test.cpp and the crash tests):
//  1. For every (topic, lane), the `log` keys present are exactly the offsets
//     [LaneState.first, LaneState.next): appends add at `next`, retention
//     deletes at `first`, both in the same transaction as the LaneState update.
//  2. LaneState.count == next - first and LaneState.bytes == sum of record sizes.
//  3. `meta/id_next` is greater than every id assigned by the store; it is
//     written in the same transaction as the messages that used the ids, so a
//     crash never hands out an id twice (and two processes serialise on LMDB's
//     writer lock, so their id ranges are disjoint).
//  4. A queue group's cursor `committed` is the lowest offset not yet acked;
//     `inflight` holds claims for offsets >= committed only.
//  5. Nothing is reported complete before the transaction holding it committed
//     (Sync: fsynced). No completion runs inside a transaction.

namespace lanebus::detail {
namespace {

constexpr char kLayoutMagic[8] = {'L', 'A', 'N', 'E', 'B', 'U', 'S', '\0'};
constexpr std::size_t kRecordHeader = 64;  // fixed part before key/idem/payload
constexpr std::size_t kRecordOverhead = kRecordHeader + 4;  // + crc32c trailer
constexpr std::uint32_t kMaxLanes = 4096;
constexpr std::uint64_t kMaxPayload = 1ull << 30;
constexpr std::uint32_t kInflightClaimed = 0;
constexpr std::uint32_t kInflightAcked = 1;

// Fixed-width coding: coding.hpp (LE for values, BE for keys so they sort).

// A small fixed-capacity key buffer (no allocation for keys).
struct Key {
  char b[24];
  std::size_t n = 0;
  std::string_view sv() const { return {b, n}; }
};
Key lane_key(std::uint32_t tid, std::uint32_t lane) {
  Key k;
  put_be32(k.b, tid);
  put_be32(k.b + 4, lane);
  k.n = 8;
  return k;
}
Key log_key(std::uint32_t tid, std::uint32_t lane, std::uint64_t off) {
  Key k = lane_key(tid, lane);
  put_be64(k.b + 8, off);
  k.n = 16;
  return k;
}
Key cursor_key(std::uint32_t tid, std::uint32_t gid, std::uint32_t lane) {
  Key k;
  put_be32(k.b, tid);
  put_be32(k.b + 4, gid);
  put_be32(k.b + 8, lane);
  k.n = 12;
  return k;
}
Key inflight_key(std::uint32_t tid, std::uint32_t gid, std::uint32_t lane, std::uint64_t off) {
  Key k = cursor_key(tid, gid, lane);
  put_be64(k.b + 12, off);
  k.n = 20;
  return k;
}
std::string group_key(std::uint32_t tid, std::string_view name) {
  std::string k(4, '\0');
  put_be32(k.data(), tid);
  k.append(name);
  return k;
}

std::int64_t wall_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}


// ---- per-lane bounds ----
struct LaneState {
  std::uint64_t first = 0;
  std::uint64_t next = 0;
  std::uint64_t bytes = 0;
  std::uint64_t count = 0;
  std::int64_t last_ts = 0;
};
constexpr std::size_t kLaneStateBytes = 40;
void encode_lane(const LaneState& s, char* p) {
  put_le64(p, s.first);
  put_le64(p + 8, s.next);
  put_le64(p + 16, s.bytes);
  put_le64(p + 24, s.count);
  put_le64(p + 32, static_cast<std::uint64_t>(s.last_ts));
}
bool decode_lane(std::string_view v, LaneState* s) {
  if (v.size() != kLaneStateBytes) return false;
  s->first = get_le64(v.data());
  s->next = get_le64(v.data() + 8);
  s->bytes = get_le64(v.data() + 16);
  s->count = get_le64(v.data() + 24);
  s->last_ts = static_cast<std::int64_t>(get_le64(v.data() + 32));
  return s->first <= s->next && s->count == s->next - s->first;
}

// ---- topic record ----
constexpr std::size_t kTopicBytes = 48;
// Version 2 (fenced topics only) appends: u8 per-lane, u8 0, le16 length, the
// fence name. Unfenced topics stay version 1; an older lanebus refuses a
// version-2 record instead of appending unfenced to a fenced topic.
std::string encode_topic(const TopicRef& t, std::int64_t created_ns) {
  std::string v(kTopicBytes, '\0');
  put_le32(v.data(), t.fence.empty() ? 1 : 2);
  put_le32(v.data() + 4, t.id);
  put_le32(v.data() + 8, t.lanes);
  v[12] = t.is_queue ? 1 : 0;
  put_le64(v.data() + 16, static_cast<std::uint64_t>(t.retention.max_age.count()));
  put_le64(v.data() + 24, t.retention.max_bytes);
  put_le64(v.data() + 32, t.retention.max_count);
  put_le64(v.data() + 40, static_cast<std::uint64_t>(created_ns));
  if (!t.fence.empty()) {
    char f[4] = {static_cast<char>(t.fence_per_lane ? 1 : 0), 0, 0, 0};
    put_le16(f + 2, static_cast<std::uint16_t>(t.fence.size()));
    v.append(f, 4);
    v.append(t.fence);
  }
  return v;
}
bool decode_topic(std::string_view name, std::string_view v, TopicRef* t) {
  const std::uint32_t format = v.size() >= kTopicBytes ? get_le32(v.data()) : 0;
  if (format != 1 && format != 2) return false;
  t->name = std::string(name);
  t->id = get_le32(v.data() + 4);
  t->lanes = get_le32(v.data() + 8);
  t->is_queue = v[12] != 0;
  t->retention.max_age = std::chrono::milliseconds(static_cast<std::int64_t>(get_le64(v.data() + 16)));
  t->retention.max_bytes = get_le64(v.data() + 24);
  t->retention.max_count = get_le64(v.data() + 32);
  t->fence.clear();
  t->fence_per_lane = false;
  if (format == 2) {
    if (v.size() < kTopicBytes + 4 || v.size() != kTopicBytes + 4 + get_le16(v.data() + kTopicBytes + 2)) return false;
    t->fence_per_lane = v[kTopicBytes] != 0;
    t->fence.assign(v.data() + kTopicBytes + 4, v.size() - kTopicBytes - 4);
    if (t->fence.empty()) return false;
  }
  return t->id != 0 && t->lanes >= 1 && t->lanes <= kMaxLanes;
}

// ---- cursor / inflight records ----
struct CursorRec {
  std::uint64_t committed = 0;
  std::uint64_t skipped = 0;
};
struct InflightRec {
  std::uint32_t attempt = 0;
  std::uint32_t state = kInflightClaimed;
  std::int64_t deadline_ns = 0;
  std::int64_t first_claim_ns = 0;
};

// ---- log record (see doc/storage-format.md) ----
std::size_t record_size(const AppendRequest& r) {
  return kRecordOverhead + r.key.size() + r.idempotency_key.size() + r.payload.size();
}
void encode_record(char* p, std::size_t size, const AppendRequest& r, const MessageHeader& h,
                   std::int64_t index_ts) {
  std::memset(p, 0, kRecordHeader);
  p[0] = 1;  // record format
  put_le16(p + 2, static_cast<std::uint16_t>(r.key.size()));
  put_le16(p + 4, static_cast<std::uint16_t>(r.idempotency_key.size()));
  put_le32(p + 8, static_cast<std::uint32_t>(r.payload.size()));
  put_le64(p + 16, static_cast<std::uint64_t>(index_ts));
  put_le64(p + 24, h.id);
  put_le64(p + 32, static_cast<std::uint64_t>(h.created_at_ns));
  put_le64(p + 40, h.correlation_id);
  put_le64(p + 48, h.fencing_token);
  put_le32(p + 56, h.attempt);
  put_le16(p + 60, h.content_type);
  put_le16(p + 62, h.schema_version);
  char* d = p + kRecordHeader;
  std::memcpy(d, r.key.data(), r.key.size());
  d += r.key.size();
  std::memcpy(d, r.idempotency_key.data(), r.idempotency_key.size());
  d += r.idempotency_key.size();
  std::memcpy(d, r.payload.data(), r.payload.size());
  put_le32(p + size - 4, crc32c(p, size - 4));
}

Status decode_record(std::string_view v, std::string_view topic, std::uint32_t lane, std::uint64_t off,
                     StoredMessage* m) {
  auto bad = [&](const char* why) {
    return Status(Code::Corruption, "read topic " + quoted(topic) + " lane " + std::to_string(lane) + " offset " +
                                        std::to_string(off) + ": " + why);
  };
  if (v.size() < kRecordOverhead) return bad("record shorter than its header");
  const char* p = v.data();
  if (p[0] != 1) return bad("unknown record format");
  std::size_t klen = get_le16(p + 2), ilen = get_le16(p + 4), plen = get_le32(p + 8);
  if (kRecordOverhead + klen + ilen + plen != v.size()) return bad("record lengths do not add up");
  if (crc32c(p, v.size() - 4) != get_le32(p + v.size() - 4)) return bad("record checksum mismatch");
  m->lane = lane;
  m->offset = off;
  m->index_ts_ns = static_cast<std::int64_t>(get_le64(p + 16));
  m->header.id = get_le64(p + 24);
  m->header.created_at_ns = static_cast<std::int64_t>(get_le64(p + 32));
  m->header.correlation_id = get_le64(p + 40);
  m->header.fencing_token = get_le64(p + 48);
  m->header.attempt = get_le32(p + 56);
  m->header.content_type = get_le16(p + 60);
  m->header.schema_version = get_le16(p + 62);
  const char* d = p + kRecordHeader;
  m->key.assign(d, klen);
  m->idempotency_key.assign(d + klen, ilen);
  m->payload.assign(d + klen + ilen, plen);
  return Status();
}

// The first offset in [ls.first, ls.next) whose index timestamp is >= ts:
// binary search (offsets are contiguous and index timestamps monotonic).
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

Result<std::uint64_t> start_offset(LmdbTxn& txn, LmdbDbi log, std::uint32_t tid, std::uint32_t lane,
                                   const LaneState& ls, const StartPosition& start) {
  switch (start.from) {
    case StartFrom::Earliest: return ls.first;
    case StartFrom::Latest: return ls.next;
    case StartFrom::Offset: return std::clamp(start.offset, ls.first, ls.next);
    case StartFrom::Timestamp: return search_time(txn, log, tid, lane, ls, start.timestamp_ns);
  }
  return ls.first;
}

}  // namespace

// ---- exposed decoders (lib/store/store_codec.hpp: the verify walk and fuzz targets) ----

Status decode_log_record(std::string_view value, std::string_view topic, std::uint32_t lane, std::uint64_t offset,
                         StoredMessage* out) {
  return decode_record(value, topic, lane, offset, out);
}

std::string encode_log_record(const AppendRequest& request, std::int64_t index_ts) {
  std::string v(record_size(request), '\0');
  encode_record(v.data(), v.size(), request, request.header, index_ts);
  return v;
}

bool decode_topic_record(std::string_view name, std::string_view value, TopicRef* out) {
  return decode_topic(name, value, out);
}

bool decode_lane_record(std::string_view value, LaneRecord* out) {
  LaneState s;
  if (!decode_lane(value, &s)) return false;
  *out = LaneRecord{s.first, s.next, s.bytes, s.count, s.last_ts};
  return true;
}

bool decode_group_record(std::string_view value, GroupRecord* out) {
  if (value.size() != 16) return false;
  out->format = get_le32(value.data());
  out->group_id = get_le32(value.data() + 4);
  out->created_ns = static_cast<std::int64_t>(get_le64(value.data() + 8));
  return out->format == 1 && out->group_id != 0;
}

bool decode_cursor_record(std::string_view value, CursorRecord* out) {
  if (value.size() != 16) return false;
  out->committed = get_le64(value.data());
  out->skipped = get_le64(value.data() + 8);
  return true;
}

bool decode_inflight_record(std::string_view value, InflightRecord* out) {
  if (value.size() != 24) return false;
  out->attempt = get_le32(value.data());
  out->state = get_le32(value.data() + 4);
  out->deadline_ns = static_cast<std::int64_t>(get_le64(value.data() + 8));
  out->first_claim_ns = static_cast<std::int64_t>(get_le64(value.data() + 16));
  return out->attempt >= 1 && (out->state == kInflightClaimed || out->state == kInflightAcked);
}

Status check_layout_record(std::string_view value) {
  if (value.size() != 12 || std::memcmp(value.data(), kLayoutMagic, 8) != 0) {
    return Status(Code::Corruption, "the layout record is not lanebus's (foreign data)");
  }
  const std::uint32_t version = get_le32(value.data() + 8);
  if (version > kLayoutVersion) {
    return Status(Code::VersionTooNew, "layout version " + std::to_string(version) + " was written by a newer lanebus");
  }
  if (version == 0) return Status(Code::Corruption, "layout version 0 is invalid");
  return Status();
}

std::string encode_layout_record(std::uint32_t version) {
  std::string v(kLayoutMagic, sizeof kLayoutMagic);
  v.resize(12);
  put_le32(v.data() + 8, version);
  return v;
}

// ======================================================================
// WriteCtx: the state of one write transaction of the writer thread.

struct DurableStore::WriteCtx {
  DurableStore* store;
  LmdbTxn* txn;
  std::int64_t now_ns;
  // Any LMDB failure through ctx makes the whole transaction unusable (LMDB
  // may have marked it failed): the batch is aborted.
  Status dead;
  std::map<std::uint64_t, LaneState> lanes;      // loaded lane states
  std::map<std::uint64_t, bool> dirty;           // key -> got appends
  bool ids_loaded = false;
  std::uint64_t id_next = 0;
  bool ids_dirty = false;
  std::uint64_t retention_deleted = 0;
  std::uint64_t claims = 0, redeliveries = 0, acks = 0;

  static std::uint64_t lk(std::uint32_t tid, std::uint32_t lane) {
    return (static_cast<std::uint64_t>(tid) << 32) | lane;
  }
  Status fail(Status s) {
    if (dead.ok()) dead = s;
    return s;
  }
  Result<std::string_view> get(LmdbDbi dbi, std::string_view key) {
    auto r = txn->get(dbi, key);
    if (!r.ok() && r.code() != Code::NotFound) (void)fail(r.status());
    return r;
  }
  Status put(LmdbDbi dbi, std::string_view key, std::string_view value) {
    Status s = txn->put(dbi, key, value);
    if (!s.ok()) return fail(std::move(s));
    return s;
  }
  Status del(LmdbDbi dbi, std::string_view key) {
    Status s = txn->del(dbi, key);
    if (!s.ok() && s.code() != Code::NotFound) return fail(std::move(s));
    return s;
  }
  Result<LaneState*> lane(std::uint32_t tid, std::uint32_t lane_no) {
    auto k = lk(tid, lane_no);
    auto it = lanes.find(k);
    if (it != lanes.end()) return &it->second;
    auto s = read_lane(*txn, store->dbi_lanes_, tid, lane_no);
    if (!s.ok()) return fail(s.status());
    return &lanes.emplace(k, *s).first->second;
  }
  void mark(std::uint32_t tid, std::uint32_t lane_no, bool appended) {
    auto& d = dirty[lk(tid, lane_no)];
    d = d || appended;
  }
  Result<std::uint64_t> meta_u64(std::string_view key, std::uint64_t dflt) {
    auto v = get(store->dbi_meta_, key);
    if (!v.ok()) {
      if (v.code() == Code::NotFound) return dflt;
      return v.status();
    }
    if (v->size() != 8) return fail(Status(Code::Corruption, "meta record " + std::string(key) + " is malformed"));
    return get_le64(v->data());
  }
  Status put_meta_u64(std::string_view key, std::uint64_t value) {
    char b[8];
    put_le64(b, value);
    return put(store->dbi_meta_, key, std::string_view(b, 8));
  }
  Result<std::uint64_t> take_ids(std::uint64_t n) {
    if (!ids_loaded) {
      auto v = meta_u64("id_next", 1);
      if (!v.ok()) return v.status();
      id_next = *v;
      ids_loaded = true;
    }
    std::uint64_t first = id_next;
    id_next += n;
    ids_dirty = true;
    return first;
  }
  Result<CursorRec> cursor(std::uint32_t tid, std::uint32_t gid, std::uint32_t lane_no) {
    CursorRec c;
    auto v = get(store->dbi_cursors_, cursor_key(tid, gid, lane_no).sv());
    if (!v.ok()) {
      if (v.code() == Code::NotFound) return c;
      return v.status();
    }
    if (v->size() != 16) return fail(Status(Code::Corruption, "group cursor record is malformed"));
    c.committed = get_le64(v->data());
    c.skipped = get_le64(v->data() + 8);
    return c;
  }
  Status put_cursor(std::uint32_t tid, std::uint32_t gid, std::uint32_t lane_no, const CursorRec& c) {
    char b[16];
    put_le64(b, c.committed);
    put_le64(b + 8, c.skipped);
    return put(store->dbi_cursors_, cursor_key(tid, gid, lane_no).sv(), std::string_view(b, 16));
  }
  Result<std::optional<InflightRec>> inflight(const Key& k) {
    auto v = get(store->dbi_inflight_, k.sv());
    if (!v.ok()) {
      if (v.code() == Code::NotFound) return std::optional<InflightRec>();
      return v.status();
    }
    if (v->size() != 24) return fail(Status(Code::Corruption, "in-flight record is malformed"));
    InflightRec r;
    r.attempt = get_le32(v->data());
    r.state = get_le32(v->data() + 4);
    r.deadline_ns = static_cast<std::int64_t>(get_le64(v->data() + 8));
    r.first_claim_ns = static_cast<std::int64_t>(get_le64(v->data() + 16));
    return std::optional<InflightRec>(r);
  }
  Status put_inflight(const Key& k, const InflightRec& r) {
    char b[24];
    put_le32(b, r.attempt);
    put_le32(b + 4, r.state);
    put_le64(b + 8, static_cast<std::uint64_t>(r.deadline_ns));
    put_le64(b + 16, static_cast<std::uint64_t>(r.first_claim_ns));
    return put(store->dbi_inflight_, k.sv(), std::string_view(b, 24));
  }
  // Delete in-flight records of (tid, gid, lane) with offset < below.
  Status drop_inflight_below(std::uint32_t tid, std::uint32_t gid, std::uint32_t lane_no, std::uint64_t below) {
    std::vector<Key> keys;
    {
      auto c = LmdbCursor::open(*txn, store->dbi_inflight_, store->options_.directory);
      if (!c.ok()) return fail(c.status());
      Key prefix = cursor_key(tid, gid, lane_no);
      auto r = c->seek(prefix.sv());
      while (r.ok() && *r) {
        auto k = c->key();
        if (k.size() != 20 || k.substr(0, 12) != prefix.sv() || get_be64(k.data() + 12) >= below) break;
        Key copy;
        std::memcpy(copy.b, k.data(), 20);
        copy.n = 20;
        keys.push_back(copy);
        r = c->next();
      }
      if (!r.ok()) return fail(r.status());
    }
    for (const Key& k : keys) {
      Status s = del(store->dbi_inflight_, k.sv());
      if (!s.ok() && s.code() != Code::NotFound) return s;
    }
    return Status();
  }
  // Write back every loaded lane state that changed, and the id high-water.
  Status flush() {
    for (auto& [k, appended] : dirty) {
      (void)appended;
      char b[kLaneStateBytes];
      encode_lane(lanes[k], b);
      Key key = lane_key(static_cast<std::uint32_t>(k >> 32), static_cast<std::uint32_t>(k));
      Status s = put(store->dbi_lanes_, key.sv(), std::string_view(b, kLaneStateBytes));
      if (!s.ok()) return s;
    }
    if (ids_dirty) return put_meta_u64("id_next", id_next);
    return Status();
  }
};

struct DurableStore::Waiter {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  Status status;
  AppendResult result;
  void finish(const Status& s, const AppendResult& r) {
    std::lock_guard<std::mutex> l(m);
    status = s;
    result = r;
    done = true;
    cv.notify_one();
  }
  void wait() {
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return done; });
  }
};

// ======================================================================
// open / close

DurableStore::DurableStore(const StoreOptions& options) : options_(options) {}

Result<std::unique_ptr<DurableStore>> DurableStore::open(const StoreOptions& options) {
  if (options.max_batch == 0 || options.max_pending == 0 || options.retention_batch == 0) {
    return Status(Code::InvalidArgument, "open store " + quoted(options.directory) +
                                             ": max_batch, max_pending and retention_batch must be > 0");
  }
  if (options.verify_on_open) {  // the walk in a child that may die (lib/ops/verify.hpp)
    auto report = verify_store_in_child(options.directory);
    if (!report.ok() && report.code() != Code::NotFound) return report.status();
    if (report.ok() && !report->ok()) {
      return Status(Code::Corruption, "open " + quoted(options.directory) + ": verify_on_open found " +
                                          std::to_string(report->problem_count) + " problem(s), the first: " +
                                          (report->problems.empty() ? std::string("?") : report->problems.front()) +
                                          "; run `lanebus verify " + options.directory + "` for all of them");
    }
  }
  LmdbEnv::Config cfg;
  cfg.path = options.directory;
  cfg.map_size_initial = options.map_size_initial;
  cfg.map_size_max = options.map_size_max;
  cfg.max_readers = options.max_readers;
  cfg.max_dbs = 32;  // 7 core databases + extension tables (StoreTable) + room to grow
  cfg.read_only = options.read_only;
  cfg.no_sync = options.durability == Durability::Async;
  auto env = LmdbEnv::open(cfg);
  if (!env.ok()) return env.status();
  std::unique_ptr<DurableStore> store(new DurableStore(options));
  store->env_ = std::move(*env);
  Status s = store->init_layout();
  if (!s.ok()) return s;
  if (!options.read_only) {
    store->writer_ = std::thread([p = store.get()] { p->writer_main(); });
    store->writer_id_ = store->writer_.get_id();
  }
  return store;
}

Status DurableStore::init_layout() {
  const std::string& path = options_.directory;
  auto txn = options_.read_only ? env_->begin_read() : env_->begin_write();
  if (!txn.ok()) return txn.status();
  auto meta = env_->open_dbi(*txn, "meta", false);
  if (!meta.ok()) {
    if (meta.code() != Code::NotFound) return meta.status();
    // No lanebus metadata: a fresh environment, or someone else's.
    auto main_dbi = env_->open_dbi(*txn, nullptr, false);
    if (!main_dbi.ok()) return main_dbi.status();
    bool any_key = false;
    {
      // A write txn's cursors are freed by its commit: close this one first.
      auto c = LmdbCursor::open(*txn, *main_dbi, path);
      if (!c.ok()) return c.status();
      auto any = c->first();
      if (!any.ok()) return any.status();
      any_key = *any;
    }
    if (any_key) {
      return Status(Code::Corruption, "open " + quoted(path) +
                                          ": a foreign LMDB environment (no lanebus layout record); "
                                          "not a lanebus store");
    }
    if (options_.read_only) {
      return Status(Code::NotFound, "open " + quoted(path) + ": empty environment: not a lanebus store");
    }
    const char* names[] = {"meta", "topics", "lanes", "log", "groups", "cursors", "inflight"};
    LmdbDbi* slots[] = {&dbi_meta_, &dbi_topics_, &dbi_lanes_, &dbi_log_, &dbi_groups_, &dbi_cursors_, &dbi_inflight_};
    for (int i = 0; i < 7; ++i) {
      auto d = env_->open_dbi(*txn, names[i], true);
      if (!d.ok()) return d.status();
      *slots[i] = *d;
    }
    Status s = txn->put(dbi_meta_, "layout", encode_layout_record(kLayoutVersion));
    if (!s.ok()) return s;
    s = open_extension_tables(*txn);
    if (!s.ok()) return s;
    return txn->commit();
  }
  dbi_meta_ = *meta;
  auto layout = txn->get(dbi_meta_, "layout");
  if (!layout.ok()) {
    if (layout.code() == Code::NotFound) {
      return Status(Code::Corruption, "open " + quoted(path) + ": no layout record: not a lanebus store");
    }
    return layout.status();
  }
  if (layout->size() != 12 || std::memcmp(layout->data(), kLayoutMagic, 8) != 0) {
    return Status(Code::Corruption, "open " + quoted(path) + ": the layout record is not lanebus's (foreign data)");
  }
  std::uint32_t version = get_le32(layout->data() + 8);
  if (version > kLayoutVersion) {
    return Status(Code::VersionTooNew, "open " + quoted(path) + ": layout version " + std::to_string(version) +
                                           " was written by a newer lanebus; this release reads up to version " +
                                           std::to_string(kLayoutVersion));
  }
  if (version == 0) return Status(Code::Corruption, "open " + quoted(path) + ": layout version 0 is invalid");
  const char* names[] = {"topics", "lanes", "log", "groups", "cursors", "inflight"};
  LmdbDbi* slots[] = {&dbi_topics_, &dbi_lanes_, &dbi_log_, &dbi_groups_, &dbi_cursors_, &dbi_inflight_};
  for (int i = 0; i < 6; ++i) {
    auto d = env_->open_dbi(*txn, names[i], false);
    if (!d.ok()) {
      if (d.code() == Code::NotFound) {
        return Status(Code::Corruption, "open " + quoted(path) + ": database \"" + names[i] + "\" is missing");
      }
      return d.status();
    }
    *slots[i] = *d;
  }
  if (Status es = open_extension_tables(*txn); !es.ok()) return es;
  return txn->commit();  // keeps the dbi handles (also for a read-only txn)
}

Status DurableStore::open_extension_tables(LmdbTxn& txn) {
  static const char* const kNames[kStoreTables] = {"idem", "idem_age", "dlq", "dlq_audit", "fence", "user",
                                                    "tenancy", "schema"};
  for (int i = 0; i < kStoreTables; ++i) {
    auto d = env_->open_dbi(txn, kNames[i], !options_.read_only);
    if (!d.ok()) {
      if (d.code() == Code::NotFound && options_.read_only) continue;  // never written: reads as empty
      return d.status();
    }
    dbi_ext_[i] = *d;
    ext_present_[i] = true;
  }
  return Status();
}

// ---------------------------------------------------------------- extensions

Result<std::string_view> StoreTxn::get(StoreTable table, std::string_view key) {
  const int t = static_cast<int>(table);
  if (!store_->ext_present_[t]) return Status(Code::NotFound);
  if (ctx_) return static_cast<DurableStore::WriteCtx*>(ctx_)->get(store_->dbi_ext_[t], key);
  return txn_->get(store_->dbi_ext_[t], key);
}

Status StoreTxn::put(StoreTable table, std::string_view key, std::string_view value) {
  if (!ctx_) return Status(Code::InvalidArgument, "put in a read transaction");
  return static_cast<DurableStore::WriteCtx*>(ctx_)->put(store_->dbi_ext_[static_cast<int>(table)], key, value);
}

Status StoreTxn::del(StoreTable table, std::string_view key) {
  if (!ctx_) return Status(Code::InvalidArgument, "del in a read transaction");
  return static_cast<DurableStore::WriteCtx*>(ctx_)->del(store_->dbi_ext_[static_cast<int>(table)], key);
}

Status StoreTxn::scan(StoreTable table, std::string_view from, std::string_view prefix,
                      const std::function<bool(std::string_view, std::string_view)>& visit) {
  const int t = static_cast<int>(table);
  if (!store_->ext_present_[t]) return Status();
  return scan_dbi(store_->dbi_ext_[t], from, prefix, visit);
}

Status StoreTxn::abort_batch(Status cause) {
  if (cause.ok()) cause = Status(Code::Internal, "abort_batch without a cause");
  if (ctx_) return static_cast<DurableStore::WriteCtx*>(ctx_)->fail(std::move(cause));
  return cause;
}

LmdbDbi StoreTxn::core_dbi(Core table) const noexcept {
  switch (table) {
    case Core::Meta: return store_->dbi_meta_;
    case Core::Topics: return store_->dbi_topics_;
    case Core::Lanes: return store_->dbi_lanes_;
    case Core::Log: return store_->dbi_log_;
    case Core::Groups: return store_->dbi_groups_;
    case Core::Cursors: return store_->dbi_cursors_;
    case Core::Inflight: return store_->dbi_inflight_;
  }
  return store_->dbi_meta_;
}

Result<std::string_view> StoreTxn::core_get(Core table, std::string_view key) {
  if (ctx_) return static_cast<DurableStore::WriteCtx*>(ctx_)->get(core_dbi(table), key);
  return txn_->get(core_dbi(table), key);
}

Status StoreTxn::core_put(Core table, std::string_view key, std::string_view value) {
  if (!ctx_) return Status(Code::InvalidArgument, "put in a read transaction");
  return static_cast<DurableStore::WriteCtx*>(ctx_)->put(core_dbi(table), key, value);
}

Status StoreTxn::core_del(Core table, std::string_view key) {
  if (!ctx_) return Status(Code::InvalidArgument, "del in a read transaction");
  return static_cast<DurableStore::WriteCtx*>(ctx_)->del(core_dbi(table), key);
}

Status StoreTxn::core_scan(Core table, std::string_view from, std::string_view prefix,
                           const std::function<bool(std::string_view, std::string_view)>& visit) {
  return scan_dbi(core_dbi(table), from, prefix, visit);
}

Status StoreTxn::scan_dbi(LmdbDbi dbi, std::string_view from, std::string_view prefix,
                          const std::function<bool(std::string_view, std::string_view)>& visit) {
  Status result;
  {
    auto c = LmdbCursor::open(*txn_, dbi, store_->options_.directory);
    if (!c.ok()) return c.status();
    auto found = from.empty() ? c->first() : c->seek(from);  // LMDB refuses an empty key
    while (found.ok() && *found) {
      std::string_view k = c->key(), v = c->value();
      if (k.substr(0, prefix.size()) != prefix) break;
      if (!visit(k, v)) break;
      found = c->next();
    }
    if (!found.ok()) result = found.status();
  }
  if (!result.ok() && ctx_) (void)static_cast<DurableStore::WriteCtx*>(ctx_)->fail(result);
  return result;
}

Result<AppendResult> StoreTxn::append(AppendRequest request) {
  if (!ctx_) return Status(Code::InvalidArgument, "append in a read transaction");
  DurableStore::WriteOp op;
  op.is_append = true;
  op.request = std::move(request);
  Status s = store_->apply_append(*static_cast<DurableStore::WriteCtx*>(ctx_), op);
  if (!s.ok()) return s;
  return op.result;
}

Status StoreTxn::commit_offset(const GroupRef& group, std::uint32_t lane, std::uint64_t offset) {
  if (!ctx_) return Status(Code::InvalidArgument, "commit_offset in a read transaction");
  return store_->commit_offset_in(*static_cast<DurableStore::WriteCtx*>(ctx_), group, lane, offset);
}

Status StoreTxn::ack(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt) {
  if (!ctx_) return Status(Code::InvalidArgument, "ack in a read transaction");
  return store_->ack_in(*static_cast<DurableStore::WriteCtx*>(ctx_), group, lane, offset, attempt);
}

Status StoreTxn::release(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt,
                         std::int64_t delay_ns) {
  if (!ctx_) return Status(Code::InvalidArgument, "release in a read transaction");
  return store_->release_in(*static_cast<DurableStore::WriteCtx*>(ctx_), group, lane, offset, attempt,
                            now_ns_ + delay_ns, false);
}

Status StoreTxn::unclaim(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt) {
  if (!ctx_) return Status(Code::InvalidArgument, "unclaim in a read transaction");
  return store_->release_in(*static_cast<DurableStore::WriteCtx*>(ctx_), group, lane, offset, attempt, now_ns_, true);
}

Status StoreTxn::expire_claim(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt) {
  if (!ctx_) return Status(Code::InvalidArgument, "expire_claim in a read transaction");
  return store_->release_in(*static_cast<DurableStore::WriteCtx*>(ctx_), group, lane, offset, attempt, now_ns_, false);
}

Status DurableStore::write(const std::function<Status(StoreTxn&)>& fn) {
  return run_write(
      [this, &fn](WriteCtx& ctx) -> Status {
        StoreTxn t(this, &ctx, ctx.txn, ctx.now_ns);
        return fn(t);
      },
      false);
}

Status DurableStore::read(const std::function<Status(StoreTxn&)>& fn) {
  Status s = check_open();
  if (!s.ok()) return s;
  std::shared_lock life(life_mutex_);
  if (closed_.load()) return Status(Code::ShutDown, "store " + quoted(options_.directory) + " is closed");
  auto txn = env_->begin_read();
  if (!txn.ok()) return txn.status();
  StoreTxn t(this, nullptr, &*txn, wall_now_ns());
  return fn(t);
}

DurableStore::~DurableStore() { (void)close(); }

Status DurableStore::health() const {
  if (env_ && env_->fatal()) return env_->fatal_status();
  return Status();
}

Status DurableStore::close() {
  if (writer_.joinable() && std::this_thread::get_id() == writer_id_) {
    return Status(Code::Busy, "close store " + quoted(options_.directory) + ": called from a completion callback");
  }
  {
    MutexLock l(&queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  space_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  std::unique_lock<std::shared_mutex> life(life_mutex_);
  if (closed_.load()) return Status();
  Status s;
  if (options_.durability == Durability::Async && !options_.read_only && env_ && !env_->fatal()) {
    s = env_->sync();
  }
  closed_.store(true);
  env_.reset();
  return s;
}

Status DurableStore::check_open() const {
  if (closed_.load()) return Status(Code::ShutDown, "store " + quoted(options_.directory) + " is closed");
  return Status();
}

Status DurableStore::check_writable() const {
  if (options_.read_only) {
    return Status(Code::InvalidArgument, "store " + quoted(options_.directory) + " is open read-only");
  }
  return check_open();
}

std::uint64_t DurableStore::map_size() const noexcept {
  std::shared_lock<std::shared_mutex> life(life_mutex_);
  return env_ ? env_->map_size() : 0;
}

StoreCounters DurableStore::counters() const noexcept {
  StoreCounters c;
  auto ld = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  c.appends = ld(counters_.appends);
  c.append_failures = ld(counters_.append_failures);
  c.commits = ld(counters_.commits);
  c.fsyncs = ld(counters_.fsyncs);
  c.batched_ops = ld(counters_.batched_ops);
  c.max_batch = ld(counters_.max_batch);
  c.skipped_by_retention = ld(counters_.skipped_by_retention);
  c.retention_deleted = ld(counters_.retention_deleted);
  c.claims = ld(counters_.claims);
  c.redeliveries = ld(counters_.redeliveries);
  c.acks = ld(counters_.acks);
  c.stale_readers_cleared = ld(counters_.stale_readers_cleared);
  c.max_write_lock_wait_ns = ld(counters_.max_write_lock_wait_ns);
  {
    std::shared_lock<std::shared_mutex> life(life_mutex_);
    c.map_growths = env_ ? env_->map_growths() : 0;
  }
  return c;
}

void DurableStore::set_append_listener(
    std::function<void(std::uint32_t, std::uint32_t, std::uint64_t)> listener) {
  MutexLock l(&queue_mutex_);  // the writer reads it after taking a batch under this mutex
  append_listener_ = std::move(listener);
}

// ======================================================================
// the writer

Status DurableStore::enqueue(WriteOp op, bool may_block) {
  {
    MutexLock l(&queue_mutex_);
    while (!stopping_ && queue_.size() >= options_.max_pending) {
      if (!may_block) return Status(Code::WouldBlock);
      space_cv_.wait(queue_mutex_);
    }
    if (stopping_) return Status(Code::ShutDown, "store " + quoted(options_.directory) + " is closing");
    queue_.push_back(std::move(op));
  }
  queue_cv_.notify_one();
  return Status();
}

Status DurableStore::run_write(std::function<Status(WriteCtx&)> apply, bool bookkeeping) {
  Status s = check_writable();
  if (!s.ok()) return s;
  if (std::this_thread::get_id() == writer_id_) {
    return Status(Code::Busy, "blocking store call from a completion callback (writer thread)");
  }
  Waiter w;
  WriteOp op;
  op.apply = std::move(apply);
  op.bookkeeping = bookkeeping;
  op.done = [&w](const Status& st) { w.finish(st, {}); };
  s = enqueue(std::move(op), true);
  if (!s.ok()) return s;
  w.wait();
  return w.status;
}

void DurableStore::writer_main() {
  using clock = std::chrono::steady_clock;
  auto next_maint = clock::now() + options_.maintenance_interval;
  auto next_flush = clock::now() + options_.async_flush_interval;
  const bool async = options_.durability == Durability::Async;
  bool retention_more = false;
  std::vector<WriteOp> batch;
  std::function<void(std::uint32_t, std::uint32_t, std::uint64_t)> listener;
  for (;;) {
    bool stop = false, force = false;
    batch.clear();
    {
      MutexLock l(&queue_mutex_);
      for (;;) {
        auto now = clock::now();
        if (!queue_.empty() || stopping_ || force_retention_ || retention_more || now >= next_maint ||
            (async && now >= next_flush)) {
          break;
        }
        auto until = async ? std::min(next_maint, next_flush) : next_maint;
        queue_cv_.wait_until(queue_mutex_, until);
      }
      while (!queue_.empty() && batch.size() < options_.max_batch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      stop = stopping_ && queue_.empty();
      force = force_retention_;
      force_retention_ = false;
      listener = append_listener_;
    }
    space_cv_.notify_all();
    if (!batch.empty()) process_batch(batch);
    if (batch.size() > 0) {
      // Completions and the listener run here: after the commit, outside any txn and lock.
      for (WriteOp& op : batch) {
        if (op.is_append) {
          // Relaxed: a statistic.
          if (!op.status.ok()) counters_.append_failures.fetch_add(1, std::memory_order_relaxed);
          if (op.append_done) op.append_done(op.status, op.result);
        } else if (op.done) {
          op.done(op.status);
        }
      }
      if (listener) {
        std::map<std::uint64_t, std::uint64_t> ends;
        for (const WriteOp& op : batch) {
          if (op.is_append && op.status.ok() && !op.result.duplicate) {
            auto k = (static_cast<std::uint64_t>(op.request.topic_id) << 32) | op.request.lane;
            ends[k] = std::max(ends[k], op.result.offset + 1);
          }
        }
        for (auto& [k, end] : ends) listener(static_cast<std::uint32_t>(k >> 32), static_cast<std::uint32_t>(k), end);
      }
    }
    if (stop) break;
    auto now = clock::now();
    if (now >= next_maint || force) {
      auto dead = env_->reader_check();
      if (dead.ok() && *dead > 0) {
        counters_.stale_readers_cleared.fetch_add(static_cast<std::uint64_t>(*dead), std::memory_order_relaxed);
      }
      retention_more = true;
      next_maint = now + options_.maintenance_interval;
    }
    if (retention_more && !env_->fatal()) {
      // One bounded step; queued operations get their turn before the next.
      std::vector<WriteOp> step(1);
      bool more = false;
      step[0].apply = [this, &more](WriteCtx& ctx) {
        return apply_retention(ctx, options_.retention_batch, &more);
      };
      step[0].bookkeeping = true;
      process_batch(step);
      retention_more = step[0].status.ok() && more;
    } else {
      retention_more = false;
    }
    if (async && clock::now() >= next_flush) {
      if (!env_->fatal() && env_->sync().ok()) counters_.fsyncs.fetch_add(1, std::memory_order_relaxed);
      next_flush = clock::now() + options_.async_flush_interval;
    }
  }
}

void DurableStore::process_batch(std::vector<WriteOp>& ops) {
  bool bookkeeping_only = false;  // the map is at its maximum: retry small writes alone
  for (WriteOp& op : ops) op.excluded = false;
  for (;;) {
    auto t0 = std::chrono::steady_clock::now();
    auto txn = env_->begin_write();
    auto waited = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    // Relaxed: a statistic (watchdog of the LMDB writer-lock wait).
    std::uint64_t prev = counters_.max_write_lock_wait_ns.load(std::memory_order_relaxed);
    while (waited > prev &&
           !counters_.max_write_lock_wait_ns.compare_exchange_weak(prev, waited, std::memory_order_relaxed)) {
    }
    if (!txn.ok()) {
      for (WriteOp& op : ops) {
        if (!op.excluded) op.status = txn.status();
      }
      break;
    }
    WriteCtx ctx{this, &*txn, wall_now_ns(), Status(), {}, {}, false, 0, false, 0, 0, 0, 0};
    std::size_t applied = 0;
    for (WriteOp& op : ops) {
      if (op.excluded) continue;
      op.status = op.is_append ? apply_append(ctx, op) : op.apply(ctx);
      ++applied;
      if (!ctx.dead.ok()) break;
    }
    Status batch = ctx.dead;
    if (batch.ok()) batch = ctx.flush();
    if (batch.ok()) batch = txn->commit();
    if (batch.ok()) {
      std::uint64_t appends = 0;
      for (const WriteOp& op : ops) {
        if (op.is_append && !op.excluded && op.status.ok() && !op.result.duplicate) appends += 1;
      }
      // Relaxed: independent statistics.
      counters_.appends.fetch_add(appends, std::memory_order_relaxed);
      counters_.commits.fetch_add(1, std::memory_order_relaxed);
      if (options_.durability == Durability::Sync) counters_.fsyncs.fetch_add(1, std::memory_order_relaxed);
      counters_.batched_ops.fetch_add(applied, std::memory_order_relaxed);
      std::uint64_t mb = counters_.max_batch.load(std::memory_order_relaxed);
      while (applied > mb && !counters_.max_batch.compare_exchange_weak(mb, applied, std::memory_order_relaxed)) {
      }
      counters_.retention_deleted.fetch_add(ctx.retention_deleted, std::memory_order_relaxed);
      counters_.claims.fetch_add(ctx.claims, std::memory_order_relaxed);
      counters_.redeliveries.fetch_add(ctx.redeliveries, std::memory_order_relaxed);
      counters_.acks.fetch_add(ctx.acks, std::memory_order_relaxed);
      break;
    }
    txn->abort();
    if (batch.code() == Code::MapFull && !env_->fatal()) {
      Status grown = env_->grow_map();
      if (grown.ok()) continue;  // retry the whole batch in the bigger map
      if (!bookkeeping_only) {
        // At the maximum: fail the appends (nothing of them was committed) and
        // give acks / offset commits / retention, which are small and free
        // space, one more try alone (headroom for acks).
        bool any = false;
        for (WriteOp& op : ops) {
          if (op.excluded) continue;
          if (op.bookkeeping) {
            any = true;
          } else {
            op.status = grown;
            op.excluded = true;
          }
        }
        bookkeeping_only = true;
        if (any) continue;
        break;
      }
      batch = grown;
    }
    for (WriteOp& op : ops) {
      if (!op.excluded) op.status = batch;
    }
    break;
  }
}

Status DurableStore::apply_append(WriteCtx& ctx, WriteOp& op) {
  AppendRequest& r = op.request;
  auto topic = topic_by_id(r.topic_id);
  if (!topic.ok()) return topic.status();
  auto ls = ctx.lane(r.topic_id, r.lane);
  if (!ls.ok()) return ls.status();
  // Fenced topics (doc/leases.md, lib/features/fence.cpp): decided here, in the transaction,
  // against the high-water as left by earlier ops of this batch, before
  // anything of this op is written. A duplicate writes nothing.
  FencePlan fence;
  if (!topic->fence.empty()) {
    StoreTxn ft(this, &ctx, ctx.txn, ctx.now_ns);
    Status fs = fences_.check(ft, *topic, r, op.fence, &fence);
    if (!fs.ok()) return fs;
    if (fence.duplicate) {
      op.result = AppendResult{fence.dup_offset, fence.dup_id, true};
      return Status();
    }
  }
  MessageHeader h = r.header;
  if (h.id == 0) {
    auto id = ctx.take_ids(1);
    if (!id.ok()) return id.status();
    h.id = *id;
  }
  if (h.created_at_ns == 0) h.created_at_ns = ctx.now_ns;
  LaneState& s = **ls;
  std::int64_t index_ts = std::max(s.last_ts, h.created_at_ns);
  std::size_t size = record_size(r);
  auto p = ctx.txn->reserve(dbi_log_, log_key(r.topic_id, r.lane, s.next).sv(), size);
  if (!p.ok()) return ctx.fail(p.status());
  encode_record(*p, size, r, h, index_ts);
  op.result = AppendResult{s.next, h.id};
  s.next += 1;
  s.count += 1;
  s.bytes += size;
  s.last_ts = index_ts;
  ctx.mark(r.topic_id, r.lane, true);
  if (fence.fenced) {
    StoreTxn ft(this, &ctx, ctx.txn, ctx.now_ns);
    return fences_.record(ft, fence, r, op.result);
  }
  return Status();
}

// ======================================================================
// topics

Result<TopicRef> DurableStore::topic_by_id(std::uint32_t id) const {
  MutexLock l(&topics_mutex_);
  auto it = topics_.find(id);
  if (it == topics_.end()) {
    return Status(Code::InvalidArgument, "topic id " + std::to_string(id) + " is not open in this store");
  }
  return it->second;
}

void DurableStore::remember_topic(const TopicRef& t) {
  MutexLock l(&topics_mutex_);
  topics_[t.id] = t;
}

Result<TopicRef> DurableStore::open_topic(std::string_view name, const TopicSpec& spec) {
  Status s = check_name(name, "topic");
  if (!s.ok()) return s;
  if (spec.lanes == 0 || spec.lanes > kMaxLanes) {
    return Status(Code::InvalidArgument, "topic " + quoted(name) + ": lanes must be 1..4096, got " +
                                             std::to_string(spec.lanes));
  }
  if (spec.retention.max_age.count() < 0) {
    return Status(Code::InvalidArgument, "topic " + quoted(name) + ": retention max_age is negative");
  }
  if (!spec.fence.empty()) {
    if (Status fs = validate_topic_fence(name, spec.fence, spec.fence_per_lane, spec.lanes); !fs.ok()) return fs;
  }
  TopicRef out;
  s = run_write(
      [&](WriteCtx& ctx) -> Status {
        auto v = ctx.get(dbi_topics_, name);
        if (v.ok()) {
          TopicRef t;
          if (!decode_topic(name, *v, &t)) {
            return Status(Code::Corruption, "topic " + quoted(name) + ": stored record is malformed");
          }
          if (t.lanes != spec.lanes) {
            return Status(Code::Conflict, "topic " + quoted(name) + " exists with " + std::to_string(t.lanes) +
                                              " lanes, not " + std::to_string(spec.lanes) +
                                              " (the lane count is fixed: changing it would break per-key order)");
          }
          if (t.is_queue != spec.is_queue) {
            return Status(Code::Conflict, "topic " + quoted(name) + " exists as a " + (t.is_queue ? "queue" : "topic") +
                                              ", not a " + (spec.is_queue ? "queue" : "topic"));
          }
          if (t.fence != spec.fence || (!t.fence.empty() && t.fence_per_lane != spec.fence_per_lane)) {
            auto show = [](const std::string& f, bool per_lane) {
              return f.empty() ? std::string("no fence") : "fence " + quoted(f) + (per_lane ? " per lane" : " per topic");
            };
            return Status(Code::Conflict, "topic " + quoted(name) + " exists with " + show(t.fence, t.fence_per_lane) +
                                              ", not " + show(spec.fence, spec.fence_per_lane) +
                                              " (the fence is fixed at creation)");
          }
          if (t.retention.max_age != spec.retention.max_age || t.retention.max_bytes != spec.retention.max_bytes ||
              t.retention.max_count != spec.retention.max_count) {
            t.retention = spec.retention;
            Status ps = ctx.put(dbi_topics_, name, encode_topic(t, ctx.now_ns));
            if (!ps.ok()) return ps;
          }
          out = t;
          return Status();
        }
        if (v.code() != Code::NotFound) return v.status();
        auto next = ctx.meta_u64("next_topic_id", 1);
        if (!next.ok()) return next.status();
        TopicRef t;
        t.id = static_cast<std::uint32_t>(*next);
        t.name = std::string(name);
        t.lanes = spec.lanes;
        t.is_queue = spec.is_queue;
        t.retention = spec.retention;
        t.fence = spec.fence;
        t.fence_per_lane = !spec.fence.empty() && spec.fence_per_lane;
        Status ps = ctx.put_meta_u64("next_topic_id", *next + 1);
        if (ps.ok()) ps = ctx.put(dbi_topics_, name, encode_topic(t, ctx.now_ns));
        if (!ps.ok()) return ps;
        out = t;
        return Status();
      },
      true);
  if (!s.ok()) return s;
  remember_topic(out);
  return out;
}

Result<TopicRef> DurableStore::find_topic(std::string_view name) {
  Status s = check_name(name, "topic");
  if (!s.ok()) return s;
  std::shared_lock<std::shared_mutex> life(life_mutex_);
  if (!(s = check_open()).ok()) return s;
  auto txn = env_->begin_read();
  if (!txn.ok()) return txn.status();
  auto v = txn->get(dbi_topics_, name);
  if (!v.ok()) {
    if (v.code() == Code::NotFound) return Status(Code::NotFound, "topic " + quoted(name) + " not found in store " + quoted(options_.directory));
    return v.status();
  }
  TopicRef t;
  if (!decode_topic(name, *v, &t)) return Status(Code::Corruption, "topic " + quoted(name) + ": stored record is malformed");
  remember_topic(t);
  return t;
}

Result<std::vector<TopicRef>> DurableStore::list_topics() {
  std::shared_lock<std::shared_mutex> life(life_mutex_);
  Status s = check_open();
  if (!s.ok()) return s;
  auto txn = env_->begin_read();
  if (!txn.ok()) return txn.status();
  auto c = LmdbCursor::open(*txn, dbi_topics_, options_.directory);
  if (!c.ok()) return c.status();
  std::vector<TopicRef> out;
  auto r = c->first();
  while (r.ok() && *r) {
    TopicRef t;
    if (!decode_topic(c->key(), c->value(), &t)) {
      return Status(Code::Corruption, "topic " + quoted(c->key()) + ": stored record is malformed");
    }
    // Names were checked when the topic was created: an invalid one in the
    // catalogue is a damaged key (LMDB does not checksum keys).
    if (Status ns = check_name(c->key(), "stored topic"); !ns.ok()) {
      return Status(Code::Corruption, "the topic catalogue of " + quoted(options_.directory) + " is damaged: " +
                                          std::string(ns.message()));
    }
    out.push_back(t);
    r = c->next();
  }
  if (!r.ok()) return r.status();
  for (const TopicRef& t : out) remember_topic(t);
  return out;
}

// ======================================================================
// append

Status DurableStore::append_async(AppendRequest request, AppendCallback done) {
  Status s = check_writable();
  if (!s.ok()) return s;
  auto topic = topic_by_id(request.topic_id);
  if (!topic.ok()) return topic.status();
  if (request.lane >= topic->lanes) {
    return Status(Code::InvalidArgument, "append to " + quoted(topic->name) + ": lane " + std::to_string(request.lane) +
                                             " out of range (lanes = " + std::to_string(topic->lanes) + ")");
  }
  if (request.payload.empty()) {
    return Status(Code::InvalidArgument, "append to " + quoted(topic->name) + ": empty payload");
  }
  if (request.key.size() > 0xFFFF || request.idempotency_key.size() > 0xFFFF || request.payload.size() > kMaxPayload) {
    return Status(Code::PayloadTooLarge, "append to " + quoted(topic->name) +
                                             ": key and idempotency key are limited to 65535 bytes, payload to 1 GiB");
  }
  WriteOp op;
  if (!topic->fence.empty() && fences_.check_enabled()) {
    if (request.header.fencing_token == 0) {
      return Status(Code::InvalidArgument, "append to " + quoted(topic->name) + ": the topic is fenced by lease " +
                                               quoted(topic->fence) + " and the message has no fencing token");
    }
    // Ask the lease table now, on the caller's thread, so the writer never
    // waits on it while holding LMDB's writer lock (lib/features/fence.cpp).
    op.fence = fences_.preconfirm(*topic, request.lane, request.header.fencing_token);
  }
  op.is_append = true;
  op.request = std::move(request);
  op.append_done = std::move(done);
  return enqueue(std::move(op), true);
}

Result<AppendResult> DurableStore::append(AppendRequest request) {
  if (std::this_thread::get_id() == writer_id_) {
    return Status(Code::Busy, "blocking append from a completion callback (writer thread)");
  }
  Waiter w;
  Status s = append_async(std::move(request), [&w](const Status& st, const AppendResult& r) { w.finish(st, r); });
  if (!s.ok()) return s;
  w.wait();
  if (!w.status.ok()) return w.status;
  return w.result;
}

Result<std::uint64_t> DurableStore::reserve_ids(std::uint64_t count) {
  if (count == 0) return Status(Code::InvalidArgument, "reserve_ids: count is 0");
  std::uint64_t first = 0;
  Status s = run_write(
      [&](WriteCtx& ctx) -> Status {
        auto r = ctx.take_ids(count);
        if (!r.ok()) return r.status();
        first = *r;
        return Status();
      },
      true);
  if (!s.ok()) return s;
  return first;
}

// ======================================================================
// reads

Result<ReadBatch> DurableStore::read(const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                                     const ReadLimits& limits) {
  ReadBatch b;
  Status s = read_into(topic, lane, from, limits, &b);
  if (!s.ok()) return s;
  return b;
}

Status DurableStore::read_into(const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                               const ReadLimits& limits, ReadBatch* out) {
  ReadBatch& b = *out;
  // Keep the messages' strings (their capacity is reused); only the count resets.
  std::size_t used = 0;
  if (lane >= topic.lanes) {
    return Status(Code::InvalidArgument, "read " + quoted(topic.name) + ": lane " + std::to_string(lane) + " out of range");
  }
  std::shared_lock<std::shared_mutex> life(life_mutex_);
  Status s = check_open();
  if (!s.ok()) return s;
  auto txn = env_->begin_read();
  if (!txn.ok()) return txn.status();
  auto ls = read_lane(*txn, dbi_lanes_, topic.id, lane);
  if (!ls.ok()) return ls.status();
  b.skipped = 0;
  b.end_offset = ls->next;
  std::uint64_t start = from;
  if (start < ls->first) {
    b.skipped = ls->first - start;
    start = ls->first;
    // Relaxed: a statistic.
    counters_.skipped_by_retention.fetch_add(b.skipped, std::memory_order_relaxed);
  }
  b.first_offset = start;
  b.next_offset = start;
  if (start >= ls->next || limits.max_messages == 0) {
    b.messages.clear();
    return Status();
  }
  auto c = LmdbCursor::open(*txn, dbi_log_, options_.directory);
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
    s = decode_record(c->value(), topic.name, lane, off, &b.messages[used]);
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

Result<LaneInfo> DurableStore::lane_info(const TopicRef& topic, std::uint32_t lane) {
  if (lane >= topic.lanes) {
    return Status(Code::InvalidArgument, "lane " + std::to_string(lane) + " of " + quoted(topic.name) + " out of range");
  }
  std::shared_lock<std::shared_mutex> life(life_mutex_);
  Status s = check_open();
  if (!s.ok()) return s;
  auto txn = env_->begin_read();
  if (!txn.ok()) return txn.status();
  auto ls = read_lane(*txn, dbi_lanes_, topic.id, lane);
  if (!ls.ok()) return ls.status();
  return LaneInfo{ls->first, ls->next, ls->bytes, ls->count};
}

Result<std::uint64_t> DurableStore::end_offset(const TopicRef& topic, std::uint32_t lane) {
  auto li = lane_info(topic, lane);
  if (!li.ok()) return li.status();
  return li->end_offset;
}

Result<std::uint64_t> DurableStore::offset_for_time(const TopicRef& topic, std::uint32_t lane, std::int64_t ts_ns) {
  if (lane >= topic.lanes) {
    return Status(Code::InvalidArgument, "lane " + std::to_string(lane) + " of " + quoted(topic.name) + " out of range");
  }
  std::shared_lock<std::shared_mutex> life(life_mutex_);
  Status s = check_open();
  if (!s.ok()) return s;
  auto txn = env_->begin_read();
  if (!txn.ok()) return txn.status();
  auto ls = read_lane(*txn, dbi_lanes_, topic.id, lane);
  if (!ls.ok()) return ls.status();
  return search_time(*txn, dbi_log_, topic.id, lane, *ls, ts_ns);
}

// ======================================================================
// groups

Result<GroupRef> DurableStore::open_group(const TopicRef& topic, std::string_view name, StartPosition start) {
  Status s = check_name(name, "group");
  if (!s.ok()) return s;
  if (topic.id == 0) return Status(Code::InvalidArgument, "open group " + quoted(name) + ": invalid topic");
  GroupRef g;
  g.topic_id = topic.id;
  g.lanes = topic.lanes;
  g.name = std::string(name);
  s = run_write(
      [&](WriteCtx& ctx) -> Status {
        std::string gk = group_key(topic.id, name);
        auto v = ctx.get(dbi_groups_, gk);
        if (v.ok()) {
          if (v->size() < 8) return Status(Code::Corruption, "group " + quoted(name) + ": stored record is malformed");
          g.group_id = get_le32(v->data() + 4);
          return Status();
        }
        if (v.code() != Code::NotFound) return v.status();
        auto next = ctx.meta_u64("next_group_id", 1);
        if (!next.ok()) return next.status();
        g.group_id = static_cast<std::uint32_t>(*next);
        // Compute every lane's start before writing anything (no partial op).
        std::vector<std::uint64_t> starts(topic.lanes);
        for (std::uint32_t lane = 0; lane < topic.lanes; ++lane) {
          auto ls = ctx.lane(topic.id, lane);
          if (!ls.ok()) return ls.status();
          auto o = start_offset(*ctx.txn, dbi_log_, topic.id, lane, **ls, start);
          if (!o.ok()) return ctx.fail(o.status());
          starts[lane] = *o;
        }
        std::string rec(16, '\0');
        put_le32(rec.data(), 1);
        put_le32(rec.data() + 4, g.group_id);
        put_le64(rec.data() + 8, static_cast<std::uint64_t>(ctx.now_ns));
        Status ps = ctx.put_meta_u64("next_group_id", *next + 1);
        if (ps.ok()) ps = ctx.put(dbi_groups_, gk, rec);
        for (std::uint32_t lane = 0; ps.ok() && lane < topic.lanes; ++lane) {
          ps = ctx.put_cursor(topic.id, g.group_id, lane, CursorRec{starts[lane], 0});
        }
        return ps;
      },
      true);
  if (!s.ok()) return s;
  return g;
}

Result<GroupRef> DurableStore::find_group(const TopicRef& topic, std::string_view name) {
  Status s = check_name(name, "group");
  if (!s.ok()) return s;
  std::shared_lock<std::shared_mutex> life(life_mutex_);
  if (!(s = check_open()).ok()) return s;
  auto txn = env_->begin_read();
  if (!txn.ok()) return txn.status();
  auto v = txn->get(dbi_groups_, group_key(topic.id, name));
  if (!v.ok()) {
    if (v.code() == Code::NotFound) return Status(Code::NotFound, "group " + quoted(name) + " of " + quoted(topic.name) + " not found");
    return v.status();
  }
  if (v->size() < 8) return Status(Code::Corruption, "group " + quoted(name) + ": stored record is malformed");
  return GroupRef{topic.id, get_le32(v->data() + 4), topic.lanes, std::string(name)};
}

Result<std::vector<GroupRef>> DurableStore::list_groups(const TopicRef& topic) {
  std::shared_lock<std::shared_mutex> life(life_mutex_);
  Status s = check_open();
  if (!s.ok()) return s;
  auto txn = env_->begin_read();
  if (!txn.ok()) return txn.status();
  auto c = LmdbCursor::open(*txn, dbi_groups_, options_.directory);
  if (!c.ok()) return c.status();
  std::string prefix = group_key(topic.id, "");
  std::vector<GroupRef> out;
  auto r = c->seek(prefix);
  while (r.ok() && *r) {
    auto k = c->key();
    if (k.size() < 4 || k.substr(0, 4) != prefix) break;
    if (c->value().size() < 8) return Status(Code::Corruption, "group record is malformed");
    out.push_back(GroupRef{topic.id, get_le32(c->value().data() + 4), topic.lanes, std::string(k.substr(4))});
    r = c->next();
  }
  if (!r.ok()) return r.status();
  return out;
}

Result<std::vector<GroupLaneInfo>> DurableStore::group_info(const GroupRef& group) {
  std::shared_lock<std::shared_mutex> life(life_mutex_);
  Status s = check_open();
  if (!s.ok()) return s;
  auto txn = env_->begin_read();
  if (!txn.ok()) return txn.status();
  std::vector<GroupLaneInfo> out(group.lanes);
  const std::int64_t now = wall_now_ns();
  auto c = LmdbCursor::open(*txn, dbi_inflight_, options_.directory);
  if (!c.ok()) return c.status();
  for (std::uint32_t lane = 0; lane < group.lanes; ++lane) {
    auto v = txn->get(dbi_cursors_, cursor_key(group.topic_id, group.group_id, lane).sv());
    if (v.ok() && v->size() == 16) {
      out[lane].committed = get_le64(v->data());
      out[lane].skipped = get_le64(v->data() + 8);
    } else if (!v.ok() && v.code() != Code::NotFound) {
      return v.status();
    }
    Key prefix = cursor_key(group.topic_id, group.group_id, lane);
    auto r = c->seek(prefix.sv());
    while (r.ok() && *r && c->key().size() == 20 && c->key().substr(0, 12) == prefix.sv()) {
      if (c->value().size() == 24 && get_le32(c->value().data() + 4) == kInflightClaimed) {
        ++out[lane].in_flight;
        if (static_cast<std::int64_t>(get_le64(c->value().data() + 8)) <= now) ++out[lane].overdue;
      }
      r = c->next();
    }
    if (!r.ok()) return r.status();
  }
  return out;
}

Status DurableStore::commit_offset_async(const GroupRef& group, std::uint32_t lane, std::uint64_t offset,
                                         StatusCallback done) {
  Status s = check_writable();
  if (!s.ok()) return s;
  if (lane >= group.lanes) {
    return Status(Code::InvalidArgument, "commit offset of group " + quoted(group.name) + ": lane out of range");
  }
  WriteOp op;
  op.bookkeeping = true;
  op.done = std::move(done);
  op.apply = [this, group, lane, offset](WriteCtx& ctx) -> Status {
    return commit_offset_in(ctx, group, lane, offset);
  };
  return enqueue(std::move(op), true);
}

Status DurableStore::commit_offset_in(WriteCtx& ctx, const GroupRef& group, std::uint32_t lane,
                                      std::uint64_t offset) {
  if (lane >= group.lanes) {
    return Status(Code::InvalidArgument, "commit offset of group " + quoted(group.name) + ": lane out of range");
  }
  auto ls = ctx.lane(group.topic_id, lane);
  if (!ls.ok()) return ls.status();
  if (offset > (*ls)->next) {
    return Status(Code::InvalidArgument, "commit offset " + std::to_string(offset) + " of group " + quoted(group.name) +
                                             " lane " + std::to_string(lane) + ": beyond the end (" +
                                             std::to_string((*ls)->next) + ")");
  }
  auto c = ctx.cursor(group.topic_id, group.group_id, lane);
  if (!c.ok()) return c.status();
  CursorRec rec = *c;
  rec.committed = offset;
  return ctx.put_cursor(group.topic_id, group.group_id, lane, rec);
}

Status DurableStore::commit_offset(const GroupRef& group, std::uint32_t lane, std::uint64_t offset) {
  if (std::this_thread::get_id() == writer_id_) {
    return Status(Code::Busy, "blocking commit_offset from a completion callback (writer thread)");
  }
  Waiter w;
  Status s = commit_offset_async(group, lane, offset, [&w](const Status& st) { w.finish(st, {}); });
  if (!s.ok()) return s;
  w.wait();
  return w.status;
}

Status DurableStore::seek(const GroupRef& group, const StartPosition& start) {
  auto topic = topic_by_id(group.topic_id);
  if (!topic.ok()) return topic.status();
  return run_write(
      [&](WriteCtx& ctx) -> Status {
        std::vector<std::uint64_t> starts(group.lanes);
        for (std::uint32_t lane = 0; lane < group.lanes; ++lane) {
          auto ls = ctx.lane(group.topic_id, lane);
          if (!ls.ok()) return ls.status();
          auto o = start_offset(*ctx.txn, dbi_log_, group.topic_id, lane, **ls, start);
          if (!o.ok()) return ctx.fail(o.status());
          starts[lane] = *o;
        }
        for (std::uint32_t lane = 0; lane < group.lanes; ++lane) {
          auto c = ctx.cursor(group.topic_id, group.group_id, lane);
          if (!c.ok()) return c.status();
          CursorRec rec = *c;
          rec.committed = starts[lane];
          Status ps = ctx.put_cursor(group.topic_id, group.group_id, lane, rec);
          if (ps.ok() && topic->is_queue) ps = ctx.drop_inflight_below(group.topic_id, group.group_id, lane, ~0ull);
          if (!ps.ok()) return ps;
        }
        return Status();
      },
      true);
}

// ======================================================================
// queues

Status DurableStore::claim_in(WriteCtx& ctx, const TopicRef& topic, const GroupRef& group, std::uint32_t lane,
                              const ClaimOptions& options, std::uint32_t max, std::vector<ClaimedMessage>* out) {
  out->clear();
  auto ls = ctx.lane(group.topic_id, lane);
  if (!ls.ok()) return ls.status();
  auto cur = ctx.cursor(group.topic_id, group.group_id, lane);
  if (!cur.ok()) return cur.status();
  CursorRec rec = *cur;
  bool cursor_dirty = false;
  if (rec.committed < (*ls)->first) {
    // Retention deleted messages this group never acked: skip and count.
    rec.skipped += (*ls)->first - rec.committed;
    Status ds = ctx.drop_inflight_below(group.topic_id, group.group_id, lane, (*ls)->first);
    if (!ds.ok()) return ds;
    rec.committed = (*ls)->first;
    cursor_dirty = true;
  }
  const std::int64_t visibility_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(options.visibility).count();
  std::uint64_t end = std::min<std::uint64_t>((*ls)->next, rec.committed + options.scan_limit);
  for (std::uint64_t o = rec.committed; o < end && out->size() < max; ++o) {
    Key ik = inflight_key(group.topic_id, group.group_id, lane, o);
    auto inf = ctx.inflight(ik);
    if (!inf.ok()) return inf.status();
    InflightRec claim;
    if (!inf->has_value()) {
      claim.attempt = 1;
      claim.first_claim_ns = ctx.now_ns;
    } else if ((*inf)->state == kInflightAcked) {
      if (o == rec.committed) {  // acked out of order earlier: advance past it
        Status ds = ctx.del(dbi_inflight_, ik.sv());
        if (!ds.ok() && ds.code() != Code::NotFound) return ds;
        rec.committed = o + 1;
        cursor_dirty = true;
      }
      continue;
    } else if ((*inf)->deadline_ns > ctx.now_ns) {
      if (options.ordered) break;  // the lane's head is in flight
      continue;
    } else {
      // A redelivery (its claim expired, or it was given back). Ordered
      // claims take it alone: if the process dies with it, only this message
      // is charged a crash (poison detection), not a whole batch.
      if (options.ordered && !out->empty()) break;
      claim = **inf;
      claim.attempt += 1;
    }
    claim.state = kInflightClaimed;
    claim.deadline_ns = ctx.now_ns + visibility_ns;
    auto v = ctx.get(dbi_log_, log_key(group.topic_id, lane, o).sv());
    if (!v.ok()) {
      if (v.code() == Code::NotFound) {
        return Status(Code::Corruption, "claim from " + quoted(topic.name) + ": offset " + std::to_string(o) +
                                            " is missing from the log");
      }
      return v.status();
    }
    ClaimedMessage cm;
    Status ds = decode_record(*v, topic.name, lane, o, &cm.message);
    if (!ds.ok()) {
      if (out->empty() && !cursor_dirty) return ds;  // nothing written yet for this op
      break;  // hand out what was claimed; the damaged record fails the next claim
    }
    Status ps = ctx.put_inflight(ik, claim);
    if (!ps.ok()) return ps;
    cm.attempt = claim.attempt;
    cm.deadline_ns = claim.deadline_ns;
    cm.message.header.attempt = claim.attempt;
    ctx.claims += 1;
    if (claim.attempt > 1) ctx.redeliveries += 1;
    const bool redelivery = claim.attempt > 1;
    out->push_back(std::move(cm));
    if (redelivery && options.ordered) break;
  }
  if (cursor_dirty) return ctx.put_cursor(group.topic_id, group.group_id, lane, rec);
  return Status();
}

Result<std::optional<ClaimedMessage>> DurableStore::claim(const GroupRef& group, std::uint32_t lane,
                                                          const ClaimOptions& options) {
  auto r = claim_batch(group, lane, 1, options);
  if (!r.ok()) return r.status();
  std::optional<ClaimedMessage> out;
  if (!r->empty()) out = std::move(r->front());
  return out;
}

Result<std::vector<ClaimedMessage>> DurableStore::claim_batch(const GroupRef& group, std::uint32_t lane,
                                                              std::uint32_t max, const ClaimOptions& options) {
  if (lane >= group.lanes) return Status(Code::InvalidArgument, "claim from group " + quoted(group.name) + ": lane out of range");
  if (max == 0) return Status(Code::InvalidArgument, "claim from group " + quoted(group.name) + ": max must be at least 1");
  auto topic = topic_by_id(group.topic_id);
  if (!topic.ok()) return topic.status();
  std::vector<ClaimedMessage> out;
  Status s = run_write([&](WriteCtx& ctx) -> Status { return claim_in(ctx, *topic, group, lane, options, max, &out); },
                       true);
  if (!s.ok()) return s;
  return out;
}

Status DurableStore::write_async(std::function<Status(StoreTxn&)> fn, StatusCallback done) {
  Status s = check_writable();
  if (!s.ok()) return s;
  WriteOp op;
  op.done = std::move(done);
  op.apply = [this, fn = std::move(fn)](WriteCtx& ctx) -> Status {
    StoreTxn t(this, &ctx, ctx.txn, ctx.now_ns);
    return fn(t);
  };
  return enqueue(std::move(op), true);
}

Status DurableStore::release_in(WriteCtx& ctx, const GroupRef& group, std::uint32_t lane, std::uint64_t offset,
                                std::uint32_t attempt, std::int64_t deadline_ns, bool undo_attempt) {
  if (lane >= group.lanes) return Status(Code::InvalidArgument, "release in group " + quoted(group.name) + ": lane out of range");
  Key ik = inflight_key(group.topic_id, group.group_id, lane, offset);
  auto inf = ctx.inflight(ik);
  if (!inf.ok()) return inf.status();
  if (!inf->has_value() || (*inf)->state != kInflightClaimed) {
    return Status(Code::NotFound, "release of offset " + std::to_string(offset) + " in group " + quoted(group.name) +
                                      ": not in flight");
  }
  if ((*inf)->attempt != attempt) {
    return Status(Code::StaleToken, "release of offset " + std::to_string(offset) + " attempt " +
                                        std::to_string(attempt) + ": the message was redelivered (current attempt " +
                                        std::to_string((*inf)->attempt) + ")");
  }
  InflightRec r = **inf;
  if (undo_attempt) {
    if (r.attempt <= 1) {
      // Never handed out before this claim: back to "never claimed".
      Status ds = ctx.del(dbi_inflight_, ik.sv());
      return (ds.ok() || ds.code() == Code::NotFound) ? Status() : ds;
    }
    r.attempt -= 1;
  }
  r.deadline_ns = deadline_ns;
  return ctx.put_inflight(ik, r);
}

Status DurableStore::ack_in(WriteCtx& ctx, const GroupRef& group, std::uint32_t lane, std::uint64_t offset,
                            std::uint32_t attempt) {
  if (lane >= group.lanes) return Status(Code::InvalidArgument, "ack in group " + quoted(group.name) + ": lane out of range");

  Key ik = inflight_key(group.topic_id, group.group_id, lane, offset);
  auto inf = ctx.inflight(ik);
  if (!inf.ok()) return inf.status();
  if (!inf->has_value() || (*inf)->state != kInflightClaimed) {
    return Status(Code::NotFound, "ack of offset " + std::to_string(offset) + " in group " + quoted(group.name) +
                                      " lane " + std::to_string(lane) + ": not in flight (already acked or never claimed)");
  }
  if ((*inf)->attempt != attempt) {
    return Status(Code::StaleToken, "ack of offset " + std::to_string(offset) + " attempt " +
                                        std::to_string(attempt) + " in group " + quoted(group.name) +
                                        ": the message was redelivered (current attempt " +
                                        std::to_string((*inf)->attempt) + ")");
  }
  auto cur = ctx.cursor(group.topic_id, group.group_id, lane);
  if (!cur.ok()) return cur.status();
  CursorRec rec = *cur;
  ctx.acks += 1;
  if (offset != rec.committed) {  // out of order (unordered claims): mark, advance later
    InflightRec r = **inf;
    r.state = kInflightAcked;
    return ctx.put_inflight(ik, r);
  }
  Status ds = ctx.del(dbi_inflight_, ik.sv());
  if (!ds.ok() && ds.code() != Code::NotFound) return ds;
  rec.committed = offset + 1;
  // Advance past messages acked earlier out of order.
  for (;;) {
    Key nk = inflight_key(group.topic_id, group.group_id, lane, rec.committed);
    auto n = ctx.inflight(nk);
    if (!n.ok()) return n.status();
    if (!n->has_value() || (*n)->state != kInflightAcked) break;
    ds = ctx.del(dbi_inflight_, nk.sv());
    if (!ds.ok() && ds.code() != Code::NotFound) return ds;
    rec.committed += 1;
  }
  return ctx.put_cursor(group.topic_id, group.group_id, lane, rec);
}

Status DurableStore::ack(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt) {
  if (lane >= group.lanes) return Status(Code::InvalidArgument, "ack in group " + quoted(group.name) + ": lane out of range");
  return run_write([&](WriteCtx& ctx) -> Status { return ack_in(ctx, group, lane, offset, attempt); }, true);
}

Status DurableStore::release(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt,
                             std::chrono::milliseconds delay) {
  if (lane >= group.lanes) return Status(Code::InvalidArgument, "release in group " + quoted(group.name) + ": lane out of range");
  return run_write(
      [&](WriteCtx& ctx) -> Status {
        return release_in(ctx, group, lane, offset, attempt,
                          ctx.now_ns + std::chrono::duration_cast<std::chrono::nanoseconds>(delay).count(), false);
      },
      true);
}

// ======================================================================
// retention and maintenance

Status DurableStore::apply_retention(WriteCtx& ctx, std::uint32_t budget, bool* more) {
  *more = false;
  std::vector<TopicRef> topics;
  {
    auto c = LmdbCursor::open(*ctx.txn, dbi_topics_, options_.directory);
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
          auto v = ctx.get(dbi_log_, k.sv());
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
        Status ds = ctx.del(dbi_log_, k.sv());
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

Status DurableStore::run_retention() {
  for (;;) {
    bool more = false;
    Status s = run_write([&](WriteCtx& ctx) { return apply_retention(ctx, options_.retention_batch, &more); }, true);
    if (!s.ok()) return s;
    if (!more) return Status();
  }
}

Status DurableStore::sync() {
  std::shared_lock<std::shared_mutex> life(life_mutex_);
  Status s = check_writable();
  if (!s.ok()) return s;
  if (options_.durability == Durability::Sync) return Status();
  s = env_->sync();
  if (s.ok()) counters_.fsyncs.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistic
  return s;
}

}  // namespace lanebus::detail
