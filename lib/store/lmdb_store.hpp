// lanebus — MIT License.
// LmdbEnv / LmdbTxn / LmdbCursor: the only wrapper around LMDB. Maps every
// MDB_* code and errno to a lanebus Code with a message naming path and cause.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <sys/types.h>

#include "lanebus/status.hpp"

// Opaque LMDB handles (lmdb.h declares them the same way); lmdb.h itself is
// included only by lmdb_store.cpp.
struct MDB_env;
struct MDB_txn;
struct MDB_cursor;

namespace lanebus::detail {

class LmdbEnv;

/// A named database handle inside an environment (LMDB's MDB_dbi).
using LmdbDbi = unsigned int;

/// Maps an LMDB return code (an MDB_* code or an errno) to a Status whose
/// message is `<what> "<path>": <MDB name or errno name>: <text>[; <hint>]`.
Status lmdb_error(int rc, std::string_view what, std::string_view path);
/// Corruption for an MDB_BAD_TXN in a read-only transaction (LMDB marked it
/// failed after meeting a damaged page).
Status damaged_read_txn(std::string_view what, std::string_view path);
/// LMDB's version string (mdb_version), for benchmark and tool banners.
const char* lmdb_version_string() noexcept;

/// A read or write transaction. Move-only RAII: destruction aborts an
/// uncommitted transaction and releases the environment's map lock.
///
/// A read transaction must stay on its thread and be short (it pins pages and
/// a reader slot); the durable store never keeps one beyond a single call.
///
/// Thread safety: one thread at a time (LMDB's rule for transactions).
class LmdbTxn {
 public:
  LmdbTxn() = default;
  LmdbTxn(LmdbTxn&& other) noexcept;
  LmdbTxn& operator=(LmdbTxn&& other) noexcept;
  LmdbTxn(const LmdbTxn&) = delete;
  LmdbTxn& operator=(const LmdbTxn&) = delete;
  ~LmdbTxn();

  /// The value stored under `key`, or NotFound. The view is valid until the
  /// transaction ends or (write txn) the next write to the same database.
  Result<std::string_view> get(LmdbDbi dbi, std::string_view key);
  /// Store `value` under `key` (overwrites). Errors: MapFull (the transaction
  /// is then dead: abort it), DiskFull, InvalidArgument (value too large), ...
  Status put(LmdbDbi dbi, std::string_view key, std::string_view value);
  /// As put, with MDB_APPEND: REQUIRES key > every key in `dbi` (else Conflict).
  /// Used by the benchmark's raw-LMDB baseline.
  Status put_append(LmdbDbi dbi, std::string_view key, std::string_view value);
  /// Reserve `size` bytes under `key` and return where to write them (LMDB's
  /// MDB_RESERVE): saves one copy for large values. Same errors as put.
  Result<char*> reserve(LmdbDbi dbi, std::string_view key, std::size_t size);
  /// reserve for a new key (MDB_NOOVERWRITE; with `append`, MDB_APPEND too:
  /// no search when the key sorts after every key of `dbi`). Conflict, and
  /// nothing written, when the key exists or (`append`) does not sort last.
  /// Other errors as put.
  Result<char*> reserve_new(LmdbDbi dbi, std::string_view key, std::size_t size, bool append);
  /// Delete `key`. NotFound when absent.
  Status del(LmdbDbi dbi, std::string_view key);
  /// Commit. On MapFull/DiskFull the transaction was aborted and the
  /// environment stays usable; on any other failure (EIO, a failed fsync,
  /// MDB_PANIC) the environment is marked fatal (never retry-then-ack).
  Status commit();
  /// Abort (no-op when already ended).
  void abort() noexcept;
  /// A read kept while its thread may wait for this process's writer (a batch
  /// handler holding views into the map): gives up the map lock, so that no
  /// lock of lanebus is held across the caller's code, and is counted
  /// instead; a resize of the map refuses (MapFull naming the cause) while any
  /// held read is counted. No-op on a write transaction.
  void hold() noexcept;

  bool active() const noexcept { return txn_ != nullptr; }
  MDB_txn* raw() const noexcept { return txn_; }

