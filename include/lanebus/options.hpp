// lanebus — MIT License.
// Plain option structs with documented defaults: BusOptions, TopicOptions, GroupOptions.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lanebus/dlq.hpp"
#include "lanebus/durable.hpp"
#include "lanebus/log.hpp"
#include "lanebus/trace.hpp"

namespace lanebus {

class LeaseTable;

/// What publish does when a topic has no free message slot (doc/topics.md).
enum class Backpressure : std::uint8_t {
  /// Wait up to TopicOptions::block_timeout for room, then fail with TimedOut.
  Block,
  /// Fail at once with WouldBlock.
  FailFast,
  /// Make room by discarding the oldest undelivered message of the lanes
  /// (counted per group and lane as `dropped`). For telemetry-like topics.
  DropOldest,
};

/// Per topic or queue. Fixed at creation; creating the same name again with a
/// different lane count or kind is a Conflict.
struct TopicOptions {
  // ---- behaviour ----
  /// Number of lanes (ordered sub-streams). 1..4096. Default 8. Fixed forever:
  /// changing it would remap keys and break per-key order.
  std::uint32_t lanes = 8;
  /// What publish does when the topic is full. Default Block.
  Backpressure backpressure = Backpressure::Block;
  /// Longest a blocking publish waits for room. Default 1 s.
  std::chrono::milliseconds block_timeout{1000};

  // ---- memory (bounded; allocated once at creation) ----
  /// Messages the topic can hold in memory at once (published but not yet
  /// handled by every group). Rounded up to a power of two. Default 4096.
  std::uint32_t capacity = 4096;
  /// Bytes per message slot for key + idempotency key + payload. A message
  /// that does not fit is refused with PayloadTooLarge. Default 256.
  std::uint32_t slot_bytes = 256;
  /// Largest payload (bytes) a publish accepts (doc/topics.md "Payload
  /// sizes"). In-memory topics keep a message whose key + idempotency key +
  /// payload fit slot_bytes in its slot and take a larger payload from a
  /// size-classed block of the bus's payload pool (BusOptions::memory_budget;
  /// the slot then holds the keys and a 12-byte block reference); no block
  /// free means the topic's backpressure applies, as for a full topic.
  /// Durable topics store the payload in LMDB. Past it: PayloadTooLarge,
  /// naming this option. 1..16 MiB for in-memory topics, 1..64 MiB for
  /// durable ones. Default 1 MiB.
  std::uint32_t max_payload = 1u << 20;
  /// Most consumer groups the topic can have at once. Default 16.
  std::uint32_t max_groups = 16;
  /// Expiry of every message published without OutgoingMessage::ttl
  /// (doc/delays.md). 0 = none (the default); negative or over 100 years:
  /// InvalidArgument at creation.
  std::chrono::nanoseconds default_ttl{0};

