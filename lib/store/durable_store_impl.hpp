// lanebus — MIT License.
// The durable store's private internals, shared by its files in lib/store/
// (durable_*.cpp, store_codec.cpp, store_txn.cpp): key layout, record structs
// and codecs, the state of one write transaction, the waiter of a blocking
// call. Include it only from those files.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "claim_ahead.hpp"
#include "coding.hpp"
#include "durable_store.hpp"
#include "wall_clock.hpp"  // WallClock::realtime_ns: the clock of claim deadlines and timestamps

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
//
// Where each concern lives (each part is an object with its own state; the
// DurableStore holds them and forwards its public calls):
//   durable_store.cpp      DurableStore: open (layout, tables), close, counters,
//                          health, sync, the extension calls (write/read)
//   durable_writer.cpp     StoreWriter: the queue, the writer thread, group commit
//   durable_topics.cpp     TopicLog: the topic catalogue and appends
//   durable_reads.cpp      TopicLog: reads, lane bounds, seek by time
//   durable_groups.cpp     GroupOffsets: consumer groups and their offsets
//   durable_queues.cpp     QueueClaims: queue claims, acks and releases
//   durable_retention.cpp  LogRetention: retention in bounded batches
//   store_codec.cpp        the record codecs (doc/storage-format.md)
//   store_txn.cpp          StoreTxn