 private:
  friend class LmdbEnv;
  friend class LmdbCursor;
  LmdbTxn(LmdbEnv* env, MDB_txn* txn, std::shared_lock<std::shared_mutex> lock, bool write,
          std::size_t slot = 0) noexcept
      : env_(env), txn_(txn), lock_(std::move(lock)), write_(write), slot_(slot) {}
  void release_writer() noexcept;
  LmdbEnv* env_ = nullptr;
  MDB_txn* txn_ = nullptr;
  std::shared_lock<std::shared_mutex> lock_;  // held while the txn uses the map
  bool write_ = false;
  bool writer_locked_ = false;  // holds env_'s writer lock (a write txn)
  std::size_t slot_ = 0;        // a read txn: its entry in env_'s reserved reader slots
  bool held_ = false;           // hold(): counted in env_->held_reads_ instead of lock_
};

/// A cursor on one database inside a transaction; closed on destruction.
/// REQUIRES: destroyed before its transaction commits or aborts (LMDB frees a
/// write transaction's cursors itself at its end; closing one again is a
/// double free).
///
/// Thread safety: one thread at a time.
class LmdbCursor {
 public:
  /// Errors: Internal if LMDB refuses to open a cursor (bad dbi).
  static Result<LmdbCursor> open(LmdbTxn& txn, LmdbDbi dbi, std::string_view path);
  LmdbCursor(LmdbCursor&& other) noexcept;
  LmdbCursor& operator=(LmdbCursor&& other) noexcept;
  LmdbCursor(const LmdbCursor&) = delete;
  LmdbCursor& operator=(const LmdbCursor&) = delete;
  ~LmdbCursor();

  /// Position at the first key >= `key`. false when there is none.
  Result<bool> seek(std::string_view key);
  Result<bool> first();
  Result<bool> last();
  Result<bool> next();
  Result<bool> prev();
  /// Delete the current entry (write txn only); the cursor moves to the next.
  Status del();
  /// LmdbTxn::reserve through this cursor (write txn only): when `key`
  /// belongs on the cursor's current leaf page, LMDB searches that page alone
  /// instead of the tree from its root. The cursor is left at the new entry.
  Result<char*> reserve(std::string_view key, std::size_t size);
  /// Key and value at the current position (valid until the cursor moves).
  std::string_view key() const noexcept { return key_; }
  std::string_view value() const noexcept { return value_; }

