// lanebus — MIT License.
// Lane scheduling and the worker pool: start, schedule, requeue, workers,
// shutdown. Design notes in bus_impl.hpp.
#include <algorithm>
#include <bit>
#include <cassert>
#include <exception>
#include <string>

#include "bus_impl.hpp"
#include "lanebus/lease.hpp"

namespace lanebus::detail {

thread_local Consumer* tl_running_consumer = nullptr;
thread_local BusCore* tl_running_bus = nullptr;
thread_local GroupLane* tl_running_lane = nullptr;

// ---------------------------------------------------------------- bus core

BusCore::BusCore(const BusOptions& o) : options(o), logger(o.log, o.name) {}

BusCore::~BusCore() {
  // Bus::~Bus already shut down; this covers a failed start().
  if (!stopped_.load()) (void)shutdown(ShutdownMode::Abandon, std::chrono::milliseconds(0));
  drop_thread_publishers();  // their magazines go back to the pools, still here
}

Status BusCore::start() {
  if (!options.store.directory.empty()) {
    auto st = DurableStore::open(options.store);
    if (!st.ok()) return st.status();
    store_ = std::move(*st);
    store_->set_logger(&logger);
    dlq_ = std::make_unique<DlqStore>(*store_, options.dlq);
    if (options.lease_table != nullptr) {
      LeaseTable* table = options.lease_table;
      store_->set_fence_confirm(
          [table](std::string_view lease, std::uint64_t token) { return table->confirm_grant(lease, token); });
    }
    dead_letters_ = Access::dead_letters(this);
    store_->set_append_listener(
        [this](std::uint32_t topic_id, std::uint32_t lane, std::uint64_t end) { on_append(topic_id, lane, end); });
  }
  // Before the poller: its maintenance pass uses both.
  tenancy_ = std::make_unique<TenancyImpl>(store_.get(), &closing_);
  tenancy_->set_logger(&logger);
  if (Status ts = tenancy_->open(); !ts.ok()) return ts;
  tenancy_->set_rebind([this] {
    MutexLock l(&mu_);
    for (auto& [name, t] : topics_) t->ns.store(tenancy_->resolve(name), std::memory_order_release);
  });
  if (dlq_) {
    // A replay re-appends to the origin topic: usage of its namespace, like a publish.
    dlq_->set_replay_listener([t = tenancy_.get()](std::string_view topic, std::uint64_t bytes) {
      if (NamespaceState* ns = t->resolve(topic); ns != nullptr) ns->count_in(1, bytes);
    });
  }
  namespaces_ = Access::namespaces(this);
  schemas_ = std::make_unique<SchemaRegistry>(this, store_.get());
  if (store_) {
    try {
      poller_ = std::thread([this] { poller_main(); });
    } catch (const std::exception& e) {
      return Status(Code::Internal, std::string("bus \"") + options.name + "\": starting the poller: " + e.what());
    }
  }
  try {
    timer_ = std::make_unique<RetryTimer>([this](TimerEntry* e) {
      if (e->kind == TimerEntry::Kind::Wake) {
        schedule(static_cast<WakeEntry*>(e)->lane);  // a parked message is due
        return;
      }
      if (e->kind == TimerEntry::Kind::Delayed) {
        // Delayed messages are due (delayed.cpp; a durable store's index: delayed_durable.cpp).
        if (TopicImpl* t = static_cast<DelayEntry*>(e)->topic) {
          t->release_due();
        } else {
          move_durable_delayed();
        }
        return;
      }
      enqueue_lane(static_cast<GroupLane*>(e));
    });
  } catch (const std::exception& e) {
    return Status(Code::Internal, std::string("bus \"") + options.name + "\": starting the retry timer: " + e.what());
  }
  durable_delays_.kind = TimerEntry::Kind::Delayed;
  refresh_durable_delays();  // delayed messages stored before this start (a restart)
  std::size_t n = options.workers ? options.workers : std::max(1u, std::thread::hardware_concurrency());
  held_ = std::make_unique<HeldLanes[]>(n);
  worker_count_ = n;
  try {
    workers_.reserve(n);
    for (std::size_t i = 0; i < n; ++i) workers_.emplace_back([this, i] { worker_main(i); });
    // Return only once every worker runs (its thread-locals exist), so
    // "after warm-up" never includes a worker start.
    while (workers_ready_.load(std::memory_order_acquire) < n) std::this_thread::sleep_for(std::chrono::microseconds(50));
  } catch (const std::exception& e) {
    return Status(Code::Internal, std::string("bus \"") + options.name + "\": starting workers: " + e.what());
  }
  return Status();
}

void BusCore::schedule(GroupLane* gl) noexcept {
  // seq_cst: the publisher's side of the Dekker hand-off (bus_impl.hpp).
  if (gl->scheduled.load(std::memory_order_seq_cst)) return;
  if (gl->scheduled.exchange(true, std::memory_order_seq_cst)) return;
  enqueue_lane(gl);
}

void BusCore::enqueue_lane(GroupLane* gl) noexcept {
  // The lane is charged to the class it was queued in, even if its topic
  // moves to another namespace meanwhile. acquire (here and in worker_main):
  // declaring a namespace creates its NamespaceState on another thread and
  // rebinds the topic with a release store.
  NamespaceState* ns = gl->group->topic->ns.load(std::memory_order_acquire);
  runq_.enqueue(gl, ns != nullptr ? &ns->sched : nullptr);  // never allocates (fair_queue.hpp)
}

std::uint32_t BusCore::claim_publisher_slot() noexcept {
  for (std::uint32_t k = 0; k < kPublisherSlots; ++k) {
    bool used = false;
    if (pub_slots_[k].used.compare_exchange_strong(used, true, std::memory_order_acq_rel)) return k;
  }
  return kNoPublisherSlot;
}

void BusCore::release_publisher_slot(std::uint32_t k) noexcept {
  pub_slots_[k].in_push.store(0, std::memory_order_relaxed);
  pub_slots_[k].used.store(false, std::memory_order_release);
}

PublisherLink* PublisherState::find_link(TopicImpl* t) noexcept {
  for (std::uint32_t i = 0; i < link_count; ++i)
    if (links[i].topic == t) return last_link = &links[i];
  if (link_count == kLinks) return nullptr;
  PublisherLink& l = links[link_count++];
  l.topic = t;
  t->pool.attach(&l.mag);
  return last_link = &l;
}

PublisherState::~PublisherState() {
  for (std::uint32_t i = 0; i < link_count; ++i) {
    TopicImpl* t = links[i].topic;
    t->pool.detach(&links[i].mag);
    if (slot != kNoPublisherSlot) {
      // Give up solo ownership: the next publisher of the topic may take it
      // (once the timer gives it back, if it has it lent: lend_to_timer).
      const std::uintptr_t mine = std::uintptr_t{slot} + 2;
      for (;;) {
        std::uintptr_t o = mine;
        if (t->owner.compare_exchange_strong(o, 0, std::memory_order_acq_rel, std::memory_order_relaxed)) break;
        if (o != (mine | TopicImpl::kLent)) break;  // shared, or never ours
        std::this_thread::yield();
      }
    }
  }
  if (slot != kNoPublisherSlot && bus != nullptr) bus->release_publisher_slot(slot);
}

Consumer* BusCore::pin_consumer(GroupImpl* g) noexcept {
  std::uint32_t n = g->consumers_hw.load(std::memory_order_acquire);
  if (n == 0) return nullptr;
  // One consumer (a topic's subscription, the common case): nothing to rotate.
  std::uint32_t start = n == 1 ? 0 : g->rr.fetch_add(1, std::memory_order_relaxed);
  for (std::uint32_t i = 0; i < n; ++i) {
    Consumer* c = &g->consumers[(start + i) % n];
    if (!c->enabled.load(std::memory_order_acquire)) continue;
    // seq_cst pair with close(): enabled=false then wait for calls==0.
    c->calls.fetch_add(1, std::memory_order_seq_cst);
    if (c->enabled.load(std::memory_order_seq_cst)) return c;
    c->calls.fetch_sub(1, std::memory_order_release);
  }
  return nullptr;
}

void BusCore::requeue(GroupLane* gl, std::int64_t delay_ns) noexcept {
  if (delay_ns > 0 && timer_) {
    gl->due_ns = RetryTimer::now_ns() + delay_ns;
    timer_->add(gl);  // the lane stays scheduled while it waits
    return;
  }
  enqueue_lane(gl);
}

// The watchdog (GroupOptions::attempt_timeout): a handler call still running
// past its group's budget is counted once as stuck; on a durable queue its
// claim is ended so another consumer process may take the message. Runs on
// its own thread, started with the first group that has a budget.
void BusCore::watchdog_main() {
  std::vector<std::pair<GroupImpl*, std::chrono::milliseconds>> groups;
  for (;;) {
    std::chrono::milliseconds tick{100};
    {
      // A queue's options are rewritten under mu_ when a new first consumer
      // attaches: read the budget here, not later.
      MutexLock l(&mu_);
      groups.clear();
      for (GroupImpl* g : watched_) groups.emplace_back(g, g->options.attempt_timeout);
    }
    for (auto [g, budget] : groups) {
      if (budget.count() <= 0) continue;
      tick = std::min(tick, std::max(std::chrono::milliseconds(5), budget / 4));
      const std::int64_t now = RetryTimer::now_ns();
      const std::int64_t budget_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(budget).count();
      for (auto& lane : g->lanes) {
        GroupLane* gl = lane.get();
        const std::int64_t since = gl->running_since_ns.load(std::memory_order_acquire);
        if (since <= kRunningUntimed || now - since <= budget_ns) continue;
        const std::uint64_t seq = gl->call_seq.load(std::memory_order_relaxed);
        if (seq == gl->stuck_seen_seq) continue;  // this call was counted already
        gl->stuck_seen_seq = seq;
        gl->stuck.fetch_add(1, std::memory_order_relaxed);
        if (logger.enabled())
          logger.limited(g->stuck_log, LogLevel::Warn,
                         "handler of group \"%s\" on \"%s\" lane %u still running after %lld ms, past attempt_timeout (%lld ms)%s",
                         g->name.c_str(), g->topic->name.c_str(), gl->lane,
                         static_cast<long long>((now - since) / 1'000'000), static_cast<long long>(budget.count()),
                         g->topic->durable && g->topic->is_queue ? "; its claim is ended" : "");
        if (g->topic->durable && g->topic->is_queue && store_) {
          // End the claim now: the message may go to another consumer. This
          // call's late settle still commits if nobody took it meanwhile;
          // else it finds the claim gone and the rest of its batch goes back.
          const std::uint64_t offset = gl->running_offset.load(std::memory_order_relaxed);
          const std::uint32_t attempt = gl->running_attempt.load(std::memory_order_relaxed);
          GroupRef group = g->store_group;
          const std::uint32_t lane_no = gl->lane;
          (void)store_->write_async(
              [group, lane_no, offset, attempt](StoreTxn& t) -> Status {
                Status es = t.expire_claim(group, lane_no, offset, attempt);
                return (es.code() == Code::NotFound || es.code() == Code::StaleToken) ? Status() : es;
              },
              [gl](const Status& st) {
                if (!st.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
              });
        }
      }
    }
    std::unique_lock l(watchdog_mu_);
    if (watchdog_cv_.wait_for(l, tick, [&] { return watchdog_stop_; })) return;
  }
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
//   when nobody holds a lane, and while one does, no lane is held (hold()
//   declines): an idle bus has no timed wake-ups.
// - Fairness: held lanes and the run queue take turns. Once two namespaces
//   have competed for workers (FairRunQueue::contended) nothing is held:
//   every run goes through the fair queue and is charged.
// - Letting go: before it parks, a worker unschedules every lane it holds
//   (store, fence, check the ring: the worker's side of the Dekker hand-off)
//   and schedules again any that a message reached meanwhile.

thread_local WorkerLocal* tl_worker = nullptr;

bool BusCore::hold(GroupLane* gl) noexcept {
  WorkerLocal* me = tl_worker;
  if (me == nullptr || runq_.contended() || abandon_.load(std::memory_order_relaxed) || closing()) return false;
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

GroupLane* BusCore::take_held(WorkerLocal& me) noexcept {
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

GroupLane* BusCore::steal_held(WorkerLocal& me) noexcept {
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

void BusCore::fence_after_unschedule(const GroupLane* gl) noexcept {
  if (gl->group->topic->ever_solo.load(std::memory_order_seq_cst)) AsymmetricFence::heavy();
}

void BusCore::release_held(WorkerLocal& me) noexcept {
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

bool BusCore::other_work() const noexcept {
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

GroupLane* BusCore::next_lane(WorkerLocal& me, FairRunQueue<GroupLane>::Pick& pick) noexcept {
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
  if (options.spin.count() > 0) {
    const auto until = clock::now() + options.spin;
    for (std::uint32_t i = 1; !runq_.stopped(); ++i) {
      if (runq_.try_dequeue(pick)) return pick.lane;
      if (GroupLane* gl = take_held(me)) return gl;
      if ((i & 7) == 0 && worker_count_ > 1) {
        if (GroupLane* gl = steal_held(me)) return gl;
      }
      if ((i & 63) == 0 && clock::now() >= until) break;
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
  for (;;) {
    if (runq_.stopped()) return nullptr;
    if (others_hold(me)) {
      if (GroupLane* gl = steal_held(me)) return gl;
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

bool BusCore::others_hold(const WorkerLocal& me) const noexcept {
  for (std::size_t w = 0; w < worker_count_; ++w)
    if (w != me.index && held_[w].count.load(std::memory_order_seq_cst) != 0) return true;
  return false;
}

void BusCore::run_taken(WorkerLocal& me, GroupLane* gl, const FairRunQueue<GroupLane>::Pick& pick) {
  // Tenancy: a namespace over its consume quota runs its lanes later
  // (slowed, not failed); what the lane delivered is counted and charged.
  // acquire (here and in enqueue_lane): declaring a namespace creates its
  // NamespaceState on another thread and rebinds the topic with a release store.
  NamespaceState* ns = gl->group->topic->ns.load(std::memory_order_acquire);
  if (ns != nullptr && !abandon_.load(std::memory_order_relaxed)) {
    if (const std::int64_t wait = ns->consume_wait(); wait > 0) {
      if (me.run_slot >= 0) drop_held(*me.held, static_cast<std::uint32_t>(me.run_slot));
      me.run_slot = -1;
      requeue(gl, wait);
      return;
    }
  }
  tl_delivered_msgs = 0;
  tl_delivered_bytes = 0;
  // Fair sharing (fair_queue.hpp): the run's time is charged to the
  // namespace it was queued in; a bus that never had two namespaces with
  // work at once reads no clock here.
  const std::int64_t started = pick.timed ? RetryTimer::now_ns() : 0;
  run_lane(gl);
  if (pick.timed) runq_.charge(pick, RetryTimer::now_ns() - started);
  if (ns != nullptr && tl_delivered_msgs != 0) ns->delivered(tl_delivered_msgs, tl_delivered_bytes);
  // Taken from the held array and not held again: drop its entry.
  if (me.run_slot >= 0 && gl->holder.load(std::memory_order_relaxed) != me.tag) {
    HeldLanes& h = *me.held;
    const auto i = static_cast<std::uint32_t>(me.run_slot);
    if (i < h.count.load(std::memory_order_relaxed) && h.lane[i].load(std::memory_order_relaxed) == gl) drop_held(h, i);
  }
}

void BusCore::worker_main(std::size_t index) {
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

std::int64_t BusCore::slots_in_use() const {
  MutexLock l(&mu_);
  std::int64_t n = 0;
  for (const auto& [name, t] : topics_) n += t->pool.in_use();
  return n;
}

void BusCore::release_remaining() noexcept {
  MutexLock l(&mu_);
  for (auto& [name, t] : topics_) {
    for (auto& g : t->owned_groups) {
      for (auto& gl : g->lanes) {
        if (gl->current) {
          gl->dropped.fetch_add(1, std::memory_order_relaxed);
          t->pool.release(gl->current);
          gl->current = nullptr;
        }
        for (Parked& pk : gl->parked) {
          if (pk.slot != nullptr) {
            gl->dropped.fetch_add(1, std::memory_order_relaxed);
            t->pool.release(pk.slot);
          }
        }
        gl->parked.clear();
        gl->parked_count.store(0, std::memory_order_relaxed);
        std::uint32_t idx;
        while (gl->ring.try_dequeue(idx)) {
          gl->dropped.fetch_add(1, std::memory_order_relaxed);
          t->pool.release(t->pool.at(idx));
        }
        gl->scheduled.store(false, std::memory_order_relaxed);
      }
    }
  }
}

std::string BusCore::running_handlers() const {
  std::string out;
  const std::int64_t now = RetryTimer::now_ns();
  MutexLock l(&mu_);
  for (const auto& [name, t] : topics_) {
    for (const auto& g : t->owned_groups) {
      for (const auto& gl : g->lanes) {
        const std::int64_t since = gl->running_since_ns.load(std::memory_order_acquire);
        if (since == 0) continue;
        if (!out.empty()) out += ", ";
        out += std::string(t->is_queue ? "queue" : "topic") + " \"" + t->name + "\"";
        if (!t->is_queue) out += " group \"" + g->name + "\"";
        out += " lane " + std::to_string(gl->lane);
        if (since != kRunningUntimed) out += " (running for " + std::to_string((now - since) / 1'000'000) + " ms)";
      }
    }
  }
  return out;
}

Status BusCore::shutdown(ShutdownMode mode, std::chrono::milliseconds timeout) {
  if (tl_running_bus == this)
    return Status(Code::Busy, "bus \"" + options.name + "\": shutdown called from a handler; a worker cannot join itself");
  MutexLock guard(&shutdown_mu_);
  if (stopped_.load()) return Status();
  closing_.store(true, std::memory_order_seq_cst);
  // Publishers through a Publisher take a slot with a light fence before
  // they read closing (publish_via): from here on each of them sees closing
  // or is counted in slots_in_use().
  if (AsymmetricFence::available()) AsymmetricFence::heavy();
  discard_delayed();  // in-memory delayed messages end with the bus (doc/delays.md)
  Status result;
  const auto drain_deadline = std::chrono::steady_clock::now() + timeout;
  if (mode == ShutdownMode::Drain) {
    auto deadline = drain_deadline;
    while (slots_in_use() > 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        result = Status(Code::TimedOut, "bus \"" + options.name + "\": drain did not finish within " +
                                            std::to_string(timeout.count()) + " ms; " +
                                            std::to_string(slots_in_use()) + " messages abandoned");
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      discard_delayed();  // a timed publish that passed its closing check late
    }
  }
  // From here on workers start no handler call.
  abandon_.store(true, std::memory_order_release);
  {
    // A handler cannot be stopped: wait for running calls until the deadline,
    // then name the ones that held shutdown up (joining waits for them).
    auto deadline = drain_deadline;
    std::string held = running_handlers();
    while (!held.empty() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      held = running_handlers();
    }
    if (!held.empty()) {
      std::string msg = "bus \"" + options.name + "\": shutdown held up past " + std::to_string(timeout.count()) +
                        " ms by a running handler: " + held;
      if (!result.ok()) msg = std::string(result.message()) + "; " + msg;
      result = Status(Code::TimedOut, msg);
    }
  }
  abandon_.store(true, std::memory_order_release);
  runq_.stop(static_cast<int>(workers_.size()));
  for (auto& w : workers_) w.join();
  workers_.clear();
  if (watchdog_.joinable()) {
    {
      std::lock_guard l(watchdog_mu_);
      watchdog_stop_ = true;
    }
    watchdog_cv_.notify_all();
    watchdog_.join();
  }
  if (timer_) timer_->stop();  // lanes waiting out a backoff are abandoned below
  // Publishers that passed the closing check before it was set may still be
  // pushing into rings; they hold a slot (in_use) until done, so loop.
  for (;;) {
    discard_delayed();
    release_remaining();
    if (slots_in_use() == 0) break;
    std::this_thread::yield();
  }
  if (poller_.joinable()) {
    {
      std::lock_guard l(poller_mu_);
      poller_stop_ = true;
    }
    poller_cv_.notify_all();
    store_->interrupt_commit_wait();  // after poller_stop_: see poller_main
    poller_.join();
  }
  if (tenancy_) tenancy_->close();  // flushes usage into the store
  if (store_) {
    // The usage audit keeps this process's last reads (best effort: a
    // read-only or failed store only loses the counts since the last tick).
    if (schemas_ && !store_->read_only()) (void)schemas_->flush_usage();
    Status cs = store_->close();
    if (!cs.ok() && result.ok()) result = cs;
  }
  stopped_.store(true);
  return result;
}

}  // namespace lanebus::detail
