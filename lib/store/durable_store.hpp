// lanebus — MIT License.
// DurableStore: the durable engine (doc/durable.md) on LMDB — per-lane append-only
// logs, group commit by one writer thread, group offsets, queue in-flight state,
// retention, and reading for replay. Internal API for the Bus to plug in.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "log.hpp"
#include "lanebus/durable.hpp"
#include "lanebus/message.hpp"
#include "lanebus/status.hpp"
#include "commit_wake.hpp"
#include "fence_lane.hpp"
#include "lmdb_store.hpp"
#include "sync.hpp"

namespace lanebus::detail {

/// On-disk layout version written in the `meta` database. A store with a
/// larger number is refused with VersionTooNew. 2: the log may hold record
/// batches; a layout-1 store is raised to 2 when opened for writing.
inline constexpr std::uint32_t kLayoutVersion = 2;
/// The bytes of the layout record for `version` (magic "LANEBUS\0" + u32 LE):
/// exposed so tests can forge a record from the future.
std::string encode_layout_record(std::uint32_t version);

/// Topic or queue settings persisted with the topic.
struct TopicSpec {
  std::uint32_t lanes = 8;  ///< 1..4096; fixed at creation (another count = Conflict).
  bool is_queue = false;    ///< Queue (competing consumers) or topic (fan-out); fixed.
  RetentionOptions retention{};
  /// Fenced lanes (doc/leases.md "Fenced lanes and resources"): the
  /// lease name that fences appends, "" = not fenced. Fixed at creation
  /// (reopening with another fence or scope = Conflict). Every append then
  /// needs a header.fencing_token: below the high-water -> StaleToken; equal ->
  /// accepted (a repeated idempotency key in that generation is dropped and
  /// reported as AppendResult::duplicate); above -> a generation barrier,
  /// accepted only if the confirm hook (set_fence_confirm) says the lease table
  /// granted it for that lease, else FenceViolation.
  std::string fence{};
  /// false: one high-water for the whole topic, fenced by lease `fence`.
  /// true: lane i has its own high-water, fenced by lease "<fence>/slot-<i>"
  /// (LeaseTable::acquire_any_slot(fence, lanes, ...)).
  bool fence_per_lane = false;
};

/// A reference to an open durable topic: cheap to copy, valid while the store is open.
struct TopicRef {
  std::uint32_t id = 0;  ///< Store-wide id (0 = none).
  std::uint32_t lanes = 0;
  bool is_queue = false;
  std::string name;
  RetentionOptions retention;
  std::string fence;            ///< As TopicSpec::fence ("" = not fenced).
  bool fence_per_lane = false;  ///< As TopicSpec::fence_per_lane.
};

/// A consumer group of a topic (or the consumer set of a queue).
struct GroupRef {
  std::uint32_t topic_id = 0;
  std::uint32_t group_id = 0;
  std::uint32_t lanes = 0;
  std::string name;
};

/// One message to append. The store copies nothing else: the strings are moved
/// into the writer's queue.
struct AppendRequest {
  std::uint32_t topic_id = 0;
  std::uint32_t lane = 0;
  /// Stored unchanged, except: id 0 = assign a store-unique id (from a
  /// persisted high-water, unique across restarts and processes);
  /// created_at_ns 0 = the append time.
  MessageHeader header;
  std::string key;
  std::string idempotency_key;
  std::string payload;
  /// Delayed delivery and expiry (doc/delays.md), wall clock ns, 0 = none:
  /// stored in the record's extension block (doc/storage-format.md).
  std::int64_t due_ns = 0;
  std::int64_t expires_ns = 0;
  /// Message headers in their stored form (lanebus/message.hpp HeadersView;
  /// doc/tracing.md), empty = none: stored in the extension block of a
  /// format-3 record (doc/storage-format.md).
  std::string headers;
};

/// Where an appended message landed.
struct AppendResult {
  std::uint64_t offset = 0;
  std::uint64_t id = 0;
  /// Fenced topics only: true when the append was dropped because a message
  /// with the same idempotency key was already accepted in this lease
  /// generation (same token); offset and id are then the original's. The
  /// status is OK and nothing was written.
  bool duplicate = false;
};

/// Called once per append_async that returned OK, on the store's writer thread,
/// after the commit (Sync: after the fsync), with no lanebus lock and no LMDB
/// transaction held. It must be short and must not call blocking DurableStore
/// methods (they return Busy on the writer thread); *_async calls are allowed.
using AppendCallback = std::function<void(const Status&, const AppendResult&)>;
/// As AppendCallback, for offset commits and other writes without a result.
using StatusCallback = std::function<void(const Status&)>;

/// A message read back from the log. Owns its bytes.
struct StoredMessage {
  MessageHeader header;
  std::uint32_t lane = 0;
  std::uint64_t offset = 0;
  /// The lane's timestamp index at this message: max(created_at_ns of every
  /// message up to here). Monotonic per lane; seek-by-time and age retention use it.
  std::int64_t index_ts_ns = 0;
  std::string key;
  std::string idempotency_key;
  std::string payload;
  /// From the record's extension block (format 2), else 0: its due time and
  /// expiry (doc/delays.md), wall clock ns.
  std::int64_t due_ns = 0;
  std::int64_t expires_ns = 0;
  /// From a format-3 record's extension block, else empty: the message
  /// headers in their stored form (checked at decode; HeadersView).
  std::string headers;
};

/// Limits of one read call.
struct ReadLimits {
  std::uint32_t max_messages = 256;
  std::uint64_t max_bytes = 4ull << 20;  ///< At least one message is returned if any exists.
};

/// The result of read(): messages from `first_offset` on, contiguous.
struct ReadBatch {
  std::vector<StoredMessage> messages;
  std::uint64_t first_offset = 0;  ///< Where reading started (>= the requested offset).
  std::uint64_t next_offset = 0;   ///< Pass this to the next read.
  std::uint64_t end_offset = 0;    ///< The lane's end at the time of the read.
  /// Messages between the requested offset and the earliest retained one,
  /// deleted by retention before they were read (also added to
  /// StoreCounters::skipped_by_retention).
  std::uint64_t skipped = 0;
  /// read_into's reserve: message storage kept between reads (not results).
  std::vector<StoredMessage> spare;
};

/// A message read in place (DurableStore::read_in_place): its key, payload
/// and headers are views into LMDB's mapped pages, valid while the
/// InPlaceBatch that holds it keeps its read. Checked like StoredMessage
/// (its checksum, once, when it was read).
struct MessageRef {
  MessageHeader header;
  std::uint32_t lane = 0;
  std::uint64_t offset = 0;
  std::int64_t index_ts_ns = 0;  ///< As StoredMessage::index_ts_ns.
  std::string_view key;
  std::string_view idempotency_key;
  std::string_view payload;
  std::int64_t due_ns = 0;
  std::int64_t expires_ns = 0;
  std::string_view headers;  ///< The stored header block, or empty.
};

/// `r`'s bytes copied into `*m` (reusing its strings' storage): a message
/// read in place that must outlive the read.
void copy_message(const MessageRef& r, StoredMessage* m);

/// The result of read_in_place: messages whose bytes stay in LMDB's pages,
/// and the read transaction that keeps them there. Hold it no longer than the
/// views are used: a held read pins the pages it sees (LMDB cannot reuse them
/// for later writes) and one of the process's reserved reader slots. Its
/// destructor, or release(), ends the read. Not thread-safe; it may be used on
/// one thread at a time (MDB_NOTLS).
class InPlaceBatch {
 public:
  std::vector<MessageRef> messages;
  std::uint64_t first_offset = 0;  ///< As ReadBatch.
  std::uint64_t next_offset = 0;
  std::uint64_t end_offset = 0;
  std::uint64_t skipped = 0;