 private:
  LmdbCursor(MDB_cursor* cursor, std::string_view path) noexcept : cursor_(cursor), path_(path) {}
  Result<bool> move(int op, std::string_view key);
  MDB_cursor* cursor_ = nullptr;
  std::string_view path_;
  std::string_view key_;
  std::string_view value_;
  bool read_txn_ = false;  // opened in a read-only transaction (MDB_BAD_TXN there = damage)
};

/// One LMDB environment (one directory). Opens with MDB_NOTLS (reader slots
/// belong to transactions, not threads) and never with MDB_WRITEMAP.
///
/// Design notes:
/// - A process-wide registry keyed by the directory's (st_dev, st_ino) refuses
///   a second open of the same environment in one process (Busy): closing any
///   descriptor of lock.mdb would drop this process's fcntl locks.
/// - The map is resized only with no transaction of this process open: every
///   transaction holds `map_mutex_` shared, a resize takes it exclusively.
///   The map is reserved at Config::map_size_max at open (Config::reserve_map);
///   without the reservation, growth after MDB_MAP_FULL doubles up to it;
///   MDB_MAP_RESIZED (another process grew it) is handled inside begin_*.
/// - Writers of different processes queue on a POSIX record lock on
///   `writer.lock` in the store directory (fcntl F_SETLKW), taken before
///   LMDB's writer mutex and released after the commit. LMDB's mutex is a
///   robust pthread mutex in lock.mdb: when a process is killed with SIGKILL
///   after its unlock woke it but before it took the mutex, the wake-up is
///   lost and the next waiter sleeps forever on a free mutex (seen as a hung
///   producer in bus_multiprocess_test under load). The kernel drops a dead
///   process's record locks and wakes every waiter, so with the outer lock
///   only threads of the one process that holds it ever wait on LMDB's mutex.
///   Threads of one process queue on `writer_mutex_` first (record locks are
///   per process). LMDB's mutex still decides who writes: a store without
///   writer.lock (a read-only directory) or another program's writer is safe.
/// - Reader slots are reserved at open and never taken afterwards. LMDB's
///   reader mutex (robust, in lock.mdb, with the writer mutex's lost wake-up)
///   is taken only to claim a new reader slot and by mdb_reader_check when it
///   finds a dead process's slot. open() takes a record lock on byte 1 of
///   `writer.lock` (the "slot lock"; byte 0 is the writers'), runs
///   mdb_reader_check, begins `read_slots` read transactions (each claims a
///   slot), resets them and keeps them. begin_read renews a kept one
///   (mdb_txn_renew: no lock at all), and a finished read is reset and handed
///   back (mdb_txn_reset keeps the slot). When every kept transaction is in
///   use, begin_read waits for one to come back instead of claiming a slot.
///   Every later reader-mutex user of this class (reader_check; a nested read
///   on a thread that already holds one, which would otherwise wait for
///   itself; a read-only open's commit of its first read) takes the slot lock
///   first. So among lanebus processes only one thread at a time ever waits
///   on the reader mutex, and a process killed while it waits for the slot
///   lock loses it in the kernel, which wakes the next waiter. Another program
///   on the same directory (mdb_stat -r, an older lanebus) does not take the
///   slot lock: with it the hazard is LMDB's own. A reset transaction pins no
///   pages; the reserved slots are freed when the environment closes.
/// - After a failed commit that is not MapFull/DiskFull, or a failed sync, the
///   environment is fatal: every later transaction fails with IOError naming
///   the first cause, until the store is closed and reopened.
///
/// Thread safety: thread-safe (transactions themselves are one thread at a time).
class LmdbEnv {
 public:
  struct Config {
    std::string path;
    std::uint64_t map_size_initial = 64ull << 20;
    std::uint64_t map_size_max = 16ull << 30;
    unsigned max_readers = 126;
    unsigned max_dbs = 16;
    bool read_only = false;
    bool no_sync = false;  ///< MDB_NOSYNC: commit without fsync (async durability).
    /// MDB_NOMETASYNC: the commit fsyncs the data pages but writes the meta
    /// page without a sync, so a commit is durable only after the next
    /// commit's fsync or sync(). Not used by the store; bench/durable's
    /// `layouts` case measures what pipelining acknowledgements that way would gain.
    bool no_meta_sync = false;
    /// Map the whole of map_size_max at open, so that the map never moves
    /// while this process has a transaction open (a read held across a
    /// handler call can then never hold up the writer). Costs address space
    /// only. Where the OS refuses the address space, or when false, the map
    /// starts at map_size_initial and doubles on MDB_MAP_FULL.
    bool reserve_map = true;
    /// Reader slots this process reserves at open (read transactions open at
    /// once; more wait). 0: min(8, max(1, maxreaders / 16)). At most kMaxReadSlots.
    unsigned read_slots = 0;
  };
  static constexpr std::size_t kMaxReadSlots = 64;

  /// Create the directory if needed (0700; not in read-only mode), refuse
  /// network file systems, register (dev, ino), open the environment (files
  /// 0600) and clear stale reader slots.
  /// Errors: InvalidArgument (path empty or not a directory), NotFound
  /// (read-only and no store there), PermissionDenied, Busy (already open in
  /// this process, or reader table full), Corruption (not an LMDB file, or
  /// incompatible), VersionTooNew (LMDB file format version mismatch), IOError.
  static Result<std::unique_ptr<LmdbEnv>> open(const Config& config);
  ~LmdbEnv();
  LmdbEnv(const LmdbEnv&) = delete;
  LmdbEnv& operator=(const LmdbEnv&) = delete;

  /// Begin a read-only transaction on one of the reader slots reserved at open
  /// (handles MDB_MAP_RESIZED). Waits while every reserved slot is in use on
  /// other threads; a thread that already holds a read of this environment
  /// gets a new slot (claimed under the slot lock) instead of waiting for
  /// itself. Busy when the reader table is full then.
  Result<LmdbTxn> begin_read();
  /// Begin a write transaction. Blocks while another process (or thread) holds
  /// LMDB's writer lock — LMDB has no timeout for it.
  Result<LmdbTxn> begin_write();
  /// Open (and with `create`, create) a named database. REQUIRES: `txn` is the
  /// only transaction of this process that opens dbis (LMDB rule).
  Result<LmdbDbi> open_dbi(LmdbTxn& txn, const char* name, bool create);

