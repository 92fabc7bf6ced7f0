// lanebus — MIT License.
// The lane scheduler and the worker pool (Scheduler, bus_impl.hpp): workers,
// the run queue, held lanes. Design notes in bus_impl.hpp.
#include <algorithm>
#include <chrono>
#include <exception>
#include <string>

#include "bus_impl.hpp"

namespace lanebus::detail {
// ---------------------------------------------------------------- the scheduler

Status Scheduler::start(std::size_t n) {
  held_ = std::make_unique<HeldLanes[]>(n);
  worker_count_ = n;
  // As many workers as CPUs (or more): with any publisher, more threads want
  // a CPU than there are, so an idle worker's spin takes the publisher's.
  const unsigned cpus = std::thread::hardware_concurrency();
  yield_idle_ = cpus != 0 && n >= cpus;
  try {
    workers_.reserve(n);
    for (std::size_t i = 0; i < n; ++i) workers_.emplace_back([this, i] { worker_main(i); });
    while (workers_ready_.load(std::memory_order_acquire) < n) std::this_thread::sleep_for(std::chrono::microseconds(50));
  } catch (const std::exception& e) {
    return Status(Code::Internal, std::string("bus \"") + options_.name + "\": starting workers: " + e.what());
  }
  return Status();
}

void Scheduler::stop() noexcept {
  runq_.stop(static_cast<int>(workers_.size()));
  for (auto& w : workers_) w.join();
  workers_.clear();
}

void Scheduler::schedule(GroupLane* gl) noexcept {
  // seq_cst: the publisher's side of the Dekker hand-off (bus_impl.hpp).
  if (gl->scheduled.load(std::memory_order_seq_cst)) return;
  if (gl->scheduled.exchange(true, std::memory_order_seq_cst)) return;
  enqueue_lane(gl);
}

void Scheduler::enqueue_lane(GroupLane* gl) noexcept {
  // The lane is charged to the class it was queued in, even if its topic
  // moves to another namespace meanwhile. acquire (here and in worker_main):
  // declaring a namespace creates its NamespaceState on another thread and
  // rebinds the topic with a release store.
  NamespaceState* ns = gl->group->topic->ns.load(std::memory_order_acquire);
  runq_.enqueue(gl, ns != nullptr ? &ns->sched : nullptr);  // never allocates (fair_queue.hpp)
}

// ---------------------------------------------------------------- held lanes
//
// A worker that runs a lane empty keeps it scheduled and remembers it (its
// HeldLanes) instead of clearing the flag: a publisher that appends to it
// then finds it scheduled and does nothing else (no run queue, no wake), and
// the worker finds the message by polling the lane's ring between runs. A
// stream spread over many lanes (16 keys over 8 lanes) otherwise costs a
// flag swap, a run-queue push and pop and an unschedule per message.
// - Ownership: GroupLane::holder is the holding worker's tag; whoever swaps
//   it to 0 (the holder, or a thief) runs the lane, exactly as if it had
//   taken it from the run queue. The flag stays set throughout.
// - Latency: a held lane runs only when its holder looks. The holder looks
//   between runs and while idle; an idle worker steals a held lane of
//   another worker that had a message at two of its looks in a row (its
//   holder is busy in a handler), so a message never waits out another
//   lane's long handler while a worker is free. A parked worker wakes every
//   kHeldLookUs to look while another worker holds lanes (so such a message
//   waits at most about twice that). A worker parks without a timeout only
//   when nobody holds a lane and after kQuietLooks timed looks (a stream's
//   gaps park workers often), and while one does, no lane is held (hold()
//   declines): an idle bus has no timed wake-ups once it has been idle
//   kQuietLooks x kHeldLookUs.
// - Oversubscribed (as many workers as CPUs, the default): the idle spin
//   yields the CPU every 64 PAUSEs, so that a publisher sharing a CPU with a
//   spinning worker gets it (yield_when_idle). The linger ends its run at
//   that point instead: a worker off its CPU then holds the lane (stealable)
//   rather than having it taken (nobody else may run it).
// - Fairness: held lanes and the run queue take turns. Once two namespaces
//   have competed for workers (FairRunQueue::contended) nothing is held:
//   every run goes through the fair queue and is charged.
// - Letting go: before it parks, a worker unschedules every lane it holds
//   (store, fence, check the ring: the worker's side of the Dekker hand-off)
//   and schedules again any that a message reached meanwhile.

thread_local constinit WorkerLocal* tl_worker = nullptr;

bool Scheduler::hold(GroupLane* gl) noexcept {
  WorkerLocal* me = tl_worker;
  if (me == nullptr || runq_.contended() || abandon_.load(std::memory_order_relaxed) || closing_.load(std::memory_order_seq_cst)) return false;
  HeldLanes& h = *me->held;
  std::uint32_t n = h.count.load(std::memory_order_relaxed);
  bool listed = me->run_slot >= 0 && h.lane[me->run_slot].load(std::memory_order_relaxed) == gl;
  for (std::uint32_t i = 0; i < n && !listed; ++i) listed = h.lane[i].load(std::memory_order_relaxed) == gl;
  if (!listed) {
    if (n == HeldLanes::kMax) return false;
    h.lane[n].store(gl, std::memory_order_relaxed);
    h.count.store(n + 1, std::memory_order_seq_cst);
  }
  if (worker_count_ == 1) {
    // release: the lane's owner state (written by this run) before a thief's swap.
    gl->holder.store(me->tag, std::memory_order_release);
    return true;
  }
  // A worker parked without a timeout would never look at this lane: hold
  // it only if none is (Dekker with next_lane: the holder, then the count;
  // there the count, then the holders).
  gl->holder.store(me->tag, std::memory_order_seq_cst);
  if (parked_untimed_.load(std::memory_order_seq_cst) == 0) return true;
  std::uint32_t tag = me->tag;
  // Taken back, the caller lets go; else a thief took it and runs it.
  return !gl->holder.compare_exchange_strong(tag, 0, std::memory_order_acq_rel, std::memory_order_relaxed);
}

namespace {
/// Drop entry i of the owner's held array (order does not matter).
void drop_held(HeldLanes& h, std::uint32_t i) noexcept {
  const std::uint32_t n = h.count.load(std::memory_order_relaxed);
  h.lane[i].store(h.lane[n - 1].load(std::memory_order_relaxed), std::memory_order_relaxed);
  h.count.store(n - 1, std::memory_order_release);
}
}  // namespace

GroupLane* Scheduler::take_held(WorkerLocal& me) noexcept {
  HeldLanes& h = *me.held;
  const std::uint32_t n = h.count.load(std::memory_order_relaxed);
  for (std::uint32_t k = 0; k < n; ++k) {
    const std::uint32_t i = (me.next + k) % n;
    GroupLane* gl = h.lane[i].load(std::memory_order_relaxed);
    std::uint32_t tag = gl->holder.load(std::memory_order_relaxed);
    if (tag != me.tag) {
      drop_held(h, i);  // stolen
      return nullptr;   // (the array moved; look again next time)
    }
    if (!gl->ring.ready()) continue;
    // acq_rel: pairs with a thief's swap and with our own hold (release).
    if (!gl->holder.compare_exchange_strong(tag, 0, std::memory_order_acq_rel, std::memory_order_relaxed)) {
      drop_held(h, i);
      return nullptr;
    }
    me.next = i + 1;
    me.run_slot = static_cast<std::int32_t>(i);
    return gl;
  }
  return nullptr;
}

GroupLane* Scheduler::steal_held(WorkerLocal& me) noexcept {
  // Second look: the lane seen last time still waits at the same message.
  if (GroupLane* gl = me.candidate) {
    me.candidate = nullptr;
    std::uint32_t tag = me.candidate_tag;
    if (gl->holder.load(std::memory_order_relaxed) == tag && gl->ring.ready() &&
        gl->ring.head_position() == me.candidate_head &&
        gl->holder.compare_exchange_strong(tag, 0, std::memory_order_acq_rel, std::memory_order_relaxed)) {
      me.run_slot = -1;
      return gl;
    }
  }
  // First look: remember one held lane that has a message (one at a time,
  // so two waiting lanes cannot keep replacing each other as the candidate).
  for (std::size_t w = 0; w < worker_count_; ++w) {
    if (w == me.index) continue;
    HeldLanes& h = held_[w];
    const std::uint32_t n = std::min(h.count.load(std::memory_order_acquire), HeldLanes::kMax);
    const auto tag = static_cast<std::uint32_t>(w + 1);
    for (std::uint32_t i = 0; i < n; ++i) {
      GroupLane* gl = h.lane[i].load(std::memory_order_relaxed);
      if (gl == nullptr || gl->holder.load(std::memory_order_relaxed) != tag || !gl->ring.ready()) continue;
      me.candidate = gl;
      me.candidate_tag = tag;
      me.candidate_head = gl->ring.head_position();
      return nullptr;
    }
  }
  return nullptr;
}

void Scheduler::fence_after_unschedule(const GroupLane* gl) noexcept {
  if (gl->group->topic->ever_solo.load(std::memory_order_seq_cst)) AsymmetricFence::heavy();
}

void Scheduler::release_held(WorkerLocal& me) noexcept {
  // Every flag first, then one fence for all of them, then the rings.
  HeldLanes& h = *me.held;
  const std::uint32_t n = h.count.load(std::memory_order_relaxed);
  GroupLane* mine[HeldLanes::kMax];
  std::uint32_t k = 0;
  bool heavy = false;
  for (std::uint32_t i = 0; i < n; ++i) {
    GroupLane* gl = h.lane[i].load(std::memory_order_relaxed);
    std::uint32_t tag = me.tag;
    if (!gl->holder.compare_exchange_strong(tag, 0, std::memory_order_acq_rel, std::memory_order_relaxed)) continue;
    unschedule(gl);
    heavy = heavy || gl->group->topic->ever_solo.load(std::memory_order_seq_cst);
    mine[k++] = gl;
  }
  h.count.store(0, std::memory_order_release);
  me.next = 0;
  if (heavy) AsymmetricFence::heavy();
  for (std::uint32_t i = 0; i < k; ++i)
    if (mine[i]->ring.ready()) schedule(mine[i]);
}

bool Scheduler::other_work() const noexcept {
  if (runq_.size_approx() != 0) return true;
  const WorkerLocal* me = tl_worker;
  if (me == nullptr) return false;
  const HeldLanes& h = *me->held;
  const std::uint32_t n = h.count.load(std::memory_order_relaxed);
  for (std::uint32_t i = 0; i < n; ++i) {
    const GroupLane* gl = h.lane[i].load(std::memory_order_relaxed);
    if (gl->holder.load(std::memory_order_relaxed) == me->tag && gl->ring.ready()) return true;
  }
  return false;
}

GroupLane* Scheduler::next_lane(WorkerLocal& me, FairRunQueue<GroupLane>::Pick& pick) noexcept {
  using clock = std::chrono::steady_clock;
  // Held lanes and the run queue take turns (a lane from one, then the other first).
  const bool runq_first = me.run_slot >= 0;
  me.run_slot = -1;
  pick = {};
  if (runq_first && runq_.try_dequeue(pick)) return pick.lane;
  if (GroupLane* gl = take_held(me)) return gl;
  if (!runq_first && runq_.try_dequeue(pick)) return pick.lane;
  // Idle: give the freed slots back, then spin looking everywhere.
  me.frees.flush();
  if (options_.spin.count() > 0) {
    const auto until = clock::now() + options_.spin;
    for (std::uint32_t i = 1; !runq_.stopped(); ++i) {
      if (runq_.try_dequeue(pick)) return pick.lane;
      if (GroupLane* gl = take_held(me)) return gl;
      if ((i & 7) == 0 && worker_count_ > 1) {
        if (GroupLane* gl = steal_held(me)) return gl;
      }
      if ((i & 63) == 0) {
        if (clock::now() >= until) break;
        if (yield_idle_) std::this_thread::yield();  // oversubscribed: let a publisher have the CPU
      }
      cpu_relax();
    }
  }
  // Park: no CPU until a lane is scheduled. Let go of the held lanes first
  // (any that got a message meanwhile goes to the run queue). nullptr:
  // shutdown() stopped the queue (lanes still queued then are released by
  // release_remaining()).
  release_held(me);
  if (runq_.try_dequeue(pick)) return pick.lane;
  // While another worker holds lanes, wake now and then to look at them: a
  // message there waits for its holder, which may be inside a long handler
  // call (steal_held takes a lane that had a message at two looks).
  // Just parked (the first kQuietLooks looks): a timed park even when nobody
  // holds a lane. A stream with gaps (a publisher descheduled, a topic full)
  // parks workers often, and while one is parked without a timeout, hold()
  // declines and every other worker lets go of each lane it empties: a
  // heavy fence (a membarrier's IPIs) per run and a run-queue trip per
  // message after it. That was 17-20 k declines a second in fanout1to4
  // (doc/performance.md, thirteenth round). An idle bus still ends up
  // parked without a timeout, kQuietLooks × kHeldLookUs after its last run.
  std::uint32_t looks = 0;
  for (;;) {
    if (runq_.stopped()) return nullptr;
    const bool held = others_hold(me);
    if (held || (worker_count_ > 1 && looks < kQuietLooks)) {
      if (held) {
        if (GroupLane* gl = steal_held(me)) return gl;
      } else {
        ++looks;
      }
      if (runq_.wait_dequeue_for(pick, kHeldLookUs)) return pick.lane;
      continue;
    }
    // Nobody holds a lane: park without a timeout, unless a worker started
    // holding meanwhile (hold() checks this count after its holder store).
    parked_untimed_.fetch_add(1, std::memory_order_seq_cst);
    if (others_hold(me)) {
      parked_untimed_.fetch_sub(1, std::memory_order_seq_cst);
      continue;
    }
    const bool got = runq_.wait_dequeue(pick);
    parked_untimed_.fetch_sub(1, std::memory_order_seq_cst);
    return got ? pick.lane : nullptr;
  }
}

bool Scheduler::others_hold(const WorkerLocal& me) const noexcept {
  for (std::size_t w = 0; w < worker_count_; ++w)
    if (w != me.index && held_[w].count.load(std::memory_order_seq_cst) != 0) return true;
  return false;
}

void Scheduler::run_taken(WorkerLocal& me, GroupLane* gl, const FairRunQueue<GroupLane>::Pick& pick) {
  // Tenancy: a namespace over its consume quota runs its lanes later
  // (slowed, not failed); what the lane delivered is counted and charged.
  // acquire (here and in enqueue_lane): declaring a namespace creates its
  // NamespaceState on another thread and rebinds the topic with a release store.
  NamespaceState* ns = gl->group->topic->ns.load(std::memory_order_acquire);
  if (ns != nullptr && !abandon_.load(std::memory_order_relaxed)) {
    if (const std::int64_t wait = ns->consume_wait(); wait > 0) {
      if (me.run_slot >= 0) drop_held(*me.held, static_cast<std::uint32_t>(me.run_slot));
      me.run_slot = -1;
      bus_.requeue(gl, wait);
      return;
    }
  }
  tl_delivered_msgs = 0;
  tl_delivered_bytes = 0;
  // Fair sharing (fair_queue.hpp): the run's time is charged to the
  // namespace it was queued in; a bus that never had two namespaces with
  // work at once reads no clock here.
  const std::int64_t started = pick.timed ? RetryTimer::now_ns() : 0;
  bus_.lanes_.run_lane(gl);
  if (pick.timed) runq_.charge(pick, RetryTimer::now_ns() - started);
  if (ns != nullptr && tl_delivered_msgs != 0) ns->delivered(tl_delivered_msgs, tl_delivered_bytes);
  // Taken from the held array and not held again: drop its entry.
  if (me.run_slot >= 0 && gl->holder.load(std::memory_order_relaxed) != me.tag) {
    HeldLanes& h = *me.held;
    const auto i = static_cast<std::uint32_t>(me.run_slot);
    if (i < h.count.load(std::memory_order_relaxed) && h.lane[i].load(std::memory_order_relaxed) == gl) drop_held(h, i);
  }
}

void Scheduler::worker_main(std::size_t index) {
  WorkerLocal me(static_cast<std::uint32_t>(index), &held_[index]);
  tl_worker = &me;
  workers_ready_.fetch_add(1, std::memory_order_release);
  for (;;) {
    FairRunQueue<GroupLane>::Pick pick;
    GroupLane* gl = next_lane(me, pick);
    if (gl == nullptr) break;
    run_taken(me, gl, pick);
  }
  me.frees.flush();  // shutdown counts slots in use until every one is back
  tl_worker = nullptr;
}

}  // namespace lanebus::detail