  /// True while the read is held (the views of `messages` are valid).
  bool held() const noexcept { return txn_.active(); }
  /// End the read: every view of `messages` dangles from here on. The
  /// messages' offsets, headers and sizes stay readable.
  void release() noexcept { txn_.abort(); }

 private:
  friend class TopicLog;
  // Kept with LmdbTxn::hold: no lock of the store is held while the caller
  // uses the views (its handler may take its own locks, which other threads
  // hold while they read); DurableStore::close waits for the release.
  LmdbTxn txn_;
};

/// One lane's log bounds.
struct LaneInfo {
  std::uint64_t first_offset = 0;  ///< Earliest retained offset.
  std::uint64_t end_offset = 0;    ///< One past the last appended offset.
  std::uint64_t bytes = 0;         ///< Bytes of stored records.
  std::uint64_t count = 0;         ///< Retained messages (= end - first).
};

/// A group's persisted state in one lane.
struct GroupLaneInfo {
  std::uint64_t committed = 0;  ///< Next offset to consume; everything before it is done.
  std::uint64_t skipped = 0;    ///< Messages this group lost to retention (queues count it here).
  std::uint64_t in_flight = 0;  ///< Queue messages claimed and not acked.
  /// Of those, claims whose deadline has passed: a consumer that died with
  /// them, or a handler that overran attempt_timeout (the watchdog ends its
  /// claim), until they are claimed again. Also a retry waiting out its
  /// backoff shows here once the backoff is over, until it is redelivered.
  std::uint64_t overdue = 0;
};

/// How a queue consumer claims.
struct ClaimOptions {
  /// How long the claim lasts before the message is redelivered (to any
  /// consumer of any process). Deadlines are wall-clock (CLOCK_REALTIME) so
  /// they survive restarts. Default 30 s.
  std::chrono::milliseconds visibility{30000};
  /// true: at most one message of the lane is in flight at a time (lane
  /// order, doc/topics.md). false: any deliverable message among the next
  /// `scan_limit` may be claimed (competing consumers inside a lane).
  bool ordered = true;
  std::uint32_t scan_limit = 1024;
};

/// A claimed queue message. The attempt count and deadline were committed
/// (and in Sync mode fsynced) before claim returned, so a message that crashes
/// its consumer is seen with attempt+1 next time (poison detection, doc/dlq.md).
struct ClaimedMessage {
  StoredMessage message;  ///< message.header.attempt = attempt.
  std::uint32_t attempt = 0;
  std::int64_t deadline_ns = 0;
  std::int64_t claimed_ns = 0;  ///< The claiming transaction's time (wall clock).
};

/// Counters since open, read with relaxed loads (each is monotonic; a snapshot
/// is not atomic across counters).
struct StoreCounters {
  std::uint64_t appends = 0;          ///< Messages committed.
  std::uint64_t append_failures = 0;  ///< Appends completed with an error.
  std::uint64_t commits = 0;          ///< Write transactions committed.
  std::uint64_t commit_ns = 0;        ///< Of those, the time from begin to the commit's return (Sync: its fsyncs), summed.
  /// Of commit_ns, the time in LMDB's commit call alone (writing the dirty
  /// pages and the meta page, and in Sync mode their fsyncs), summed; the
  /// rest is building the transaction (the puts, lookups and encodings).
  std::uint64_t commit_call_ns = 0;
  std::uint64_t fsyncs = 0;           ///< Sync-mode commits + async-mode flushes.
  std::uint64_t batched_ops = 0;      ///< Operations in committed transactions (avg batch = /commits).
  std::uint64_t max_batch = 0;        ///< Largest batch committed.
  std::uint64_t map_growths = 0;      ///< Map doublings after MDB_MAP_FULL.
  std::uint64_t skipped_by_retention = 0;
  std::uint64_t retention_deleted = 0;
  std::uint64_t claims = 0;        ///< Queue claims (every attempt).
  std::uint64_t redeliveries = 0;  ///< Claims with attempt > 1.
  std::uint64_t claims_ahead = 0;  ///< Of claims, made in the commit that appended them (claim_ahead.hpp).
  std::uint64_t claims_passed = 0;  ///< Of claims_ahead, made behind in-flight claims of the same mailbox (pipelined).
  std::uint64_t acks = 0;
  std::uint64_t stale_readers_cleared = 0;  ///< Reader slots of dead processes cleared.
  std::uint64_t max_write_lock_wait_ns = 0;  ///< Longest wait for LMDB's writer lock (watchdog).
  std::uint64_t commit_wakes_sent = 0;      ///< FUTEX_WAKEs sent to other processes' sleeping consumers.
  std::uint64_t commit_wakes_received = 0;  ///< wait_for_commit calls woken by another process's commit.
};

/// Tables that other lanebus components keep in the store's environment, so
/// their writes commit in the same transaction as appends and acks.
enum class StoreTable : std::uint8_t {
  Idempotency,     ///< `idem`: idempotency records (lib/features/idempotency.cpp)
  IdempotencyAge,  ///< `idem_age`: done records by time, for durable retention
  Dlq,             ///< `dlq`: dead-letter entries
  DlqAudit,        ///< `dlq_audit`: who replayed / archived / purged what, when
  Fence,           ///< `fence`: fencing high-water marks (doc/leases.md)
  User,            ///< `user`: handlers' own tables (transactional consume)
  Tenancy,         ///< `tenancy`: namespaces, credentials, usage by minute (doc/tenancy.md)
  Schema,          ///< `schema`: schema registry, contracts, usage audit (lib/features/schema_registry.cpp)
  Delayed,         ///< `delayed`: durable messages waiting for their due time (lib/store/delayed_index.hpp)
};
inline constexpr int kStoreTables = 9;

class DurableStore;
class StorePart;
class StoreWriter;
class TopicLog;
class GroupOffsets;
class QueueClaims;
class LogRetention;
class ClaimAhead;

/// A transaction handed to extension code by DurableStore::write (a write
/// transaction, on the store's writer thread, batched with other operations)
/// or DurableStore::read (a short read transaction).
///
/// Rules for write functions: they may run more than once (a batch that hits
/// MDB_MAP_FULL is retried after the map grows), so they must reset their
/// outputs at the start; and they must return a logic error (NotFound,
/// Conflict, ...) only BEFORE their first write — a storage error from any
/// call aborts the whole batch, but a logic error returned after writing
/// would leave those writes in the batch's commit.
///
/// Thread safety: one thread (the one running the function).
class StoreTxn {
 public:
  /// Value of `key`, valid until the function returns. NotFound when absent.
  Result<std::string_view> get(StoreTable table, std::string_view key);
  Status put(StoreTable table, std::string_view key, std::string_view value);
  /// `size` bytes to fill under a new `key` (LMDB's MDB_RESERVE, valid until
  /// the next write): Conflict when the key exists, or with `append` when it
  /// does not sort after every key of `table` (MDB_APPEND: no search); the
  /// batch goes on either way.
  Result<char*> reserve_new(StoreTable table, std::string_view key, std::size_t size, bool append);
  /// NotFound when absent.
  Status del(StoreTable table, std::string_view key);
  /// Visit, in key order, the keys >= `from` ("" = from the first key) that start with `prefix`, until
  /// `visit` returns false. Do not write to `table` from inside `visit`.
  Status scan(StoreTable table, std::string_view from, std::string_view prefix,
              const std::function<bool(std::string_view key, std::string_view value)>& visit);
  /// What sweep's `visit` asks for the entry it was shown.
  enum class Sweep : std::uint8_t { Next, Delete, Stop };
  /// Visit `table` in key order from its first key, deleting each entry
  /// `visit` answers Delete for (LMDB's cursor delete: no search per key),
  /// until it answers Stop. Write transactions only (InvalidArgument in a
  /// read one). `visit` may write to other tables, never to `table`.
  Status sweep(StoreTable table, const std::function<Sweep(std::string_view key, std::string_view value)>& visit);
  /// The core tables (doc/storage-format.md), for the offline namespace move
  /// (lib/features/namespace_move.hpp) only: raw keys and values, bypassing the topic
  /// cache and the writer's lane state, so never use them on a store a bus
  /// has open. Same rules and errors as get/put/del/scan.
  enum class Core : std::uint8_t { Meta, Topics, Lanes, Log, Groups, Cursors, Inflight };
  Result<std::string_view> core_get(Core table, std::string_view key);
  Status core_put(Core table, std::string_view key, std::string_view value);
  Status core_del(Core table, std::string_view key);
  Status core_scan(Core table, std::string_view from, std::string_view prefix,
                   const std::function<bool(std::string_view key, std::string_view value)>& visit);
  /// Write transactions: make the whole batch abort with `cause` (nothing
  /// of it is committed; every operation of the batch gets `cause`), for a
  /// function that found a logic error after its first write. Returns `cause`.
  Status abort_batch(Status cause);
  /// Wall clock of this transaction (one value per batch), ns since the epoch.
  std::int64_t now_ns() const noexcept { return now_ns_; }
  bool writable() const noexcept { return ctx_ != nullptr; }