  /// Double the map (capped at map_size_max). REQUIRES: no transaction of this
  /// process is open on another thread that could block on this one; waits
  /// for open ones to end. MapFull when already at the maximum.
  Status grow_map();
  /// mdb_reader_check under the slot lock: the number of stale reader slots cleared.
  Result<int> reader_check();
  /// Reader slots of lock.mdb that this process holds (open and kept read
  /// transactions), from mdb_reader_list.
  unsigned reader_slots_held();
  /// Reader slots reserved by this process (at open, plus any a nested read added).
  std::size_t read_slots_reserved();
  /// Flush committed data to disk (mdb_env_sync, forced). A failure marks the
  /// environment fatal.
  Status sync();

  bool fatal() const noexcept { return fatal_.load(); }
  /// Mark the environment fatal with a cause (first cause wins).
  void set_fatal(const Status& cause);
  /// The IOError every call returns once fatal.
  Status fatal_status() const;

  const std::string& path() const noexcept { return config_.path; }
  const Config& config() const noexcept { return config_; }
  std::uint64_t map_size() const noexcept { return map_size_.load(std::memory_order_relaxed); }
  std::uint64_t map_growths() const noexcept { return map_growths_.load(std::memory_order_relaxed); }
  /// The map is at map_size_max: this process never resizes it again, unless
  /// another process with a larger map_size_max grows the file past it
  /// (MDB_MAP_RESIZED, adopted with no transaction of this process open).
  bool map_at_max() const noexcept { return map_size() >= config_.map_size_max; }
  /// `p` points into the mapped data file (a view read in place).
  bool in_map(const void* p) const noexcept;
  /// Reads kept with LmdbTxn::hold and not yet ended.
  std::uint32_t held_reads() const noexcept { return held_reads_.load(std::memory_order_seq_cst); }
  /// DiskFull when data.mdb is at RLIMIT_FSIZE or the file system is full
  /// (explains an EIO that LMDB reports for a short write), else OK.
  Status short_write_cause() const;
  /// Bytes of the data file in use (last page number × page size).
  Result<std::uint64_t> used_bytes();

 private:
  friend class LmdbTxn;
  LmdbEnv(const Config& config, MDB_env* env, dev_t dev, ino_t ino) noexcept;
  Result<LmdbTxn> begin_write_txn();
  Status adopt_map_size();   // after MDB_MAP_RESIZED
  Status refuse_resize_if_held(const char* what) const;  // MapFull while held reads are counted
  Status check_meta_fits();  // Corruption when the meta page claims more pages than the map
  Status lock_writer();     // writer_mutex_, then the record lock on writer_fd_
  void unlock_writer() noexcept;
  Status lock_slots();      // slot_mutex_, then the record lock on byte 1 of writer_fd_
  void unlock_slots() noexcept;
  Status reserve_read_slots(std::size_t want);  // at open
  // A new reset read txn, its slot claimed under the map lock (shared) and then
  // the slot lock; `may_adopt`: adopt a grown map and retry (never while this
  // thread holds a read).
  Result<MDB_txn*> claim_slot(bool may_adopt);
  Result<std::size_t> acquire_read_slot();      // a kept txn (waits), or a new one for a nested read
  void end_read(MDB_txn* txn, std::size_t slot) noexcept;  // reset it and hand it back
  void replace_read_slot(std::size_t slot) noexcept;       // after a read txn's commit freed the slot
  void free_read_slots() noexcept;              // abort every kept txn (frees their slots)

