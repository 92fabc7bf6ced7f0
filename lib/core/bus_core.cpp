// lanebus — MIT License.
// BusCore's life: start (the store, tenancy, the poller, the retry timer,
// the scheduler), shutdown, the watchdog, the poller's maintenance pass
// (schema usage, outage resumes, the DLQ and idempotency retention), the
// poller and the append listener, the publisher slots and the implicit
// publishers of Topic::publish. Design notes in bus_impl.hpp.
#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bus_impl.hpp"
#include "lanebus/lease.hpp"

namespace lanebus::detail {

thread_local constinit Consumer* tl_running_consumer = nullptr;
thread_local constinit BusCore* tl_running_bus = nullptr;
thread_local constinit GroupLane* tl_running_lane = nullptr;

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
    outages_.set_store(store_.get());
    dlq_ = std::make_unique<DlqStore>(*store_, options.dlq);
    delivery_.set_store(store_.get(), dlq_.get());
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
        sched_.schedule(static_cast<WakeEntry*>(e)->lane);  // a parked message is due
        return;
      }
      if (e->kind == TimerEntry::Kind::Delayed) {
        // Delayed messages are due (delayed.cpp; a durable store's index: delayed_durable.cpp).
        if (TopicImpl* t = static_cast<DelayEntry*>(e)->topic) {
          t->timed.release_due();
        } else {
          durable_delays_.move();
        }
        return;
      }
      sched_.enqueue_lane(static_cast<GroupLane*>(e));
    });
  } catch (const std::exception& e) {
    return Status(Code::Internal, std::string("bus \"") + options.name + "\": starting the retry timer: " + e.what());
  }
  durable_delays_.refresh();  // delayed messages stored before this start (a restart)
  return sched_.start(options.workers ? options.workers : std::max(1u, std::thread::hardware_concurrency()));
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
  sched_.enqueue_lane(gl);
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
  sched_.abandon();
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
  sched_.abandon();
  sched_.stop();
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
  drop_claims_ahead();
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

// Workers and poller are stopped: every queue lane's mailbox closes, stops
// being watched (waiting for a commit that claims for it), and gives back
// what nobody took, so a clean shutdown leaves no claim to wait out its
// visibility nor an attempt counted as a crash.
void BusCore::drop_claims_ahead() noexcept {
  if (!store_) return;
  std::vector<GroupImpl*> queues;
  try {
    MutexLock l(&mu_);
    for (auto& [name, t] : topics_)
      if (t->is_queue && t->durable) queues.push_back(t->owned_groups.front().get());
  } catch (const std::exception&) {
    return;  // out of memory: the claims expire after their visibility
  }
  for (GroupImpl* g : queues) {
    Status s = close_claims_ahead(g);
    if (!s.ok() && logger.enabled())
      logger.log(LogLevel::Warn, "shutdown: %s (those claims expire after their visibility)", s.to_string().c_str());
    for (auto& gl : g->lanes)
      if (gl->claim_ahead) store_->unwatch_claims(gl->claim_ahead.get());
  }
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
  RestoredHeaders headers(e.headers);  // its trace context too (doc/tracing.md)
  m.headers = headers.headers();
  headers.enter();
  return t->durable ? t->publish_durable(m, {}) : t->publish(m, true, take_ids(1));
}

// DLQ entries refused by the quota since the last maintenance pass (about
// once a second): one line, off the worker that was refused.
void BusCore::log_dlq_refusals() noexcept {
  const std::uint64_t rejected = dlq_->rejected();
  if (rejected == dlq_rejected_logged_ || !logger.enabled()) return;
  const std::uint64_t n = rejected - dlq_rejected_logged_;
  dlq_rejected_logged_ = rejected;
  const DlqOptions& o = dlq_->options();
  logger.log(LogLevel::Warn,
             "the DLQ refused %llu entr%s over its quota (DlqOptions max_entries %llu, max_bytes %llu): "
             "the messages stay in their queues and lanes and are retried; "
             "review the DLQ (lanebus dlq list) or raise the quota",
             static_cast<unsigned long long>(n), n == 1 ? "y" : "ies",
             static_cast<unsigned long long>(o.max_entries), static_cast<unsigned long long>(o.max_bytes));
}