  // Built-in operations inside the same transaction (write only):
  /// Append a message (an outbox publish); listeners run after the commit.
  Result<AppendResult> append(AppendRequest request);
  /// append, borrowing `request`: it is given back unchanged, its strings
  /// with their capacity (a caller that decodes into one request reuses it).
  Result<AppendResult> append_borrowed(AppendRequest& request);
  /// As DurableStore::commit_offset.
  Status commit_offset(const GroupRef& group, std::uint32_t lane, std::uint64_t offset);
  /// As DurableStore::ack (same errors).
  Status ack(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt);
  /// As DurableStore::release, with the delay in ns from this transaction's clock.
  Status release(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt,
                 std::int64_t delay_ns);
  /// Give back a claim whose message was never handled to completion (the
  /// rest of a claimed batch after a retry, a conflict, a lost claim): the
  /// claim is undone — its attempt is not counted — and the message is
  /// deliverable at once. Errors as ack.
  Status unclaim(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt);
  /// End a claim now, keeping its attempt (a handler overran its
  /// attempt_timeout: another consumer may take the message). Errors as ack.
  Status expire_claim(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt);

 private:
  friend class DurableStore;
  friend class StoreWriter;  // apply_delayed
  friend class TopicLog;     // fenced appends
  LmdbDbi core_dbi(Core table) const noexcept;
  Status scan_dbi(LmdbDbi dbi, std::string_view from, std::string_view prefix,
                  const std::function<bool(std::string_view, std::string_view)>& visit);
  StoreTxn(DurableStore* store, void* ctx, LmdbTxn* txn, std::int64_t now) noexcept
      : store_(store), ctx_(ctx), txn_(txn), now_ns_(now) {}
  DurableStore* store_;
  void* ctx_;  // DurableStore::WriteCtx* (write) or nullptr (read)
  LmdbTxn* txn_;
  std::int64_t now_ns_;
};

/// The durable engine: one LMDB environment per directory.
///
/// Design notes:
/// - Layout: fixed named databases `meta` (layout version, id high-water, id
///   counters), `topics`, `lanes` (per-lane bounds), `log` (key: topic id,
///   lane, offset, big-endian), `groups`, `cursors` (committed offsets) and
///   `inflight` (queue claims). See doc/storage-format.md.
/// - One writer thread owns every write transaction of this process. Calls
///   queue operations; the writer takes up to StoreOptions::max_batch of them,
///   applies them in one transaction, commits (Sync: fsync), then runs the
///   completions. No user code runs inside a write transaction.
/// - A MapFull transaction is aborted, the map grown with no transaction of
///   this process open, and the whole batch retried; at map_size_max appends
///   fail with MapFull while small bookkeeping writes get one retry alone.
/// - Reads use one short read transaction per call.
/// - Several processes may open the same directory: LMDB's writer lock
///   serialises their writers; ids come from a shared persisted high-water.
///
/// Thread safety: thread-safe. Blocking methods return Busy when called on the
/// writer thread (from a completion callback).
class DurableStore {
 public:
  /// Open (creating if needed) the store in options.directory.
  /// Errors: InvalidArgument (bad options, path is a file, network FS,
  /// read-only with nothing there), NotFound (read-only and no store),
  /// PermissionDenied, Busy (already open in this process), Corruption
  /// (garbage or foreign file, foreign LMDB environment), VersionTooNew
  /// (layout written by a newer lanebus), MapFull/DiskFull (cannot initialise),
  /// IOError.
  [[nodiscard]] static Result<std::unique_ptr<DurableStore>> open(const StoreOptions& options);
  /// close(), ignoring its status.
  ~DurableStore();
  DurableStore(const DurableStore&) = delete;
  DurableStore& operator=(const DurableStore&) = delete;

