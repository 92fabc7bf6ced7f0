// lanebus — MIT License.
// BusCore and the objects it owns: topics, groups, per-(group, lane) state,
// consumers and the worker pool.
//
// Design notes
// - Data path: publish copies the message into a pooled Slot of its topic, sets
//   refs = 1 (the publisher's guard), and for each active group adds a ref and
//   pushes the slot index into that group's LaneRing for the message's lane;
//   then it schedules the lane (below) and drops its guard.
// - Scheduling: a GroupLane is "scheduled" from the moment a publisher (or a
//   worker) sets its flag until the worker that ran it clears the flag. Only
//   whoever flips the flag false→true pushes the lane onto the run queue, so a
//   lane is queued at most once and runs on at most one worker at a time.
// - Lost-wakeup freedom (Dekker): the publisher makes its ring entry visible
//   (seq_cst store) and then reads the flag (seq_cst exchange); the worker
//   clears the flag (seq_cst store) and then checks the ring (seq_cst loads).
//   One of the two must see the other's write, so a message never sits in a
//   ring whose lane is not scheduled.
// - Fair sharing: the run queue (fair_queue.hpp) keeps the queued lanes per
//   namespace (NamespaceState::sched) and hands workers the lane of the
//   namespace furthest behind its weighted share of run time; the worker
//   charges the lane's run time to that namespace. Which lane runs next
//   changes, nothing else: a lane is still queued at most once and run by one
//   worker at a time, and per-key order lives in its ring.
// - Consumers: a worker "pins" one consumer of the group for a batch
//   (calls += 1, then re-checks enabled; close() clears enabled, then waits for
//   calls == 0). Hence no handler call starts after close() returns.
// - Memory: everything (slots, rings, groups, consumer tables) is allocated
//   when a topic or group is created; the hot path never allocates.
//
// - Durable topics and queues (doc/durable.md) do not use slots or rings: publish
//   appends to the DurableStore (group commit on its writer thread); the
//   store's append listener, and a poller for other processes' appends and
//   expired queue claims, schedule the durable GroupLanes; a worker running
//   one reads a batch from the log at the lane's position (topics) or claims
//   messages (queues), calls the handler, and commits offsets / acks.
//
// - Solo publishers (doc/performance.md): a topic published to through one
//   Publisher only is owned by it (TopicImpl::owner = its slot + 2). The
//   owner publishes without a locked instruction: a slot from its magazine,
//   plain ring appends (lane_ring.hpp invariant 5), plain lane and usage
//   counters. The slot taken against `closing` (shutdown's Dekker) uses a
//   light fence, and shutdown pays a heavy one (asym_fence.hpp); so does the
//   ring entry against the lane's `scheduled` flag: a light fence after the
//   append, a heavy one when a worker lets go of a lane of a topic that was
//   ever solo (BusCore::let_go). Workers hold emptied lanes instead of
//   letting go (scheduler.cpp, "Held lanes"), so that heavy fence runs about
//   once per worker going to sleep, not once per lane run (which cost more
//   than a full fence per publish). Each solo publish runs inside an
//   `in_push` window of its publisher slot (store in_push, light fence,
//   re-check owner). Any other publish first makes the topic shared for good
//   (owner = 1): it swaps the owner for kSharing, runs a heavy fence, waits
//   for the old owner's window to close (after which the old owner sees the
//   change at its next re-check) and only then stores 1; a publisher that
//   finds kSharing waits for the 1. (Storing 1 first let a third publisher
//   append shared while the old owner's window was still open: two tails
//   for one ring, and a publisher spinning forever on a cell; batch_test's
//   DropOldest case under load.) Without membarrier no topic goes solo.
//
// Lock order: BusCore::mu_ (registry: topic map, group creation, consumer
// slots) → GroupImpl::commit_mu (durable seek vs offset commits). durable_mu_
// (store topic id → TopicImpl) is a leaf. No lanebus lock is held while a
// handler runs or while waiting for a store commit, except commit_mu around
// a seek (it orders the seek against a worker's offset commit).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "access.hpp"
#include "asym_fence.hpp"
#include "delayed.hpp"
#include "wall_clock.hpp"
#include "delivery.hpp"
#include "dlq.hpp"
#include "claim_ahead.hpp"
#include "durable_store.hpp"
#include "histogram.hpp"
#include "idempotency.hpp"
#include "lane_ring.hpp"
#include "log.hpp"
#include "lanebus/bus.hpp"
#include "message_pool.hpp"
#include "outage.hpp"
#include "payload_pool.hpp"
#include "fair_queue.hpp"
#include "hash.hpp"
#include "retry_timer.hpp"
#include "schema_registry.hpp"
#include "schema_usage.hpp"
#include "sync.hpp"
#include "tenancy.hpp"