  // ---- durability (doc/durable.md) ----
  /// Store every message in the bus's LMDB store (BusOptions::store) before
  /// publish reports success. Requires a bus opened with a store directory.
  /// capacity, slot_bytes and backpressure do not apply (the store's
  /// max_pending bounds queued appends). Default false (ephemeral).
  bool durable = false;
  /// Retention of a durable topic's log (age, bytes, count per lane; 0 = keep).
  RetentionOptions retention{};
  /// Fence the durable topic by this lease name (doc/leases.md), "" = not fenced.
  /// Every publish must then carry OutgoingMessage::fencing_token: a token
  /// below the topic's high-water is refused with StaleToken; an equal one is
  /// accepted (a repeat of an idempotency key in the same generation is
  /// dropped and reported OK); a higher one is a generation barrier, accepted
  /// only if BusOptions::lease_table confirms it granted that token for the
  /// lease (else FenceViolation, fence unchanged). Fixed at creation.
  std::string fence{};
  /// false: one high-water for the whole topic, fenced by lease `fence`.
  /// true: lane i has its own, fenced by lease "<fence>/slot-<i>" (the names
  /// LeaseTable::acquire_any_slot hands out).
  bool fence_per_lane = false;
};

/// Per consumer group (topic subscription) or queue consumer set.
/// Outage pause, a circuit breaker per consumer group (GroupOptions::outage,
/// doc/retries.md "Outage pause"). Off by default. When transient failures
/// (retry outcomes, handler exceptions) of the group reach `threshold` within
/// `window`, from at least `distinct_keys` different keys (keyless messages
/// count one key each) and with no ack in between, the group is *paused*:
/// - no attempt made while paused counts against max_attempts and nothing goes
///   to the DLQ for a transient failure (the failed message stays at the head
///   of its lane, uncounted);
/// - one probe message is delivered per backoff interval (probe_initial,
///   doubling, capped at probe_max); its ack (or any ack) resumes the group;
/// - a message that is about to use up its attempts while the window already
///   holds failures of `distinct_keys` keys trips the breaker too, so an
///   outage never dead-letters the first messages it hits.
/// A lone failing message among acked neighbours (every ack empties the
/// window) is still retried and dead-lettered as without the option; rejects
/// (permanent) go to the DLQ at once, paused or not. Bus::resume and
/// `lanebus resume` end a pause by hand. A durable group's pause is recorded
/// in the store: a process that restarts (or `kill -9`) comes back paused.
/// The breaker's window is a fixed ring inside the group: no allocation per
/// message. Groups with the option on do not take the plain fast path.
struct OutageOptions {
  bool enabled = false;
  /// Transient failures within `window` that pause the group. 1..256. Default 20.
  std::uint32_t threshold = 20;
  /// ... from at least this many different keys. 1..256, <= threshold. Default 3.
  std::uint32_t distinct_keys = 3;
  /// How far back failures count. Default 10 s.
  std::chrono::milliseconds window{10000};
  /// First wait before a probe; doubles after each failed probe. Default 500 ms.
  std::chrono::milliseconds probe_initial{500};
  /// Cap of the probe wait. Default 30 s.
  std::chrono::milliseconds probe_max{30000};
};

struct GroupOptions {
  // ---- retry policy (doc/retries.md) ----
  /// Deliveries of one message before it counts as failed (retry outcomes and
  /// handler exceptions both use attempts). Default 3. Minimum 1.
  std::uint32_t max_attempts = 3;
  /// Wait before redelivering after a retry outcome or a handler exception:
  /// backoff_initial × backoff_multiplier^(attempt−1), capped at backoff_max,
  /// then spread by ±backoff_jitter (a fraction) at random. While it waits the
  /// message stays at the head of its lane (later messages of the lane wait
  /// too: per-key order); other lanes keep flowing. Default 0 = at once.
  std::chrono::milliseconds backoff_initial{0};
  /// Cap of the backoff. Default 30 s.
  std::chrono::milliseconds backoff_max{30000};
  /// Growth per attempt, >= 1. Default 2.
  double backoff_multiplier = 2.0;
  /// Random spread, 0..1. Default 0.2 (±20 %).
  double backoff_jitter = 0.2;
  /// Time budget of one handler call, shown to the handler as
  /// MessageView::deadline_ns(). Handlers cannot be pre-empted (a thread
  /// cannot be stopped safely), so the budget is enforced as far as a thread
  /// allows:
  /// - a call still running past it is counted as `stuck` (LaneCounters),
  ///   shown while it runs (`stuck_now`), in the exports and `lanebus stats`,
  ///   and named by the SLA report; the other lanes keep flowing on the other
  ///   workers;
  /// - on a durable queue the watchdog then ends the call's claim, so
  ///   another consumer process may take the message (`lanebus stats` shows
  ///   the claim as overdue until then); if nobody took it by the time the
  ///   call returns, its outcome still commits, else the late ack finds the
  ///   claim gone and the rest of its claimed batch goes back to the queue;
  /// - a call that overruns it and then returns retry (or throws) is counted
  ///   as timed_out; an ack or reject after the deadline is honoured on
  ///   ephemeral lanes and durable topics (the work was done);
  /// - shutdown reports the group and lane of a handler that held it up.
  /// Default 0 = no budget.
  std::chrono::milliseconds attempt_timeout{0};
  /// Outage pause (circuit breaker) of the group: see OutageOptions. Default off.
  OutageOptions outage{};
  /// Dead-letter messages whose TTL ended before their handler started
  /// (OutgoingMessage::ttl) with ErrorClass::Expired (doc/delays.md). They
  /// are counted as `expired` either way. Needs a bus with a store (DLQ).
  /// Default false.
  bool dead_letter_expired = false;

