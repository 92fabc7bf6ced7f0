// lanebus — MIT License.
// The in-process bus: publish path, lane scheduling, workers, subscriptions,
// shutdown. Design notes and lock order are in bus_impl.hpp.
#include <algorithm>
#include <bit>
#include <cassert>
#include <exception>
#include <string>

#include "bus_impl.hpp"
#include "lanebus/lease.hpp"
#include "names.hpp"

namespace lanebus {
namespace detail {

namespace {

// The consumer whose handler this thread is running, if any: lets close() and
// shutdown() called from inside a handler return Busy instead of deadlocking.
thread_local Consumer* tl_running_consumer = nullptr;
thread_local BusCore* tl_running_bus = nullptr;

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// How long a lane waits when another consumer holds a message's idempotency key.
constexpr std::int64_t kDedupBusyDelayNs = 50'000'000;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::uint32_t round_pow2(std::uint32_t v) { return std::bit_ceil(std::max<std::uint32_t>(v, 2)); }

Status check_topic_options(std::string_view name, const TopicOptions& o) {
  auto bad = [&](const std::string& why) {
    return Status(Code::InvalidArgument, "topic \"" + std::string(name) + "\": " + why);
  };
  if (o.lanes == 0 || o.lanes > 4096) return bad("lanes must be 1..4096, got " + std::to_string(o.lanes));
  if (o.capacity == 0 || o.capacity > (1u << 24))
    return bad("capacity must be 1..16777216, got " + std::to_string(o.capacity));
  if (o.slot_bytes == 0 || o.slot_bytes > (16u << 20))
    return bad("slot_bytes must be 1..16 MiB, got " + std::to_string(o.slot_bytes));
  if (o.max_groups == 0 || o.max_groups > 1024)
    return bad("max_groups must be 1..1024, got " + std::to_string(o.max_groups));
  if (o.block_timeout.count() < 0) return bad("block_timeout must not be negative");
  return Status();
}

}  // namespace

// ---------------------------------------------------------------- groups

GroupImpl::GroupImpl(TopicImpl* t, std::string n, const GroupOptions& o, std::uint32_t lane_count,
                     std::uint32_t ring_capacity, std::uint32_t max_cons)
    : topic(t),
      name(std::move(n)),
      options(o),
      consumers(new Consumer[max_cons]),
      max_consumers(max_cons),
      persistent(t->is_queue || t->durable) {
  lanes.reserve(lane_count);
  for (std::uint32_t l = 0; l < lane_count; ++l) lanes.push_back(std::make_unique<GroupLane>(this, l, ring_capacity));
  for (std::uint32_t i = 0; i < max_cons; ++i) consumers[i].group = this;
}

// ---------------------------------------------------------------- topics

TopicImpl::TopicImpl(BusCore* b, std::string n, bool queue, const TopicOptions& o)
    : bus(b),
      name(std::move(n)),
      is_queue(queue),
      options(o),
      durable(o.durable),
      // Durable topics keep messages in the store, not in slots.
      capacity(o.durable ? 2 : round_pow2(o.capacity)),
      pool(capacity, o.durable ? 1 : o.slot_bytes),
      groups(new std::atomic<GroupImpl*>[o.max_groups]),
      lane_load(new LaneLoad[o.lanes]) {
  for (std::uint32_t i = 0; i < o.max_groups; ++i) groups[i].store(nullptr, std::memory_order_relaxed);
}

// Discard the oldest queued message of each active group, lane by lane from
// `first_lane`, until a slot comes free. True if something was dropped.
bool TopicImpl::drop_oldest(std::uint32_t first_lane) noexcept {
  bool dropped_any = false;
  std::uint32_t ng = group_count.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < options.lanes; ++i) {
    std::uint32_t lane = (first_lane + i) % options.lanes;
    for (std::uint32_t gi = 0; gi < ng; ++gi) {
      GroupImpl* g = groups[gi].load(std::memory_order_acquire);
      if (g == nullptr) continue;
      GroupLane& gl = *g->lanes[lane];
      std::uint32_t idx;
      if (gl.ring.try_dequeue(idx)) {
        gl.dropped.fetch_add(1, std::memory_order_relaxed);
        pool.release(pool.at(idx));
        dropped_any = true;
      }
    }
    if (dropped_any) return true;
  }
  return false;
}

Slot* TopicImpl::acquire_slot(std::uint32_t lane, bool may_block) noexcept {
  Slot* s = pool.try_alloc();
  if (s != nullptr) return s;
  switch (options.backpressure) {
    case Backpressure::FailFast:
      return nullptr;
    case Backpressure::DropOldest: {
      // A drop frees a slot unless another group or a worker still holds the
      // message; keep dropping (bounded by the pool size) until one is free.
      for (std::uint32_t tries = 0; tries <= capacity; ++tries) {
        if (!drop_oldest(lane)) break;
        if ((s = pool.try_alloc()) != nullptr) return s;
      }
      if ((s = pool.try_alloc()) != nullptr) return s;
      if (!may_block) return nullptr;
      [[fallthrough]];
    }
    case Backpressure::Block: {
      if (!may_block) return nullptr;
      // Workers free slots in batches within microseconds: spin, then yield,
      // then sleep in short steps until the deadline.
      auto deadline = std::chrono::steady_clock::now() + options.block_timeout;
      for (std::uint32_t spin = 0;; ++spin) {
        if ((s = pool.try_alloc()) != nullptr) return s;
        if (bus->closing()) return nullptr;
        if (spin < 256) {
          cpu_relax();
        } else if (spin < 2048) {
          std::this_thread::yield();
        } else {
          if (std::chrono::steady_clock::now() >= deadline) return nullptr;
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
    }
  }
  return nullptr;
}

Status TopicImpl::publish(const OutgoingMessage& m, bool may_block, std::uint64_t id) noexcept {
  if (m.payload.empty()) return Status::from_literal(Code::InvalidArgument, "publish: the payload is empty");
  std::size_t need = m.key.size() + m.idempotency_key.size() + m.payload.size();
  if (need > options.slot_bytes)
    return Status::from_literal(Code::PayloadTooLarge,
                                "publish: key + idempotency key + payload exceed the topic's slot_bytes "
                                "(raise TopicOptions::slot_bytes)");
  if (bus->closing()) return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");

  const std::uint32_t lane = lane_for_key(m.key, options.lanes);
  Slot* s = acquire_slot(lane, may_block);
  if (s == nullptr) {
    if (bus->closing()) return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");
    refused.fetch_add(1, std::memory_order_relaxed);
    if (may_block && options.backpressure != Backpressure::FailFast)
      return Status::from_literal(Code::TimedOut, "publish: the topic stayed full for its whole block_timeout");
    return Status::from_literal(Code::WouldBlock, "publish: the topic is full (all capacity slots in use)");
  }
  // try_alloc incremented the pool's in_use (seq_cst); shutdown sets closing
  // and then waits on in_use, so either we see closing here or it waits for us.
  if (bus->closing()) {
    pool.free(s);
    return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");
  }

  s->lane = lane;
  s->key_len = static_cast<std::uint32_t>(m.key.size());
  s->idem_len = static_cast<std::uint32_t>(m.idempotency_key.size());
  s->payload_len = static_cast<std::uint32_t>(m.payload.size());
  char* d = s->data();
  if (!m.key.empty()) std::memcpy(d, m.key.data(), m.key.size());
  if (!m.idempotency_key.empty()) std::memcpy(d + m.key.size(), m.idempotency_key.data(), m.idempotency_key.size());
  std::memcpy(d + m.key.size() + m.idempotency_key.size(), m.payload.data(), m.payload.size());
  s->header.id = id;
  s->header.created_at_ns = now_ns();
  s->header.correlation_id = m.correlation_id;
  s->header.fencing_token = m.fencing_token;
  s->header.attempt = 0;
  s->header.content_type = m.content_type;
  s->header.schema_version = m.schema_version;
  // Route to every active group. The slot's reference count must be final
  // before the first ring push makes it visible, so collect the targets first
  // (a group deactivated meanwhile still drains its rings, so a stale target
  // is harmless). More groups than fit the local array: guard-reference path.
  constexpr std::uint32_t kInline = 16;
  GroupLane* targets[kInline];
  std::uint32_t n = 0;
  bool overflow = false;
  const std::uint32_t ng = group_count.load(std::memory_order_acquire);
  for (std::uint32_t gi = 0; gi < ng; ++gi) {
    GroupImpl* g = groups[gi].load(std::memory_order_acquire);
    if (g == nullptr || !g->active.load(std::memory_order_acquire)) continue;
    if (n == kInline) {
      overflow = true;
      break;
    }
    targets[n++] = g->lanes[lane].get();
  }
  lane_load[lane].published.fetch_add(1, std::memory_order_relaxed);
  if (n == 0) {
    unrouted.fetch_add(1, std::memory_order_relaxed);
    pool.free(s);
    return Status();
  }
  const std::uint32_t index = pool.index_of(s);
  // The ring holds at most `capacity` entries and every entry pins a live
  // slot, so it cannot be full; a failed try only means a dequeuer of the
  // cell we need has not finished its store yet.
  auto push = [&](GroupLane* gl) {
    while (!gl->ring.try_enqueue(index)) std::this_thread::yield();
    bus->schedule(gl);
  };
  if (!overflow) {
    // relaxed: the seq_cst ring push below publishes the count with the slot.
    s->refs.store(n, std::memory_order_relaxed);
    for (std::uint32_t i = 0; i < n; ++i) push(targets[i]);
    return Status();
  }
  s->refs.store(1, std::memory_order_relaxed);  // the publisher's guard
  for (std::uint32_t gi = 0; gi < ng; ++gi) {
    GroupImpl* g = groups[gi].load(std::memory_order_acquire);
    if (g == nullptr || !g->active.load(std::memory_order_acquire)) continue;
    s->refs.fetch_add(1, std::memory_order_relaxed);  // relaxed: we still hold the guard
    push(g->lanes[lane].get());
  }
  pool.release(s);  // drop the guard
  return Status();
}

Status TopicImpl::publish_durable(const OutgoingMessage& m, PublishCallback done) {
  if (m.payload.empty()) return Status::from_literal(Code::InvalidArgument, "publish: the payload is empty");
  if (bus->closing()) return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");
  AppendRequest req;
  req.topic_id = store_topic.id;
  req.lane = lane_for_key(m.key, options.lanes);
  req.header.id = 0;  // the store assigns ids unique across restarts and processes
  req.header.created_at_ns = now_ns();
  req.header.correlation_id = m.correlation_id;
  req.header.fencing_token = m.fencing_token;
  req.header.content_type = m.content_type;
  req.header.schema_version = m.schema_version;
  req.key.assign(m.key);
  req.idempotency_key.assign(m.idempotency_key);
  req.payload.assign(m.payload);
  const std::uint32_t lane = req.lane;
  if (!done) {
    auto r = bus->store()->append(std::move(req));
    if (!r.ok()) {
      refused.fetch_add(1, std::memory_order_relaxed);
      return r.status();
    }
    lane_load[lane].published.fetch_add(1, std::memory_order_relaxed);
    return Status();
  }
  Status s = bus->store()->append_async(
      std::move(req), [this, lane, done = std::move(done)](const Status& st, const AppendResult& res) {
        if (st.ok()) {
          lane_load[lane].published.fetch_add(1, std::memory_order_relaxed);
        } else {
          refused.fetch_add(1, std::memory_order_relaxed);
        }
        done(st, res.offset);
      });
  if (!s.ok()) refused.fetch_add(1, std::memory_order_relaxed);
  return s;
}

// ---------------------------------------------------------------- bus core

BusCore::BusCore(const BusOptions& o) : options(o), runq_(4096) {}

BusCore::~BusCore() {
  // Bus::~Bus already shut down; this covers a failed start().
  if (!stopped_.load()) (void)shutdown(ShutdownMode::Abandon, std::chrono::milliseconds(0));
}

Status BusCore::start() {
  if (!options.store.directory.empty()) {
    auto st = DurableStore::open(options.store);
    if (!st.ok()) return st.status();
    store_ = std::move(*st);
    dlq_ = std::make_unique<DlqStore>(*store_, options.dlq);
    if (options.lease_table != nullptr) {
      LeaseTable* table = options.lease_table;
      store_->set_fence_confirm(
          [table](std::string_view lease, std::uint64_t token) { return table->confirm_grant(lease, token); });
    }
    dead_letters_ = std::make_unique<DeadLetters>(this);
    store_->set_append_listener(
        [this](std::uint32_t topic_id, std::uint32_t lane, std::uint64_t end) { on_append(topic_id, lane, end); });
    try {
      poller_ = std::thread([this] { poller_main(); });
    } catch (const std::exception& e) {
      return Status(Code::Internal, std::string("bus \"") + options.name + "\": starting the poller: " + e.what());
    }
  }
  try {
    timer_ = std::make_unique<RetryTimer>([this](TimerEntry* e) {
      GroupLane* gl = static_cast<GroupLane*>(e);
      if (!runq_.try_enqueue(gl)) {
        runq_fallbacks_.fetch_add(1, std::memory_order_relaxed);
        runq_.enqueue(gl);
      }
    });
  } catch (const std::exception& e) {
    return Status(Code::Internal, std::string("bus \"") + options.name + "\": starting the retry timer: " + e.what());
  }
  std::size_t n = options.workers ? options.workers : std::max(1u, std::thread::hardware_concurrency());
  try {
    workers_.reserve(n);
    for (std::size_t i = 0; i < n; ++i) workers_.emplace_back([this, i] { worker_main(i); });
    // Return only once every worker has made its one-time allocations (its
    // moodycamel producer), so "after warm-up" never includes a worker start.
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
  if (!runq_.try_enqueue(gl)) {
    // The queue's pre-sized blocks are exhausted (many publishing threads):
    // correctness first, allocate one more block, and count it.
    runq_fallbacks_.fetch_add(1, std::memory_order_relaxed);
    runq_.enqueue(gl);
  }
}

Consumer* BusCore::pin_consumer(GroupImpl* g) noexcept {
  std::uint32_t n = g->consumers_hw.load(std::memory_order_acquire);
  if (n == 0) return nullptr;
  std::uint32_t start = g->rr.fetch_add(1, std::memory_order_relaxed);
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

void BusCore::record_latency(GroupLane* gl, std::int64_t created_at_ns) noexcept {
  const std::int64_t d = now_ns() - created_at_ns;
  gl->latency.record(d > 0 ? static_cast<std::uint64_t>(d) : 0);
}

Outcome BusCore::call_handler(Consumer* c, MessageView& view, GroupLane* gl, TxnState* tx) noexcept {
  const GroupOptions& o = gl->group->options;
  std::int64_t deadline = 0;
  if (o.attempt_timeout.count() > 0) {
    deadline = now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(o.attempt_timeout).count();
    view.set_deadline_ns(deadline);
  }
  Outcome out = Outcome::ack();
  tl_running_consumer = c;
  tl_running_bus = this;
  try {
    if (c->tx_handler) {
      if (tx == nullptr) {
        out = Outcome::reject("transactional handler on a non-durable lane");
      } else {
        tx->clear();
        Transaction t(tx);
        out = c->tx_handler(view, t);
      }
    } else {
      out = c->handler(view);
    }
  } catch (const std::exception&) {
    out = Outcome::retry("handler threw an exception");
  } catch (...) {
    out = Outcome::retry("handler threw a non-standard exception");
  }
  tl_running_consumer = nullptr;
  tl_running_bus = nullptr;
  if (deadline != 0 && out.kind() == Outcome::Kind::Retry && now_ns() > deadline) bump(gl->timed_out);
  return out;
}

bool BusCore::plan_retry(GroupLane* gl, std::uint32_t attempt) noexcept {
  const GroupOptions& o = gl->group->options;
  if (attempt >= o.max_attempts) return false;
  gl->retry_delay_ns = 0;
  if (o.backoff_initial.count() > 0) {
    double d = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(o.backoff_initial).count());
    for (std::uint32_t i = 1; i < attempt; ++i) d *= o.backoff_multiplier;
    const double cap = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(o.backoff_max).count());
    if (d > cap) d = cap;
    // xorshift64: per-lane state, owner-only, allocation-free.
    gl->rng ^= gl->rng << 13;
    gl->rng ^= gl->rng >> 7;
    gl->rng ^= gl->rng << 17;
    const double u = static_cast<double>(gl->rng >> 11) / 9007199254740992.0;  // [0, 1)
    d *= 1.0 + o.backoff_jitter * (2.0 * u - 1.0);
    gl->retry_delay_ns = d > 0 ? static_cast<std::int64_t>(d) : 0;
  }
  return true;
}

void BusCore::requeue(GroupLane* gl) noexcept {
  if (gl->retry_delay_ns > 0 && timer_) {
    gl->due_ns = RetryTimer::now_ns() + gl->retry_delay_ns;
    gl->retry_delay_ns = 0;
    timer_->add(gl);  // the lane stays scheduled while it waits
    return;
  }
  if (!runq_.try_enqueue(gl)) {
    runq_fallbacks_.fetch_add(1, std::memory_order_relaxed);
    runq_.enqueue(gl);
  }
}

void BusCore::run_lane(GroupLane* gl) {
  GroupImpl* g = gl->group;
  if (g->topic->durable) {
    run_durable_lane(gl);
    return;
  }
  MessagePool& pool = g->topic->pool;
  const bool abandon = abandon_.load(std::memory_order_acquire);
  Consumer* c = abandon ? nullptr : pin_consumer(g);

  if (c == nullptr && g->persistent && !abandon) {
    // A queue with no consumer: messages wait. Unschedule; attach() reschedules
    // lanes once a consumer exists (Dekker on enabled / scheduled).
    const bool holding = gl->current != nullptr;  // owner-only: read before releasing the lane
    gl->scheduled.store(false, std::memory_order_seq_cst);
    if (g->consumer_count.load(std::memory_order_seq_cst) > 0 && (holding || gl->ring.ready())) schedule(gl);
    return;
  }

  // Topics without DropOldest have one dequeuer per lane ring (its owner).
  const bool single = g->topic->options.backpressure != Backpressure::DropOldest;
  auto take = [&](std::uint32_t& idx) { return single ? gl->ring.try_dequeue_single(idx) : gl->ring.try_dequeue(idx); };
  FreeChain frees(pool);
  const bool metrics = options.metrics;
  std::uint32_t handled = 0;
  bool yield_for_retry = false;
  while (handled < g->options.batch) {
    if (gl->current == nullptr) {
      std::uint32_t idx;
      if (!take(idx)) {
        // The lane is empty. If no other lane waits, linger briefly: a
        // producer in a burst is likely to publish again within the spin,
        // which saves a trip through the run queue per message.
        if (c == nullptr || runq_.size_approx() != 0) break;
        frees.flush();
        bool got = false;
        for (int spin = 0; spin < 64 && !got; ++spin) {
          cpu_relax();
          got = take(idx);
        }
        if (!got) break;
      }
      gl->current = pool.at(idx);
      gl->attempts = 0;
      if (metrics) gl->oldest_ns.store(gl->current->header.created_at_ns, std::memory_order_relaxed);
    }
    Slot* s = gl->current;
    if (c == nullptr) {
      // No consumer (the group was left, or shutdown abandons): discard.
      gl->dropped.fetch_add(1, std::memory_order_relaxed);
      gl->current = nullptr;
      frees.release(s);
      continue;
    }
    if (g->idempotency != nullptr && s->idem_len != 0) {
      Dedup d = dedup_claim(gl, s->idempotency_key());
      if (d == Dedup::Later) {
        gl->retry_delay_ns = kDedupBusyDelayNs;  // not an attempt: the key is busy elsewhere
        yield_for_retry = true;
        break;
      }
      if (d == Dedup::Skip) {
        bump(gl->duplicates_skipped);
        ++handled;
        gl->current = nullptr;
        frees.release(s);
        continue;
      }
    }
    ++gl->attempts;
    bump(gl->delivered);
    MessageView view(s->header, s->key(), s->idempotency_key(), s->payload(), s->lane);
    view.set_attempt(gl->attempts);
    Outcome out = call_handler(c, view, gl);
    ++handled;
    if (g->idempotency != nullptr && s->idem_len != 0)
      dedup_finish(gl, s->idempotency_key(), out.kind() == Outcome::Kind::Ack);
    if (out.kind() != Outcome::Kind::Ack && gl->first_failure_ns == 0) gl->first_failure_ns = now_ns();
    switch (out.kind()) {
      case Outcome::Kind::Ack:
        bump(gl->acked);
        break;
      case Outcome::Kind::Reject:
        bump(gl->rejected);
        dead_letter_ephemeral(gl, s, out);
        break;
      case Outcome::Kind::Retry:
        bump(gl->retried);
        if (plan_retry(gl, gl->attempts)) {
          // Keep the message at the head of its lane (later messages of the
          // lane must not overtake it) and let other lanes run first.
          yield_for_retry = true;
        } else {
          bump(gl->failed);
          dead_letter_ephemeral(gl, s, out);
        }
        break;
    }
    if (yield_for_retry) break;
    gl->first_failure_ns = 0;
    if (metrics) record_latency(gl, s->header.created_at_ns);
    gl->current = nullptr;
    frees.release(s);
  }
  frees.flush();
  if (metrics && gl->current == nullptr && !gl->ring.ready()) gl->oldest_ns.store(0, std::memory_order_relaxed);
  if (c) c->calls.fetch_sub(1, std::memory_order_release);  // release: handler's effects before close() returns

  if (gl->current != nullptr) {
    // A retry is pending: stay scheduled; run again after the backoff, or at
    // the back of the run queue.
    requeue(gl);
    return;
  }
  gl->scheduled.store(false, std::memory_order_seq_cst);
  if (gl->ring.ready()) schedule(gl);
}

// ---------------------------------------------------------------- idempotency

Result<IdempotencyTable*> BusCore::idempotency(std::string_view scope, const IdempotencyOptions& o) {
  if (Status s = check_name(scope, "idempotency scope"); !s.ok()) return s;
  if (!store_)
    return Status(Code::InvalidArgument, "idempotency scope \"" + std::string(scope) +
                                             "\": needs a bus opened with BusOptions::store.directory");
  if (o.hot_capacity == 0 || o.max_key_bytes == 0 || o.max_key_bytes > 4096 || o.hot_ttl.count() < 0 ||
      o.claim_timeout.count() <= 0 || o.durable_retention.count() < 0)
    return Status(Code::InvalidArgument, "idempotency scope \"" + std::string(scope) +
                                             "\": hot_capacity must be >= 1, max_key_bytes 1..4096, claim_timeout "
                                             "positive, TTL and retention not negative");
  if (closing()) return Status(Code::ShutDown, "bus \"" + options.name + "\" is shut down");
  MutexLock l(&mu_);
  auto it = idempotency_.find(scope);
  if (it != idempotency_.end()) return it->second.get();
  auto table = std::unique_ptr<IdempotencyTable>(
      new IdempotencyTable(std::make_unique<IdempotencyImpl>(store_.get(), std::string(scope), o)));
  IdempotencyTable* raw = table.get();
  idempotency_.emplace(std::string(scope), std::move(table));
  return raw;
}

BusCore::Dedup BusCore::dedup_claim(GroupLane* gl, std::string_view key) noexcept {
  IdempotencyImpl* idem = gl->group->idempotency;
  if (idem == nullptr || key.empty()) return Dedup::Proceed;
  try {
    auto r = idem->claim(key, false);
    if (!r.ok()) {
      gl->errors.fetch_add(1, std::memory_order_relaxed);
      // An oversized or empty key can never be claimed: handle it unguarded
      // rather than wedging the lane. Storage errors: try again later.
      return (r.code() == Code::PayloadTooLarge || r.code() == Code::InvalidArgument) ? Dedup::Proceed
                                                                                          : Dedup::Later;
    }
    if (r->state == ClaimState::Done) return Dedup::Skip;
    if (r->state == ClaimState::InProgress) return Dedup::Later;
    return Dedup::Proceed;
  } catch (...) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
    return Dedup::Later;
  }
}

void BusCore::dedup_finish(GroupLane* gl, std::string_view key, bool acked) noexcept {
  IdempotencyImpl* idem = gl->group->idempotency;
  if (idem == nullptr || key.empty()) return;
  try {
    Status s = acked ? idem->complete(key, {}) : idem->release(key);
    if (!s.ok() && s.code() != Code::PayloadTooLarge && s.code() != Code::InvalidArgument)
      gl->errors.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
  }
}

// ---------------------------------------------------------------- dead letters

DlqEntry BusCore::dlq_entry(GroupLane* gl, const MessageHeader& h, std::string_view key, std::string_view idem,
                            std::string_view payload, std::uint64_t offset, const Outcome& out,
                            std::uint32_t attempts, ErrorClass cls) const {
  const GroupImpl* g = gl->group;
  DlqEntry e;
  e.header = h;
  e.header.attempt = attempts;
  e.key.assign(key);
  e.idempotency_key.assign(idem);
  e.payload.assign(payload);
  e.error_class = cls;
  e.reason.assign(out.reason().empty() ? (out.kind() == Outcome::Kind::Reject ? "rejected" : "retries exhausted")
                                       : out.reason());
  e.error_text = std::string(to_string(cls)) + " failure after " + std::to_string(attempts) + " attempt(s)";
  e.attempts = attempts;
  e.last_failure_ns = now_ns();
  e.first_failure_ns = gl->first_failure_ns ? gl->first_failure_ns : e.last_failure_ns;
  e.topic = g->topic->name;
  e.topic_id = g->topic->durable ? g->topic->store_topic.id : 0;
  e.lane = gl->lane;
  e.offset = offset;
  e.group = g->topic->is_queue ? std::string("queue") : g->name;
  return e;
}

void BusCore::dead_letter_ephemeral(GroupLane* gl, const Slot* s, const Outcome& out) noexcept {
  if (!dlq_) return;  // an in-memory bus: failures are only counted
  try {
    const ErrorClass cls = classify_failure(out.kind(), gl->attempts, gl->attempts, false, 0);
    auto r = dlq_->add(dlq_entry(gl, s->header, s->key(), s->idempotency_key(), s->payload(), 0, out, gl->attempts,
                                 cls));
    if (!r.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
  }
}

bool BusCore::dead_letter_durable(GroupLane* gl, const StoredMessage& m, const Outcome& out, std::uint32_t attempts,
                                  ErrorClass cls) {
  GroupImpl* g = gl->group;
  const bool queue = g->topic->is_queue;
  DlqEntry e = dlq_entry(gl, m.header, m.key, m.idempotency_key, m.payload, m.offset, out, attempts, cls);
  Status s = store_->write([&](StoreTxn& t) -> Status {
    return dlq_
        ->add_in(t, e,
                 [&]() -> Status {
                   if (!queue) return t.commit_offset(g->store_group, gl->lane, m.offset + 1);
                   Status as = t.ack(g->store_group, gl->lane, m.offset, m.header.attempt);
                   return as.ok() ? dlq_->forget_outcomes_in(t, g->store_group, gl->lane, m.offset) : as;
                 })
        .status();
  });
  if (s.ok() || s.code() == Code::StaleToken) return true;  // StaleToken: already redelivered elsewhere
  gl->errors.fetch_add(1, std::memory_order_relaxed);
  return false;
}

Status BusCore::republish(const DlqEntry& e) {
  TopicImpl* t = find(e.topic);
  if (t == nullptr) return Status(Code::NotFound, "dlq replay: no topic \"" + e.topic + "\" in this bus");
  OutgoingMessage m;
  m.key = e.key;
  m.payload = e.payload;
  m.idempotency_key = e.idempotency_key;
  m.correlation_id = e.header.correlation_id;
  m.content_type = e.header.content_type;
  m.schema_version = e.header.schema_version;
  return t->durable ? t->publish_durable(m, {}) : t->publish(m, true, take_ids(1));
}

Status BusCore::release_claim(GroupLane* gl, const StoredMessage& m, std::uint32_t attempt,
                              std::chrono::milliseconds delay) {
  GroupImpl* g = gl->group;
  if (dlq_) {
    // Every deliberate release counts as an attempt that came back with an
    // outcome: poison detection treats claims without one as consumer crashes.
    // (A crash between the two commits errs towards "not poison".)
    Status ns = store_->write([&](StoreTxn& t) -> Status {
      return dlq_->note_outcome_in(t, g->store_group, gl->lane, m.offset).status();
    });
    if (!ns.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
  }
  return store_->release(g->store_group, gl->lane, m.offset, attempt, delay);
}

void BusCore::dlq_maintenance() noexcept {
  if (!dlq_) return;
  try {
    for (int i = 0; i < 16; ++i) {
      auto r = dlq_->expire();
      if (!r.ok() || *r < dlq_->options().expire_batch) break;
    }
    (void)dlq_->replay_due_transient(dlq_->options().transient_cooldown, "auto",
                                     [this](const DlqEntry& e) { return republish(e); });
  } catch (...) {
  }
}

// ---------------------------------------------------------------- transactional consume

namespace {

constexpr std::size_t kMaxUserKey = 500;

Result<std::string> user_key(std::string_view table, std::string_view key) {
  if (Status s = check_name(table, "table"); !s.ok()) return s;
  if (key.empty() || key.size() > kMaxUserKey)
    return Status(Code::InvalidArgument, "table \"" + std::string(table) + "\": keys must be 1.." +
                                             std::to_string(kMaxUserKey) + " bytes");
  std::string k(table);
  k.push_back('\0');
  k.append(key);
  return k;
}

}  // namespace

Result<std::string> user_key_public(std::string_view table, std::string_view key) { return user_key(table, key); }
std::int64_t now_ns_public() noexcept { return now_ns(); }

Result<std::string> BusCore::table_get(std::string_view table, std::string_view key) const {
  auto k = user_key(table, key);
  if (!k.ok()) return k.status();
  if (!store_) return Status(Code::InvalidArgument, "table_get: the bus has no store");
  std::string out;
  Status s = store_->read([&](StoreTxn& t) -> Status {
    auto v = t.get(StoreTable::User, *k);
    if (!v.ok()) {
      if (v.code() == Code::NotFound)
        return Status(Code::NotFound, "table \"" + std::string(table) + "\": no key \"" +
                                          std::string(key.substr(0, 64)) + "\"");
      return v.status();
    }
    out.assign(*v);
    return Status();
  });
  if (!s.ok()) return s;
  return out;
}

Status BusCore::commit_tx(GroupLane* gl, TxnState& tx, const StoredMessage& m, std::uint32_t attempt) {
  GroupImpl* g = gl->group;
  const bool queue = g->topic->is_queue;
  IdempotencyImpl* idem = (g->idempotency != nullptr && !m.idempotency_key.empty()) ? g->idempotency : nullptr;
  std::int64_t at = 0;
  Status s = store_->write([&](StoreTxn& t) -> Status {
    at = t.now_ns();
    // 1. Validate everything the handler read (no write yet: a Conflict
    //    leaves this batch's other operations untouched).
    for (const TxnState::Read& r : tx.reads) {
      auto cur = t.get(StoreTable::User, r.key);
      if (!cur.ok() && cur.code() != Code::NotFound) return cur.status();
      const bool found = cur.ok();
      if (found != r.found || (found && *cur != r.value))
        return Status(Code::Conflict, "transaction of \"" + g->topic->name + "\": a value it read changed");
    }
    // 2. The ack / offset commit validates before it writes (a redelivered
    //    queue message gives StaleToken here, before anything is written).
    Status as = queue ? t.ack(g->store_group, gl->lane, m.offset, attempt)
                      : t.commit_offset(g->store_group, gl->lane, m.offset + 1);
    if (!as.ok()) return as;
    // 3. From here on only storage errors can fail (they abort the batch).
    if (queue && dlq_ && attempt > 1) {
      Status fs = dlq_->forget_outcomes_in(t, g->store_group, gl->lane, m.offset);
      if (!fs.ok() && fs.code() != Code::NotFound) return fs;
    }
    if (idem != nullptr) {
      Status cs = idem->complete_in(t, m.idempotency_key, {}, false);
      if (!cs.ok()) return cs;
    }
    for (const auto& [k, v] : tx.writes) {
      Status ws = v ? t.put(StoreTable::User, k, *v) : t.del(StoreTable::User, k);
      if (!ws.ok() && ws.code() != Code::NotFound) return ws;
    }
    for (const AppendRequest& req : tx.outbox) {
      auto r = t.append(req);
      if (!r.ok()) return r.status();
    }
    return Status();
  });
  if (s.ok() && idem != nullptr) idem->remember_done(m.idempotency_key, at);
  return s;
}

// ---------------------------------------------------------------- durable lanes

void BusCore::run_durable_lane(GroupLane* gl) {
  GroupImpl* g = gl->group;
  const bool abandon = abandon_.load(std::memory_order_acquire);
  Consumer* c = abandon ? nullptr : pin_consumer(g);
  bool more = false;
  if (c != nullptr) {
    more = g->topic->is_queue ? run_durable_queue_batch(gl, c) : run_durable_topic_batch(gl, c);
    c->calls.fetch_sub(1, std::memory_order_release);
  }
  if (more && !abandon_.load(std::memory_order_acquire)) {
    requeue(gl);
    return;
  }
  // Owner-only state must be read before the lane is released to others.
  const std::uint64_t read_pos = gl->read_pos;
  gl->scheduled.store(false, std::memory_order_seq_cst);
  if (abandon) return;
  if (c == nullptr) {
    // No consumer right now: messages stay in the store. attach() schedules
    // the lanes again; re-check in case it raced with us (Dekker, seq_cst).
    if (g->consumer_count.load(std::memory_order_seq_cst) > 0) schedule(gl);
    return;
  }
  // (`more` was false, so nothing is left in the buffer.)
  if (!g->topic->is_queue && gl->known_end.load(std::memory_order_seq_cst) > read_pos) schedule(gl);
}

// Durable topic group: read a batch at the lane's position, deliver in order,
// then queue one offset commit. True if the lane should run again at once.
bool BusCore::run_durable_topic_batch(GroupLane* gl, Consumer* c) {
  GroupImpl* g = gl->group;
  TopicImpl* t = g->topic;
  const std::uint64_t gen = g->seek_gen.load(std::memory_order_acquire);
  if (!gl->positioned || gen != gl->seen_seek_gen) {
    // First run, or a seek happened: load the committed offset. commit_mu
    // makes us wait for a seek that is still being written.
    MutexLock l(&g->commit_mu);
    auto info = store_->group_info(g->store_group);
    if (!info.ok() || info->size() <= gl->lane) {
      gl->errors.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    const std::uint64_t committed = (*info)[gl->lane].committed;
    gl->read_pos = gl->done_pos = gl->committed_sent = committed;
    gl->buffer.clear();
    gl->buffer_index = 0;
    gl->attempts = 0;
    gl->seen_seek_gen = g->seek_gen.load(std::memory_order_acquire);
    gl->positioned = true;
  }
  std::uint32_t handled = 0;
  bool retry_pending = false;
  while (handled < g->options.batch) {
    if (gl->buffer_index == gl->buffer.size()) {
      ReadLimits limits;
      limits.max_messages = g->options.batch;
      auto r = store_->read(t->store_topic, gl->lane, gl->read_pos, limits);
      if (!r.ok()) {
        gl->errors.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      if (r->skipped > 0) {
        gl->skipped.fetch_add(r->skipped, std::memory_order_relaxed);
        if (gl->done_pos < r->first_offset) gl->done_pos = r->first_offset;
      }
      gl->buffer = std::move(r->messages);
      gl->buffer_index = 0;
      gl->read_pos = r->next_offset;
      std::uint64_t k = gl->known_end.load(std::memory_order_relaxed);
      while (r->end_offset > k && !gl->known_end.compare_exchange_weak(k, r->end_offset)) {
      }
      if (gl->buffer.empty()) break;
    }
    const StoredMessage& m = gl->buffer[gl->buffer_index];
    const bool guarded = g->idempotency != nullptr && !m.idempotency_key.empty();
    if (guarded) {
      Dedup d = dedup_claim(gl, m.idempotency_key);
      if (d == Dedup::Later) {
        gl->retry_delay_ns = kDedupBusyDelayNs;
        retry_pending = true;
        break;
      }
      if (d == Dedup::Skip) {
        bump(gl->duplicates_skipped);
        ++handled;
        gl->attempts = 0;
        gl->done_pos = m.offset + 1;
        ++gl->buffer_index;
        continue;
      }
    }
    ++gl->attempts;
    bump(gl->delivered);
    MessageView view(m.header, m.key, m.idempotency_key, m.payload, gl->lane, m.offset);
    view.set_attempt(gl->attempts);
    TxnState tx;
    TxnState* txp = nullptr;
    if (c->tx_handler) {
      tx.store = store_.get();
      tx.bus = this;
      txp = &tx;
    }
    Outcome out = call_handler(c, view, gl, txp);
    ++handled;
    if (txp != nullptr && out.kind() == Outcome::Kind::Ack) {
      // Effects, dedup record and offset commit in one transaction.
      Status cs = commit_tx(gl, tx, m, gl->attempts);
      if (!cs.ok()) {
        if (guarded) dedup_finish(gl, m.idempotency_key, false);
        bump(gl->retried);
        if (cs.code() == Code::Conflict) {
          --gl->attempts;  // an optimistic-concurrency retry does not use an attempt
          gl->retry_delay_ns = 0;
        } else {
          gl->errors.fetch_add(1, std::memory_order_relaxed);
          if (!plan_retry(gl, gl->attempts)) gl->retry_delay_ns = kDedupBusyDelayNs;  // storage trouble: keep trying
        }
        retry_pending = true;
        break;
      }
      gl->committed_sent = m.offset + 1;
    } else if (guarded) {
      dedup_finish(gl, m.idempotency_key, out.kind() == Outcome::Kind::Ack);
    }
    if (out.kind() != Outcome::Kind::Ack && gl->first_failure_ns == 0) gl->first_failure_ns = now_ns();
    if (out.kind() == Outcome::Kind::Retry) {
      bump(gl->retried);
      if (plan_retry(gl, gl->attempts)) {
        retry_pending = true;  // the message stays at the head of its lane
        break;
      }
    }
    if (out.kind() != Outcome::Kind::Ack && dlq_) {
      // Dead-letter it and commit the offset past it in one transaction.
      const ErrorClass cls = classify_failure(out.kind(), gl->attempts, gl->attempts, false, 0);
      if (!dead_letter_durable(gl, m, out, gl->attempts, cls)) {
        --gl->attempts;
        gl->retry_delay_ns = 1'000'000'000;  // the DLQ refused it (quota): keep it, try again later
        retry_pending = true;
        break;
      }
      if (m.offset + 1 > gl->committed_sent) gl->committed_sent = m.offset + 1;
    }
    if (out.kind() == Outcome::Kind::Retry) {
      bump(gl->failed);
    } else if (out.kind() == Outcome::Kind::Reject) {
      bump(gl->rejected);
    } else {
      bump(gl->acked);
    }
    gl->first_failure_ns = 0;
    gl->attempts = 0;
    gl->done_pos = m.offset + 1;
    if (options.metrics) record_latency(gl, m.header.created_at_ns);
    ++gl->buffer_index;
  }
  if (gl->done_pos > gl->committed_sent) {
    MutexLock l(&g->commit_mu);
    if (g->seek_gen.load(std::memory_order_acquire) == gl->seen_seek_gen) {
      GroupLane* lane = gl;
      Status s = store_->commit_offset_async(g->store_group, gl->lane, gl->done_pos, [lane](const Status& st) {
        if (!st.ok()) lane->errors.fetch_add(1, std::memory_order_relaxed);
      });
      if (s.ok()) {
        gl->committed_sent = gl->done_pos;
      } else {
        gl->errors.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  gl->lag.store(gl->known_end.load(std::memory_order_relaxed) > gl->done_pos
                    ? gl->known_end.load(std::memory_order_relaxed) - gl->done_pos
                    : 0,
                std::memory_order_relaxed);
  return retry_pending || gl->buffer_index < gl->buffer.size() || handled == g->options.batch;
}

// Durable queue: claim (attempt persisted before delivery), deliver, ack or
// release. True if the lane should run again at once.
bool BusCore::run_durable_queue_batch(GroupLane* gl, Consumer* c) {
  GroupImpl* g = gl->group;
  ClaimOptions claim_options;
  claim_options.visibility = g->options.visibility;
  claim_options.ordered = true;
  std::uint32_t handled = 0;
  while (handled < g->options.batch) {
    auto r = store_->claim(g->store_group, gl->lane, claim_options);
    if (!r.ok()) {
      gl->errors.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (!r->has_value()) return false;  // nothing deliverable now
    const ClaimedMessage& cm = **r;
    if (dlq_ && cm.attempt > 1 && dlq_->options().poison_after_crashes > 0) {
      // Poison: earlier attempts were claimed (persisted) but never came back
      // with an outcome — the consumer process died with it in flight.
      std::uint32_t outcomes = 0;
      Status rs = store_->read([&](StoreTxn& t) -> Status {
        auto o = dlq_->outcomes_in(t, g->store_group, gl->lane, cm.message.offset);
        if (!o.ok()) return o.status();
        outcomes = *o;
        return Status();
      });
      if (rs.ok() && classify_failure(Outcome::Kind::Retry, cm.attempt - 1, outcomes, false,
                                      dlq_->options().poison_after_crashes) == ErrorClass::Poison) {
        Outcome poison = Outcome::reject("poison: the consumer died with it in flight");
        if (dead_letter_durable(gl, cm.message, poison, cm.attempt - 1, ErrorClass::Poison)) {
          bump(gl->failed);
          ++handled;
          continue;
        }
      }
    }
    const bool guarded = g->idempotency != nullptr && !cm.message.idempotency_key.empty();
    if (guarded) {
      Dedup d = dedup_claim(gl, cm.message.idempotency_key);
      if (d != Dedup::Proceed) {
        Status s;
        if (d == Dedup::Skip) {
          bump(gl->duplicates_skipped);
          s = store_->ack(g->store_group, gl->lane, cm.message.offset, cm.attempt);
        } else {
          s = release_claim(gl, cm.message, cm.attempt, std::chrono::milliseconds(kDedupBusyDelayNs / 1'000'000));
        }
        if (!s.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
        ++handled;
        if (d == Dedup::Later) return false;
        continue;
      }
    }
    bump(gl->delivered);
    MessageView view(cm.message.header, cm.message.key, cm.message.idempotency_key, cm.message.payload, gl->lane,
                     cm.message.offset);
    view.set_attempt(cm.attempt);
    TxnState tx;
    TxnState* txp = nullptr;
    if (c->tx_handler) {
      tx.store = store_.get();
      tx.bus = this;
      txp = &tx;
    }
    Outcome out = call_handler(c, view, gl, txp);
    ++handled;
    if (txp != nullptr && out.kind() == Outcome::Kind::Ack) {
      Status cs = commit_tx(gl, tx, cm.message, cm.attempt);
      if (cs.ok()) {
        bump(gl->acked);
        if (options.metrics) record_latency(gl, cm.message.header.created_at_ns);
        continue;
      }
      if (guarded) dedup_finish(gl, cm.message.idempotency_key, false);
      bump(gl->retried);
      if (cs.code() != Code::Conflict && cs.code() != Code::StaleToken)
        gl->errors.fetch_add(1, std::memory_order_relaxed);
      // Nothing was written; hand the message back for another delivery.
      Status rs = release_claim(gl, cm.message, cm.attempt, std::chrono::milliseconds(0));
      if (!rs.ok() && rs.code() != Code::StaleToken && rs.code() != Code::NotFound)
        gl->errors.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    Status s;
    const bool acked = out.kind() == Outcome::Kind::Ack;
    if (guarded && !acked) dedup_finish(gl, cm.message.idempotency_key, false);
    if (out.kind() == Outcome::Kind::Retry && plan_retry(gl, cm.attempt)) {
      bump(gl->retried);
      // The store keeps the message claimed until the backoff ends (the
      // claim, not this process, holds the delay: it survives a crash).
      auto delay = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::nanoseconds(gl->retry_delay_ns));
      gl->retry_delay_ns = 0;
      s = release_claim(gl, cm.message, cm.attempt, delay);
      if (!s.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
      return delay.count() == 0;  // at once: run again after other lanes; else the poller wakes it
    }
    if (!acked && dlq_) {
      std::uint32_t outcomes = 1;
      (void)store_->read([&](StoreTxn& t) -> Status {
        auto o = dlq_->outcomes_in(t, g->store_group, gl->lane, cm.message.offset);
        if (o.ok()) outcomes = *o + 1;
        return Status();
      });
      const bool late = g->options.attempt_timeout.count() > 0 && view.deadline_ns() != 0 && now_ns() > view.deadline_ns();
      const ErrorClass cls =
          classify_failure(out.kind(), cm.attempt, outcomes, late, dlq_->options().poison_after_crashes);
      if (!dead_letter_durable(gl, cm.message, out, cm.attempt, cls)) {
        // The DLQ refused it (quota): keep the message, try again later.
        Status rs = release_claim(gl, cm.message, cm.attempt, std::chrono::seconds(1));
        if (!rs.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      if (out.kind() == Outcome::Kind::Retry) {
        bump(gl->retried);
        bump(gl->failed);
      } else {
        bump(gl->rejected);
      }
      continue;
    }
    if (out.kind() == Outcome::Kind::Retry) {
      bump(gl->retried);
      bump(gl->failed);
    } else if (out.kind() == Outcome::Kind::Reject) {
      bump(gl->rejected);
    } else {
      bump(gl->acked);
    }
    if (acked && dlq_ && cm.attempt > 1 && !guarded) {
      // The ack and dropping the message's outcome record, together.
      s = store_->write([&](StoreTxn& t) -> Status {
        Status as = t.ack(g->store_group, gl->lane, cm.message.offset, cm.attempt);
        return as.ok() ? dlq_->forget_outcomes_in(t, g->store_group, gl->lane, cm.message.offset) : as;
      });
    } else if (guarded && acked) {
      // The dedup record and the ack commit in one transaction.
      IdempotencyImpl* idem = g->idempotency;
      const std::string_view key = cm.message.idempotency_key;
      std::int64_t at = 0;
      s = store_->write([&](StoreTxn& txn) -> Status {
        at = txn.now_ns();
        Status cs = idem->complete_in(txn, key, {});
        if (!cs.ok() && cs.code() != Code::NotFound) return cs;
        return txn.ack(g->store_group, gl->lane, cm.message.offset, cm.attempt);
      });
      if (s.ok()) idem->remember_done(key, at);
    } else {
      s = store_->ack(g->store_group, gl->lane, cm.message.offset, cm.attempt);
    }
    if (!s.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
    if (options.metrics) record_latency(gl, cm.message.header.created_at_ns);
  }
  return true;
}

void BusCore::wake_durable_group(GroupImpl* g, std::uint32_t lane, std::uint64_t end) noexcept {
  GroupLane* gl = g->lanes[lane].get();
  std::uint64_t k = gl->known_end.load(std::memory_order_relaxed);
  bool grew = false;
  while (end > k) {
    if (gl->known_end.compare_exchange_weak(k, end, std::memory_order_seq_cst)) {
      grew = true;
      break;
    }
  }
  if ((grew || g->topic->is_queue) && g->consumer_count.load(std::memory_order_seq_cst) > 0) schedule(gl);
}

void BusCore::on_append(std::uint32_t topic_id, std::uint32_t lane, std::uint64_t end) noexcept {
  TopicImpl* t = nullptr;
  {
    MutexLock l(&durable_mu_);
    auto it = durable_topics_.find(topic_id);
    if (it != durable_topics_.end()) t = it->second;
  }
  if (t == nullptr || lane >= t->options.lanes) return;
  const std::uint32_t ng = t->group_count.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < ng; ++i) {
    GroupImpl* g = t->groups[i].load(std::memory_order_acquire);
    if (g != nullptr) wake_durable_group(g, lane, end);
  }
}

// Finds appends made by other processes and expired queue claims.
void BusCore::poller_main() {
  std::vector<TopicImpl*> topics;
  std::int64_t polls = 0;
  for (;;) {
    {
      std::unique_lock l(poller_mu_);
      if (poller_cv_.wait_for(l, options.durable_poll, [&] { return poller_stop_; })) return;
    }
    if (++polls % std::max<std::int64_t>(1, 1000 / std::max<std::int64_t>(1, options.durable_poll.count())) == 0)
      dlq_maintenance();
    topics.clear();
    {
      MutexLock l(&durable_mu_);
      for (auto& [id, t] : durable_topics_) topics.push_back(t);
    }
    for (TopicImpl* t : topics) {
      for (std::uint32_t lane = 0; lane < t->options.lanes; ++lane) {
        auto end = store_->end_offset(t->store_topic, lane);
        if (!end.ok()) continue;
        const std::uint32_t ng = t->group_count.load(std::memory_order_acquire);
        for (std::uint32_t i = 0; i < ng; ++i) {
          GroupImpl* g = t->groups[i].load(std::memory_order_acquire);
          if (g != nullptr) wake_durable_group(g, lane, *end);
        }
      }
    }
  }
}

Status BusCore::seek(TopicImpl* t, std::string_view group, const StartPosition& position) {
  if (!t->durable)
    return Status(Code::InvalidArgument, "seek \"" + t->name + "\": only durable topics and queues can seek");
  if (closing()) return Status(Code::ShutDown, "bus \"" + options.name + "\" is shut down");
  GroupImpl* g = nullptr;
  {
    MutexLock l(&mu_);
    for (auto& og : t->owned_groups)
      if (t->is_queue || og->name == group) g = og.get();
  }
  if (g == nullptr)
    return Status(Code::NotFound, "seek \"" + t->name + "\": no group \"" + std::string(group) + "\" in this bus");
  {
    MutexLock l(&g->commit_mu);
    g->seek_gen.fetch_add(1, std::memory_order_acq_rel);
    if (Status s = store_->seek(g->store_group, position); !s.ok()) return s;
  }
  if (g->consumer_count.load(std::memory_order_seq_cst) > 0)
    for (auto& gl : g->lanes) schedule(gl.get());
  return Status();
}

namespace {
// A run-queue entry that is not a lane: each worker enqueues one when it
// starts, so moodycamel creates that thread's implicit producer (an
// allocation) while the bus opens rather than on the worker's first
// reschedule, which may come long after warm-up.
char warmup_marker_byte;
GroupLane* warmup_marker() noexcept { return reinterpret_cast<GroupLane*>(&warmup_marker_byte); }
}  // namespace

void BusCore::worker_main(std::size_t /*index*/) {
  using clock = std::chrono::steady_clock;
  runq_.enqueue(warmup_marker());
  workers_ready_.fetch_add(1, std::memory_order_release);
  for (;;) {
    GroupLane* gl = nullptr;
    bool got = runq_.try_dequeue(gl);
    if (!got && options.spin.count() > 0) {
      auto until = clock::now() + options.spin;
      for (std::uint32_t i = 1; !got; ++i) {
        got = runq_.try_dequeue(gl);
        if (!got && (i & 63) == 0 && clock::now() >= until) break;
      }
    }
    if (!got) runq_.wait_dequeue(gl);  // park: no CPU until a lane is scheduled
    if (gl == nullptr) return;         // stop sentinel from shutdown()
    if (gl == warmup_marker()) continue;
    run_lane(gl);
  }
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

Status BusCore::shutdown(ShutdownMode mode, std::chrono::milliseconds timeout) {
  if (tl_running_bus == this)
    return Status(Code::Busy, "bus \"" + options.name + "\": shutdown called from a handler; a worker cannot join itself");
  MutexLock guard(&shutdown_mu_);
  if (stopped_.load()) return Status();
  closing_.store(true, std::memory_order_seq_cst);
  Status result;
  if (mode == ShutdownMode::Drain) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (slots_in_use() > 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        result = Status(Code::TimedOut, "bus \"" + options.name + "\": drain did not finish within " +
                                            std::to_string(timeout.count()) + " ms; " +
                                            std::to_string(slots_in_use()) + " messages abandoned");
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  abandon_.store(true, std::memory_order_release);
  for (std::size_t i = 0; i < workers_.size(); ++i) runq_.enqueue(nullptr);
  for (auto& w : workers_) w.join();
  workers_.clear();
  if (timer_) timer_->stop();  // lanes waiting out a backoff are abandoned below
  // Publishers that passed the closing check before it was set may still be
  // pushing into rings; they hold a slot (in_use) until done, so loop.
  for (;;) {
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
    poller_.join();
  }
  if (store_) {
    Status cs = store_->close();
    if (!cs.ok() && result.ok()) result = cs;
  }
  stopped_.store(true);
  return result;
}

TopicImpl* BusCore::find(std::string_view name) const {
  MutexLock l(&mu_);
  auto it = topics_.find(name);
  return it == topics_.end() ? nullptr : it->second.get();
}

Result<TopicImpl*> BusCore::create(std::string_view name, bool is_queue, const TopicOptions& o) {
  const char* kind = is_queue ? "queue" : "topic";
  if (Status s = check_name(name, kind); !s.ok()) return s;
  if (Status s = check_topic_options(name, o); !s.ok()) return s;
  if (closing()) return Status(Code::ShutDown, "bus \"" + options.name + "\" is shut down");
  TopicRef ref;
  GroupRef queue_group;
  if (o.durable) {
    if (!store_)
      return Status(Code::InvalidArgument, std::string(kind) + " \"" + std::string(name) +
                                               "\": durable needs a bus opened with BusOptions::store.directory");
    // Blocking store calls happen before taking mu_ (they wait for the
    // store's writer thread, whose listener must never wait for mu_).
    TopicSpec spec;
    spec.lanes = o.lanes;
    spec.is_queue = is_queue;
    spec.retention = o.retention;
    spec.fence = o.fence;
    spec.fence_per_lane = o.fence_per_lane;
    auto r = store_->open_topic(name, spec);
    if (!r.ok()) return r.status();
    ref = *r;
    if (is_queue) {
      auto g = store_->open_group(ref, "queue", StartPosition::earliest());
      if (!g.ok()) return g.status();
      queue_group = *g;
    }
  }
  MutexLock l(&mu_);
  auto it = topics_.find(name);
  if (it != topics_.end()) {
    TopicImpl* t = it->second.get();
    if (t->is_queue != is_queue)
      return Status(Code::Conflict, std::string(kind) + " \"" + std::string(name) + "\": already exists as a " +
                                        (t->is_queue ? "queue" : "topic"));
    if (t->options.lanes != o.lanes)
      return Status(Code::Conflict, std::string(kind) + " \"" + std::string(name) + "\": already exists with " +
                                        std::to_string(t->options.lanes) + " lanes, asked for " +
                                        std::to_string(o.lanes) + " (the lane count is fixed at creation)");
    if (t->durable != o.durable)
      return Status(Code::Conflict, std::string(kind) + " \"" + std::string(name) + "\": already exists as " +
                                        (t->durable ? "durable" : "ephemeral"));
    return t;
  }
  if (topics_.size() >= options.max_topics)
    return Status(Code::Busy, "bus \"" + options.name + "\": max_topics (" + std::to_string(options.max_topics) +
                                  ") reached; raise BusOptions::max_topics");
  auto t = std::make_unique<TopicImpl>(this, std::string(name), is_queue, o);
  TopicImpl* raw = t.get();
  raw->store_topic = ref;
  if (is_queue) {
    // The queue's one group exists from the start and keeps messages until a
    // consumer attaches.
    auto g = std::make_unique<GroupImpl>(raw, std::string(), GroupOptions{}, o.lanes, raw->capacity,
                                         options.max_consumers_per_group);
    g->store_group = queue_group;
    g->active.store(true, std::memory_order_release);
    raw->groups[0].store(g.get(), std::memory_order_release);
    raw->owned_groups.push_back(std::move(g));
    raw->group_count.store(1, std::memory_order_release);
  }
  topics_.emplace(std::string(name), std::move(t));
  if (o.durable) {
    MutexLock dl(&durable_mu_);
    durable_topics_[ref.id] = raw;
  }
  return raw;
}

Result<Consumer*> BusCore::attach(TopicImpl* t, std::string_view group, Handler handler, TxHandler tx_handler,
                                  const GroupOptions& o) {
  if (!handler && !tx_handler)
    return Status(Code::InvalidArgument, "subscribe to \"" + t->name + "\": the handler is empty");
  if (tx_handler && !t->durable)
    return Status(Code::InvalidArgument, "subscribe to \"" + t->name +
                                             "\": transactional handlers need a durable topic or queue");
  if (o.max_attempts == 0 || o.batch == 0)
    return Status(Code::InvalidArgument,
                  "subscribe to \"" + t->name + "\": max_attempts and batch must be at least 1");
  if (o.visibility.count() <= 0)
    return Status(Code::InvalidArgument, "subscribe to \"" + t->name + "\": visibility must be positive");
  if (o.backoff_initial.count() < 0 || o.backoff_max.count() < 0 || o.attempt_timeout.count() < 0 ||
      !(o.backoff_multiplier >= 1.0) || !(o.backoff_jitter >= 0.0 && o.backoff_jitter <= 1.0))
    return Status(Code::InvalidArgument,
                  "subscribe to \"" + t->name +
                      "\": backoff and timeout must not be negative, backoff_multiplier must be >= 1 and "
                      "backoff_jitter within 0..1");
  if (closing()) return Status(Code::ShutDown, "bus \"" + options.name + "\" is shut down");
  IdempotencyImpl* idem = nullptr;
  if (!o.idempotency_scope.empty()) {
    auto table = idempotency(o.idempotency_scope, {});  // takes mu_ itself
    if (!table.ok()) return table.status();
    idem = (*table)->impl();
  }
  GroupRef store_group;
  if (t->durable && !t->is_queue) {
    auto r = store_->open_group(t->store_topic, group, o.start);  // blocking: before mu_
    if (!r.ok()) return r.status();
    store_group = *r;
  }
  MutexLock l(&mu_);
  GroupImpl* g = nullptr;
  if (t->is_queue) {
    g = t->owned_groups.front().get();
  } else {
    for (auto& og : t->owned_groups)
      if (og->name == group) g = og.get();
    if (g == nullptr) {
      std::uint32_t n = t->group_count.load(std::memory_order_relaxed);
      if (n >= t->options.max_groups)
        return Status(Code::Busy, "topic \"" + t->name + "\": max_groups (" + std::to_string(t->options.max_groups) +
                                      ") reached; raise TopicOptions::max_groups");
      auto ng = std::make_unique<GroupImpl>(t, std::string(group), o, t->options.lanes, t->capacity,
                                            options.max_consumers_per_group);
      ng->store_group = store_group;
      ng->idempotency = idem;
      g = ng.get();
      t->owned_groups.push_back(std::move(ng));
      t->groups[n].store(g, std::memory_order_release);
      t->group_count.store(n + 1, std::memory_order_release);
    }
  }
  Consumer* c = nullptr;
  for (std::uint32_t i = 0; i < g->max_consumers; ++i) {
    if (!g->consumers[i].in_use) {
      c = &g->consumers[i];
      if (i + 1 > g->consumers_hw.load(std::memory_order_relaxed))
        g->consumers_hw.store(i + 1, std::memory_order_release);
      break;
    }
  }
  if (c == nullptr)
    return Status(Code::Busy, "group \"" + g->name + "\" of \"" + t->name + "\": max_consumers_per_group (" +
                                  std::to_string(g->max_consumers) + ") reached");
  c->in_use = true;
  c->handler = std::move(handler);
  c->tx_handler = std::move(tx_handler);
  if (t->is_queue && g->consumer_count.load(std::memory_order_relaxed) == 0) {
    // The first consumer of a queue sets its delivery options.
    g->options = o;
    g->idempotency = idem;
  }
  c->enabled.store(true, std::memory_order_seq_cst);
  g->consumer_count.fetch_add(1, std::memory_order_seq_cst);
  g->active.store(true, std::memory_order_seq_cst);
  // Lanes may hold messages that waited for a consumer (queues, durable logs,
  // a pending retry): let a worker look at each (an empty lane costs one
  // run-queue round trip). Lane state itself belongs to the worker running it.
  for (auto& gl : g->lanes) schedule(gl.get());
  return c;
}

Status BusCore::detach(Consumer* c) noexcept {
  c->enabled.store(false, std::memory_order_seq_cst);
  if (tl_running_consumer == c) {
    // Cannot wait for ourselves; the slot is freed by nobody until the bus
    // dies (documented: detached, not awaited).
    return Status::from_literal(Code::Busy,
                                "close: called from the subscription's own handler; detached without waiting");
  }
  while (c->calls.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  MutexLock l(&mu_);
  GroupImpl* g = c->group;
  Handler old = std::move(c->handler);
  TxHandler old_tx = std::move(c->tx_handler);
  c->handler = nullptr;
  c->tx_handler = nullptr;
  c->in_use = false;
  if (g->consumer_count.fetch_sub(1, std::memory_order_seq_cst) == 1 && !g->persistent) {
    // Last consumer of a topic group: it stops receiving; queued messages are
    // discarded by the workers (no consumer) and counted as dropped.
    g->active.store(false, std::memory_order_seq_cst);
    for (auto& gl : g->lanes) schedule(gl.get());
  }
  return Status();
}

BusStats BusCore::stats() const {
  BusStats out;
  out.name = options.name;
  MutexLock l(&mu_);
  out.workers = static_cast<std::uint32_t>(workers_.size());
  if (dlq_) {
    auto c = dlq_->counters();
    if (c.ok()) {
      out.dlq_available = true;
      out.dlq = *c;
    }
  }
  for (const auto& [name, t] : topics_) {
    TopicStats ts;
    ts.name = name;
    ts.is_queue = t->is_queue;
    ts.durable = t->durable;
    ts.lanes = t->options.lanes;
    std::vector<std::uint64_t> ends;
    if (t->durable) {
      for (std::uint32_t i = 0; i < t->options.lanes; ++i) {
        auto e = store_->end_offset(t->store_topic, i);
        ends.push_back(e.ok() ? *e : 0);
      }
    }
    ts.unrouted = t->unrouted.load(std::memory_order_relaxed);
    ts.publish_refused = t->refused.load(std::memory_order_relaxed);
    for (std::uint32_t i = 0; i < t->options.lanes; ++i) {
      std::uint64_t p = t->lane_load[i].published.load(std::memory_order_relaxed);
      ts.lane_published.push_back(p);
      ts.published += p;
    }
    for (const auto& g : t->owned_groups) {
      GroupStats gs;
      gs.name = g->name;
      gs.consumers = g->consumer_count.load(std::memory_order_relaxed);
      std::vector<GroupLaneInfo> persisted;
      if (t->durable) {
        auto info = store_->group_info(g->store_group);
        if (info.ok()) persisted = std::move(*info);
      }
      for (const auto& gl : g->lanes) {
        LaneCounters lc;
        lc.delivered = gl->delivered.load(std::memory_order_relaxed);
        lc.acked = gl->acked.load(std::memory_order_relaxed);
        lc.retried = gl->retried.load(std::memory_order_relaxed);
        lc.rejected = gl->rejected.load(std::memory_order_relaxed);
        lc.failed = gl->failed.load(std::memory_order_relaxed);
        lc.timed_out = gl->timed_out.load(std::memory_order_relaxed);
        lc.duplicates_skipped = gl->duplicates_skipped.load(std::memory_order_relaxed);
        lc.dropped = gl->dropped.load(std::memory_order_relaxed);
        lc.in_flight = gl->ring.size_approx();  // + the one being handled, not visible here
        lc.skipped = gl->skipped.load(std::memory_order_relaxed);
        if (t->durable && gl->lane < persisted.size() && gl->lane < ends.size()) {
          const GroupLaneInfo& pi = persisted[gl->lane];
          lc.in_flight = ends[gl->lane] > pi.committed ? ends[gl->lane] - pi.committed : 0;
          lc.skipped += pi.skipped;
        }
        gs.total.delivered += lc.delivered;
        gs.total.acked += lc.acked;
        gs.total.retried += lc.retried;
        gs.total.rejected += lc.rejected;
        gs.total.failed += lc.failed;
        gs.total.timed_out += lc.timed_out;
        gs.total.duplicates_skipped += lc.duplicates_skipped;
        gs.total.dropped += lc.dropped;
        gs.total.in_flight += lc.in_flight;
        gs.total.skipped += lc.skipped;
        gs.lanes.push_back(lc);
        gl->latency.add_to(gs.latency);
        std::int64_t oldest = gl->oldest_ns.load(std::memory_order_relaxed);
        if (t->durable && gl->lane < persisted.size() && lc.in_flight > 0) {
          // The message at the committed offset is the oldest unfinished one.
          ReadLimits one;
          one.max_messages = 1;
          auto r = store_->read(t->store_topic, gl->lane, persisted[gl->lane].committed, one);
          oldest = (r.ok() && !r->messages.empty()) ? r->messages.front().header.created_at_ns : 0;
        } else if (t->durable) {
          oldest = 0;
        }
        if (oldest != 0 && (gs.oldest_unprocessed_ns == 0 || oldest < gs.oldest_unprocessed_ns))
          gs.oldest_unprocessed_ns = oldest;
      }
      ts.groups.push_back(std::move(gs));
    }
    out.topics.push_back(std::move(ts));
  }
  return out;
}

}  // namespace detail

// ---------------------------------------------------------------- public API

Result<std::string> Transaction::get(std::string_view table, std::string_view key) {
  auto k = detail::user_key_public(table, key);
  if (!k.ok()) return k.status();
  auto w = state_->writes.find(*k);
  if (w != state_->writes.end()) {
    if (!w->second) return Status(Code::NotFound, "table \"" + std::string(table) + "\": key deleted in this transaction");
    return *w->second;
  }
  for (const auto& r : state_->reads)
    if (r.key == *k) {
      if (!r.found) return Status(Code::NotFound, "table \"" + std::string(table) + "\": no such key");
      return r.value;
    }
  detail::TxnState::Read read;
  read.key = *k;
  Status s = state_->store->read([&](detail::StoreTxn& t) -> Status {
    auto v = t.get(detail::StoreTable::User, read.key);
    if (!v.ok() && v.code() != Code::NotFound) return v.status();
    read.found = v.ok();
    if (v.ok()) read.value.assign(*v);
    return Status();
  });
  if (!s.ok()) return s;
  state_->reads.push_back(read);
  if (!read.found) return Status(Code::NotFound, "table \"" + std::string(table) + "\": no such key");
  return read.value;
}

Status Transaction::put(std::string_view table, std::string_view key, std::string_view value) {
  auto k = detail::user_key_public(table, key);
  if (!k.ok()) return k.status();
  state_->writes[*k] = std::string(value);
  return Status();
}

Status Transaction::del(std::string_view table, std::string_view key) {
  auto k = detail::user_key_public(table, key);
  if (!k.ok()) return k.status();
  state_->writes[*k] = std::nullopt;
  return Status();
}

Status Transaction::publish(const Topic& topic, const OutgoingMessage& m) {
  if (topic.impl_ == nullptr || topic.impl_->bus != state_->bus || !topic.impl_->durable)
    return Status(Code::InvalidArgument, "outbox publish: the topic must be a durable topic or queue of this bus");
  if (m.payload.empty()) return Status(Code::InvalidArgument, "outbox publish: the payload is empty");
  detail::AppendRequest req;
  req.topic_id = topic.impl_->store_topic.id;
  req.lane = lane_for_key(m.key, topic.impl_->options.lanes);
  req.header.created_at_ns = detail::now_ns_public();
  req.header.correlation_id = m.correlation_id;
  req.header.fencing_token = m.fencing_token;
  req.header.content_type = m.content_type;
  req.header.schema_version = m.schema_version;
  req.key.assign(m.key);
  req.idempotency_key.assign(m.idempotency_key);
  req.payload.assign(m.payload);
  state_->outbox.push_back(std::move(req));
  return Status();
}

namespace {
Status no_topic() noexcept {
  return Status::from_literal(Code::InvalidArgument, "publish: the topic handle is empty or foreign to this bus");
}
}  // namespace

namespace {
Status publish_durable_noexcept(detail::TopicImpl* t, const OutgoingMessage& m) noexcept {
  try {
    return t->publish_durable(m, {});
  } catch (const std::exception& e) {
    return Status::from_literal(Code::Internal, "publish: out of memory copying the message for the store");
  }
}
}  // namespace

Status Topic::publish(const OutgoingMessage& message) const noexcept {
  if (impl_ == nullptr) return no_topic();
  if (impl_->durable) return publish_durable_noexcept(impl_, message);
  return impl_->publish(message, true, impl_->bus->take_ids(1));
}

Status Topic::try_publish(const OutgoingMessage& message) const noexcept {
  if (impl_ == nullptr) return no_topic();
  if (impl_->durable) return publish_durable_noexcept(impl_, message);
  return impl_->publish(message, false, impl_->bus->take_ids(1));
}

Status Topic::publish_async(const OutgoingMessage& message, PublishCallback done) const {
  if (impl_ == nullptr) return no_topic();
  if (!done) return Status(Code::InvalidArgument, "publish_async: the completion callback is empty");
  if (impl_->durable) return impl_->publish_durable(message, std::move(done));
  Status s = impl_->publish(message, true, impl_->bus->take_ids(1));
  if (s.ok()) done(s, 0);
  return s;
}

bool Topic::is_durable() const noexcept { return impl_ && impl_->durable; }

std::string_view Topic::name() const noexcept { return impl_ ? std::string_view(impl_->name) : std::string_view(); }
std::uint32_t Topic::lanes() const noexcept { return impl_ ? impl_->options.lanes : 0; }
bool Topic::is_queue() const noexcept { return impl_ && impl_->is_queue; }

// Subscription

Subscription::Subscription(std::shared_ptr<detail::BusCore> core, detail::Consumer* consumer) noexcept
    : core_(std::move(core)), consumer_(consumer) {}

Subscription::Subscription(Subscription&& other) noexcept
    : core_(std::move(other.core_)), consumer_(std::exchange(other.consumer_, nullptr)) {}

Subscription& Subscription::operator=(Subscription&& other) noexcept {
  if (this != &other) {
    (void)close();
    core_ = std::move(other.core_);
    consumer_ = std::exchange(other.consumer_, nullptr);
  }
  return *this;
}

Subscription::~Subscription() { (void)close(); }

Status Subscription::close() noexcept {
  if (consumer_ == nullptr) return Status();
  detail::Consumer* c = std::exchange(consumer_, nullptr);
  Status s = core_->detach(c);
  core_.reset();
  return s;
}

// Publisher

Publisher::Publisher() noexcept = default;
Publisher::Publisher(std::unique_ptr<detail::PublisherState> state) noexcept : state_(std::move(state)) {}
Publisher::Publisher(Publisher&&) noexcept = default;
Publisher& Publisher::operator=(Publisher&&) noexcept = default;
Publisher::~Publisher() = default;

namespace {
constexpr std::uint64_t kIdBlock = 1024;

std::uint64_t next_publisher_id(detail::PublisherState& st) noexcept {
  if (st.next_id == st.end_id) {
    st.next_id = st.bus->take_ids(kIdBlock);
    st.end_id = st.next_id + kIdBlock;
  }
  return st.next_id++;
}
}  // namespace

Status Publisher::publish(const Topic& topic, const OutgoingMessage& message) noexcept {
  if (!state_ || topic.impl_ == nullptr || topic.impl_->bus != state_->bus) return no_topic();
  if (topic.impl_->durable) return publish_durable_noexcept(topic.impl_, message);
  return topic.impl_->publish(message, true, next_publisher_id(*state_));
}

Status Publisher::try_publish(const Topic& topic, const OutgoingMessage& message) noexcept {
  if (!state_ || topic.impl_ == nullptr || topic.impl_->bus != state_->bus) return no_topic();
  if (topic.impl_->durable) return publish_durable_noexcept(topic.impl_, message);
  return topic.impl_->publish(message, false, next_publisher_id(*state_));
}

// Bus

Bus::Bus(std::shared_ptr<detail::BusCore> core) noexcept : core_(std::move(core)) {}

Result<std::unique_ptr<Bus>> Bus::open(const BusOptions& options) {
  if (options.workers > 1024)
    return Status(Code::InvalidArgument, "bus \"" + options.name + "\": workers must be at most 1024, got " +
                                             std::to_string(options.workers));
  if (options.max_topics == 0 || options.max_consumers_per_group == 0)
    return Status(Code::InvalidArgument,
                  "bus \"" + options.name + "\": max_topics and max_consumers_per_group must be at least 1");
  if (options.spin.count() < 0 || options.close_timeout.count() < 0)
    return Status(Code::InvalidArgument, "bus \"" + options.name + "\": spin and close_timeout must not be negative");
  auto core = std::make_shared<detail::BusCore>(options);
  if (Status s = core->start(); !s.ok()) return s;
  return std::unique_ptr<Bus>(new Bus(std::move(core)));
}

Bus::~Bus() { (void)core_->shutdown(ShutdownMode::Drain, core_->options.close_timeout); }

Result<Topic> Bus::create_topic(std::string_view name, const TopicOptions& options) {
  auto t = core_->create(name, false, options);
  if (!t.ok()) return t.status();
  return Topic(*t);
}

Result<Topic> Bus::create_queue(std::string_view name, const TopicOptions& options) {
  auto t = core_->create(name, true, options);
  if (!t.ok()) return t.status();
  return Topic(*t);
}

Result<Topic> Bus::find(std::string_view name) const {
  if (Status s = detail::check_name(name, "topic"); !s.ok()) return s;
  detail::TopicImpl* t = core_->find(name);
  if (t == nullptr) return Status(Code::NotFound, "no topic or queue named \"" + std::string(name) + "\"");
  return Topic(t);
}

Result<Subscription> Bus::subscribe(const Topic& topic, std::string_view group, Handler handler,
                                    const GroupOptions& options) {
  if (topic.impl_ == nullptr || topic.impl_->bus != core_.get())
    return Status(Code::InvalidArgument, "subscribe: the topic handle is empty or belongs to another bus");
  if (topic.impl_->is_queue)
    return Status(Code::InvalidArgument,
                  "subscribe: \"" + topic.impl_->name + "\" is a queue; use Bus::consume for competing consumers");
  if (Status s = detail::check_name(group, "group"); !s.ok()) return s;
  auto c = core_->attach(topic.impl_, group, std::move(handler), {}, options);
  if (!c.ok()) return c.status();
  return Subscription(core_, *c);
}

Result<Subscription> Bus::consume(const Topic& queue, Handler handler, const GroupOptions& options) {
  if (queue.impl_ == nullptr || queue.impl_->bus != core_.get())
    return Status(Code::InvalidArgument, "consume: the queue handle is empty or belongs to another bus");
  if (!queue.impl_->is_queue)
    return Status(Code::InvalidArgument,
                  "consume: \"" + queue.impl_->name + "\" is a topic; use Bus::subscribe with a group name");
  auto c = core_->attach(queue.impl_, {}, std::move(handler), {}, options);
  if (!c.ok()) return c.status();
  return Subscription(core_, *c);
}

Status Bus::seek(const Topic& topic, std::string_view group, const StartPosition& position) {
  if (topic.impl_ == nullptr || topic.impl_->bus != core_.get())
    return Status(Code::InvalidArgument, "seek: the topic handle is empty or belongs to another bus");
  return core_->seek(topic.impl_, group, position);
}

Result<IdempotencyTable*> Bus::idempotency(std::string_view scope, const IdempotencyOptions& options) {
  return core_->idempotency(scope, options);
}

Result<Subscription> Bus::subscribe_tx(const Topic& topic, std::string_view group, TxHandler handler,
                                       const GroupOptions& options) {
  if (topic.impl_ == nullptr || topic.impl_->bus != core_.get())
    return Status(Code::InvalidArgument, "subscribe_tx: the topic handle is empty or belongs to another bus");
  if (topic.impl_->is_queue)
    return Status(Code::InvalidArgument, "subscribe_tx: \"" + topic.impl_->name + "\" is a queue; use consume_tx");
  if (Status s = detail::check_name(group, "group"); !s.ok()) return s;
  auto c = core_->attach(topic.impl_, group, {}, std::move(handler), options);
  if (!c.ok()) return c.status();
  return Subscription(core_, *c);
}

Result<Subscription> Bus::consume_tx(const Topic& queue, TxHandler handler, const GroupOptions& options) {
  if (queue.impl_ == nullptr || queue.impl_->bus != core_.get())
    return Status(Code::InvalidArgument, "consume_tx: the queue handle is empty or belongs to another bus");
  if (!queue.impl_->is_queue)
    return Status(Code::InvalidArgument, "consume_tx: \"" + queue.impl_->name + "\" is a topic; use subscribe_tx");
  auto c = core_->attach(queue.impl_, {}, {}, std::move(handler), options);
  if (!c.ok()) return c.status();
  return Subscription(core_, *c);
}

Result<std::string> Bus::table_get(std::string_view table, std::string_view key) const {
  return core_->table_get(table, key);
}

Result<DeadLetters*> Bus::dead_letters() {
  if (core_->dead_letters() == nullptr)
    return Status(Code::InvalidArgument, "dead_letters: an in-memory bus has no DLQ (set BusOptions::store.directory)");
  return core_->dead_letters();
}

Result<std::vector<DlqEntry>> DeadLetters::list(const DlqFilter& filter) { return core_->dlq()->list(filter); }
Result<DlqEntry> DeadLetters::show(std::uint64_t id) { return core_->dlq()->show(id); }
Result<std::uint64_t> DeadLetters::replay(const std::vector<std::uint64_t>& ids, std::string_view operator_name) {
  auto r = core_->dlq()->replay(std::span<const std::uint64_t>(ids), operator_name,
                                [this](const DlqEntry& e) { return core_->republish(e); });
  if (!r.ok()) return r.status();
  return static_cast<std::uint64_t>(r->size());
}
Status DeadLetters::archive(const std::vector<std::uint64_t>& ids, std::string_view operator_name) {
  return core_->dlq()->archive(std::span<const std::uint64_t>(ids), operator_name);
}
Result<std::uint64_t> DeadLetters::purge(const std::vector<std::uint64_t>& ids, std::string_view operator_name) {
  return core_->dlq()->purge(std::span<const std::uint64_t>(ids), operator_name);
}
Result<std::vector<DlqAuditRecord>> DeadLetters::audit() { return core_->dlq()->audit(); }
Result<DlqCounters> DeadLetters::counters() { return core_->dlq()->counters(); }

Publisher Bus::publisher() {
  auto st = std::make_unique<detail::PublisherState>();
  st->bus = core_.get();
  return Publisher(std::move(st));
}

BusStats Bus::stats() const { return core_->stats(); }

Status Bus::shutdown(ShutdownMode mode, std::chrono::milliseconds timeout) { return core_->shutdown(mode, timeout); }

}  // namespace lanebus
