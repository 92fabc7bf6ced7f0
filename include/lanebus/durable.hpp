// lanebus — MIT License.
// Options of the durable layer (doc/durable.md): where and how messages are stored in
// LMDB, how long they are kept, and where a consumer group starts reading.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace lanebus {

// Reading in place (zero-copy delivery, doc/durable.md "Reading in place"):
// a batch handler (Bus::subscribe_batch) of a durable topic receives
// MessageViews whose key, idempotency key, payload and headers point into
// LMDB's memory-mapped data file. A view lives for the handler call: the bus
// holds the read transaction that keeps those pages from call start to
// return, and ends it before the next call. Copy whatever must outlive the
// call (the bus itself copies the messages a handler did not ack, for their
// retry). While the call runs, the handler may publish, acknowledge and read
// as anywhere else; the views stay valid across those writes (LMDB's
// copy-on-write pages), because the store reserves map_size_max of address
// space at open and so never moves the map. A held read pins the pages it
// sees and one of the process's reserved reader slots: a handler that runs
// for minutes keeps the file from reusing the space freed meanwhile.

/// What "publish returned OK" means for a durable topic or queue.
///
/// Both modes commit every message in an LMDB write transaction before the
/// publish completes, and many publishers share one transaction (group commit).
enum class Durability : std::uint8_t {
  /// The commit is fsynced (LMDB's default: fdatasync of the data pages, then
  /// the meta page through an O_DSYNC descriptor) before publish completes.
  /// A `kill -9` or a power loss after OK loses nothing (atomic-sector storage
  /// assumed, see doc/storage-format.md). Many concurrent publishers share one
  /// fsync.
  Sync,
  /// The commit is written with MDB_NOSYNC and flushed every
  /// StoreOptions::async_flush_interval. A process crash (`kill -9`) loses
  /// nothing that completed (the page cache survives it); a power loss or OS
  /// crash may lose up to the last interval, and leaves the store intact only
  /// on a file system that keeps the order of writes (LMDB's MDB_NOSYNC
  /// caveat; on a disk that reorders them a power loss can leave the store
  /// Corruption — see doc/power-loss.md). NOT durable in the at-least-once
  /// sense: label it so to your users.
  Async,
};

/// Per bus directory (one LMDB environment). Plain struct; every field has a
/// default.
struct StoreOptions {
  // ---- behaviour ----
  /// The store's directory. Created (mode 0700, parents must exist) if it is
  /// missing; the LMDB files in it are created with mode 0600. Must be on a
  /// local file system (NFS/CIFS are refused: LMDB's locks do not work there).
  std::string directory{};
  /// Durability of publishes and of acknowledgements/offset commits. Default Sync.
  Durability durability = Durability::Sync;
  /// Open the store read-only (the CLI's inspect mode). No file is created,
  /// no writer thread runs, and every mutating call returns InvalidArgument.
  /// Works on a store that another process has open read-write. Default false.
  bool read_only = false;
  /// Walk the whole store before opening it (every LMDB page and every
  /// record: the check `lanebus verify` runs, see doc/storage-format.md
  /// "Verification"), in a forked child process, so that a page LMDB cannot
  /// read kills the child and not this process. Damage makes the open fail
  /// with Corruption and a message naming the first problem. Costs one read
  /// of the whole data file per open; for stores whose files may have been
  /// damaged or come from elsewhere. The child only reads and then _exits; it
  /// runs no code of the application. Default false.
  bool verify_on_open = false;

  // ---- capacity ----
  /// The map a process starts with only where the OS refuses to reserve
  /// map_size_max of address space (RLIMIT_AS, a 32-bit process); the map
  /// then doubles, up to map_size_max, each time a write hits MDB_MAP_FULL.
  /// Default 64 MiB.
  std::uint64_t map_size_initial = 64ull << 20;
  /// The largest the data file may grow. The store maps this much address
  /// space when it opens (the file itself grows only as data is written), so
  /// the map never moves while a handler holds views into it (durable
  /// handlers read in place, doc/durable.md "Reading in place"). Beyond it
  /// appends fail with MapFull and nothing already acknowledged is lost.
  /// Default 16 GiB. Must be >= map_size_initial. Give every process that
  /// opens the directory the same value: a process whose file another one has
  /// grown past its own map adopts the larger map only once none of its reads
  /// is open.
  std::uint64_t map_size_max = 16ull << 30;
  /// LMDB reader slots shared by every process that opens the directory; each
  /// read call holds one slot for its duration. Default 126 (LMDB's default).
  /// Only the first process to open the environment sets it.
  unsigned max_readers = 126;