  /// Stop accepting operations (new ones get ShutDown), let the writer commit
  /// everything already queued and run its completions, flush (Async mode),
  /// and close the environment. Blocks for that long. Idempotent.
  /// Errors: the flush failure, if any; Busy when called on the writer thread.
  [[nodiscard]] Status close();

  // ---------------------------------------------------------------- topics

  /// Create the topic, or open it if it exists with the same lane count and
  /// kind (its retention is updated to spec.retention). Blocks for one commit.
  /// Errors: InvalidName, InvalidArgument (lanes 0 or > 4096, read-only store),
  /// Conflict (exists with another lane count or kind), ShutDown, storage codes.
  [[nodiscard]] Result<TopicRef> open_topic(std::string_view name, const TopicSpec& spec);
  /// An existing topic (works read-only; sees topics created by other
  /// processes). Errors: NotFound, InvalidName, ShutDown, storage codes.
  [[nodiscard]] Result<TopicRef> find_topic(std::string_view name);
  /// All topics, sorted by name.
  [[nodiscard]] Result<std::vector<TopicRef>> list_topics();

  // ---------------------------------------------------------------- append

  /// Append and wait until committed (Sync: fsynced). Blocks for one group
  /// commit (plus queueing behind StoreOptions::max_pending operations).
  /// Errors: InvalidArgument (unknown topic id, lane out of range, empty
  /// payload, read-only), PayloadTooLarge (key or idempotency key > 65535
  /// bytes, payload > 1 GiB), MapFull, DiskFull, IOError (the store went fatal:
  /// close and reopen), ShutDown, Busy (on the writer thread).
  [[nodiscard]] Result<AppendResult> append(AppendRequest request);
  /// Queue an append; `done` runs once after the commit (see AppendCallback).
  /// Returns an error, and never calls `done`, when the request is refused up
  /// front (InvalidArgument, PayloadTooLarge, ShutDown). Blocks only while
  /// max_pending operations are queued.
  [[nodiscard]] Status append_async(AppendRequest request, AppendCallback done);
  /// What append_batch did: how many leading requests were appended
  /// (committed; a duplicate idempotency key counts as appended) and, when
  /// not all were, why the first of the rest was not.
  struct AppendBatchResult {
    std::size_t appended = 0;
    Status status;
  };
  /// Append `requests` in order as one request to the writer: they are queued
  /// together, share its group commits (one transaction when they fit
  /// StoreOptions::max_batch) and the caller waits once. Each request is
  /// checked as append() checks it; the first refused one ends the batch (the
  /// ones before it are still appended). On a fenced topic the requests go one
  /// at a time: a stale token refuses its own message inside the transaction,
  /// and the messages after it must not be appended. The requests are moved
  /// from. Errors: as append().
  [[nodiscard]] AppendBatchResult append_batch(std::span<AppendRequest> requests);
  /// Reserve `count` message ids (unique across restarts and processes) for a
  /// caller that assigns ids itself; returns the first. Blocks for one commit.
  [[nodiscard]] Result<std::uint64_t> reserve_ids(std::uint64_t count);

