// lanebus — MIT License.
// The ephemeral lane runner: take slots from the lane ring and drive each
// through the delivery core (delivery.hpp); key_parallel_retry's parking.
#include <algorithm>
#include <exception>
#include <string>

#include "bus_impl.hpp"

namespace lanebus::detail {

// The most messages a plain run looks at, and delivers, before it frees
// their cells and returns their slots (run_plain): the chain's size
// (FreeChain, Magazine::kMax).
constexpr std::uint32_t kRunChunk = 32;

// ---------------------------------------------------------------- parking (key_parallel_retry)

std::ptrdiff_t due_parked(const GroupLane* gl, std::int64_t now) noexcept {
  const auto& pk = gl->parked;
  for (std::size_t i = 0; i < pk.size(); ++i) {
    if (pk[i].due_ns > now || pk[i].released) continue;
    // Only the first parked message of its key may go (per-key order): lane
    // order is the vector's for slots, the log offset for durable messages.
    bool first = true;
    for (std::size_t j = 0; j < pk.size() && first; ++j) {
      if (j == i || pk[j].key() != pk[i].key()) continue;
      first = pk[i].slot != nullptr ? j > i : pk[j].stored.offset > pk[i].stored.offset;
    }
    if (first) return static_cast<std::ptrdiff_t>(i);
  }
  return -1;
}

bool key_parked(const GroupLane* gl, std::string_view key) noexcept {
  for (const Parked& p : gl->parked)
    if (p.key() == key) return true;
  return false;
}

std::int64_t earliest_parked_due(const GroupLane* gl) noexcept {
  std::int64_t earliest = 0;
  for (const Parked& p : gl->parked)
    if (p.due_ns > 0 && (earliest == 0 || p.due_ns < earliest)) earliest = p.due_ns;
  return earliest;
}

std::int64_t wait_for_parked(const GroupLane* gl) noexcept {
  const std::int64_t earliest = earliest_parked_due(gl);
  const std::int64_t now = RetryTimer::now_ns();
  return earliest > now ? earliest - now : 0;
}

void LaneRunner::park_lane(GroupLane* gl) noexcept {
  // Owner-only state is read before the lane is released.
  const std::int64_t earliest = earliest_parked_due(gl);
  const bool durable = gl->group->topic->durable;
  const bool queue = gl->group->topic->is_queue;
  const std::uint64_t read_pos = gl->read_pos;
  if (earliest != 0 && bus_.timer_) bus_.timer_->arm(&gl->wake, earliest);
  bus_.sched_.unschedule(gl);
  if (!durable) bus_.sched_.fence_after_unschedule(gl);
  // The wake may have fired before the flag was cleared (schedule() then saw
  // the lane scheduled and did nothing): check the time ourselves.
  const bool due = earliest != 0 && RetryTimer::now_ns() >= earliest;
  // (Durable queues are woken by the poller and the append listener.)
  const bool fresh = durable ? (!queue && gl->known_end.load(std::memory_order_seq_cst) > read_pos)
                             : gl->ring.ready();
  if (due || fresh) bus_.sched_.schedule(gl);
}

// ---------------------------------------------------------------- the plain fast path

// Waits on a lane the plain runner just emptied, while no other work waits
// (the run queue, this worker's held lanes), for as long as an idle worker
// would spin (BusOptions::spin, at least 1 µs). A producer in a stream
// publishes again within it, and the run goes on: no unschedule, no trip
// through the run queue. The freed slots go back once the wait is not
// short (a publisher may be waiting for them). True when `found` found one.
template <class Found>
bool LaneRunner::linger(FreeChain& frees, const Consumer* c, Found&& found) noexcept {
  if (bus_.sched_.other_work()) return false;
  // The deadline from the start: a PAUSE costs 10-140 cycles by CPU model,
  // so a count of them is no measure of the wait. Other lanes are looked at
  // after every PAUSE (a few loads of lines that stay cached while nothing
  // changes): looked at every 16th, a message that reached another lane
  // waited out 8 PAUSEs on average, 200 ns where one costs 25 ns (AMD
  // Zen 4), and latency1to1's p50 was 335-386 ns instead of 185-205
  // (doc/performance.md, "Seventh round: lingering workers").
  const std::int64_t until = now_ns() + std::max<std::int64_t>(bus_.options.spin.count(), 1'000);
  for (std::uint32_t spin = 1;; ++spin) {
    cpu_relax();
    if (found()) return true;
    if (bus_.sched_.other_work()) return false;
    if ((spin & 15) != 0) continue;
    // Oversubscribed: end the run rather than yield the CPU with the lane
    // taken. A worker descheduled inside linger keeps its lane from every
    // other worker until it runs again (a tick, 4 ms, behind a publisher
    // that never yields): latency1to1 with 2 workers had a p99 of 3.9 ms.
    // A held lane (the run's end) is stolen from a worker that does not
    // look at it (Scheduler::steal_held), and the idle loop yields instead.
    if ((spin & 63) == 0 && bus_.sched_.yield_when_idle()) return false;
    if (spin == 256) frees.flush();
    // A closing subscription (BusCore::detach waits for the run's end) or bus.
    if (bus_.closing() || !c->enabled.load(std::memory_order_relaxed) || now_ns() >= until) return false;
  }
}

namespace {
// The handler's call: an exception is a retry (doc/retries.md). Returned
// straight into the caller's Outcome, nothing to clear or copy on an ack.
// `in_context`: the message has headers, and the handler runs inside its
// trace context (trace.hpp).
inline Outcome call_handler(const Handler& handler, const MessageView& view, bool in_context) noexcept {
  try {
    return in_context ? handle_in_context(handler, view) : handler(view);
  } catch (const std::exception&) {
    return Outcome::retry("handler threw an exception");
  } catch (...) {
    return Outcome::retry("handler threw a non-standard exception");
  }
}
// A plain run's marks (invoke's, done once per run): the thread-locals a
// handler's calls into the bus read, and the lane marked as running with
// no budget and no watchdog (shutdown's report).
inline void mark_run(BusCore* bus, Consumer* c, GroupLane* gl) noexcept {
  tl_running_consumer = c;
  tl_running_bus = bus;
  tl_running_lane = gl;
  gl->running_since_ns.store(kRunningUntimed, std::memory_order_relaxed);
}
// The run's end: the marks cleared, its tenancy usage (scheduler.cpp).
inline void unmark_run(GroupLane* gl, std::uint32_t handled, std::uint64_t bytes) noexcept {
  tl_running_consumer = nullptr;
  tl_running_bus = nullptr;
  tl_running_lane = nullptr;
  gl->running_since_ns.store(0, std::memory_order_release);
  tl_delivered_msgs += handled;
  tl_delivered_bytes += bytes;
}
}  // namespace

// A message of a plain run that was not acked (first attempt of the lane's
// head message; plain groups never park): settle decides as in the general
// loop. True when it stays at the head of its lane for a retry (*hold_ns:
// the backoff); the run must end.
bool LaneRunner::settle_plain_failure(GroupLane* gl, Slot* s, const Outcome& out, FreeChain& frees,
                                   std::int64_t* hold_ns) noexcept {
  gl->running_since_ns.store(0, std::memory_order_release);
  gl->attempts = 1;
  gl->first_failure_ns = 0;
  Invocation inv;
  inv.outcome = out;
  const Parcel p{&s->header, s->key(), s->idempotency_key(), s->payload(), s->lane, 0, 1};
  const Settlement st = bus_.delivery_.settle(gl, p, inv, AdmitMode::Claim, false, 1, &gl->first_failure_ns);
  if (st.next == Settlement::Next::Retry) {
    gl->current = s;  // kept at the head of its lane: later messages must not overtake it
    *hold_ns = st.delay_ns;
    if (s->kind & Slot::kExtension) [[unlikely]] *hold_ns = clip_to_expiry(s, *hold_ns);  // delayed.cpp
    return true;
  }
  if (st.next == Settlement::Next::DeadLetter)
    bus_.delivery_.dead_letter_ephemeral(gl, s, inv.outcome, 1, st.error_class, gl->first_failure_ns);
  frees.release(s);
  gl->running_since_ns.store(kRunningUntimed, std::memory_order_relaxed);
  return false;
}


// Delivers the lane's ring a chunk at a time: the same steps as admit
// (nothing to admit) → invoke → settle for an ack, with the per-call
// bookkeeping that does not depend on the message done once per run (the
// running marks and thread-locals of invoke, the tenancy tally) and the
// counters kept in registers between their stores. Each counter is still
// stored before (delivered) or after (acked) its handler call, so stats()
// sees what it saw from the general loop. A message that is not acked is
// settled by the delivery core as in the general loop. Returns the hold of a
// message kept at the head for a retry (the lane's `current`), or -1.
//
// A chunk (doc/performance.md, "Sixth round"): the run looks at every
// message the ring holds (up to kRunChunk, an eighth of the pool, what is
// left of `batch`) once, fetching their slots while the handler runs, and
// takes each as its handler is called (head_ moves per message, as before).
// The cells of the chunk are freed, and then its slots returned, once at
// its end: no slot goes back to the pool while its cell is taken (the rule
// of LaneRing::take_deferred), and a slot another group holds is returned
// by that group only after this group's cell is free. A DropOldest ring has
// other dequeuers: its chunks are one message, taken (and freed) at once.
std::int64_t LaneRunner::run_plain(GroupLane* gl, Consumer* c, bool single, FreeChain& frees,
                                std::uint32_t* handled_out) noexcept {
  GroupImpl* g = gl->group;
  MessagePool& pool = g->topic->pool;
  LaneRing& ring = gl->ring;
  const std::uint32_t batch = g->options.batch;
  const std::uint32_t chunk_max = std::clamp<std::uint32_t>(pool.capacity() / 8, 1, kRunChunk);
  const bool metrics = bus_.options.metrics;
  const Handler& handler = c->handler;
  std::uint64_t delivered = gl->delivered.load(std::memory_order_relaxed);
  std::uint64_t acked = gl->acked.load(std::memory_order_relaxed);
  std::uint64_t bytes = 0;
  std::uint32_t handled = 0;
  std::int64_t hold_ns = -1;
  mark_run(&bus_, c, gl);
  Slot* chunk[kRunChunk];
  std::uint64_t first = 0;  // the chunk's first position (single): cells from it on are not free
  auto gather = [&]() -> std::uint32_t {
    if (!single) {
      std::uint32_t idx;
      if (!ring.try_dequeue(idx)) return 0;
      chunk[0] = pool.at(idx);
      return 1;
    }
    const std::uint32_t max = std::min(chunk_max, batch - handled);
    first = ring.head_position();
    return ring.peek_each(first, max, [&](std::uint32_t i, std::uint32_t value) {
      Slot* s = pool.at(value);
      __builtin_prefetch(s);  // both lines, while the handler runs on the messages before it
      __builtin_prefetch(reinterpret_cast<const char*>(s) + 64);
      chunk[i] = s;
      return true;
    });
  };
  const MessageHeader none{};
  MessageView view(none, {}, {}, {}, 0, 0);  // repointed per message (Access::rebind)
  Access::set_attempt(view, 1);
  bool with_headers = false;  // the view holds a message's headers
  const WallClock::Reading clock = WallClock::reading();
  while (handled < batch) {
    std::uint32_t n = gather();
    if (n == 0) {
      // The wait looks at one cell (a DropOldest ring's dequeue takes the message).
      std::uint32_t idx;
      if (!linger(frees, c, [&] { return single ? ring.peek_at(first, idx) : (n = gather()) != 0; })) break;
      if (single) n = gather();
    }
    std::uint64_t freed = first;  // the chunk's cells below it are free
    bool held = false;
    for (std::uint32_t i = 0; i < n; ++i) {
      Slot* s = chunk[i];
      if (single) ring.take_to(first + i + 1);
      std::string_view headers{};  // headers and trace context (trace.hpp)
      if (s->kind & Slot::kExtension) [[unlikely]] {
        // A due time or an expiry (delayed.cpp): its cell is freed first. An
        // expired message is never delivered (its slot goes with the chunk's).
        if (single) ring.free_taken(freed, first + i + 1);
        freed = first + i + 1;
        if (bus_.delivery_.expire_if_due(gl, s, 0, 0)) continue;
        headers = slot_headers(s);
      }
      const std::int64_t created_at = s->header.created_at_ns;
      if (metrics) gl->oldest_ns.store(created_at, std::memory_order_relaxed);
      const std::string_view payload = s->payload();
      Access::rebind(view, s->header, s->key(), s->idempotency_key(), payload, s->lane);
      if (!headers.empty() || with_headers) [[unlikely]] {
        Access::set_headers(view, headers);
        with_headers = !headers.empty();
      }
      gl->delivered.store(++delivered, std::memory_order_relaxed);
      bytes += payload.size();
      ++handled;
      const Outcome out = call_handler(handler, view, !headers.empty());
      if (out.kind() != Outcome::Kind::Ack) [[unlikely]] {
        // Not acked: the delivery core decides, as in the general loop. The
        // chunk ends with it; the messages after it stay in the ring.
        if (single) ring.free_taken(freed, first + i + 1);
        for (std::uint32_t j = 0; j < i; ++j) frees.release(chunk[j]);
        held = settle_plain_failure(gl, s, out, frees, &hold_ns);
        n = 0;  // settled
        break;
      }
      gl->acked.store(++acked, std::memory_order_relaxed);
      if (metrics) {  // record_latency, inlined; the run's copy of the clock's anchor
        const std::int64_t d = WallClock::now_ns(clock) - created_at;
        gl->latency.record(d > 0 ? static_cast<std::uint64_t>(d) : 0);
      }
    }
    // The chunk's end: its cells, then its slots (acked or expired).
    if (single && n != 0) ring.free_taken(freed, first + n);
    for (std::uint32_t j = 0; j < n; ++j) frees.release(chunk[j]);
    if (held) break;
  }
  unmark_run(gl, handled, bytes);
  *handled_out = handled;
  return hold_ns;
}

// ---------------------------------------------------------------- the batch fast path

namespace {
// The latencies of a span's first `n` messages, done now: one clock read
// stamps the span (every message of it is done when the call returns), and
// messages with the same created_at (a publish_batch chunk is stamped once)
// are counted in their bucket together, so a span of one chunk costs one
// bucket computation, not one per message. The sum is stored once.
void record_span_latency(GroupLane* gl, Slot* const* slots, std::uint32_t n) noexcept {
  const std::int64_t now = now_ns();
  std::uint64_t latency_sum = 0;
  std::int64_t created = slots[0]->header.created_at_ns;
  std::uint32_t same = 0;  // messages stamped `created` so far, not yet counted
  auto count = [&] {
    const std::int64_t d = now - created;
    const std::uint64_t ns = d > 0 ? static_cast<std::uint64_t>(d) : 0;
    gl->latency.count(ns, same);
    latency_sum += ns * same;
  };
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::int64_t c = slots[i]->header.created_at_ns;
    if (c != created) {
      count();
      created = c;
      same = 0;
    }
    ++same;
  }
  count();
  gl->latency.add_sum(latency_sum);
}
}  // namespace

// run_plain for a batch handler (Bus::subscribe_batch): each call gets the
// run of messages the lane holds (up to batch_max), looked at in the ring and
// taken only once settled, so the messages after a stop stay at the head of
// the lane for the next call. One clock read per call stamps the latencies
// (every message of the span is done when the call returns). Ring with one
// dequeuer only (no DropOldest).
std::int64_t LaneRunner::run_plain_batch(GroupLane* gl, Consumer* c, FreeChain& frees,
                                      std::uint32_t* handled_out) noexcept {
  GroupImpl* g = gl->group;
  MessagePool& pool = g->topic->pool;
  LaneRing& ring = gl->ring;
  const std::uint32_t limit = std::max(g->options.batch, g->options.batch_max);
  const std::uint32_t span_max = g->options.batch_max;
  const bool metrics = bus_.options.metrics;
  const BatchHandler& handler = c->batch_handler;
  Slot* slots[kMaxBatch];
  std::uint32_t indices[kMaxBatch];  // the slots' indices (the ring's values), for the free chain
  alignas(MessageView) unsigned char view_bytes[kMaxBatch * sizeof(MessageView)];
  MessageView* const views = reinterpret_cast<MessageView*>(view_bytes);
  std::uint64_t delivered = gl->delivered.load(std::memory_order_relaxed);
  std::uint64_t acked_total = gl->acked.load(std::memory_order_relaxed);
  std::uint64_t bytes = 0;
  std::uint32_t handled = 0;
  std::int64_t hold_ns = -1;
  mark_run(&bus_, c, gl);
  while (handled < limit) {
    Slot* expired_head = nullptr;
    const std::uint32_t n = ring.peek_each(ring.head_position(), span_max, [&](std::uint32_t i, std::uint32_t value) {
      Slot* s = pool.at(value);
      // An expired message (delayed.cpp) ends the span; at its head it is taken and never delivered.
      if ((s->kind & Slot::kExtension) && slot_expired(s, now_ns())) [[unlikely]] {
        if (i == 0) expired_head = s;
        return false;
      }
      __builtin_prefetch(reinterpret_cast<const char*>(s) + 64);  // its second line, while the next is found
      slots[i] = s;
      indices[i] = value;
      return true;
    });
    if (expired_head != nullptr) [[unlikely]] {
      ring.advance_single(1);
      const bool expired = bus_.delivery_.expire_if_due(gl, expired_head, 0, 0);
      frees.release(expired_head);
      if (expired) continue;
    }
    if (n == 0) {
      std::uint32_t idx;
      if (!linger(frees, c, [&] { return ring.peek_single(0, idx); })) break;
      continue;
    }
    std::uint64_t span_bytes = 0;  // the payloads' bytes (all acked, the common case)
    for (std::uint32_t i = 0; i < n; ++i) {
      const Slot* s = slots[i];
      if (s->kind == Slot::kInline) [[likely]] {
        // The payload right behind the keys: no look at an extension block or an external block.
        const char* d = s->data();
        new (&views[i]) MessageView(s->header, {d, s->key_len}, {d + s->key_len, s->idem_len},
                                    {d + s->key_len + s->idem_len, s->payload_len}, s->lane, 0);
      } else {
        new (&views[i]) MessageView(s->header, s->key(), s->idempotency_key(), s->payload(), s->lane, 0);
        if (s->kind & Slot::kExtension) Access::set_headers(views[i], slot_headers(s));  // trace.hpp
      }
      Access::set_attempt(views[i], 1);
      span_bytes += s->payload_len;
    }
    if (metrics) gl->oldest_ns.store(slots[0]->header.created_at_ns, std::memory_order_relaxed);
    const BatchOutcome result = call_batch_handler(handler, std::span<const MessageView>(views, n));
    std::uint32_t acked = static_cast<std::uint32_t>(std::min<std::size_t>(result.acked(), n));
    if (acked < n && result.next().kind() == Outcome::Kind::Ack) ++acked;  // an ack at the stop
    const std::uint32_t settled = acked + (acked < n ? 1 : 0);
    ring.advance_single(settled);
    gl->delivered.store(delivered += settled, std::memory_order_relaxed);
    gl->acked.store(acked_total += acked, std::memory_order_relaxed);
    handled += settled;
    if (acked == n) {
      bytes += span_bytes;
    } else {
      for (std::uint32_t i = 0; i < acked; ++i) bytes += slots[i]->payload_len;
    }
    if (metrics && acked > 0) record_span_latency(gl, slots, acked);
    frees.release_span(slots, indices, acked);  // after advance_single: their cells are free
    if (acked == n) continue;
    bytes += slots[acked]->payload_len;
    // Message `acked` failed: the delivery core decides, as in run_plain.
    if (settle_plain_failure(gl, slots[acked], result.next(), frees, &hold_ns)) break;
  }
  unmark_run(gl, handled, bytes);
  *handled_out = handled;
  return hold_ns;
}

// ---------------------------------------------------------------- the runner

namespace {
// The general loop's message leaves the lane: its head, or parked[pi].
void clear_pick(GroupLane* gl, std::ptrdiff_t pi) {
  if (pi >= 0) {
    gl->parked.erase(gl->parked.begin() + pi);
  } else {
    gl->current = nullptr;
  }
}
}  // namespace

void LaneRunner::run_lane(GroupLane* gl) {
  GroupImpl* g = gl->group;
  if (g->topic->durable) {
    bus_.durable_.run_durable_lane(gl);
    return;
  }
  const bool abandon = bus_.sched_.abandoning();
  Consumer* c = abandon ? nullptr : bus_.pin_consumer(g);

  if (c == nullptr && g->persistent && !abandon) {
    // A queue with no consumer: messages wait. Unschedule; attach() reschedules
    // lanes once a consumer exists (Dekker on enabled / scheduled).
    const bool holding = gl->current != nullptr || !gl->parked.empty();  // owner-only: read before releasing
    bus_.sched_.unschedule(gl);
    bus_.sched_.fence_after_unschedule(gl);
    if (g->consumer_count.load(std::memory_order_seq_cst) > 0 && (holding || gl->ring.ready())) bus_.sched_.schedule(gl);
    return;
  }

  // Topics without DropOldest have one dequeuer per lane ring (its owner).
  const bool single = g->topic->options.backpressure != Backpressure::DropOldest;
  // The worker's chain of freed slots outlives the run (WorkerLocal).
  FreeChain own_frees;
  FreeChain& frees = tl_worker != nullptr ? tl_worker->frees : own_frees;
  frees.bind(g->topic->pool);
  const bool kp = g->options.key_parallel_retry;
  if (kp && gl->parked.capacity() < g->options.key_parallel_limit)
    gl->parked.reserve(g->options.key_parallel_limit);  // once: parking never allocates after
  std::uint32_t handled = 0;
  // The plain fast path (doc/performance.md): a group with no idempotency
  // scope, no key_parallel_retry, no attempt_timeout, no tracer and no retry pending
  // hands each message of the ring straight to its handler. The general loop
  // (run_general) takes the lane again when a message is held for a retry.
  // A batch handler takes the batch path, which needs a single dequeuer;
  // with DropOldest it runs in the general loop (spans of one, via invoke).
  const bool plain = c != nullptr && gl->current == nullptr && gl->parked.empty() && !kp &&
                     g->idempotency == nullptr && g->options.attempt_timeout.count() == 0 && !c->tx_handler &&
                     !g->options.outage.enabled && bus_.options.tracer == nullptr &&
                     (!c->batch_handler || single);
  // >= 0: the head message waits this long, the lane with it.
  const std::int64_t hold_ns = !plain             ? run_general(gl, c, single, frees, &handled)
                               : c->batch_handler ? run_plain_batch(gl, c, frees, &handled)
                                                  : run_plain(gl, c, single, frees, &handled);
  end_run(gl, c, frees, &frees == &own_frees, handled, hold_ns);
}

namespace {
// A subscription of the group is attached and enabled now (BusCore::attach
// enables it before it returns; close() disables it first).
bool has_enabled_consumer(const GroupImpl* g) noexcept {
  const std::uint32_t n = g->consumers_hw.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < n; ++i)
    if (g->consumers[i].enabled.load(std::memory_order_acquire)) return true;
  return false;
}
}  // namespace