  /// Per-key retry without head-of-line blocking (doc/retries.md). false (default):
  /// a message waiting out its retry backoff holds back its whole lane.
  /// true: it holds back only the later messages of its own key; the other
  /// keys of the lane keep flowing. The held key's later messages are set
  /// aside in order (per-key order is unchanged) and delivered after it.
  /// Works the same on ephemeral lanes, durable topics and durable queues.
  bool key_parallel_retry = false;
  /// With key_parallel_retry: the most messages one lane sets aside (messages
  /// in backoff plus the later messages of their keys). When it is reached
  /// the lane waits for the oldest backoff, as without key_parallel_retry, so
  /// memory stays bounded. 1..65536. Default 256.
  std::uint32_t key_parallel_limit = 256;

  /// Most messages a worker handles from one lane before it lets other lanes
  /// run (fairness between lanes). Default 64.
  std::uint32_t batch = 64;

  /// Batch handlers (Bus::subscribe_batch): the most messages of one lane in
  /// one call. 1..1024. Default 64. Spans reach this size on groups without
  /// idempotency scope, key_parallel_retry, attempt_timeout, the outage
  /// breaker or a tracer, on in-memory topics without DropOldest and on
  /// durable topics and queues (doc/durable.md); elsewhere each call carries
  /// one message.
  std::uint32_t batch_max = 64;

  /// Idempotency scope (Bus::idempotency) of the group, or empty for none.
  /// With a scope, a message that carries an idempotency key is claimed in
  /// the scope before its handler runs: a key already done is acked without
  /// calling the handler (counted as duplicates_skipped); a key another
  /// consumer is working on is retried later; an ack completes the key (for
  /// durable queues in the same transaction as the ack); a retry, reject or
  /// failure releases it. Messages without a key are handled normally.
  /// Needs a bus with a store. Default empty.
  std::string idempotency_scope{};

  // ---- durable topics and queues only ----
  /// Where a new durable group starts (an existing group resumes from its
  /// committed offsets). Default: the earliest retained message.
  StartPosition start{};
  /// Durable queues: how long a delivered message stays claimed before it is
  /// redelivered (to any consumer, in any process) if not acked. Default 30 s.
  /// The claim may be made in the commit that appended the message, before
  /// the handler is called (doc/durable.md, "Claims in the append's
  /// transaction"): a process killed in between leaves it to expire after
  /// this long, with its attempt counted; a clean close or shutdown gives
  /// such claims back at once, uncounted.
  std::chrono::milliseconds visibility{30000};