  // ---------------------------------------------------------------- read

  /// Read up to `limits` messages of (topic, lane) from offset `from` with one
  /// short read transaction. A `from` behind retention starts at the earliest
  /// retained offset and reports the skip. Never blocks on writers.
  /// Errors: InvalidArgument (lane), Corruption (a record fails its checksum:
  /// the message names topic, lane and offset), ShutDown, storage codes.
  [[nodiscard]] Result<ReadBatch> read(const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                                       const ReadLimits& limits = {});
  /// As read, into `out`, reusing its messages' storage (a reader that keeps
  /// one ReadBatch allocates only when a message is larger than before).
  /// On error `out->messages` is empty.
  [[nodiscard]] Status read_into(const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                                 const ReadLimits& limits, ReadBatch* out);
  /// As read_into, without copying: `out` gets views into LMDB's mapped
  /// pages and holds the read transaction that keeps them valid, until
  /// out->release() or its destruction (first releasing any read it held).
  /// Holds no read when it returns no message, nor on error (then
  /// out->messages is empty). Each record's checksum is checked once here.
  /// Release it before close(), which waits for every held read.
  /// The views stay valid across writes of this and other processes (LMDB's
  /// copy-on-write) as long as the map does not move: see
  /// LmdbEnv::map_at_max, which the caller checks before holding a read
  /// across a call that can wait for the writer.
  [[nodiscard]] Status read_in_place(const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                                     const ReadLimits& limits, InPlaceBatch* out);
  /// The map never moves while this process holds a read (LmdbEnv::map_at_max).
  bool map_at_max() const noexcept;
  /// `p` points into the mapped data file (tests of reads in place).
  bool in_map(const void* p) const noexcept;
  /// The lane's end offset (one past the last message): one read txn and one
  /// lookup, cheap enough to poll for new data from any process.
  [[nodiscard]] Result<std::uint64_t> end_offset(const TopicRef& topic, std::uint32_t lane);
  /// The end offset of every lane of `topic`, in one read transaction, into
  /// `ends` (topic.lanes entries; the poller's scan of other processes'
  /// appends). Errors as end_offset.
  [[nodiscard]] Status end_offsets(const TopicRef& topic, std::uint64_t* ends);
  [[nodiscard]] Result<LaneInfo> lane_info(const TopicRef& topic, std::uint32_t lane);
  /// The first offset whose timestamp index is >= ts_ns (end offset if none).
  [[nodiscard]] Result<std::uint64_t> offset_for_time(const TopicRef& topic, std::uint32_t lane,
                                                      std::int64_t ts_ns);