LaneRunner::PickStep LaneRunner::pick_next(GroupLane* gl, Consumer* c, bool single, FreeChain& frees, LanePick* pick,
                                     std::int64_t* hold_ns) {
  GroupImpl* g = gl->group;
  const bool kp = g->options.key_parallel_retry;
  // 1. A parked message whose backoff is over (key_parallel_retry).
  pick->pi = -1;
  if (kp && !gl->parked.empty() && c != nullptr) pick->pi = due_parked(gl, RetryTimer::now_ns());
  if (pick->pi >= 0) {
    Parked& pk = gl->parked[static_cast<std::size_t>(pick->pi)];
    pick->s = pk.slot;
    pick->attempts = &pk.attempts;
    pick->first_failure = &pk.first_failure_ns;
    return PickStep::Got;
  }
  // 2. The lane's head: the message held from an earlier run, or the next one.
  pick->attempts = &gl->attempts;
  pick->first_failure = &gl->first_failure_ns;
  if (gl->current == nullptr) {
    auto take = [&](std::uint32_t& idx) {
      return single ? gl->ring.try_dequeue_single(idx) : gl->ring.try_dequeue(idx);
    };
    std::uint32_t idx;
    if (!take(idx)) {
      // The lane is empty. If no other lane waits, linger briefly: a
      // producer in a burst is likely to publish again within the spin,
      // which saves a trip through the run queue per message.
      if (c == nullptr || bus_.sched_.other_work() || !gl->parked.empty()) return PickStep::Stop;
      frees.flush();
      bool got = false;
      for (int spin = 0; spin < 64 && !got; ++spin) {
        cpu_relax();
        got = take(idx);
        if (!got && bus_.sched_.other_work()) return PickStep::Stop;  // as linger: another lane waits
      }
      if (!got) return PickStep::Stop;
    }
    gl->current = g->topic->pool.at(idx);
    gl->attempts = 0;
    gl->first_failure_ns = 0;
    if (bus_.options.metrics && gl->parked.empty())
      gl->oldest_ns.store(gl->current->header.created_at_ns, std::memory_order_relaxed);
  }
  if (kp && c != nullptr && gl->attempts == 0 && key_parked(gl, gl->current->key())) {
    // Behind an earlier message of its key: set it aside, in order.
    if (gl->parked.size() < g->options.key_parallel_limit) {
      gl->parked.push_back(Parked{gl->current, {}, 0, 0, 0});
      gl->current = nullptr;
      return PickStep::Again;
    }
    *hold_ns = 0;  // the limit: the lane waits for its parked messages
    return PickStep::Stop;
  }
  pick->s = gl->current;
  return PickStep::Got;
}