namespace lanebus::detail {

constexpr char kLayoutMagic[8] = {'L', 'A', 'N', 'E', 'B', 'U', 'S', '\0'};
constexpr std::size_t kRecordHeader = 64;  // fixed part before key/idem/payload
constexpr std::size_t kRecordOverhead = kRecordHeader + 4;  // + crc32c trailer
// A record batch (doc/storage-format.md): one `log` value holding the records
// of consecutive offsets of one lane, keyed by the first one's offset. The
// writer packs a lane's appends of one transaction into batches of at most
// kBatchValueMax bytes; a lone record, or one too large for a batch, is
// stored alone as in layout 1. A batch larger than LMDB's node limit (about
// 2 KB with 4 KiB pages) lives on overflow pages: contiguous, filled to the
// end, read in one cursor step. kBatchValueMax is four 4 KiB pages less
// LMDB's 16-byte page header, so a full batch takes four pages, not five.
constexpr char kBatchFormat = 16;
constexpr std::size_t kBatchHeader = 8;  // u8 format 16, u8 0, le16 count, le32 0
constexpr std::size_t kBatchValueMax = 4 * 4096 - 16;
// The size of the stored record at p (format 1-3) from its length fields; 0
// when fewer than `avail` bytes cannot hold it or its format is unknown.
std::size_t stored_record_size(const char* p, std::size_t avail);
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
inline Key lane_key(std::uint32_t tid, std::uint32_t lane) {
  Key k;
  put_be32(k.b, tid);
  put_be32(k.b + 4, lane);
  k.n = 8;
  return k;
}
inline Key log_key(std::uint32_t tid, std::uint32_t lane, std::uint64_t off) {
  Key k = lane_key(tid, lane);
  put_be64(k.b + 8, off);
  k.n = 16;
  return k;
}
inline Key cursor_key(std::uint32_t tid, std::uint32_t gid, std::uint32_t lane) {
  Key k;
  put_be32(k.b, tid);
  put_be32(k.b + 4, gid);
  put_be32(k.b + 8, lane);
  k.n = 12;
  return k;
}
inline Key inflight_key(std::uint32_t tid, std::uint32_t gid, std::uint32_t lane, std::uint64_t off) {
  Key k = cursor_key(tid, gid, lane);
  put_be64(k.b + 12, off);
  k.n = 20;
  return k;
}
inline std::string group_key(std::uint32_t tid, std::string_view name) {
  std::string k(4, '\0');
  put_be32(k.data(), tid);
  k.append(name);
  return k;
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
void encode_lane(const LaneState& s, char* p);
bool decode_lane(std::string_view v, LaneState* s);

// ---- topic record (store_codec.cpp) ----
std::string encode_topic(const TopicRef& t, std::int64_t created_ns);
bool decode_topic(std::string_view name, std::string_view v, TopicRef* t);

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

// ---- log record (store_codec.cpp; see doc/storage-format.md) ----
std::size_t record_size(const AppendRequest& r);
void encode_record(char* p, std::size_t size, const AppendRequest& r, const MessageHeader& h,
                   std::int64_t index_ts);
Status decode_record(std::string_view v, std::string_view topic, std::uint32_t lane, std::uint64_t off,
                     StoredMessage* m);
// As decode_record, with views into `v` instead of copies.
Status decode_record_in_place(std::string_view v, std::string_view topic, std::uint32_t lane, std::uint64_t off,
                              MessageRef* m);

// ---- lane bounds and the time index (durable_reads.cpp) ----
// The first offset in [ls.first, ls.next) whose index timestamp is >= ts:
// binary search (offsets are contiguous and index timestamps monotonic).
Result<std::uint64_t> search_time(LmdbTxn& txn, LmdbDbi log, std::uint32_t tid, std::uint32_t lane,
                                  const LaneState& ls, std::int64_t ts);
Result<LaneState> read_lane(LmdbTxn& txn, LmdbDbi dbi, std::uint32_t tid, std::uint32_t lane);

// One lane's log, read record by record whether its records are stored alone
// or in batches (durable_reads.cpp). The views are into LMDB's pages: valid
// until the transaction writes to the log or ends.
class LaneLog {
 public:
  LaneLog(LmdbTxn& txn, LmdbDbi log, std::uint32_t tid, std::uint32_t lane, std::string_view topic)
      : txn_(txn), log_(log), tid_(tid), lane_(lane), topic_(topic) {}
  /// Position on the record of offset `off`: false when the lane's log has none.
  Result<bool> seek(std::uint64_t off);
  /// The next offset's record: false at the lane's end (or a gap: the caller
  /// compares offset() with what it expects).
  Result<bool> next();
  std::uint64_t offset() const noexcept { return off_; }
  std::string_view record() const noexcept { return rec_; }
  /// The `log` key and value holding the current record, and the offsets it holds.
  std::uint64_t value_first() const noexcept { return first_; }
  std::uint32_t value_count() const noexcept { return count_; }
  std::string_view value() const noexcept { return value_; }

 private:
  Status load();  // the cursor's current value: first_, count_, value_, the first record
  Status step_in_value();
  Status bad(std::uint64_t off, const char* why) const;
  LmdbTxn& txn_;
  LmdbDbi log_;
  std::uint32_t tid_, lane_;
  std::string_view topic_;
  std::optional<LmdbCursor> c_;
  std::string_view value_, rec_;
  std::uint64_t first_ = 0, off_ = 0;
  std::uint32_t count_ = 0;
  std::size_t pos_ = 0;  // the current record's position in value_
};

// ======================================================================
// WriteCtx: the state of one write transaction of the writer thread.

struct DurableStore::WriteCtx {
  DurableStore* store;
  LmdbTxn* txn;
  std::int64_t now_ns;
  // Any LMDB failure through ctx makes the whole transaction unusable (LMDB
  // may have marked it failed): the batch is aborted.
  Status dead{};
  std::map<std::uint64_t, LaneState> lanes{};  // loaded lane states
  std::map<std::uint64_t, bool> dirty{};       // key -> got appends
  bool ids_loaded = false;
  std::uint64_t id_next = 0;
  bool ids_dirty = false;
  std::uint64_t retention_deleted = 0;
  std::uint64_t claims = 0, redeliveries = 0, acks = 0, claims_passed = 0;
  std::vector<ClaimAhead*> ahead_requests{};  // QueueClaims::request: claim for these at the batch's end
  // A cursor on the log per lane appended to in this batch (the first
  // kLogCursors lanes; later ones use mdb_put). A lane's next record sorts
  // right after its last, so LMDB finds its page from the cursor's page
  // (mdb_cursor_set) instead of a descent from the root with a key compare
  // on every level. LMDB frees a write transaction's cursors at its end:
  // close_log_cursors() must run before the commit or abort.
  static constexpr std::size_t kLogCursors = 16;
  std::uint64_t log_cursor_lane[kLogCursors] = {};
  std::optional<LmdbCursor> log_cursor[kLogCursors]{};
  std::size_t log_cursors = 0;
  // Appends of the writer's own append ops are staged here per lane and
  // written as record batches (kBatchFormat) by flush_log_batches(), which
  // runs before every other kind of op and before the commit, so that no
  // read of the log in this transaction misses a staged record.
  struct LogBatch {
    std::uint64_t lane = 0;   // lk(tid, lane)
    std::uint64_t first = 0;  // offset of the first staged record
    std::uint32_t count = 0;
    std::size_t used = 0;                // bytes of buf in use: kBatchHeader, then the records
    std::unique_ptr<char[]> buf;         // kBatchValueMax bytes, allocated at the slot's first use
  };
  LogBatch staged[kLogCursors]{};
  std::size_t staged_lanes = 0;
  bool stage_appends = false;  // set by the writer around its own append ops

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
  /// LmdbTxn::reserve_new: Conflict (the key is taken) leaves the batch alive.
  Result<char*> reserve_new(LmdbDbi dbi, std::string_view key, std::size_t size, bool append) {
    auto r = txn->reserve_new(dbi, key, size, append);
    if (!r.ok() && r.code() != Code::Conflict) (void)fail(r.status());
    return r;
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
  // apply_append's lane lookup without the maps: a direct-mapped cache of
  // the lanes appended to (std::map nodes do not move while the transaction
  // lives; `lanes` and `dirty` only grow).
  struct LaneHit {
    std::uint64_t k = ~0ull;
    LaneState* state = nullptr;
    bool marked = false;  // dirty[k] says appended
  };
  LaneHit lane_hits[16]{};
  Result<LaneHit*> append_lane(std::uint32_t tid, std::uint32_t lane_no) {
    const std::uint64_t k = lk(tid, lane_no);
    LaneHit& h = lane_hits[(lane_no ^ (tid << 3)) & 15];
    if (h.k == k) return &h;
    auto s = lane(tid, lane_no);
    if (!s.ok()) return s.status();
    h = LaneHit{k, *s, false};
    return &h;
  }
  void mark_appended(LaneHit& h) {
    if (h.marked) return;
    dirty[h.k] = true;
    h.marked = true;
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
  /// Reserve a log record of lane (tid, lane_no) under `key` (LmdbTxn::reserve).
  Result<char*> reserve_log(std::uint32_t tid, std::uint32_t lane_no, std::string_view key, std::size_t size) {
    const std::uint64_t k = lk(tid, lane_no);
    std::size_t i = 0;
    while (i < log_cursors && log_cursor_lane[i] != k) ++i;
    if (i == log_cursors && log_cursors < kLogCursors) {
      auto c = LmdbCursor::open(*txn, store->dbi_log_, store->options_.directory);
      if (!c.ok()) return fail(c.status());
      log_cursor[i].emplace(std::move(*c));
      log_cursor_lane[i] = k;
      ++log_cursors;
    }
    auto r = i < log_cursors ? log_cursor[i]->reserve(key, size) : txn->reserve(store->dbi_log_, key, size);
    if (!r.ok()) (void)fail(r.status());
    return r;
  }
  /// Stage a record of `size` bytes at offset `off` of lane (tid, lane_no):
  /// returns where to encode it, or nullptr when it must be written alone
  /// (reserve_log) because it is too large or every staging slot is taken.
  Result<char*> stage_log(std::uint32_t tid, std::uint32_t lane_no, std::uint64_t off, std::size_t size) {
    if (size + kBatchHeader > kBatchValueMax) {
      if (Status s = write_staged(lk(tid, lane_no)); !s.ok()) return s;
      return nullptr;
    }
    const std::uint64_t k = lk(tid, lane_no);
    std::size_t i = 0;
    while (i < staged_lanes && staged[i].lane != k) ++i;
    if (i == staged_lanes) {
      if (staged_lanes == kLogCursors) return nullptr;
      ++staged_lanes;
      staged[i].lane = k;
      staged[i].count = 0;
    }
    LogBatch& b = staged[i];
    if (b.count > 0 && b.used + size > kBatchValueMax) {
      if (Status s = write_batch(b); !s.ok()) return s;
    }
    if (b.count == 0) {
      if (!b.buf) b.buf = std::make_unique_for_overwrite<char[]>(kBatchValueMax);
      b.first = off;
      std::memset(b.buf.get(), 0, kBatchHeader);
      b.used = kBatchHeader;
    }
    b.count += 1;
    char* at = b.buf.get() + b.used;
    b.used += size;
    return at;
  }
  /// Write every staged batch to the log (before any other op reads it).
  Status flush_log_batches() {
    for (std::size_t i = 0; i < staged_lanes; ++i) {
      if (Status s = write_batch(staged[i]); !s.ok()) return s;
    }
    staged_lanes = 0;
    return Status();
  }
  Status write_staged(std::uint64_t k) {
    for (std::size_t i = 0; i < staged_lanes; ++i) {
      if (staged[i].lane == k) return write_batch(staged[i]);
    }
    return Status();
  }
  Status write_batch(LogBatch& b) {
    if (b.count == 0) return Status();
    const auto tid = static_cast<std::uint32_t>(b.lane >> 32);
    const auto lane_no = static_cast<std::uint32_t>(b.lane);
    // A lone record is stored as it is, without the batch header.
    const std::size_t skip = b.count == 1 ? kBatchHeader : 0;
    auto p = reserve_log(tid, lane_no, log_key(tid, lane_no, b.first).sv(), b.used - skip);
    if (!p.ok()) return p.status();
    if (b.count > 1) {
      b.buf[0] = kBatchFormat;
      put_le16(b.buf.get() + 2, static_cast<std::uint16_t>(b.count));
    }
    std::memcpy(*p, b.buf.get() + skip, b.used - skip);
    b.count = 0;
    return Status();
  }
  void close_log_cursors() noexcept {
    for (std::size_t i = 0; i < log_cursors; ++i) log_cursor[i].reset();
    log_cursors = 0;
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
// The store's parts. Each holds the store (`s_`: the environment, its
// tables, the counters, the fences) and owns the state of its own concern;
// DurableStore's public methods forward to them.

/// What every part holds: the store, and the names of its write operation,
/// write transaction and blocking-call waiter.
class StorePart {
 public:
  using WriteOp = DurableStore::WriteOp;
  using WriteCtx = DurableStore::WriteCtx;
  using Waiter = DurableStore::Waiter;
  StorePart(const StorePart&) = delete;
  StorePart& operator=(const StorePart&) = delete;

 protected:
  explicit StorePart(DurableStore& s) noexcept : s_(s) {}
  ~StorePart() = default;
  DurableStore& s_;
};

/// The write queue, the writer thread and group commit (durable_writer.cpp).
class StoreWriter : public StorePart {
 public:
  explicit StoreWriter(DurableStore& s) : StorePart(s) {}
  void start();  // the writer thread (not for a read-only store)
  /// Refuse new operations, let the writer commit what is queued and run its
  /// completions, and join it. Idempotent.
  void stop() EXCLUDES(queue_mutex_);
  bool on_writer_thread() const noexcept { return std::this_thread::get_id() == thread_id_; }
  bool running() const noexcept { return thread_.joinable(); }
  Status enqueue(WriteOp&& op, bool may_block) EXCLUDES(queue_mutex_);  // moved from only when queued
  // Queue `ops` in order, blocking while max_pending operations are queued;
  // returns how many were queued (all, unless the store is closing: *status).
  std::size_t enqueue_all(std::span<WriteOp> ops, Status* status) EXCLUDES(queue_mutex_);
  // Runs `apply` inside a write transaction of the writer and waits.
  Status run_write(std::function<Status(WriteCtx&)> apply, bool bookkeeping);
  void set_listener(std::function<void(std::uint32_t, std::uint32_t, std::uint64_t)> listener)
      EXCLUDES(queue_mutex_);

 private:
  void writer_main();
  void process_batch(std::vector<WriteOp>& ops);
  void count_commit(const std::vector<WriteOp>& ops, const WriteCtx& ctx, std::size_t applied,
                    std::chrono::steady_clock::duration build, std::chrono::steady_clock::duration call);
  void wake_other_processes(const std::vector<WriteOp>& batch) noexcept;  // commit_wake.hpp
  void complete(std::vector<WriteOp>& batch,
                const std::function<void(std::uint32_t, std::uint32_t, std::uint64_t)>& listener);
  Status apply_delayed(WriteCtx& ctx, WriteOp& op);

  Mutex queue_mutex_;
  std::condition_variable_any queue_cv_;  // writer waits for work
  std::condition_variable_any space_cv_;  // producers wait for room
  std::vector<WriteOp> queue_ GUARDED_BY(queue_mutex_);  // swapped with the writer's batch
  bool stopping_ GUARDED_BY(queue_mutex_) = false;
  bool force_retention_ GUARDED_BY(queue_mutex_) = false;
  std::function<void(std::uint32_t, std::uint32_t, std::uint64_t)> listener_ GUARDED_BY(queue_mutex_);
  std::thread thread_;
  std::thread::id thread_id_;
};

/// The topic catalogue, appends and id reservation (durable_topics.cpp) and
/// the reads of the log (durable_reads.cpp).
class TopicLog : public StorePart {
 public:
  explicit TopicLog(DurableStore& s) : StorePart(s) {}
  Result<TopicRef> open_topic(std::string_view name, const TopicSpec& spec);
  Result<TopicRef> find_topic(std::string_view name);
  Result<std::vector<TopicRef>> list_topics();
  Result<AppendResult> append(AppendRequest request);
  Status append_async(AppendRequest request, AppendCallback done);
  DurableStore::AppendBatchResult append_batch(std::span<AppendRequest> requests);
  Result<std::uint64_t> reserve_ids(std::uint64_t count);
  Status apply_append(WriteCtx& ctx, WriteOp& op);  // the writer, inside its transaction
  Result<TopicRef> topic_by_id(std::uint32_t id) const EXCLUDES(topics_mutex_);

  Result<ReadBatch> read(const TopicRef& topic, std::uint32_t lane, std::uint64_t from, const ReadLimits& limits);
  Status read_into(const TopicRef& topic, std::uint32_t lane, std::uint64_t from, const ReadLimits& limits,
                   ReadBatch* out);
  Status read_in_place(const TopicRef& topic, std::uint32_t lane, std::uint64_t from, const ReadLimits& limits,
                       InPlaceBatch* out);
  Result<std::uint64_t> end_offset(const TopicRef& topic, std::uint32_t lane);
  Status end_offsets(const TopicRef& topic, std::uint64_t* ends);
  Result<LaneInfo> lane_info(const TopicRef& topic, std::uint32_t lane);
  Result<std::uint64_t> offset_for_time(const TopicRef& topic, std::uint32_t lane, std::int64_t ts_ns);

 private:
  // append_async's checks; fills *op (fenced topics: asks the lease table too).
  Status prepare_append(AppendRequest&& request, AppendCallback&& done, WriteOp* op);
  // The append hot path without copying the TopicRef: 1 = an open topic
  // without a fence, 2 = fenced, 0 = not open in this store. `lanes` is set
  // when open.
  int topic_kind(std::uint32_t id, std::uint32_t* lanes) const EXCLUDES(topics_mutex_);
  // Where a read of (topic, lane) from an offset starts and ends.
  struct LaneRange {
    std::uint64_t first = 0, next = 0, end = 0, skipped = 0;
  };
  // The records of read_into / read_in_place: from `from` on (retention's
  // skip counted), within `limits`, each passed to visit(record, offset),
  // whose error ends the walk with it.
  template <class Visit>
  Status walk_lane(LmdbTxn& txn, const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                   const ReadLimits& limits, LaneRange* range, Visit&& visit);
  void remember_topic(const TopicRef& t) EXCLUDES(topics_mutex_);

  mutable Mutex topics_mutex_;
  std::unordered_map<std::uint32_t, TopicRef> topics_ GUARDED_BY(topics_mutex_);  // opened or found here
  // topic_kind without the mutex (every append asks, from every publishing
  // thread): for ids below kKnownKinds, kind << 32 | lanes once looked up, 0
  // before. Entries of topics_ are only added and a topic's kind and lane
  // count never change, so a stored value stays true.
  static constexpr std::uint32_t kKnownKinds = 1024;
  mutable std::array<std::atomic<std::uint64_t>, kKnownKinds> known_kinds_{};
};

/// Consumer groups and their committed offsets (durable_groups.cpp).
class GroupOffsets : public StorePart {
 public:
  explicit GroupOffsets(DurableStore& s) : StorePart(s) {}
  Result<GroupRef> open_group(const TopicRef& topic, std::string_view name, StartPosition start);
  Result<GroupRef> find_group(const TopicRef& topic, std::string_view name);
  Result<std::vector<GroupRef>> list_groups(const TopicRef& topic);
  Result<std::vector<GroupLaneInfo>> group_info(const GroupRef& group);
  Status commit_offset(const GroupRef& group, std::uint32_t lane, std::uint64_t offset);
  Status commit_offset_async(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, StatusCallback done);
  Status commit_offset_in(WriteCtx& ctx, const GroupRef& group, std::uint32_t lane, std::uint64_t offset);
  Status seek(const GroupRef& group, const StartPosition& start);

};

/// Queue claims, acks and releases: the `inflight` table (durable_queues.cpp).
class QueueClaims : public StorePart {
 public:
  explicit QueueClaims(DurableStore& s) : StorePart(s) {}
  Result<std::optional<ClaimedMessage>> claim(const GroupRef& group, std::uint32_t lane, const ClaimOptions& options);
  Result<std::vector<ClaimedMessage>> claim_batch(const GroupRef& group, std::uint32_t lane, std::uint32_t max,
                                                  const ClaimOptions& options);
  Status ack(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt);
  Status release(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt,
                 std::chrono::milliseconds delay);
  // Inside a write transaction (the writer; StoreTxn for transactional consumers).
  Status claim_in(WriteCtx& ctx, const TopicRef& topic, const GroupRef& group, std::uint32_t lane,
                  const ClaimOptions& options, std::uint32_t max, std::vector<ClaimedMessage>* out,
                  ClaimAhead* box = nullptr);
  Status ack_in(WriteCtx& ctx, const GroupRef& group, std::uint32_t lane, std::uint64_t offset,
                std::uint32_t attempt);
  Status release_in(WriteCtx& ctx, const GroupRef& group, std::uint32_t lane, std::uint64_t offset,
                    std::uint32_t attempt, std::int64_t deadline_ns, bool undo_attempt);

  // Claims in the append's transaction (claim_ahead.hpp).
  void watch(ClaimAhead* box);
  void unwatch(ClaimAhead* box);  // waits for a batch that is claiming for it
  Status request(ClaimAhead* box);  // after box->request(): a claim in the next commit
  Status give_back(std::span<const ClaimedMessage> claims, const GroupRef& group, std::uint32_t lane);
  /// give_back queued to the writer, not waited for; `block`: wait while the
  /// queue is full (never on the writer thread).
  Status give_back_later(std::vector<ClaimedMessage> claims, const GroupRef& group, std::uint32_t lane, bool block);
  /// The writer, for one batch: locked only when some mailbox is watched
  /// (held until hand_over, across the commit, so unwatch waits for it).
  std::unique_lock<std::mutex> lock_ahead();
  /// The writer, inside the batch's transaction after its operations: claims
  /// for each armed mailbox of a lane the batch appended to. Under lock_ahead.
  void claim_ahead_in(WriteCtx& ctx);
  /// The writer, after the commit, before the completions and the listener:
  /// the claims go to their mailboxes (or back, for one that closed). With
  /// `committed` false (the batch aborted) they are dropped. Under lock_ahead.
  void hand_over(bool committed);
  /// The writer, after hand_over: the lanes whose consumer must look at its
  /// mailbox (topic id << 32 | lane -> an end offset for the append listener);
  /// nullptr: forgets them (no listener).
  void take_woken(std::map<std::uint64_t, std::uint64_t>* ends);

 private:
  struct AheadClaims {
    ClaimAhead* box = nullptr;
    std::uint64_t gen = 0;  // the mailbox's generation when claimed (offer())
    std::vector<ClaimedMessage> claims;
  };
  void give_back_async(const GroupRef& group, std::uint32_t lane, const std::vector<ClaimedMessage>& claims);

  std::mutex ahead_mu_;
  std::unordered_map<std::uint64_t, std::vector<ClaimAhead*>> ahead_;  // (topic id, lane) -> mailboxes
  std::atomic<std::size_t> ahead_count_{0};                             // mailboxes in ahead_
  std::vector<AheadClaims> ahead_pending_;                              // writer only, under ahead_mu_
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ahead_woken_;   // writer only
};

/// Retention by age, bytes and count, in bounded batches (durable_retention.cpp).
class LogRetention : public StorePart {
 public:
  explicit LogRetention(DurableStore& s) : StorePart(s) {}
  /// One bounded step inside the writer's transaction: at most `budget`
  /// messages deleted; *more when some are left.
  Status apply(WriteCtx& ctx, std::uint32_t budget, bool* more);
  /// Every step now (run_retention).
  Status run();

 private:
  Status trim_lane(WriteCtx& ctx, const TopicRef& t, std::uint32_t lane, LaneState& s, std::int64_t age_cut,
                   std::uint32_t* budget, bool* more);
};

}  // namespace lanebus::detail