  // ---------------------------------------------------------------- groups

  /// Create the group at `start` in every lane, or open it (then `start` is
  /// ignored: an existing group resumes from its committed offsets). Blocks
  /// for one commit. Errors: InvalidName, InvalidArgument, ShutDown, storage codes.
  [[nodiscard]] Result<GroupRef> open_group(const TopicRef& topic, std::string_view name,
                                            StartPosition start = {});
  /// An existing group (works read-only). Errors: NotFound, InvalidName.
  [[nodiscard]] Result<GroupRef> find_group(const TopicRef& topic, std::string_view name);
  [[nodiscard]] Result<std::vector<GroupRef>> list_groups(const TopicRef& topic);
  /// The group's persisted state in every lane (index = lane).
  [[nodiscard]] Result<std::vector<GroupLaneInfo>> group_info(const GroupRef& group);
  /// Persist that the group consumed everything before `offset` in `lane`.
  /// Batched through the writer with other operations; blocks for the commit.
  /// Errors: InvalidArgument (lane, offset beyond the end), ShutDown, storage codes.
  [[nodiscard]] Status commit_offset(const GroupRef& group, std::uint32_t lane, std::uint64_t offset);
  /// As commit_offset, completing through `done` (same rules as AppendCallback).
  [[nodiscard]] Status commit_offset_async(const GroupRef& group, std::uint32_t lane, std::uint64_t offset,
                                           StatusCallback done);
  /// Move the group in every lane to `start` (replay or skip ahead). Queue
  /// groups also drop their in-flight claims. Blocks for one commit.
  [[nodiscard]] Status seek(const GroupRef& group, const StartPosition& start);

  // ---------------------------------------------------------------- queues

  /// Claim the next deliverable message of the lane for `group`: a never
  /// delivered one (attempt 1) or one whose claim expired (attempt + 1,
  /// counted as a redelivery). The claim is committed before this returns.
  /// nullopt when nothing is deliverable now. Blocks for one commit.
  /// Errors: InvalidArgument, Corruption, ShutDown, storage codes.
  [[nodiscard]] Result<std::optional<ClaimedMessage>> claim(const GroupRef& group, std::uint32_t lane,
                                                            const ClaimOptions& options = {});
  /// Consumer-side group commit: claim up to `max` deliverable messages of
  /// the lane in one transaction (each attempt committed — Sync: fsynced —
  /// before this returns). Ordered claims take a run of never-delivered
  /// messages from the lane's head, or a redelivered message alone (so a
  /// crash charges only the message it happened on). Empty when nothing is
  /// deliverable now. Blocks for one commit. Errors as claim; InvalidArgument
  /// when max is 0.
  [[nodiscard]] Result<std::vector<ClaimedMessage>> claim_batch(const GroupRef& group, std::uint32_t lane,
                                                                std::uint32_t max, const ClaimOptions& options = {});
  /// Acknowledge a claimed message: it is done for the group. Blocks for one commit.
  /// Errors: NotFound (not in flight: already acked, or never claimed),
  /// StaleToken (`attempt` is not the current claim: the message was
  /// redelivered after this claim expired), ShutDown, storage codes.
  [[nodiscard]] Status ack(const GroupRef& group, std::uint32_t lane, std::uint64_t offset,
                           std::uint32_t attempt);
  /// Give a claim back (retry): deliverable again after `delay`. The attempt
  /// count stays. Errors as ack.
  [[nodiscard]] Status release(const GroupRef& group, std::uint32_t lane, std::uint64_t offset,
                               std::uint32_t attempt, std::chrono::milliseconds delay);
  /// Claims in the append's transaction (claim_ahead.hpp, doc/durable.md):
  /// while `box` is watched and armed, the writer's next commit that appends
  /// to its lane claims for it, in that commit. `box` must outlive
  /// unwatch_claims, which waits for a commit that is claiming for it.
  void watch_claims(ClaimAhead* box);
  void unwatch_claims(ClaimAhead* box);
  /// After box->request() returned true: the writer claims for `box` in its
  /// next commit (with whatever else that commit carries) and the append
  /// listener is called for its lane once claims are in the mailbox. Does not
  /// wait for the commit. Errors: ShutDown (then call box->answered()).
  [[nodiscard]] Status request_claims(ClaimAhead* box);
  /// Give back claims that were never handled (a closed mailbox's): each is
  /// unclaimed (its attempt not counted, deliverable at once); one that was
  /// redelivered meanwhile is left alone. Blocks for one commit. Errors:
  /// ShutDown, Busy (writer thread), storage codes.
  [[nodiscard]] Status give_back_claims(std::span<const ClaimedMessage> claims, const GroupRef& group,
                                        std::uint32_t lane);
  /// give_back_claims without waiting for the commit (queued to the writer;
  /// blocks only while max_pending operations are queued). Errors: ShutDown,
  /// read-only store; refused, the claims expire after their visibility.
  [[nodiscard]] Status give_back_claims_async(std::vector<ClaimedMessage> claims, const GroupRef& group,
                                              std::uint32_t lane);