std::int64_t LaneRunner::run_general(GroupLane* gl, Consumer* c, bool single, FreeChain& frees,
                                  std::uint32_t* handled) {
  GroupImpl* g = gl->group;
  const bool kp = g->options.key_parallel_retry;
  std::int64_t hold_ns = -1;
  while (*handled < g->options.batch) {
    LanePick pick;
    const PickStep step = pick_next(gl, c, single, frees, &pick, &hold_ns);
    if (step == PickStep::Again) continue;
    if (step == PickStep::Stop) break;
    Slot* s = pick.s;
    const std::ptrdiff_t pi = pick.pi;
    std::uint32_t* attempts = pick.attempts;
    std::int64_t* first_failure = pick.first_failure;
    if (c == nullptr) {
      // No consumer (the group was left, or shutdown abandons): discard. But
      // a consumer that joined since this run began owns what was published
      // after it joined: keep the head and run the lane again, with it (a
      // run dropping a long backlog would otherwise drop those messages too).
      if (!bus_.sched_.abandoning() && has_enabled_consumer(g)) break;
      gl->dropped.fetch_add(1, std::memory_order_relaxed);
      clear_pick(gl, pi);
      frees.release(s);
      continue;
    }
    if ((hold_ns = bus_.outages_.wait(gl, pi)) >= 0) break;  // paused: wait for the next probe (not an attempt)
    if (s->kind & Slot::kExtension) [[unlikely]] {
      // An expiry (delayed.cpp): a message whose TTL ended is never delivered, a retry included.
      if (bus_.delivery_.expire_if_due(gl, s, *attempts, *first_failure)) {
        if (gl->probing) bus_.outages_.end_probe(gl);
        clear_pick(gl, pi);
        frees.release(s);
        continue;
      }
    }
    const Parcel p{&s->header, s->key(), s->idempotency_key(), s->payload(), s->lane, 0, *attempts + 1, slot_headers(s)};
    // No idempotency scope (the common case): skip the out-of-line call.
    const Admission a = g->idempotency == nullptr ? Admission::Proceed : bus_.delivery_.admit(gl, p, AdmitMode::Claim);
    std::int64_t wait_ns = -1;  // the message stays (not an attempt, or a retry) and waits this long
    if (a == Admission::Later) {
      wait_ns = kHoldBusyKeyNs;  // the key is busy elsewhere: not an attempt
    } else if (a == Admission::Skip) {
      bump(gl->duplicates_skipped);
      ++*handled;
    } else {
      ++*attempts;
      const Invocation inv = bus_.delivery_.invoke(c, gl, p, nullptr);
      ++*handled;
      const Settlement st = bus_.delivery_.settle(gl, p, inv, AdmitMode::Claim, false, *attempts, first_failure);
      if (st.uncounted) --*attempts;  // paused: the attempt is given back
      if (st.next == Settlement::Next::Retry) {
        wait_ns = st.delay_ns;
        if (s->kind & Slot::kExtension) [[unlikely]] wait_ns = clip_to_expiry(s, wait_ns);  // delayed.cpp
      } else if (st.next == Settlement::Next::DeadLetter) {
        bus_.delivery_.dead_letter_ephemeral(gl, s, inv.outcome, *attempts, st.error_class, *first_failure);
      }
    }
    if (gl->probing) bus_.outages_.end_probe(gl);  // a probe that was skipped or held
    if (wait_ns >= 0) {
      if (pi >= 0) {
        gl->parked[static_cast<std::size_t>(pi)].due_ns = RetryTimer::now_ns() + std::max<std::int64_t>(wait_ns, 1);
        continue;
      }
      if (kp && gl->parked.size() < g->options.key_parallel_limit) {
        // Set it aside: later messages of its key queue up behind it, the
        // other keys of the lane go on.
        gl->parked.push_back(Parked{s, {}, gl->attempts, RetryTimer::now_ns() + std::max<std::int64_t>(wait_ns, 1),
                                    gl->first_failure_ns});
        gl->current = nullptr;
        continue;
      }
      // Keep the message at the head of its lane (later messages of the lane
      // must not overtake it) and let other lanes run meanwhile.
      hold_ns = wait_ns;
      break;
    }
    clear_pick(gl, pi);
    frees.release(s);
  }
  return hold_ns;
}

