// lanebus — MIT License.
// Counter snapshots, read from relaxed atomics without stopping the bus.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lanebus/dlq.hpp"
#include "lanebus/tenancy.hpp"

namespace lanebus {

/// End-to-end latency (message created_at → handler returned) as fixed
/// buckets. Bucket 0 holds [0, 1024) ns; above that each power of two
/// [2^e, 2^(e+1)), e = 10..41, is split into 4 equal sub-buckets (width at
/// most 25 % of the lower bound); the last bucket also takes anything larger
/// (~73 min and up). Recorded lock-free by the worker, without allocation.
struct LatencyHistogram {
  static constexpr std::uint32_t kBuckets = 1 + 32 * 4;
  std::vector<std::uint64_t> counts;  ///< kBuckets entries (empty when nothing was recorded).
  std::uint64_t count = 0;            ///< Sum of counts.
  std::uint64_t sum_ns = 0;           ///< Sum of recorded latencies.

  /// Exclusive upper bound of bucket i in ns (the last bucket: UINT64_MAX).
  static std::uint64_t upper_bound_ns(std::uint32_t i) noexcept {
    if (i == 0) return 1024;
    if (i >= kBuckets - 1) return ~0ull;
    const std::uint32_t e = 10 + (i - 1) / 4, sub = (i - 1) % 4;
    return (1ull << e) + (static_cast<std::uint64_t>(sub) + 1) * (1ull << (e - 2));
  }
  /// The upper bound of the bucket holding quantile q (0..1); 0 when empty.
  std::uint64_t quantile_ns(double q) const noexcept {
    if (count == 0) return 0;
    std::uint64_t rank = static_cast<std::uint64_t>(q * static_cast<double>(count));
    if (rank >= count) rank = count - 1;
    std::uint64_t seen = 0;
    for (std::uint32_t i = 0; i < counts.size(); ++i) {
      seen += counts[i];
      if (seen > rank) return upper_bound_ns(i);
    }
    return upper_bound_ns(kBuckets - 1);
  }
};

/// Counters of one consumer group in one lane (or summed over lanes).
/// Each value is read with a relaxed load: a snapshot taken while the bus runs
/// is approximate across counters but every counter only ever grows (except
/// in_flight, a gauge).
struct LaneCounters {
  std::uint64_t delivered = 0;  ///< Handler calls (every attempt counts).
  std::uint64_t acked = 0;      ///< Messages the handler acked.
  std::uint64_t retried = 0;    ///< retry outcomes and caught handler exceptions.
  std::uint64_t rejected = 0;   ///< reject outcomes.
  std::uint64_t failed = 0;     ///< Messages that used up max_attempts.
  std::uint64_t timed_out = 0;  ///< Calls that overran attempt_timeout and then failed.
  std::uint64_t stuck = 0;      ///< Calls seen still running past attempt_timeout (counted once per call).
  std::uint64_t stuck_now = 0;  ///< Gauge: handler calls of this lane running past attempt_timeout now (0 or 1).
  std::uint64_t set_aside = 0;  ///< Gauge: messages held back by key_parallel_retry (in backoff or behind one).
  std::uint64_t duplicates_skipped = 0;  ///< Idempotency key already done: acked without the handler.
  std::uint64_t dropped = 0;    ///< Discarded by DropOldest backpressure, or with no consumer.
  std::uint64_t expired = 0;    ///< Messages whose TTL ended before their handler started (never delivered).
  std::uint64_t skipped = 0;    ///< Durable: messages deleted by retention before the group read them.
  std::uint64_t in_flight = 0;  ///< Gauge: queued for the group in this lane (ephemeral), or
                                ///< stored and not yet consumed (durable: lag in messages).
  /// Gauges of durable queues, read from the store (any process's claims): messages claimed and not
  /// yet acked, and of those the claims past their deadline (a consumer died with them, or a handler
  /// overran attempt_timeout and its claim was ended). 0 for other lanes.
  std::uint64_t claimed = 0;
  std::uint64_t overdue = 0;
};

struct GroupStats {
  std::string name{};
  /// Wall-clock created_at (ns since the epoch) of the oldest message the
  /// group has not finished, over all lanes; 0 when none is known. Ephemeral
  /// topics: the head of each lane; durable: the message at the committed offset.
  std::int64_t oldest_unprocessed_ns = 0;
  LatencyHistogram latency;         ///< created_at → handler done, all lanes.
  std::uint32_t consumers = 0;      ///< Subscriptions currently attached.
  LaneCounters total;               ///< Sum over lanes.
  std::vector<LaneCounters> lanes;  ///< Indexed by lane.
  // Outage pause (GroupOptions::outage). `lanebus stats` reads a durable
  // group's pause from the store (the counters stay 0 there).
  bool paused = false;               ///< Paused through a dependency outage now.
  std::int64_t paused_since_ns = 0;  ///< Wall clock the pause began (0 = not paused).
  std::string pause_reason{};        ///< What tripped it, e.g. "20 transient failures of 4 keys within 10000 ms".
  std::string pause_last_error{};    ///< The last transient failure's reason (also kept after a resume).
  std::uint64_t pauses = 0;          ///< Times the group was paused.
  std::uint64_t probes = 0;          ///< Probe messages delivered while paused.
};

struct TopicStats {
  std::string name{};
  bool is_queue = false;
  bool durable = false;
  std::uint32_t lanes = 0;
  std::uint64_t published = 0;                ///< Messages accepted by publish.
  std::uint64_t unrouted = 0;                 ///< Accepted while the topic had no group.
  std::uint64_t publish_refused = 0;          ///< WouldBlock / TimedOut results.
  std::uint64_t slots_in_use = 0;             ///< Gauge: pooled message slots held (ephemeral; 0 when idle).
  std::vector<std::uint64_t> lane_published;  ///< Per-lane load: a hot key shows as one big lane.
  std::vector<GroupStats> groups;
};

/// Connection state of a Bridge (bridge.hpp).
enum class BridgeState : std::uint8_t {
  Connected,  ///< Connected to a server; mirrors flow.
  Retrying,   ///< No server reachable now (down at start, or lost): reconnecting with backoff.
  Failed,     ///< Stopped by an error that retrying cannot fix (authorization, missing stream); see last_error.
};

/// One mirror of a Bridge: "out" (topic -> stream) or "in" (stream -> topic).
struct BridgeMirrorStats {
  std::string direction{};  ///< "out" or "in".
  std::string topic{};      ///< Local topic.
  std::string stream{};     ///< JetStream stream.
  std::string via{};        ///< out: subject template; in: durable consumer name.
  std::uint64_t published = 0;    ///< out: publishes sent (re-sends included).
  std::uint64_t acked = 0;        ///< out: PubAcks received; in: messages acked to JetStream.
  std::uint64_t duplicates = 0;   ///< out: PubAcks flagged duplicate (re-sends the server removed);
                                  ///< in: redeliveries that were already stored (not stored again).
  std::uint64_t redelivered = 0;  ///< in: messages JetStream delivered more than once.
  std::uint64_t stored = 0;       ///< in: messages appended to the local topic.
  std::uint64_t dead_lettered = 0;  ///< out: messages sent to the DLQ (too large for the server).
  std::uint64_t lag = 0;          ///< out: stored and not yet acked by JetStream; in: pending in the consumer.
  std::uint64_t rewinds = 0;      ///< in: consumer re-created at the first un-stored sequence to keep
                                  ///< sequence order (after a bridge crash or a lost delivery; doc/bridge.md).
};

/// A Bridge's state and counters (Bridge::stats, BusStats::bridges).
struct BridgeStats {
  std::string name{};
  BridgeState state = BridgeState::Retrying;
  std::string last_error{};       ///< The last failure seen ("" = none yet).
  std::int64_t last_error_ns = 0;  ///< Wall clock of last_error.
  std::uint64_t reconnects = 0;   ///< Connections re-established after a loss.
  BridgeMirrorStats total{};      ///< Counters summed over mirrors (direction "").
  std::vector<BridgeMirrorStats> mirrors{};
  // A bridge's status record read from the store by another process
  // (`lanebus stats`, `lanebus serve`; doc/bridge.md). All 0 in a live
  // Bridge::stats().
  std::int64_t status_written_ns = 0;   ///< Wall clock the bridge last wrote its record.
  std::int64_t status_interval_ms = 0;  ///< How often it writes it (and at each state change).
  std::uint32_t status_pid = 0;         ///< The bridge's process.
  bool stopped = false;  ///< The bridge closed cleanly: these are its last state and counters.
  bool stale = false;    ///< Not stopped and not rewritten for 3 intervals (at least 5 s): the
                         ///< process died or hangs; state is only the last one it wrote.
};

/// Name of a BridgeState: "connected", "retrying", "failed".
inline const char* to_string(BridgeState s) noexcept {
  return s == BridgeState::Connected ? "connected" : s == BridgeState::Retrying ? "retrying" : "failed";
}

/// A group that read a deprecated field since its deprecation, or whose
/// contract (GroupOptions::reads) declares it (doc/schemas.md).
struct DeprecatedFieldReader {
  std::string group{};
  std::uint64_t reads = 0;         ///< Audited reads since the deprecation (flushed counts, day buckets).
  std::int64_t last_read_ns = 0;   ///< Wall clock of the last flushed read; 0 = none since the deprecation.
  bool contract_declares = false;  ///< Flagged: the group's live contract still declares the field.
};

/// A deprecated field of a typed topic and who still reads it (Schemas::deprecate).
struct DeprecatedField {
  std::string topic{};
  std::string field{};
  std::string replacement{};        ///< "" = none
  std::int64_t since_ns = 0;        ///< When it was deprecated.
  std::int64_t window_ends_ns = 0;  ///< Removal is refused before this.
  std::vector<DeprecatedFieldReader> readers{};  ///< By group name.
};

/// The commits of this process's store writer since the store was opened
/// (durable topics and queues share one writer per bus; group commit,
/// doc/durable.md). Divide a time by `commits` for the average commit: in
/// Sync mode most of it is the device's flushes, which is what a durable
/// publish waits for.
struct StoreWriteStats {
  std::uint64_t commits = 0;     ///< Write transactions committed.
  std::uint64_t operations = 0;  ///< Appends, claims, acks, offset commits... in them (operations / commits = batch).
  std::uint64_t appends = 0;     ///< Messages appended.
  std::uint64_t fsyncs = 0;      ///< Sync-mode commits plus async-mode flushes.
  /// Time from each transaction's begin to its commit's return, summed.
  std::uint64_t commit_ns = 0;
  /// Of commit_ns, the time in LMDB's commit call: writing the pages and, in
  /// Sync mode, flushing them and the meta page to the device.
  std::uint64_t commit_write_ns = 0;
  /// The longest wait for LMDB's writer lock (another process writing).
  std::uint64_t max_write_lock_wait_ns = 0;
};

struct BusStats {
  std::string name{};
  std::uint32_t workers = 0;
  /// This process's store writer (commits, their batch and their time):
  /// valid when store_available (a bus with a store, not read-only).
  bool store_available = false;
  StoreWriteStats store;
  /// The store's dead-letter queue (depth, oldest pending age, arrivals per
  /// class, ...): valid when dlq_available (a bus with a store).
  bool dlq_available = false;
  DlqCounters dlq;
  std::vector<TopicStats> topics;
  /// Open bridges (bridge.hpp) of this bus, in the order they were opened.
  std::vector<BridgeStats> bridges;
  /// Every namespace (declared and implicit) with its policy and usage (tenancy.hpp).
  std::vector<NamespaceInfo> namespaces;
  /// Deprecated fields of typed topics (the schema registry) and their readers.
  std::vector<DeprecatedField> deprecated_fields;
  /// Non-empty when the bus's store is unusable (a failed write or fsync made
  /// LMDB's environment fatal): the error every store call now returns.
  std::string store_error{};
};

}  // namespace lanebus