  // ---- performance ----
  /// How often async mode flushes committed transactions to disk
  /// (mdb_env_sync). Unused in Sync mode. Default 100 ms.
  std::chrono::milliseconds async_flush_interval{100};
  /// Most operations (appends, offset commits, claims, ...) the writer thread
  /// puts in one write transaction. Default 4096.
  std::uint32_t max_batch = 4096;
  /// Most operations queued for the writer at once; an append beyond it waits
  /// for room (the writer is always making progress or failing every queued
  /// operation). Default 65536.
  std::uint32_t max_pending = 65536;
  /// Period of the housekeeping done by the writer thread between batches:
  /// mdb_reader_check (clears reader slots of dead processes) and retention.
  /// Default 1 s.
  std::chrono::milliseconds maintenance_interval{1000};
  /// Most log records retention deletes in one write transaction, so a large
  /// deletion never holds the writer (and the publishers queued behind it) for
  /// long. Default 2048.
  std::uint32_t retention_batch = 2048;
  /// Wake the durable consumers of other processes after each commit that
  /// appended, and be woken by theirs: a futex word per process in
  /// `wake.shm` in the store's directory (doc/durable.md, "Multi-process").
  /// Costs the writer one atomic add per process that has the store open and
  /// a system call per sleeping one; nothing is locked, so a process killed
  /// or frozen never holds the others up (they fall back to the poll,
  /// BusOptions::durable_poll, which stays as the safety net). false: this
  /// process neither wakes nor is woken; other processes' appends reach its
  /// consumers by the poll alone. Ignored when read_only. Default true.
  bool wake_on_commit = true;
};

/// Retention of a durable topic's or queue's log, applied in the background
/// regardless of consumption (Kafka-like): a group behind the retention point
/// continues from the earliest retained offset and the skip is counted. Each
/// limit applies per lane; 0 means no limit. A message is deleted when any
/// limit says so. Retention may be changed when the topic is reopened.
struct RetentionOptions {
  /// Delete messages whose timestamp (see doc/storage-format.md: the running
  /// maximum of created_at in the lane) is older than this. Default 0 = keep.
  std::chrono::milliseconds max_age{0};
  /// Keep at most this many bytes of stored records per lane. Default 0 = no limit.
  std::uint64_t max_bytes = 0;
  /// Keep at most this many messages per lane. Default 0 = no limit.
  std::uint64_t max_count = 0;
};

/// Where a new consumer group starts in each lane (an existing group resumes
/// from its committed offsets; seek moves it explicitly).
enum class StartFrom : std::uint8_t {
  /// The earliest retained message (replay everything kept).
  Earliest,
  /// The end of the log: only messages appended after the group is created.
  Latest,
  /// StartPosition::offset in every lane (clamped to [earliest, end]).
  Offset,
  /// The first message whose timestamp is at or after
  /// StartPosition::timestamp_ns, in every lane (end of lane if none).
  Timestamp,
};

/// A starting point for a consumer group. Plain struct.
struct StartPosition {
  StartFrom from = StartFrom::Earliest;
  /// Used with StartFrom::Offset.
  std::uint64_t offset = 0;
  /// Used with StartFrom::Timestamp: nanoseconds since the Unix epoch.
  std::int64_t timestamp_ns = 0;

  static StartPosition earliest() noexcept { return {}; }
  static StartPosition latest() noexcept { return {StartFrom::Latest, 0, 0}; }
  static StartPosition at_offset(std::uint64_t o) noexcept { return {StartFrom::Offset, o, 0}; }
  static StartPosition at_time(std::int64_t ns) noexcept { return {StartFrom::Timestamp, 0, ns}; }
};

}  // namespace lanebus