  // ---------------------------------------------------------------- maintenance

  /// Apply retention to every topic now, in bounded batches (tests and tools;
  /// the writer also does it every maintenance_interval). Blocks until done.
  [[nodiscard]] Status run_retention();
  /// Flush to disk now (Async mode); no-op in Sync mode. Blocks for the fsync.
  [[nodiscard]] Status sync();
  /// Called on the writer thread after each commit for every lane that got
  /// new messages, with its new end offset (same rules as AppendCallback).
  /// Set it before appending; a dispatcher uses it to wake consumers.
  void set_append_listener(std::function<void(std::uint32_t topic_id, std::uint32_t lane,
                                              std::uint64_t end_offset)> listener);
  /// The hook that confirms a generation barrier on a fenced topic (see
  /// FenceConfirmFn: which thread calls it and what it may do). The Bus sets
  /// it to LeaseTable::confirm_grant. Without a hook every barrier is refused
  /// (FenceViolation). May be called at any time (the hook runs in lib/features/fence.cpp).
  void set_fence_confirm(FenceConfirmFn confirm) { fences_.set_confirm(std::move(confirm)); }
  /// TEST ONLY, for negative controls: false turns every fence check and
  /// fence update of this store object off (fenced appends are accepted as
  /// if unfenced). Never use it in production code.
  void set_fence_check_for_testing(bool on) noexcept { fences_.set_check_enabled(on); }

  // ---------------------------------------------------------------- extensions

  /// Run `fn` inside the writer's next write transaction (batched with other
  /// operations, committed — Sync: fsynced — before this returns). See
  /// StoreTxn for the rules `fn` must follow. Returns fn's status, or the
  /// batch's storage error. Errors: ShutDown, Busy (on the writer thread),
  /// read-only store (InvalidArgument), storage codes, and whatever fn returns.
  [[nodiscard]] Status write(const std::function<Status(StoreTxn&)>& fn);
  /// As write, without waiting: `fn` runs in the writer's next transaction
  /// and `done` after its commit (Sync: after the fsync), on the writer thread
  /// (same rules as AppendCallback). `fn` is kept until then. Returns an error,
  /// and never calls `done`, when refused up front (ShutDown, read-only).
  /// Blocks only while max_pending operations are queued.
  [[nodiscard]] Status write_async(std::function<Status(StoreTxn&)> fn, StatusCallback done);
  /// write_async of store_delayed(t, request, tiebreak) (delayed_index.hpp),
  /// queued as an operation of its own: a durable delayed publish without a
  /// write function wrapped around it (two allocations and two indirect
  /// calls per message). Same errors and rules as write_async.
  [[nodiscard]] Status delayed_async(AppendRequest request, std::uint32_t tiebreak, StatusCallback done);
  /// Run `fn` in a short read transaction (never blocks on writers).
  [[nodiscard]] Status read(const std::function<Status(StoreTxn&)>& fn);

  // ---------------------------------------------------------------- commit wake