void LaneRunner::end_run(GroupLane* gl, Consumer* c, FreeChain& frees, bool own_chain, std::uint32_t handled,
                      std::int64_t hold_ns) {
  if (own_chain || gl->current != nullptr || !gl->parked.empty()) frees.flush();
  gl->parked_count.store(gl->parked.size(), std::memory_order_relaxed);
  if (bus_.options.metrics && gl->current == nullptr && gl->parked.empty() && !gl->ring.ready())
    gl->oldest_ns.store(0, std::memory_order_relaxed);
  if (c) c->calls.fetch_sub(1, std::memory_order_release);  // release: handler's effects before close() returns

  if (gl->current != nullptr) {
    // The head waits (a retry, a busy key, or the parking limit): stay
    // scheduled; run again after the wait (the earliest parked message at
    // the limit), or at the back of the run queue.
    bus_.requeue(gl, hold_ns == 0 && !gl->parked.empty() ? wait_for_parked(gl) : std::max<std::int64_t>(hold_ns, 0));
    return;
  }
  if (!gl->parked.empty()) {
    if (handled >= gl->group->options.batch || gl->ring.ready() || due_parked(gl, RetryTimer::now_ns()) >= 0 ||
        c == nullptr) {
      bus_.requeue(gl, 0);
    } else {
      park_lane(gl);
    }
    return;
  }
  // Emptied: the worker holds it (scheduler.cpp, "Held lanes"), or lets go.
  if (c != nullptr && bus_.sched_.hold(gl)) return;
  bus_.sched_.let_go(gl);
}

}  // namespace lanebus::detail