  // ---- typed topics (doc/schemas.md) ----
  /// The consumer contract: the schema fields this group reads. Stored with
  /// the group in the registry at subscribe, seen by every process; a schema
  /// version that removes or incompatibly retypes a declared field is refused,
  /// and so is removing a deprecated field a contract still declares.
  /// Default empty: no contract (an earlier contract of the group stays).
  std::vector<std::string> reads{};
};

/// A namespace kept in a store of its own (doc/tenancy.md "Moving a namespace").
struct NamespaceStore {
  /// The namespace (a valid name). Every name it covers segment-wise (unless
  /// a longer mapped namespace covers it) lives in `directory`.
  std::string name{};
  /// Its store directory; the other store settings are BusOptions::store's.
  std::string directory{};
};

/// Per Bus.
struct BusOptions {
  /// A name used in error messages and stats. Default "bus".
  std::string name = "bus";
  /// Worker threads that run handlers. 0 = std::thread::hardware_concurrency().
  std::size_t workers = 0;
  /// How long an idle worker spins looking for work before it parks (sleeps
  /// on a semaphore, burning no CPU), and how long a worker lingers on an
  /// in-memory lane it just emptied while no other lane waits (at least
  /// 1 µs). Default 50 µs. 0 = park at once. With as many workers as CPUs
  /// or more (the default), a spinning worker yields its CPU every 64 spins,
  /// so that publishers sharing a CPU with it are not starved, and a worker
  /// lingering on a lane stops after 64 spins (another worker may then take
  /// the lane while this one is off its CPU). Closing a subscription ends a
  /// linger on its lanes at once.
  std::chrono::nanoseconds spin{50'000};
  /// Default for how long the Bus destructor lets pending messages drain
  /// before abandoning them. Default 5 s.
  std::chrono::milliseconds close_timeout{5000};
  /// Record end-to-end latency histograms and the age of the oldest
  /// unprocessed message per group and lane (doc/observability.md). Costs one clock read
  /// and a few relaxed stores per message. Default true.
  bool metrics = true;
  /// Most topics and queues the bus can hold. Default 1024.
  std::uint32_t max_topics = 1024;
  /// Most consumers (subscriptions) one group can have at once. Default 64.
  std::uint32_t max_consumers_per_group = 64;
  /// Bytes reserved at open for in-memory payloads that do not fit their
  /// topic's slot (TopicOptions::max_payload), shared by every in-memory
  /// topic of the bus. Split evenly over 8 size classes of 1 KiB × 4^i
  /// (1 KiB .. 16 MiB): a class gets memory_budget / 8 / its size blocks, 0
  /// if its share is below one block; a payload takes the smallest free block
  /// that holds it. Mapped with mmap, so pages cost memory only once used.
  /// Default 64 MiB (8 MiB per class: 8192 blocks of 1 KiB ... two of 4 MiB,
  /// none of 16 MiB). 0 = none: in-memory payloads must fit their slot.
  /// At most 1 TiB (else InvalidArgument).
  std::size_t memory_budget = std::size_t{64} << 20;

  // ---- durable store (doc/durable.md) ----
  /// The LMDB store for durable topics and queues. An empty
  /// store.directory (the default) means an in-memory bus: creating a durable
  /// topic then fails with InvalidArgument.
  StoreOptions store{};
  /// The lease table that confirms generation barriers of fenced topics
  /// (TopicOptions::fence). Must outlive the Bus. nullptr: every barrier is
  /// refused with FenceViolation. Default nullptr.
  LeaseTable* lease_table = nullptr;
  /// The dead-letter queue kept in the store (doc/dlq.md): where messages go
  /// that were rejected or used up max_attempts (or crashed their consumer
  /// poison_after_crashes times), its retention, quota and the cool-down of
  /// automatic transient replay. Without a store, failures are only counted.
  DlqOptions dlq{};
  /// How often the bus looks for messages appended by other processes and for
  /// expired queue claims to redeliver. Appends by this process wake consumers
  /// at once, and so do other processes' (StoreOptions::wake_on_commit): this
  /// poll is then the fallback, which bounds the delay of a lost wake-up.
  /// Default 50 ms.
  std::chrono::milliseconds durable_poll{50};

  // ---- tenancy (include/lanebus/tenancy.hpp, doc/tenancy.md) ----
  /// Deny by default: a Client (Bus::client) may do only what its
  /// credential's grants allow. Off (the default): Clients are not checked.
  /// The Bus handle is never checked. Quotas and usage apply either way.
  bool access_control = false;
  /// Namespaces whose durable topics and queues, DLQ entries, idempotency
  /// scopes and user tables live in a store of their own, e.g. after
  /// `lanebus namespace move` (doc/tenancy.md "Moving a namespace"). Client
  /// code keeps the same names: Bus::create_topic, create_queue, find,
  /// subscribe, consume, seek, idempotency and table_get route by name. Each
  /// mapped store is run by an inner bus with these options (own workers,
  /// own DLQ and namespace policies). Default empty: one store.
  std::vector<NamespaceStore> namespace_stores{};

  // ---- operations (doc/observability.md "Log hook") ----
  /// Where the library reports the events an operator needs: a store that
  /// fails to commit or sync, a bridge that connects, loses its server or
  /// rewinds, an idempotency claim taken over from a dead process, a handler
  /// stuck past attempt_timeout, a DLQ entry refused by its quota, a
  /// namespace at its publish quota ceiling. Called only on those rare events,
  /// never on the publish or delivery path; see LogHook (lanebus/log.hpp) for
  /// the threads it runs on and what it may do. Inner buses of
  /// namespace_stores use the same hook (their lines name the bus
  /// "<name>/<namespace>"). Must stay callable until the Bus is destroyed.
  /// Default empty: silent.
  LogHook log{};
  /// The tracing hook (lanebus/trace.hpp, doc/tracing.md): told of the start
  /// and end of every publish and every handler call, with topic, group, lane,
  /// attempt and outcome; its span contexts travel in the messages'
  /// `traceparent` headers. Must outlive the Bus. With a tracer, in-memory
  /// lanes take the general delivery loop instead of the plain fast path.
  /// Default nullptr: no tracer (a null check per publish and per lane run);
  /// trace context in headers is carried either way.
  Tracer* tracer = nullptr;
};

}  // namespace lanebus