namespace lanebus::detail {

class TopicImpl;
struct GroupImpl;
struct Consumer;
class BusCore;
struct QueueBatch;

/// The consumer whose handler this thread is running, if any: lets close() and
/// shutdown() called from inside a handler return Busy instead of deadlocking
/// (defined in bus_core.cpp).
extern thread_local constinit Consumer* tl_running_consumer;
extern thread_local constinit BusCore* tl_running_bus;
/// The lane whose handler this thread is running (field-usage audit: Schemas::view).
struct GroupLane;
extern thread_local constinit GroupLane* tl_running_lane;

/// GroupOptions::batch_max's upper bound (a batch's views live on the worker's stack).
inline constexpr std::uint32_t kMaxBatch = 1024;

/// GroupLane::running_since_ns of a call in a group without attempt_timeout
/// (its start time is not read: no clock read on the hot path).
inline constexpr std::int64_t kRunningUntimed = 1;

/// Wall clock, ns since the epoch (message timestamps, latencies, DLQ
/// times): the TSC scaled to CLOCK_REALTIME (wall_clock.hpp states the error
/// bound), so the hot path reads no clock_gettime per message.
inline std::int64_t now_ns() noexcept { return WallClock::now_ns(); }

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// A counter written by one thread at a time (the lane's current owner) and
/// read by stats(). relaxed: a plain tally; ownership hand-offs through the
/// run queue order successive writers.
inline void bump(std::atomic<std::uint64_t>& c) noexcept {
  c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

struct GroupLane;

/// A message set aside by key_parallel_retry: in backoff (due_ns > 0) or
/// waiting behind an earlier message of its key (due_ns = 0).
struct Parked {
  Slot* slot = nullptr;          // ephemeral lanes: the slot (its reference is held)
  StoredMessage stored;          // durable lanes (released queue entries: key and offset only)
  std::uint32_t attempts = 0;    // deliveries so far (durable queues: the claim's attempt)
  std::int64_t due_ns = 0;       // steady clock
  std::int64_t first_failure_ns = 0;
  bool released = false;         // durable queues: given back to the store until due_ns (its key's head)
  std::string_view key() const noexcept { return slot ? slot->key() : std::string_view(stored.key); }
};

/// The lane's second timer entry: fires schedule() (the lane is idle while
/// its parked messages wait), where the TimerEntry base of GroupLane puts a
/// lane that stays scheduled back on the run queue.
struct WakeEntry : TimerEntry {
  GroupLane* lane = nullptr;
};

/// One consumer group's state in one lane. The TimerEntry base links the
/// lane into the RetryTimer while its head message waits out a backoff.
struct alignas(64) GroupLane : TimerEntry {
  GroupLane(GroupImpl* g, std::uint32_t l, std::uint32_t ring_capacity)
      : group(g), lane(l), ring(ring_capacity), rng(0x9E3779B97F4A7C15ull ^ (std::uint64_t(l) << 32) ^
                                                     reinterpret_cast<std::uintptr_t>(g)) {
    wake.lane = this;
    wake.kind = TimerEntry::Kind::Wake;
  }

  GroupImpl* const group;
  const std::uint32_t lane;
  LaneRing ring;
  alignas(64) std::atomic<bool> scheduled{false};
  GroupLane* runq_next = nullptr;  // FairRunQueue's link while queued (fair_queue.hpp)

  // Owned by the worker running the lane.
  alignas(64) Slot* current = nullptr;  // taken from the ring, not yet finished (retry pending)
  /// Held lanes (scheduler.cpp): the worker index + 1 that keeps this
  /// scheduled, empty lane and polls it; 0 when not held. Whoever swaps it
  /// to 0 runs (or releases) the lane.
  std::atomic<std::uint32_t> holder{0};
  std::uint32_t attempts = 0;           // deliveries of `current` so far
  std::int64_t retry_delay_ns = 0;      // backoff before the pending retry (0 = at once)
  std::int64_t first_failure_ns = 0;    // first failed attempt of the head message (0 = none yet)
  std::uint64_t rng;                    // xorshift state for backoff jitter
  bool probing = false;                 // the message being delivered is the paused group's probe (outage.hpp)

  // key_parallel_retry (owner-only): messages in backoff and the later
  // messages of their keys, in lane order; capacity reserved at creation
  // (GroupOptions::key_parallel_limit), so parking never allocates.
  std::vector<Parked> parked;
  std::atomic<std::uint64_t> parked_count{0};  // gauge for stats (set_aside)
  WakeEntry wake;                              // timer entry: schedule the lane when a parked message is due

  // Watchdog (attempt_timeout): the handler call in progress, if any.
  std::atomic<std::int64_t> running_since_ns{0};  // steady clock; 0 = no call, kRunningUntimed = untimed call
  std::atomic<std::uint64_t> call_seq{0};         // bumped per call
  std::atomic<std::uint64_t> running_offset{0};   // durable queues: the claim being handled
  std::atomic<std::uint32_t> running_attempt{0};
  std::uint64_t stuck_seen_seq = 0;               // watchdog-owned: last call counted as stuck
  std::atomic<std::uint64_t> stuck{0};

  // Counters (see LaneCounters). Single-writer ones use bump().
  std::atomic<std::uint64_t> delivered{0}, acked{0}, retried{0}, rejected{0}, failed{0}, timed_out{0},
      duplicates_skipped{0};
  std::atomic<std::uint64_t> dropped{0};  // multi-writer (droppers, worker): fetch_add
  std::atomic<std::uint64_t> expired{0};  // TTL ended before a handler call (delayed.cpp)

  // Metrics (BusOptions::metrics), written by the owner.
  LatencyRecorder latency;                  // created_at → handler done
  std::atomic<std::int64_t> oldest_ns{0};   // created_at of the oldest unfinished message (approx.), 0 = none

  // Durable lanes (owned by the running worker unless atomic).
  std::atomic<std::uint64_t> known_end{0};  // end offset seen by the listener/poller/reads
  std::atomic<std::uint64_t> skipped{0};    // lost to retention
  std::atomic<std::uint64_t> lag{0};        // end - position, refreshed by the worker and the poller
  std::atomic<std::uint64_t> errors{0};     // store errors met by the worker
  std::uint64_t read_pos = 0;               // next offset to read from the log
  std::uint64_t done_pos = 0;               // everything before it is handled
  std::uint64_t committed_sent = 0;         // last offset commit queued
  std::int64_t committed_sent_ns = 0;       // when (steady clock): a run's commit may wait (topic_run_end)
  std::uint64_t seen_seek_gen = 0;
  bool positioned = false;                  // read_pos loaded from the store
  std::vector<StoredMessage> buffer;        // read but not yet handled
  std::vector<StoredMessage> buffer_spare;  // storage kept between reads (ReadBatch::spare)
  std::size_t buffer_index = 0;
  // A batch handler's span read in place (topic_span_in_place): held only
  // during the handler call; kept for its vector's storage.
  InPlaceBatch in_place;
  // Durable topic poison bookkeeping (DlqStore::TopicMark).
  std::uint64_t marked_to = 0;              // the committed delivery mark covers offsets below it
  std::uint64_t careful_to = 0;             // deliver one message at a time below this offset
  std::uint32_t head_crashes = 0;           // crashes of the message at read_pos (careful mode)
  // Durable queues: the claims the store's writer makes for this lane in the
  // commit that appended to it (claim_ahead.hpp); watched from the queue's
  // creation to the bus's shutdown, open while the queue has consumers.
  std::unique_ptr<ClaimAhead> claim_ahead;
  // Durable queues, the writer thread's (apply_queue_settle): the lowest
  // offset whose settle failed (kept, lost or given back) and when. A claim
  // of the lane behind it made before then goes back when it settles.
  std::uint64_t settle_break_offset = ~std::uint64_t{0};
  std::int64_t settle_break_ns = 0;

  // Field-usage audit (schema_usage.hpp): written by the lane's running worker.
  UsageTap usage;
};

/// One subscription's slot in its group's consumer table.
struct Consumer {
  GroupImpl* group = nullptr;
  Handler handler;                    // written under BusCore::mu_ before `enabled` is set
  TxHandler tx_handler;               // instead of handler: transactional consume (durable only)
  BatchHandler batch_handler;         // instead of handler: spans of one lane (ephemeral_lane.cpp)
  std::atomic<bool> enabled{false};   // may receive messages
  std::atomic<std::uint32_t> calls{0};  // workers pinning this consumer
  bool in_use = false;                // slot assigned (guarded by BusCore::mu_)
};

struct GroupImpl {
  GroupImpl(TopicImpl* t, std::string n, const GroupOptions& o, std::uint32_t lanes, std::uint32_t ring_capacity,
            std::uint32_t max_consumers);

  TopicImpl* const topic;
  const std::string name;
  // Fixed by the group's first subscription; a queue's group takes the
  // options of the first consumer that attaches while it has none (written
  // under BusCore::mu_; workers read it only while a consumer is pinned).
  GroupOptions options;
  std::vector<std::unique_ptr<GroupLane>> lanes;
  std::unique_ptr<Consumer[]> consumers;
  const std::uint32_t max_consumers;
  std::atomic<std::uint32_t> consumers_hw{0};  // consumer slots ever used (scan bound)
  std::atomic<std::uint32_t> consumer_count{0};
  // Round-robin start for picking a consumer, written by workers on a run
  // (pin_consumer): a line of its own. Beside `lanes` and `active`, which a
  // publisher reads on every message, its lock xadd cost a publish one
  // cache miss per lane run: 39 % of route's samples in 1to1.
  alignas(64) std::atomic<std::uint32_t> rr{0};
  // Receives publishes. A topic group is active while it has consumers; a
  // queue's group is always active (messages wait for a consumer).
  alignas(64) std::atomic<bool> active{false};
  const bool persistent;  // queue or durable group: keep messages while no consumer is attached
  LogLimiter stuck_log;   // the watchdog's "stuck" lines, one a second per group

  IdempotencyImpl* idempotency = nullptr;  // GroupOptions::idempotency_scope, or none

  // Durable groups.
  GroupRef store_group;
  Mutex commit_mu;  // orders seek against offset commits
  std::atomic<std::uint64_t> seek_gen{0};

  // Outage pause (GroupOptions::outage, outage.hpp): used only when enabled.
  OutageBreaker outage;
};

class BusCore;

Result<std::string> user_key_public(std::string_view table, std::string_view key);
/// Transactional consume (txconsume.cpp): Conflict when a value the handler
/// read (or a fence record it checked) changed, nothing written; the
/// handler's writes, fence advances and outbox.
Status validate_reads(StoreTxn& t, const TxnState& tx, std::string_view topic);
Status write_effects(StoreTxn& t, const TxnState& tx);
/// After the commit of write_effects: charge the outbox appends to their
/// namespaces' usage (doc/tenancy.md, usage accounting).
void count_outbox(const TxnState& tx) noexcept;

/// A transactional handler's reads, writes, fences and outbox (see transaction.hpp).
struct TxnState {
  struct Read {
    std::string key;  // table '\0' key
    bool found = false;
    std::string value;
  };
  /// A Transaction::fence that passed (fence.cpp): the `fence` table record
  /// as it was read (validated at commit like a Read) and, for a barrier, the
  /// record that moves the HWM.
  struct Fence {
    std::string key;  // resource_fence_key(resource)
    bool found = false;
    std::string seen;
    std::optional<std::string> advance;  // the new record; nullopt = current generation
  };
  DurableStore* store = nullptr;
  BusCore* bus = nullptr;
  std::vector<Read> reads;
  std::map<std::string, std::optional<std::string>> writes;  // nullopt = delete
  std::vector<AppendRequest> outbox;
  std::vector<NamespaceState*> outbox_ns;  // per outbox entry: its topic's namespace (nullptr = none)
  std::vector<Fence> fences;
  /// Set by a refused Transaction::fence: the transaction is void (nothing of
  /// it is written; every later call returns this).
  Status refused;
  /// Writes of earlier messages of the same lane batch, committed before this
  /// one in the same transaction (reads see them); nullptr = none.
  const std::map<std::string, std::optional<std::string>>* overlay = nullptr;
  void clear() {
    reads.clear();
    writes.clear();
    outbox.clear();
    outbox_ns.clear();
    fences.clear();
    refused = Status();
  }
  /// Nothing to write: the transaction was refused by a fence.
  bool is_void() const noexcept { return !refused.ok(); }
};

struct PublisherState;
struct PublisherLink;

/// A topic's messages with a due time or an expiry (doc/delays.md): the
/// timed publish (delayed.cpp; durable topics: delayed_durable.cpp) and, on
/// in-memory topics, the delayed slots waiting for their due time (`queue`)
/// and their release. Owned by its TopicImpl.
class TopicDelays {
 public:
  explicit TopicDelays(TopicImpl& topic) noexcept;
  TopicDelays(const TopicDelays&) = delete;
  TopicDelays& operator=(const TopicDelays&) = delete;

  /// A message with a due time or an expiry on an in-memory topic: the slot
  /// gets an extension block; a delayed one waits in `queue` until due.
  /// `pub`: the calling publisher (publish_via; nullptr: the shared path):
  /// its magazine `mag` gives the slot, its slot's tally counts the message
  /// in a namespace without a publish quota (count_in_slot), and it routes
  /// delayed messages that are due (release_inline).
  Status publish(const OutgoingMessage& m, bool may_block, std::uint64_t id, const PayloadFill* fill = nullptr,
                 PublisherState* pub = nullptr, Magazine* mag = nullptr) noexcept;
  /// publish_durable of a message with a due time or an expiry: sets req's
  /// expiry; a delayed one is stored in the delayed index (*handled = true,
  /// `done` consumed), else the caller appends `req`. Errors (refused times)
  /// undo the namespace admission.
  Status publish_durable(const OutgoingMessage& m, AppendRequest& req, NamespaceState* nsp, std::size_t need,
                         PublishCallback& done, bool* handled);
  /// The timer thread: route every delayed slot that is due, re-arm for the
  /// next; or, when a publisher released since its last look, look again in
  /// kTimerDeferNs (delayed.hpp, "Publishers release").
  void release_due() noexcept;
  /// A publisher (publish): route the delayed slots due at `now` through
  /// `p`, unless another thread holds the delay heap.
  void release_inline(PublisherState* p, std::int64_t now) noexcept;
  /// Shutdown: free every delayed slot not yet due (in-memory delays end with the bus).
  void discard() noexcept;
  /// How long the timer defers to publishers that release (2 × this bounds
  /// the lateness a publisher's stop can add).
  static constexpr std::int64_t kTimerDeferNs = 100'000;
  /// A publisher releases once the earliest item is this late: a call
  /// (the heap's mutex, a solo window) then carries several messages.
  static constexpr std::int64_t kInlineLagNs = 20'000;

  /// In-memory delayed messages waiting for their due time.
  DelayQueue queue;

 private:
  /// publish's steps: the message's due time and expiry (a plain delay
  /// without resolve_times' checks; a refusal counted), and the filled
  /// slot's hand-off (routed when due, else into `queue`; an error leaves
  /// the slot to the caller).
  Status times_of(const OutgoingMessage& m, std::int64_t now, MessageTimes* times) noexcept;
  Status hand_off(Slot* s, std::int64_t due_ns, std::int64_t now, PublisherState* pub) noexcept;
  /// Route `n` (at most 64) items popped from `queue` through publisher
  /// `p` (TopicImpl::route_due), or (nullptr: the timer, the topic lent to
  /// it) with shared appends. Each enters its lane now: its created_at
  /// becomes its due time (the order rule; latency counts from here).
  void route_popped(PublisherState* p, const DelayQueue::Item* items, std::uint32_t n) noexcept;

  TopicImpl& t_;
};

class TopicImpl {
 public:
  TopicImpl(BusCore* bus, std::string name, bool is_queue, const TopicOptions& options);

  /// The shared publish path (any thread): makes the topic shared first.
  /// `fill`: a typed object to construct in place of m.payload (typed.cpp).
  Status publish(const OutgoingMessage& m, bool may_block, std::uint64_t id,
                 const PayloadFill* fill = nullptr) noexcept;
  /// Publish through a Publisher (or a thread's implicit one): the id from
  /// its block, its link's slot magazine, and the solo path while the
  /// publisher owns the topic (see "Solo publishers"). Without a link (all
  /// kLinks taken) the shared path. `fill`: a typed object (typed.cpp); one
  /// that does not fit the slot takes the shared path. Six arguments: all
  /// in registers.
  Status publish_via(PublisherState& p, const OutgoingMessage& m, bool may_block,
                     const PayloadFill* fill = nullptr) noexcept;
  /// End solo ownership for good (owner = 1): after it returns, no solo
  /// publish of this topic runs, and its effects are visible.
  void make_shared() noexcept;
  /// make_shared unless the topic is shared already (one acquire load on the way to a shared append).
  void share() noexcept {
    if (owner.load(std::memory_order_acquire) != 1) make_shared();
  }
  Status publish_durable(const OutgoingMessage& m, PublishCallback done);
  /// Topic::publish_batch for an ephemeral topic; message j gets id first_id + j.
  /// `p`: the Publisher's state (its slot may own the topic), or nullptr.
  BatchPublishResult publish_batch(std::span<const OutgoingMessage> ms, bool may_block, std::uint64_t first_id,
                                   PublisherState* p = nullptr) noexcept;
  /// publish_batch's fast path: no schema check, no quota, every message fits
  /// the slot (publish_batch checks). `bad`: the index of the first message
  /// with an empty payload or a key beyond kMaxKeyBytes (refused, nothing
  /// published), ms.size() when none.
  BatchPublishResult publish_batch_unchecked(std::span<const OutgoingMessage> ms, bool may_block,
                                             std::uint64_t first_id, PublisherState* p,
                                             std::size_t bad) noexcept;
  /// A block of at least `n` bytes of the bus's payload pool under the
  /// topic's backpressure, as acquire_slot (place_large).
  std::uint32_t acquire_block(std::size_t n, std::uint32_t lane, bool may_block) noexcept;
  /// Typed topics: the schema check of publish (publish.cpp).
  Status check_schema(const OutgoingMessage& m, std::uint16_t* version) noexcept;
  /// Open publisher `p`'s solo window on this topic ("Solo publishers"):
  /// true when `p` owns it (append solo, then leave_solo). False: the topic
  /// is shared now (made so if it was not; p == nullptr: shared).
  bool enter_solo(const PublisherState* p) noexcept;
  void leave_solo(const PublisherState* p) noexcept;
  /// Route `n` filled slots (each to its own lane) as publisher `p` would:
  /// solo while `p` may own the topic, else the shared path (p == nullptr:
  /// shared). release_due's hand-off (publish.cpp, beside open_window).
  void route_due(PublisherState* p, Slot* const* slots, std::uint32_t n) noexcept;
  /// The store append for `m` (durable topics; also the outbox of
  /// transactions), with `headers` (stored form: stored_headers, trace.hpp).
  AppendRequest append_request(const OutgoingMessage& m, std::string_view headers = {}) const;
  /// What a durable publish admitted to its namespace (undone when the
  /// append fails) and the message's lane (publish_durable.cpp).
  struct DurableAdmission {
    NamespaceState* nsp = nullptr;
    std::size_t need = 0;
    std::uint32_t lane = 0;
  };
  /// A durable publish's checks (payload, shutdown, schema, headers), the
  /// namespace's admission and the store request (publish_durable.cpp).
  Status durable_request(const OutgoingMessage& m, bool may_block, AppendRequest* req, DurableAdmission* admitted);
  /// publish_batch on a durable topic: each run of messages without a due
  /// time or an expiry goes to the store's writer as one request
  /// (DurableStore::append_batch: shared commits, one wait); the result is
  /// the published prefix and the first refusal, as on in-memory topics.
  BatchPublishResult publish_batch_durable(std::span<const OutgoingMessage> ms) noexcept;

  BusCore* const bus;
  const std::string name;
  const bool is_queue;
  const TopicOptions options;
  /// lane_index(key, options.lanes) (hash.hpp) with its power-of-two test
  /// made once, at creation: the publish paths' lane of a key.
  std::uint32_t lane_of(std::string_view key) const noexcept {
    const std::uint64_t h = fnv1a64(key);
    if (lane_mask != kModuloLanes) [[likely]] return static_cast<std::uint32_t>(h) & lane_mask;
    return options.lanes == 0 ? 0 : static_cast<std::uint32_t>(h % options.lanes);
  }
  static constexpr std::uint32_t kModuloLanes = 0xffffffffu;
  /// options.lanes - 1 for a power-of-two lane count, else kModuloLanes.
  const std::uint32_t lane_mask = options.lanes != 0 && (options.lanes & (options.lanes - 1)) == 0
                                      ? options.lanes - 1
                                      : kModuloLanes;
  const bool durable;
  TopicRef store_topic;  // durable only
  const std::uint32_t capacity;  // power of two
  MessagePool pool;
  std::unique_ptr<std::atomic<GroupImpl*>[]> groups;  // [options.max_groups]
  std::atomic<std::uint32_t> group_count{0};
  std::vector<std::unique_ptr<GroupImpl>> owned_groups;  // guarded by BusCore::mu_

  struct alignas(64) LaneLoad {
    std::atomic<std::uint64_t> published{0};
  };
  std::unique_ptr<LaneLoad[]> lane_load;
  std::atomic<std::uint64_t> unrouted{0};
  std::atomic<std::uint64_t> refused{0};
  /// Solo ownership: 0 = nobody published yet, 1 = shared, k + 2 = solo by
  /// the publisher of slot k. Goes 0 → k + 2 → 0 (its publisher is gone),
  /// and to 1 from any state, for good, through kSharing (make_shared: the
  /// old owner's window is still open; everyone else waits for 1). kLent
  /// marks 0 or k + 2 while the timer thread routes due delayed messages
  /// (lend_to_timer): the owner waits for it to come back, anyone else makes
  /// the topic shared.
  std::atomic<std::uintptr_t> owner{0};
  static constexpr std::uintptr_t kLent = std::uintptr_t{1} << (sizeof(std::uintptr_t) * 8 - 1);
  static constexpr std::uintptr_t kSharing = kLent - 1;
  /// The timer thread's route of due delayed messages (release_due) without
  /// taking or ending solo ownership: marks `owner` lent, waits for the
  /// owner's window to close (heavy fence), and returns the value to give
  /// back; 1 when the topic is shared (nothing lent). Until give_back the
  /// caller routes with shared appends and no solo append runs.
  std::uintptr_t lend_to_timer() noexcept;
  void give_back(std::uintptr_t lent) noexcept;
  /// Set (for good) by the first solo claim, which then runs a heavy fence:
  /// from then on a worker letting go of one of this topic's lanes runs the
  /// heavy fence too, because solo appends end with a light one
  /// (BusCore::let_go, "Solo publishers").
  std::atomic<bool> ever_solo{false};
  /// The namespace holding the topic (tenancy.hpp); set at creation, swapped
  /// when a covering namespace is declared. Never null after creation.
  std::atomic<NamespaceState*> ns{nullptr};
  /// Typed topics: the latest schema version (owned by the SchemaRegistry);
  /// nullptr = untyped, publish unchanged.
  std::atomic<const SchemaVersion*> schema{nullptr};
  /// Typed topics (typed.hpp, typed.cpp): the C++ type bound by
  /// create_topic<T>, "" = bytes. Written once. type_mu is a leaf lock.
  Mutex type_mu;
  std::string cxx_type GUARDED_BY(type_mu);
  /// In-memory typed topics: every payload is a constructed object, so a
  /// bytes publish is refused (a typed handler would read it as a T).
  std::atomic<bool> objects_only{false};
  /// Messages with a due time or an expiry: the timed publish and the
  /// in-memory delayed messages waiting for their due time (delayed.hpp).
  TopicDelays timed{*this};
  /// options.default_ttl in ns (0 = none), for has_times().
  const std::int64_t default_ttl_ns;

 private:
  friend class TopicDelays;  // the timed publish takes slots and routes as publish does
  Slot* acquire_slot(std::uint32_t lane, bool may_block) noexcept;
  /// The status of a publish that found no slot (publish and publish_via).
  Status no_slot(bool may_block) noexcept;
  /// Route a filled slot to every active group's ring of its lane; `solo`:
  /// the owner's plain appends. Returns false when no group took it (freed).
  /// `refs_set`: the reference count the slot already holds (the timed
  /// publish sets 1 while the slot is hot): when it is the count route
  /// needs, the slot is not written (a delayed release would miss on it).
  bool route(Slot* s, std::uint32_t lane, bool solo, std::uint32_t refs_set = 0) noexcept;
  /// route for a topic with one active group, inline in publish_via (else route).
  bool route_one(Slot* s, std::uint32_t lane, bool solo) noexcept;
  /// Scheduler::schedule, with its first check (the lane already scheduled,
  /// a seq_cst load: the publisher's side of the Dekker hand-off) inline.
  void schedule(GroupLane* gl) noexcept;
  /// publish_via for every case (publish.cpp): its lean frame's fallback.
  Status publish_via_general(PublisherState& p, const OutgoingMessage& m, bool may_block,
                             const PayloadFill* fill) noexcept;
  /// The topic's backpressure around `take` (publish.cpp; its only callers
  /// are acquire_slot and acquire_block there).
  template <typename Take, typename T>
  T acquire_room(std::uint32_t lane, bool may_block, Take take, T none) noexcept;
  bool drop_oldest(std::uint32_t first_lane) noexcept;
};

/// Payloads larger than the slot and typed objects on in-memory topics
/// (large_payload.cpp): the checks before a slot is taken, then placing the
/// payload in the slot or an external block (taken under the topic's
/// backpressure). `extra`: bytes between the keys and the payload (an
/// extension block).
Status check_large(const TopicImpl& t, const OutgoingMessage& m, const PayloadFill* fill,
                   std::size_t extra = 0) noexcept;
Status place_large(TopicImpl& t, Slot* s, const OutgoingMessage& m, const PayloadFill* fill, std::uint32_t lane,
                   bool may_block) noexcept;

/// One topic a Publisher publishes to: its slot magazine (message_pool.hpp).
struct PublisherLink {
  TopicImpl* topic = nullptr;
  Magazine mag;
};

inline constexpr std::uint32_t kNoPublisherSlot = 0xffffffffu;

/// Per-thread publishing state: behind a Publisher (`keep` holds the core,
/// so the pools its magazines return slots to outlive it), and behind
/// Topic::publish (owned by the core's ThreadPublishers; `keep` empty).
struct PublisherState {
  PublisherState() = default;
  PublisherState(const PublisherState&) = delete;
  PublisherState& operator=(const PublisherState&) = delete;
  /// Returns the magazines' slots, gives up solo ownership and the slot.
  ~PublisherState();

  /// The link for `t` (created on first use; nullptr when all kLinks are
  /// taken: the shared path then serves that topic).
  PublisherLink* link(TopicImpl* t) noexcept {
    if (last_link != nullptr && last_link->topic == t) [[likely]] return last_link;
    return find_link(t);
  }
  PublisherLink* find_link(TopicImpl* t) noexcept;
  /// The next message id, from this publisher's block (a block of kIdBlock
  /// from the bus when it runs out).
  std::uint64_t take_id() noexcept;
  static constexpr std::uint64_t kIdBlock = 1024;

  BusCore* bus = nullptr;
  std::shared_ptr<BusCore> keep;
  std::uint64_t next_id = 0;
  std::uint64_t end_id = 0;
  std::uint32_t slot = kNoPublisherSlot;  // BusCore::publisher_slot: solo ownership, usage tallies
  /// AsymmetricFence::available(), read once: it never changes in a process.
  const bool asym = AsymmetricFence::available();
  static constexpr std::uint32_t kLinks = 4;
  PublisherLink links[kLinks];
  std::uint32_t link_count = 0;
  PublisherLink* last_link = nullptr;  // the last link used (one topic per stream, mostly)
};

/// The publishers behind Topic::publish, one per thread that publishes
/// (bus_core.cpp, "implicit publishers"). Owned by the core; a thread's cache
/// holds a weak reference, so a thread that outlives the bus finds it dead.
struct ThreadPublishers {
  Mutex mu;
  bool alive GUARDED_BY(mu) = true;
  std::vector<std::unique_ptr<PublisherState>> states GUARDED_BY(mu);
};

/// A publisher slot: the in_push window of solo publishes (see "Solo publishers").
struct alignas(64) PublisherSlot {
  std::atomic<std::uint32_t> in_push{0};  // written by the slot's publisher
  std::atomic<bool> used{false};
};

/// A worker's held lanes (scheduler.cpp, "Held lanes"): written by the
/// worker, read by idle workers that may steal one.
struct alignas(64) HeldLanes {
  static constexpr std::uint32_t kMax = 32;
  std::atomic<std::uint32_t> count{0};
  std::atomic<GroupLane*> lane[kMax] = {};
};

/// A worker thread's own state (scheduler.cpp).
struct WorkerLocal {
  WorkerLocal(std::uint32_t i, HeldLanes* h) noexcept : index(i), tag(i + 1), held(h) {}
  const std::uint32_t index;
  const std::uint32_t tag;  // GroupLane::holder of the lanes this worker holds
  HeldLanes* const held;
  std::uint32_t next = 0;        // round robin over held lanes
  std::int32_t run_slot = -1;    // held-array index of the lane running now, if it came from there
  GroupLane* candidate = nullptr;  // steal: a lane of another worker seen ready ...
  std::uint64_t candidate_head = 0;  // ... at this ring position ...
  std::uint32_t candidate_tag = 0;   // ... held by this worker
  FreeChain frees;               // slots freed by this worker's runs, returned a chain at a time
};
extern thread_local constinit WorkerLocal* tl_worker;

/// The lane scheduler and the worker pool (scheduler.cpp): the run queue of
/// scheduled lanes, the worker threads and the lanes each holds. It owns
/// that state; nothing else reads it. A worker runs the lane it takes with
/// LaneRunner::run_lane, and a lane whose namespace is over its consume quota
/// goes back through BusCore::requeue (the retry timer).
class Scheduler {
 public:
  Scheduler(BusCore& bus, const BusOptions& options, const std::atomic<bool>& closing) noexcept
      : bus_(bus), options_(options), closing_(closing) {}
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Start `n` workers; returns once every one runs (its thread-locals
  /// exist), so "after warm-up" never includes a worker start.
  Status start(std::size_t n);
  /// From here on workers start no handler call (shutdown).
  void abandon() noexcept { abandon_.store(true, std::memory_order_release); }
  bool abandoning() const noexcept { return abandon_.load(std::memory_order_acquire); }
  /// As many workers as CPUs or more: an idle worker's spin (next_lane)
  /// yields its CPU every 64 PAUSEs, as the baselines' consumers do
  /// (doc/performance.md, thirteenth round), and LaneRunner::linger ends the
  /// run there instead, so no worker yields with a lane taken (fourteenth).
  bool yield_when_idle() const noexcept { return yield_idle_; }
  /// Stop the run queue and join the workers (shutdown, after abandon()).
  /// Lanes still queued then are released by BusCore::release_remaining.
  void stop() noexcept;
  /// Worker threads running (0 after stop()).
  std::size_t running_workers() const noexcept { return workers_.size(); }

  /// Make sure `gl` is (or will be) run by a worker.
  void schedule(GroupLane* gl) noexcept;
  /// Clear `gl`'s scheduled flag (its worker is done with it). The caller then
  /// checks for work that arrived meanwhile and schedules again: the worker's
  /// side of the Dekker hand-off (seq_cst; the publisher's side is a seq_cst
  /// append or a full fence after a solo append).
  void unschedule(GroupLane* gl) noexcept { gl->scheduled.store(false, std::memory_order_seq_cst); }
  /// After unschedule, before the caller looks at the ring: the heavy fence
  /// when the lane's topic was ever solo (its appends end with a light one).
  static void fence_after_unschedule(const GroupLane* gl) noexcept;
  /// unschedule, the fence, and schedule again if a message came meanwhile.
  void let_go(GroupLane* gl) noexcept {
    unschedule(gl);
    fence_after_unschedule(gl);
    if (gl->ring.ready()) schedule(gl);
  }
  /// Queue a scheduled lane in its namespace's class of the run queue.
  void enqueue_lane(GroupLane* gl) noexcept;
  /// run_lane's end: keep the emptied lane scheduled in the running
  /// worker's held lanes instead of unscheduling it. False: unschedule it.
  bool hold(GroupLane* gl) noexcept;
  /// Does work wait elsewhere (the run queue, or a held lane of this worker)?
  bool other_work() const noexcept;

 private:
  void worker_main(std::size_t index);
  /// The next lane for worker `me` (its held lanes, the run queue, other
  /// workers' held lanes, then parked); nullptr once the queue is stopped.
  GroupLane* next_lane(WorkerLocal& me, FairRunQueue<GroupLane>::Pick& pick) noexcept;
  /// Run a lane taken by next_lane (tenancy's consume quota first).
  void run_taken(WorkerLocal& me, GroupLane* gl, const FairRunQueue<GroupLane>::Pick& pick);
  /// One of `me`'s held lanes that has a message, taken (holder swapped to 0).
  GroupLane* take_held(WorkerLocal& me) noexcept;
  /// A held lane of another worker that has had a message for two looks.
  GroupLane* steal_held(WorkerLocal& me) noexcept;
  /// Let go of every lane `me` holds: unschedule each (the Dekker hand-off),
  /// scheduling again the ones a message reached meanwhile.
  void release_held(WorkerLocal& me) noexcept;
  /// Does another worker hold lanes (a parked worker then looks every kHeldLookUs)?
  bool others_hold(const WorkerLocal& me) const noexcept;
  static constexpr std::int64_t kHeldLookUs = 1000;
  /// Timed looks of a worker that just parked before it parks without a timeout (next_lane).
  static constexpr std::uint32_t kQuietLooks = 10;

  BusCore& bus_;
  const BusOptions& options_;
  const std::atomic<bool>& closing_;  // BusCore's: shutdown began
  std::vector<std::thread> workers_;
  FairRunQueue<GroupLane> runq_;  // lanes with work, shared by namespace weight
  std::unique_ptr<HeldLanes[]> held_;  // per worker
  std::size_t worker_count_ = 0;
  std::atomic<std::uint32_t> parked_untimed_{0};  // workers parked without a timeout
  bool yield_idle_ = false;  // start(): workers >= CPUs
  std::atomic<bool> abandon_{false};
  std::atomic<std::size_t> workers_ready_{0};
};

/// key_parallel_retry's parked messages of a lane (ephemeral_lane.cpp; the
/// durable runners use them too). Owner-only state: the lane's runner calls these.
/// Index of the first parked message that may be delivered now, or -1.
std::ptrdiff_t due_parked(const GroupLane* gl, std::int64_t now) noexcept;
bool key_parked(const GroupLane* gl, std::string_view key) noexcept;
/// The earliest due time of a parked message in backoff (0 = none), and how
/// long from now until then (0 when due or none).
std::int64_t earliest_parked_due(const GroupLane* gl) noexcept;
std::int64_t wait_for_parked(const GroupLane* gl) noexcept;

/// The lane runner (ephemeral_lane.cpp): every run of a lane starts in
/// run_lane; a durable lane goes on to DurableRunner::run_durable_lane, an
/// in-memory one takes slots from its ring and drives each through the
/// delivery core (the plain fast paths, or the general loop: parked
/// messages, retries, idempotency, timeouts, outages, expiry). It keeps no
/// state of its own: a lane's is in its GroupLane, written by the lane's
/// owner (the worker running it).
class LaneRunner {
 public:
  explicit LaneRunner(BusCore& bus) noexcept : bus_(bus) {}
  LaneRunner(const LaneRunner&) = delete;
  LaneRunner& operator=(const LaneRunner&) = delete;

  void run_lane(GroupLane* gl);
  /// key_parallel_retry: release the lane and have the timer schedule it
  /// again when its first parked message is due.
  void park_lane(GroupLane* gl) noexcept;

 private:
  /// run_lane's general loop: parked messages, retries, idempotency,
  /// timeouts, outages, expiry. Returns the head's hold (>= 0) or -1.
  std::int64_t run_general(GroupLane* gl, Consumer* c, bool single, FreeChain& frees, std::uint32_t* handled);
  /// The general loop's next message: a parked one that is due, else the lane's head.
  struct LanePick {
    Slot* s = nullptr;
    std::ptrdiff_t pi = -1;  // >= 0: gl->parked[pi]; else the head (gl->current)
    std::uint32_t* attempts = nullptr;
    std::int64_t* first_failure = nullptr;
  };
  /// Got: *pick is set. Again: the head was parked behind its key, pick again.
  /// Stop: the lane is empty, or the parking limit holds it (*hold_ns = 0).
  enum class PickStep : std::uint8_t { Got, Again, Stop };
  PickStep pick_next(GroupLane* gl, Consumer* c, bool single, FreeChain& frees, LanePick* pick,
                     std::int64_t* hold_ns);
  /// run_lane's end: flush frees, release the consumer, requeue, park, hold or let the lane go.
  void end_run(GroupLane* gl, Consumer* c, FreeChain& frees, bool own_chain, std::uint32_t handled,
               std::int64_t hold_ns);
  /// run_lane's plain fast path (doc/performance.md).
  std::int64_t run_plain(GroupLane* gl, Consumer* c, bool single, FreeChain& frees,
                         std::uint32_t* handled) noexcept;
  /// run_plain for a batch handler (single dequeuer): spans of up to batch_max.
  std::int64_t run_plain_batch(GroupLane* gl, Consumer* c, FreeChain& frees, std::uint32_t* handled) noexcept;
  /// The plain runners' wait on an emptied lane.
  template <class Found>
  bool linger(FreeChain& frees, const Consumer* c, Found&& found) noexcept;
  /// A plain run's message that was not acked: settle it; true if held for a retry.
  bool settle_plain_failure(GroupLane* gl, Slot* s, const Outcome& out, FreeChain& frees,
                            std::int64_t* hold_ns) noexcept;

  BusCore& bus_;
};

/// The durable lane runners (durable_lane.cpp; the transactional commit,
/// apply_tx, in txconsume.cpp): a durable topic's group reads a batch at its
/// position, delivers it in order and commits offsets; a durable queue claims
/// a batch, delivers it and settles it in one asynchronous write. Both drive
/// the delivery core. No state of its own: a lane's is in its GroupLane,
/// written by the lane's owner.
class DurableRunner {
 public:
  explicit DurableRunner(BusCore& bus) noexcept : bus_(bus) {}
  DurableRunner(const DurableRunner&) = delete;
  DurableRunner& operator=(const DurableRunner&) = delete;

  /// A durable lane's run (LaneRunner::run_lane sends it here).
  void run_durable_lane(GroupLane* gl);

 private:
  bool position_durable_topic(GroupLane* gl);
  bool run_durable_topic_batch(GroupLane* gl, Consumer* c);
  /// run_durable_topic_batch's steps (durable_lane.cpp): the run's state,
  /// the read (with poison detection's delivery mark), the pick (a due
  /// parked message, else the buffer's head; a poison message and one behind
  /// a parked key settle there), the delivery (a transactional ack commits
  /// in topic_commit_tx; a batch handler's span is one call in
  /// topic_deliver_span) and its settle, what follows it, and the run's
  /// offset commit.
  struct TopicRun;
  enum class TopicStep : std::uint8_t { Got, Next, Stop, Reposition };
  TopicStep topic_refill(TopicRun& run);
  TopicStep topic_pick(TopicRun& run);
  std::int64_t topic_deliver(TopicRun& run, bool* reposition);
  std::int64_t topic_commit_tx(TopicRun& run, TxnState& tx, bool* reposition);
  std::int64_t topic_settle(TopicRun& run, const Parcel& p, const Invocation& inv);
  TopicStep topic_deliver_span(TopicRun& run, MessageView* views);
  /// A batch handler's span read in place and delivered while the read is
  /// held (no copy); Got when it cannot go that way (the caller goes the
  /// buffer's way).
  TopicStep topic_span_in_place(TopicRun& run, MessageView* views);
  TopicStep topic_settle_stop(TopicRun& run, const BatchOutcome& result);
  bool in_place_ok(const TopicRun& run) const;
  static void keep_in_buffer(GroupLane* gl, std::size_t from);
  /// How far ahead of an in-place span its delivery mark reaches (one mark
  /// commit per this many messages, as one buffer read has).
  static constexpr std::uint64_t kInPlaceMarkAhead = 1024;
  /// The delivery mark of [from, to) with the offset commit of what is done
  /// (poison detection): Got once committed, Stop (held) or Reposition.
  TopicStep topic_mark(TopicRun& run, std::uint64_t from, std::uint64_t to);
  /// What a read found before its first message: retention's skip and the lane's end.
  static void note_read(TopicRun& run, std::uint64_t first, std::uint64_t skipped, std::uint64_t end);
  template <class Message>  // StoredMessage or MessageRef (durable_lane.cpp)
  static void stored_view(const GroupLane* gl, const Message& m, std::uint32_t attempt, MessageView* out);
  TopicStep topic_after(TopicRun& run, std::int64_t wait_ns);
  bool topic_run_end(TopicRun& run);
  void commit_topic_position(GroupLane* gl);
  bool run_durable_queue_batch(GroupLane* gl, Consumer* c);
  /// run_durable_queue_batch's steps (durable_lane.cpp): the run's settles,
  /// the claim (due parked messages first), what settles a message without a
  /// handler call (parked behind its key, poison, expired, an outage), the call.
  struct QueueRun;
  bool claim_queue_batch(GroupLane* gl, std::uint32_t claim_max, QueueBatch& batch, bool* full, bool ahead);
  void give_back_claims_ahead(GroupLane* gl);
  void break_claims_ahead(GroupLane* gl);
  bool queue_before_call(QueueRun& run, std::size_t i, std::uint32_t poison_after, std::uint32_t* outcomes);
  void queue_call(QueueRun& run, std::size_t i, Consumer* c, std::uint32_t outcomes,
                  std::set<std::string_view>& keys_done);
  void queue_settle(QueueRun& run, std::size_t i, const Parcel& p, const Invocation& inv, AdmitMode mode,
                    std::uint32_t outcomes, std::unique_ptr<TxnState> tx, std::set<std::string_view>& keys_done);
  std::size_t queue_call_span(QueueRun& run, std::size_t i, Consumer* c, std::uint32_t outcomes,
                              std::set<std::string_view>& keys_done, MessageView* views);
  /// Commit a transactional handler's effects with the offset commit
  /// (topics; queues settle in apply_queue_settle) inside `t`. Conflict: a
  /// value it read changed (nothing of it was written). *duplicate: the
  /// message's idempotency key was done already (only the offset moved).
  Status apply_tx(StoreTxn& t, GroupLane* gl, TxnState& tx, const StoredMessage& m, std::uint32_t attempt,
                  bool* duplicate);
  /// Durable queues: settle message `k` of a claimed batch in the writer's
  /// transaction, and account for it after the commit (durable_lane.cpp).
  Status apply_queue_settle(StoreTxn& t, QueueBatch& batch, std::size_t k);
  Status settle_queue_op(StoreTxn& t, QueueBatch& batch, std::size_t k);
  void settled_queue_message(QueueBatch& batch, std::size_t k, const Status& st) noexcept;
  /// Durable queues with key_parallel_retry: heads given back to the store that are due or lost.
  void recheck_released_heads(GroupLane* gl) noexcept;
  /// Durable queues: attempts of the message at `offset` that came back with an outcome.
  Result<std::uint32_t> queue_outcomes(GroupLane* gl, std::uint64_t offset);
  /// The DLQ entry of a durable message that crashed the consumer `crashes` times.
  DlqEntry poison_entry(GroupLane* gl, const StoredMessage& m, std::uint32_t crashes) const;

  BusCore& bus_;
};

/// Durable delayed messages, the timer's side (delayed_durable.cpp): it
/// arms the bus's retry timer for the delayed index's earliest entry and,
/// when it fires, queues the move transaction that appends due entries to
/// their lanes (lib/store/delayed_index.hpp). One per bus; it owns its
/// timer entry and the "a move is queued" flag (one move at a time).
class DurableDelays {
 public:
  explicit DurableDelays(BusCore& bus) noexcept : bus_(bus) { entry_.kind = TimerEntry::Kind::Delayed; }
  DurableDelays(const DurableDelays&) = delete;
  DurableDelays& operator=(const DurableDelays&) = delete;
  /// Move due messages of the index at `due_wall_ns` or earlier (0: nothing).
  void arm(std::int64_t due_wall_ns) noexcept;
  /// Arm for the index's earliest entry (start, maintenance: other processes' entries).
  void refresh() noexcept;
  /// The timer thread: one move transaction (async); its completion re-arms.
  void move() noexcept;

 private:
  BusCore& bus_;
  DelayEntry entry_;  // topic nullptr: the index's entry
  std::atomic<bool> moving_{false};
  // The earliest due time armed since the timer last fired (INT64_MAX:
  // none). A publish's arm at or after it is skipped: the move that firing
  // starts runs after that publish's commit and sees its entry (it re-arms
  // for what is not yet due). Every delayed publish arms, and the timer's
  // mutex per message was a fifth of delayed_sync_4p's writer thread.
  std::atomic<std::int64_t> armed_{INT64_MAX};
  // The timer fired while a move ran: that move's scan may have missed
  // entries committed after it, so its completion moves again at once.
  std::atomic<bool> again_{false};
};

class BusCore : public std::enable_shared_from_this<BusCore> {
  friend class Scheduler;   // requeues lanes (requeue)
  friend class LaneRunner;  // the bus's parts a run uses (pin_consumer, requeue, the timer, expiry)
  friend class DurableRunner;  // the same, and the store and the DLQ
  friend class DurableDelays;  // the store, the timer and the open durable topics

 public:
  explicit BusCore(const BusOptions& options);
  ~BusCore();

  Status start();
  /// Fire `e` (a topic's DelayQueue entry) at wall-clock `due_wall_ns` or earlier (bus_core.cpp).
  void arm_delayed(DelayEntry* e, std::int64_t due_wall_ns) noexcept;
  /// The durable delayed index's timer side (DurableDelays, above).
  DurableDelays& durable_delays() noexcept { return durable_delays_; }
  Result<TopicImpl*> create(std::string_view name, bool is_queue, const TopicOptions& options);
  Result<Consumer*> attach(TopicImpl* topic, std::string_view group, Handler handler, TxHandler tx_handler,
                           const GroupOptions& options, BatchHandler batch_handler = {});
  Result<std::string> table_get(std::string_view table, std::string_view key) const;
  Status detach(Consumer* c) noexcept;
  Status close_claims_ahead(GroupImpl* g) noexcept;  // registry.cpp: no consumers left
  void drop_claims_ahead() noexcept;                 // bus_core.cpp: shutdown, before the store closes
  Status shutdown(ShutdownMode mode, std::chrono::milliseconds timeout);
  BusStats stats() const;
  TopicImpl* find(std::string_view name) const;

  /// The lane scheduler and the worker pool (Scheduler, above).
  Scheduler& scheduler() noexcept { return sched_; }

  /// Publisher slots (solo ownership, usage tallies): kNoPublisherSlot when all are taken.
  static constexpr std::uint32_t kPublisherSlots = kPublisherTallies;
  std::uint32_t claim_publisher_slot() noexcept;
  void release_publisher_slot(std::uint32_t k) noexcept;
  PublisherSlot& publisher_slot(std::uint32_t k) noexcept { return pub_slots_[k]; }
  /// The calling thread's publisher for this bus (Topic::publish): created
  /// on the thread's first publish, kept by the core until the thread exits
  /// or the core goes (bus_core.cpp, "implicit publishers"). nullptr after
  /// shutdown began or when it cannot be created (the shared path then serves).
  PublisherState* thread_publisher() noexcept;
  /// Destroy every implicit publisher (~BusCore, before the topics go).
  void drop_thread_publishers() noexcept;

  /// The group `group` of `t` (a queue: its one group), or nullptr. Takes mu_.
  GroupImpl* find_group(TopicImpl* t, std::string_view group);
  Status seek(TopicImpl* t, std::string_view group, const StartPosition& position);
  /// Bus::resume: end a group's outage pause (registry.cpp; the pause itself: OutageGate).
  Status resume(TopicImpl* t, std::string_view group);
  /// Make sure `gl` runs again soon (a batch commit gave messages back).
  void wake(GroupLane* gl) noexcept { sched_.schedule(gl); }
  Result<IdempotencyTable*> idempotency(std::string_view scope, const IdempotencyOptions& options);
  DlqStore* dlq() const noexcept { return dlq_.get(); }
  DeadLetters* dead_letters() noexcept { return dead_letters_.get(); }
  /// Publish a DLQ entry of an ephemeral origin again (DlqRepublish).
  Status republish(const DlqEntry& entry);
  DurableStore* store() const noexcept { return store_.get(); }
  /// Namespaces, credentials, quotas, usage (tenancy.hpp). Set by start().
  TenancyImpl* tenancy() const noexcept { return tenancy_.get(); }
  Namespaces* namespaces() noexcept { return namespaces_.get(); }
  SchemaRegistry* schemas() const noexcept { return schemas_.get(); }
  /// Blocks for in-memory payloads beyond a slot (BusOptions::memory_budget).
  PayloadPool* payloads() const noexcept { return payloads_.get(); }
  /// Visit every group lane's usage counters (BusCore::mu_ held; fn must not call the bus).
  void for_each_usage_tap(const std::function<void(const TopicImpl&, const GroupImpl&, const UsageTap&)>& fn);

  /// Bridges (lib/bridge/bridge.cpp) report through these: `fn` runs inside stats()
  /// (after the topics are filled in, BusCore::mu_ and bridges_mu_ held) and
  /// must not call back into the bus. Lock order: mu_, then bridges_mu_.
  std::uint64_t add_bridge_stats(std::function<BridgeStats(const BusStats&)> fn);
  void remove_bridge_stats(std::uint64_t id);

  std::uint64_t take_ids(std::uint64_t n) noexcept { return next_id_.fetch_add(n, std::memory_order_relaxed); }
  bool closing() const noexcept { return closing_.load(std::memory_order_seq_cst); }

  const BusOptions options;
  /// BusOptions::log (lanebus/log.hpp). Declared before every thread and
  /// object that logs, so it outlives them.
  const Logger logger;

 private:
  Consumer* pin_consumer(GroupImpl* g) noexcept;
  void release_remaining() noexcept;
  /// Shutdown: every in-memory topic's delayed slots not yet due are freed (registry.cpp).
  void discard_delayed() noexcept;
  /// Run the lane again: after `delay_ns` via the timer (it stays scheduled), else now.
  void requeue(GroupLane* gl, std::int64_t delay_ns) noexcept;
  void maintenance() noexcept;
  /// Log the DLQ's quota refusals since the last call (poller thread).
  void log_dlq_refusals() noexcept;

  void watchdog_main();
  void on_append(std::uint32_t topic_id, std::uint32_t lane, std::uint64_t end) noexcept;
  void poller_main();
  void scan_durable_ends(std::vector<TopicImpl*>& topics, std::vector<std::uint64_t>& ends,
                         bool periodic);  // poller thread
  void wake_durable_group(GroupImpl* g, std::uint32_t lane, std::uint64_t end) noexcept;
  std::int64_t slots_in_use() const;
  /// "topic "t" group "g" lane 3 (running for 812 ms), ..." for every handler call running now.
  std::string running_handlers() const;

  PublisherSlot pub_slots_[kPublisherSlots];
  // Unique per process (never reused, unlike the core's address): the key of
  // a thread's cache of implicit publishers.
  const std::uint64_t serial_ = next_serial();
  static std::uint64_t next_serial() noexcept {
    static std::atomic<std::uint64_t> n{0};
    return n.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  const std::shared_ptr<ThreadPublishers> thread_publishers_ = std::make_shared<ThreadPublishers>();

  // Declared before topics_: destroyed after them, so a slot still holding a
  // block when its topic goes away can give it back (MessagePool's destructor).
  std::unique_ptr<PayloadPool> payloads_ = std::make_unique<PayloadPool>(options.memory_budget);
  mutable Mutex mu_;
  mutable Mutex bridges_mu_;  // after mu_
  std::map<std::uint64_t, std::function<BridgeStats(const BusStats&)>> bridge_stats_ GUARDED_BY(bridges_mu_);
  std::uint64_t bridge_stats_next_ GUARDED_BY(bridges_mu_) = 0;
  std::map<std::string, std::unique_ptr<TopicImpl>, std::less<>> topics_ GUARDED_BY(mu_);
  std::atomic<bool> closing_{false};
  Scheduler sched_{*this, options, closing_};  // after topics_: destroyed (stopped) before them
  std::atomic<bool> stopped_{false};
  Mutex shutdown_mu_;
  std::atomic<std::uint64_t> next_id_{1};

  std::unique_ptr<RetryTimer> timer_;
  DurableDelays durable_delays_{*this};  // the delayed index's timer side (delayed_durable.cpp)
  // Watchdog (attempt_timeout): groups with a budget, appended under mu_.
  std::vector<GroupImpl*> watched_ GUARDED_BY(mu_);
  std::thread watchdog_;
  std::mutex watchdog_mu_;
  std::condition_variable watchdog_cv_;
  bool watchdog_stop_ = false;  // guarded by watchdog_mu_
  std::map<std::string, std::unique_ptr<IdempotencyTable>, std::less<>> idempotency_ GUARDED_BY(mu_);
  std::unique_ptr<DlqStore> dlq_;
  std::uint64_t dlq_rejected_logged_ = 0;  // poller-owned: DLQ refusals already logged
  std::unique_ptr<DeadLetters> dead_letters_;

  // Tenancy (tenancy.hpp).
  std::unique_ptr<TenancyImpl> tenancy_;
  std::unique_ptr<Namespaces> namespaces_;
  std::unique_ptr<SchemaRegistry> schemas_;  // schema registry (doc/schemas.md)

  // Durable layer.
  std::unique_ptr<DurableStore> store_;
  OutageGate outages_{logger};  // the outage pause's hooks (outage.hpp)
  DeliveryCore delivery_{*this, options, outages_};  // admit, invoke, settle, dead letters (delivery.hpp)
  LaneRunner lanes_{*this};  // every lane run starts there (ephemeral_lane.cpp)
  DurableRunner durable_{*this};  // durable topics' and queues' runs (durable_lane.cpp)
  Mutex durable_mu_;
  std::map<std::uint32_t, TopicImpl*> durable_topics_ GUARDED_BY(durable_mu_);  // by store topic id
  std::thread poller_;
  std::mutex poller_mu_;
  std::condition_variable poller_cv_;
  bool poller_stop_ = false;  // guarded by poller_mu_
};

inline std::uint64_t PublisherState::take_id() noexcept {
  if (next_id == end_id) {
    next_id = bus->take_ids(kIdBlock);
    end_id = next_id + kIdBlock;
  }
  return next_id++;
}

}  // namespace lanebus::detail