  Config config_;
  MDB_env* env_;
  dev_t dev_;
  ino_t ino_;
  // Shared by every open transaction of this process; exclusive for resizes.
  std::shared_mutex map_mutex_;
  // Relaxed: statistics only, read for reporting; the map size itself is
  // changed under map_mutex_ exclusively.
  std::atomic<std::uint64_t> map_size_{0};
  std::atomic<std::uint64_t> map_growths_{0};
  // Reads kept without the map lock (LmdbTxn::hold). Changed by a thread that
  // holds the map lock shared or by the read's end; read under it exclusively.
  std::atomic<std::uint32_t> held_reads_{0};
  struct ReadSlot {
    MDB_txn* txn = nullptr;  // reset while free; nullptr after a failed replacement
    bool busy = false;
    std::thread::id owner;   // the thread using it, while busy
  };
  std::mutex read_pool_mutex_;
  std::condition_variable read_pool_cv_;
  ReadSlot read_slots_[kMaxReadSlots];  // GUARDED_BY(read_pool_mutex_)
  std::size_t read_slot_count_ = 0;     // GUARDED_BY(read_pool_mutex_)
  std::mutex slot_mutex_;               // the thread of this process holding the slot lock
  std::mutex writer_mutex_;  // the writing thread of this process
  int writer_fd_ = -1;       // writer.lock (byte 0: writers, byte 1: slots); -1 when it could not be opened
  std::atomic<bool> fatal_{false};
  mutable std::mutex fatal_mutex_;
  std::string fatal_cause_;  // GUARDED_BY(fatal_mutex_)
};

}  // namespace lanebus::detail

// ---------------------------------------------------------------- verify walk
// (`lanebus verify` and StoreOptions::verify_on_open; used by lib/ops/verify.cpp)

namespace lanebus::detail {

/// Page statistics of one database (LMDB's MDB_stat).
struct LmdbDbStat {
  std::uint64_t entries = 0;
  std::uint64_t depth = 0;
  std::uint64_t branch_pages = 0;
  std::uint64_t leaf_pages = 0;
  std::uint64_t overflow_pages = 0;
  std::uint64_t pages() const noexcept { return branch_pages + leaf_pages + overflow_pages; }
};

/// A read-only view of an environment for a full walk: its own LMDB handle
/// (outside the process registry, so it must not be used in a process that
/// has the same store open through LmdbEnv: run it in a child process) and one
/// read transaction held for the walk's life.
///
/// A structurally damaged file can make LMDB itself read outside the map
/// (SIGSEGV/SIGBUS): run the walk in a process that may die.
///
/// Thread safety: one thread at a time.
class LmdbWalk {
 public:
  /// Errors: NotFound (no data.mdb), Corruption (not an LMDB file), and the
  /// codes of LmdbEnv::open.
  static Result<std::unique_ptr<LmdbWalk>> open(const std::string& path);
  ~LmdbWalk();
  LmdbWalk(const LmdbWalk&) = delete;
  LmdbWalk& operator=(const LmdbWalk&) = delete;

  std::uint64_t page_size() const noexcept { return page_size_; }
  /// Pages the snapshot uses (last page number + 1), when the snapshot is the
  /// newest meta (else 0: a writer committed after the walk began).
  std::uint64_t pages_in_snapshot() const noexcept { return snapshot_pages_; }
  /// Statistics of the free-page database (FREE_DBI) and the main database.
  Result<LmdbDbStat> free_stat();
  Result<LmdbDbStat> main_stat();
  /// Visit every entry of the free-page database: `free_pages` = how many
  /// page numbers the entry lists; `bad` = a listed page number is beyond the
  /// snapshot (or the value is malformed).
  Status scan_freelist(const std::function<void(std::uint64_t txnid, std::uint64_t free_pages, bool bad)>& visit);
  /// The keys of the main database (named databases, and anything foreign).
  Result<std::vector<std::string>> main_keys();
  /// Open named database `name` (Corruption/Internal when it is not one).
  Result<LmdbDbStat> stat(const std::string& name);
  /// Visit every entry of named database `name` in key order until `visit`
  /// returns false.
  Status scan(const std::string& name, const std::function<bool(std::string_view, std::string_view)>& visit);

 private:
  LmdbWalk(std::string path, MDB_env* env) noexcept : path_(std::move(path)), env_(env) {}
  std::string path_;
  MDB_env* env_ = nullptr;
  MDB_txn* txn_ = nullptr;
  std::uint64_t page_size_ = 0;
  std::uint64_t snapshot_pages_ = 0;
  // The mapped file: a key or value of a damaged page may point outside it.
  const char* map_begin_ = nullptr;
  const char* map_end_ = nullptr;
  bool inside_map(const void* data, std::size_t size) const noexcept;
};

}  // namespace lanebus::detail