  /// This process's commit-wake word (StoreOptions::wake_on_commit): read it
  /// before looking at the store, then pass it to wait_for_commit. 0 without one.
  std::uint32_t commit_wake_seq() const noexcept;
  /// Sleep until another process commits an append (or interrupt_commit_wait)
  /// after `seen` was read, or `timeout` passes. True when woken. Returns
  /// false at once when this process has no wake word (wake_on_commit off,
  /// read-only, wake.shm unusable or full): the caller sleeps by itself then.
  /// One thread at a time (the bus's poller).
  bool wait_for_commit(std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept;
  /// Wake the thread inside wait_for_commit (shutting down). Any thread.
  void interrupt_commit_wait() noexcept;
  /// True when this process has a wake word (wait_for_commit can sleep).
  bool has_commit_wake() const noexcept;
  /// Why there is no wake word (OK when there is one, or when turned off).
  const Status& commit_wake_status() const noexcept { return wake_status_; }
  /// The wake table itself, or nullptr (tests: statistics and the
  /// set_between_bump_and_wake_for_testing hook, set before the first append).
  CommitWake* commit_wake_for_testing() const noexcept { return wake_.get(); }

  StoreCounters counters() const noexcept;
  /// Where the writer reports failed commits and syncs (one line a second at
  /// most; lanebus/log.hpp). `logger` must outlive the store. Any thread.
  void set_logger(const Logger* logger) noexcept { logger_.store(logger, std::memory_order_release); }
  /// The logger set by set_logger, or nullptr (features log through it).
  const Logger* logger() const noexcept { return logger_.load(std::memory_order_acquire); }
  const std::string& directory() const noexcept { return options_.directory; }
  const StoreOptions& options() const noexcept { return options_; }
  /// OK, or the IOError every call returns once a failed write made the
  /// environment unusable (metrics health checks).
  Status health() const;
  bool read_only() const noexcept { return options_.read_only; }
  std::uint64_t map_size() const noexcept;

 private:
  struct WriteCtx;
  struct Waiter;
  // One queued operation: an append (request + completion) or an internal
  // write (`apply` runs inside the batch's transaction; it must be re-runnable
  // because a MapFull batch is retried after the map grows).
  struct WriteOp {
    bool is_append = false;
    bool is_delayed = false;            // delayed_async: `request` goes to store_delayed, then `done`
    std::uint32_t delayed_tiebreak = 0;
    AppendRequest request;
    AppendCallback append_done;
    std::function<Status(WriteCtx&)> apply;
    StatusCallback done;
    bool bookkeeping = false;  // small write allowed a retry alone when the map is at its maximum
    FencePreconfirm fence;     // fenced topics: the token's confirmation, asked before enqueueing
    // Filled by the writer.
    Status status;
    AppendResult result;
    bool excluded = false;
  };
  // What every read call starts with: life_mutex_ held shared for the call
  // (close() waits for it), the store checked open, one read transaction.
  // Members end in reverse order: the transaction, then the lock.
  struct ReadView {
    std::shared_lock<std::shared_mutex> life;
    LmdbTxn txn;
  };

  // The store's parts (durable_store_impl.hpp): each owns its own state and
  // has its definitions in one file; the public methods above forward to them.
  friend class StoreTxn;
  friend class StorePart;
  friend class StoreWriter;
  friend class TopicLog;
  friend class GroupOffsets;
  friend class QueueClaims;
  friend class LogRetention;
  explicit DurableStore(const StoreOptions& options);
  Status init_layout();
  Status open_extension_tables(LmdbTxn& txn);
  Status check_open() const;
  Status check_writable() const;
  Result<ReadView> begin_read() const;
  /// Report a failed store operation `what` (writer thread, sync()).
  void log_failure(const char* what, const Status& st) noexcept;

  // What every part shares, set at open and never reassigned while open.
  StoreOptions options_;
  std::unique_ptr<LmdbEnv> env_;
  LmdbDbi dbi_meta_ = 0, dbi_topics_ = 0, dbi_lanes_ = 0, dbi_log_ = 0, dbi_groups_ = 0, dbi_cursors_ = 0,
          dbi_inflight_ = 0;
  LmdbDbi dbi_ext_[kStoreTables] = {};
  bool ext_present_[kStoreTables] = {};  // false: read-only store without that table (reads as empty)

  // Readers hold it shared for a call; close() takes it exclusively before
  // destroying the environment.
  mutable std::shared_mutex life_mutex_;
  std::atomic<bool> closed_{false};

  // Set at open, never changed: the wake of other processes' consumers
  // (commit_wake.hpp), nullptr when off or unusable (wake_status_ says why).
  std::unique_ptr<CommitWake> wake_;
  Status wake_status_;
  LaneFences fences_;  // fenced topics (lib/features/fence.cpp)

  // Counters: relaxed atomics — each is an independent statistic; no other
  // memory is published through them.
  struct AtomicCounters {
    std::atomic<std::uint64_t> appends{0}, append_failures{0}, commits{0}, fsyncs{0}, batched_ops{0},
        max_batch{0}, skipped_by_retention{0}, retention_deleted{0}, claims{0}, redeliveries{0}, acks{0},
        claims_ahead{0}, claims_passed{0}, stale_readers_cleared{0}, max_write_lock_wait_ns{0}, commit_ns{0}, commit_call_ns{0};
  };
  mutable AtomicCounters counters_;

  // The log hook (set_logger; acquire/release: the Logger is built before it
  // is published here) and its limit for failure lines.
  std::atomic<const Logger*> logger_{nullptr};
  LogLimiter failure_log_;

  // The parts, built by the constructor.
  std::unique_ptr<StoreWriter> writer_;      // durable_writer.cpp: the queue, the writer thread, group commit
  std::unique_ptr<TopicLog> log_;            // durable_topics.cpp, durable_reads.cpp: topics, appends, reads
  std::unique_ptr<GroupOffsets> groups_;     // durable_groups.cpp: groups and committed offsets
  std::unique_ptr<QueueClaims> claims_;      // durable_queues.cpp: claims, acks, releases
  std::unique_ptr<LogRetention> retention_;     // durable_retention.cpp: retention in bounded batches
};

}  // namespace lanebus::detail