void BusCore::maintenance() noexcept {
  // Schema registry: this process's field reads to the store, and versions
  // registered by other processes to the publish path.
  if (schemas_ && store_ && !store_->read_only()) {
    try {
      (void)schemas_->flush_usage();
    } catch (...) {
    }
    schemas_->refresh_all();
  }
  outages_.poll_resume();
  durable_delays_.refresh();  // entries of other processes, or a failed move
  if (!dlq_) return;
  log_dlq_refusals();
  try {
    for (int i = 0; i < 16; ++i) {
      auto r = dlq_->expire();
      if (!r.ok() || *r < dlq_->options().expire_batch) break;
    }
    (void)dlq_->replay_due_transient(dlq_->options().transient_cooldown, "auto",
                                     [this](const DlqEntry& e) { return republish(e); });
  } catch (...) {
  }
  // Idempotency scopes: the durable tier's retention (tables live as long as
  // the bus, so the pointers stay valid after the lock is dropped).
  std::vector<IdempotencyImpl*> scopes;
  {
    MutexLock l(&mu_);
    for (auto& [name, table] : idempotency_) scopes.push_back(Access::impl(*table));
  }
  for (IdempotencyImpl* idem : scopes) {
    try {
      for (int i = 0; i < 16; ++i) {
        auto r = idem->expire(1024);
        if (!r.ok() || *r < 1024) break;
      }
    } catch (...) {
    }
  }
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
  if ((grew || g->topic->is_queue) && g->consumer_count.load(std::memory_order_seq_cst) > 0) sched_.schedule(gl);
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

// Finds appends made by other processes, and (`periodic`) expired queue
// claims: a queue lane with consumers is looked at on every periodic pass
// even when its log did not grow. A wake-up from another process's commit
// only schedules the lanes that grew.
void BusCore::scan_durable_ends(std::vector<TopicImpl*>& topics, std::vector<std::uint64_t>& ends, bool periodic) {
  topics.clear();
  {
    MutexLock l(&durable_mu_);
    for (auto& [id, t] : durable_topics_) topics.push_back(t);
  }
  for (TopicImpl* t : topics) {
    const std::uint32_t lanes = t->options.lanes;
    if (ends.size() < lanes) ends.resize(lanes);  // grows to the widest topic once
    if (!store_->end_offsets(t->store_topic, ends.data()).ok()) continue;
    for (std::uint32_t lane = 0; lane < lanes; ++lane) {
      const std::uint32_t ng = t->group_count.load(std::memory_order_acquire);
      for (std::uint32_t i = 0; i < ng; ++i) {
        GroupImpl* g = t->groups[i].load(std::memory_order_acquire);
        if (g == nullptr) continue;
        // Relaxed: a hint; wake_durable_group re-checks with a CAS.
        if (periodic || ends[lane] > g->lanes[lane]->known_end.load(std::memory_order_relaxed))
          wake_durable_group(g, lane, ends[lane]);
      }
    }
  }
}

// The poller: sleeps on the store's commit-wake word (another process's commit
// that appended wakes it, doc/durable.md) with the poll interval as timeout,
// so a lost or missing wake-up costs at most one interval. Without a wake word
// it sleeps on poller_cv_ alone, as before.
void BusCore::poller_main() {
  using clock = std::chrono::steady_clock;
  std::vector<TopicImpl*> topics;
  std::vector<std::uint64_t> ends;
  std::int64_t polls = 0;
  const bool wake = store_->has_commit_wake();
  auto next_poll = clock::now() + options.durable_poll;
  for (;;) {
    // Read the word before the store (a commit after this line wakes the wait).
    const std::uint32_t seen = store_->commit_wake_seq();
    bool woken = false;
    {
      std::unique_lock l(poller_mu_);
      if (poller_stop_) return;
      if (!wake && poller_cv_.wait_until(l, next_poll, [&] { return poller_stop_; })) return;
    }
    if (wake) {
      woken = store_->wait_for_commit(seen, next_poll - clock::now());
      std::lock_guard l(poller_mu_);
      if (poller_stop_) return;
    }
    if (clock::now() >= next_poll) {
      if (++polls % std::max<std::int64_t>(1, 1000 / std::max<std::int64_t>(1, options.durable_poll.count())) == 0)
        maintenance();
      scan_durable_ends(topics, ends, true);
      next_poll = clock::now() + options.durable_poll;
    } else if (woken) {
      scan_durable_ends(topics, ends, false);
    }
  }
}

// ---------------------------------------------------------------- implicit publishers
//
// Topic::publish on an in-memory topic goes through a publisher of the
// calling thread's own, as if the program had made one with Bus::publisher():
// the slot magazine, the block of ids and the solo path, where the shared
// path takes ids, slots and ring cells with a locked instruction each (2-3x
// slower, doc/performance.md "Topic::publish through a thread's publisher").
// - The core owns the states (ThreadPublishers); a thread caches the last
//   two buses it published to (serial, state, weak reference to the table).
//   The cache is the thread's: a state is used by its thread only.
// - A thread's exit destroys its states, if their core is still there (the
//   table's mutex and `alive`); the core's destruction destroys the rest.
//   Destroying a state gives its magazines' slots back, ends solo
//   ownership and frees the publisher slot, as a Publisher's destruction.
// - A state is made once per thread and bus (one allocation, on the first
//   publish); after that, publishing allocates nothing. A thread that
//   publishes to a third bus drops its oldest state.
namespace {
struct ThreadPublisherCache {
  struct Entry {
    std::uint64_t serial = 0;  // BusCore::serial_; 0: empty
    PublisherState* state = nullptr;
    std::weak_ptr<ThreadPublishers> table;
  };
  Entry entries[2];

  ~ThreadPublisherCache() {
    for (Entry& e : entries) drop(e);
  }
  static void drop(Entry& e) noexcept {
    if (std::shared_ptr<ThreadPublishers> t = e.table.lock()) {
      // Under the table's lock, so the core (whose destruction takes it
      // first) and its pools are still there while the state gives its
      // magazines back (lock order: the table, then a pool's).
      MutexLock l(&t->mu);
      if (t->alive) {
        for (auto& st : t->states) {
          if (st.get() != e.state) continue;
          st = std::move(t->states.back());  // destroys the state
          t->states.pop_back();
          break;
        }
      }
    }
    e = Entry{};
  }
};
thread_local ThreadPublisherCache tl_publishers;
}  // namespace

PublisherState* BusCore::thread_publisher() noexcept {
  ThreadPublisherCache& c = tl_publishers;
  if (c.entries[0].serial == serial_) return c.entries[0].state;
  if (c.entries[1].serial == serial_) {
    std::swap(c.entries[0], c.entries[1]);
    return c.entries[0].state;
  }
  if (closing()) return nullptr;
  try {
    auto st = std::make_unique<PublisherState>();
    st->bus = this;
    st->slot = claim_publisher_slot();
    PublisherState* raw = st.get();
    {
      MutexLock l(&thread_publishers_->mu);
      if (!thread_publishers_->alive) return nullptr;
      thread_publishers_->states.push_back(std::move(st));
    }
    ThreadPublisherCache::drop(c.entries[1]);
    c.entries[1] = std::move(c.entries[0]);
    c.entries[0] = {serial_, raw, thread_publishers_};
    return raw;
  } catch (...) {
    return nullptr;  // out of memory: the shared path
  }
}

void BusCore::drop_thread_publishers() noexcept {
  std::vector<std::unique_ptr<PublisherState>> gone;
  {
    MutexLock l(&thread_publishers_->mu);
    thread_publishers_->alive = false;
    gone.swap(thread_publishers_->states);
  }
}

void BusCore::arm_delayed(DelayEntry* e, std::int64_t due_wall_ns) noexcept {
  if (!timer_) return;
  const std::int64_t wait = due_wall_ns - now_ns();
  try {
    timer_->arm(e, RetryTimer::now_ns() + std::max<std::int64_t>(wait, 0));
  } catch (...) {
    // RetryTimer::arm takes a std::mutex: it throws only if locking fails.
  }
}

}  // namespace lanebus::detail
