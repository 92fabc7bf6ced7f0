// lanebus — MIT License.
// The registry: topics, groups and consumers (create, attach, detach, find),
// idempotency scopes, seek and resume; and the reads over it: Bus::stats()
// (counter snapshots of every topic, group and lane), the usage taps, the
// user tables' get. Lock order is in bus_impl.hpp.
#include <algorithm>
#include <cassert>
#include <exception>
#include <string>

#include "bus_impl.hpp"
#include "names.hpp"
#include "store_stats.hpp"
#include "namespace_move.hpp"

namespace lanebus::detail {

namespace {

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
  if (Status s = check_default_ttl(o.default_ttl); !s.ok()) return bad(std::string(s.message()));
  const std::uint32_t most = o.durable ? (64u << 20) : static_cast<std::uint32_t>(PayloadPool::kMaxBlock);
  if (o.max_payload == 0 || o.max_payload > most)
    return bad("max_payload must be 1.." + std::to_string(most >> 20) + " MiB for " +
               (o.durable ? "a durable" : "an in-memory") + " topic, got " + std::to_string(o.max_payload));
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

// Discard the oldest queued message of each active group, lane by lane from

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
  if (Status s = check_not_moved(*store_, scope); !s.ok()) return s;  // doc/tenancy.md "Moving a namespace"
  MutexLock l(&mu_);
  auto it = idempotency_.find(scope);
  if (it != idempotency_.end()) return it->second.get();
  auto table = std::unique_ptr<IdempotencyTable>(
      new IdempotencyTable(std::make_unique<IdempotencyImpl>(store_.get(), std::string(scope), o)));
  IdempotencyTable* raw = table.get();
  idempotency_.emplace(std::string(scope), std::move(table));
  return raw;
}

GroupImpl* BusCore::find_group(TopicImpl* t, std::string_view group) {
  MutexLock l(&mu_);
  for (auto& og : t->owned_groups)
    if (t->is_queue || og->name == group) return og.get();
  return nullptr;
}

Status BusCore::seek(TopicImpl* t, std::string_view group, const StartPosition& position) {
  if (!t->durable)
    return Status(Code::InvalidArgument, "seek \"" + t->name + "\": only durable topics and queues can seek");
  if (closing()) return Status(Code::ShutDown, "bus \"" + options.name + "\" is shut down");
  GroupImpl* g = find_group(t, group);
  if (g == nullptr)
    return Status(Code::NotFound, "seek \"" + t->name + "\": no group \"" + std::string(group) + "\" in this bus");
  {
    MutexLock l(&g->commit_mu);
    g->seek_gen.fetch_add(1, std::memory_order_acq_rel);
    if (Status s = store_->seek(g->store_group, position); !s.ok()) return s;
  }
  if (g->consumer_count.load(std::memory_order_seq_cst) > 0)
    for (auto& gl : g->lanes) sched_.schedule(gl.get());
  return Status();
}

Status BusCore::resume(TopicImpl* t, std::string_view group) {
  if (closing()) return Status(Code::ShutDown, "bus \"" + options.name + "\" is shut down");
  GroupImpl* g = find_group(t, group);
  if (g == nullptr)
    return Status(Code::NotFound, "resume \"" + t->name + "\": no group \"" + std::string(group) + "\" in this bus");
  if (!g->options.outage.enabled)
    return Status(Code::InvalidArgument, "resume \"" + t->name + "\" group \"" + g->name +
                                             "\": the group has no outage pause (GroupOptions::outage.enabled)");
  outages_.resume(g);
  if (g->consumer_count.load(std::memory_order_seq_cst) > 0)
    for (auto& gl : g->lanes) sched_.schedule(gl.get());
  return Status();
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
    // A namespace moved to another store stays there (doc/tenancy.md "Moving a namespace").
    if (Status s = check_not_moved(*store_, name); !s.ok()) return s;
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
  raw->ns.store(tenancy_->resolve(name), std::memory_order_release);  // tenancy: its namespace
  if (is_queue) {
    // The queue's one group exists from the start and keeps messages until a
    // consumer attaches.
    auto g = std::make_unique<GroupImpl>(raw, std::string(), GroupOptions{}, o.lanes, raw->capacity,
                                         options.max_consumers_per_group);
    g->store_group = queue_group;
    g->active.store(true, std::memory_order_release);
    if (o.durable) {
      // Claims in the append's transaction (claim_ahead.hpp): watched until shutdown.
      for (std::uint32_t lane = 0; lane < o.lanes; ++lane) {
        GroupLane* gl = g->lanes[lane].get();
        gl->claim_ahead = std::make_unique<ClaimAhead>(ref, queue_group, lane);
        store_->watch_claims(gl->claim_ahead.get());
      }
    }
    raw->groups[0].store(g.get(), std::memory_order_release);
    raw->owned_groups.push_back(std::move(g));
    raw->group_count.store(1, std::memory_order_release);
  }
  topics_.emplace(std::string(name), std::move(t));
  if (o.durable) {
    {
      MutexLock dl(&durable_mu_);
      durable_topics_[ref.id] = raw;
    }
    durable_delays_.refresh();  // its delayed messages that came due while no bus had it open (delayed_durable.cpp)
  }
  return raw;
}

namespace {

// Subscribe's checks of the group's times: visibility, backoff, timeout, the outage pause.
Status check_timing_options(const std::string& topic, const GroupOptions& o) {
  if (o.visibility.count() <= 0)
    return Status(Code::InvalidArgument, "subscribe to \"" + topic + "\": visibility must be positive");
  if (o.backoff_initial.count() < 0 || o.backoff_max.count() < 0 || o.attempt_timeout.count() < 0 ||
      !(o.backoff_multiplier >= 1.0) || !(o.backoff_jitter >= 0.0 && o.backoff_jitter <= 1.0))
    return Status(Code::InvalidArgument,
                  "subscribe to \"" + topic +
                      "\": backoff and timeout must not be negative, backoff_multiplier must be >= 1 and "
                      "backoff_jitter within 0..1");
  return check_outage_options(topic, o.outage);
}

// The GroupOptions a subscribe refuses (attach), each with its allowed range.
Status check_group_options(const std::string& topic, const GroupOptions& o) {
  if (o.key_parallel_limit == 0 || o.key_parallel_limit > 65536)
    return Status(Code::InvalidArgument, "subscribe to \"" + topic + "\": key_parallel_limit must be 1..65536, got " +
                                             std::to_string(o.key_parallel_limit));
  if (o.batch_max == 0 || o.batch_max > kMaxBatch)
    return Status(Code::InvalidArgument, "subscribe to \"" + topic + "\": batch_max must be 1.." +
                                             std::to_string(kMaxBatch) + ", got " + std::to_string(o.batch_max));
  if (o.max_attempts == 0 || o.batch == 0)
    return Status(Code::InvalidArgument, "subscribe to \"" + topic + "\": max_attempts and batch must be at least 1");
  return check_timing_options(topic, o);
}
}  // namespace

Result<Consumer*> BusCore::attach(TopicImpl* t, std::string_view group, Handler handler, TxHandler tx_handler,
                                  const GroupOptions& o, BatchHandler batch_handler) {
  if (!handler && !tx_handler && !batch_handler)
    return Status(Code::InvalidArgument, "subscribe to \"" + t->name + "\": the handler is empty");
  if (tx_handler && !t->durable)
    return Status(Code::InvalidArgument, "subscribe to \"" + t->name +
                                             "\": transactional handlers need a durable topic or queue");
  if (Status s = check_group_options(t->name, o); !s.ok()) return s;
  if (closing()) return Status(Code::ShutDown, "bus \"" + options.name + "\" is shut down");
  IdempotencyImpl* idem = nullptr;
  if (!o.idempotency_scope.empty()) {
    auto table = idempotency(o.idempotency_scope, {});  // takes mu_ itself
    if (!table.ok()) return table.status();
    idem = Access::impl(**table);
  }
  // Consumer contract (doc/schemas.md): stored with the group, seen by every
  // process (blocking: before mu_).
  if (!o.reads.empty()) {
    if (Status s = schemas_->set_contract(t->name, t->is_queue ? std::string_view("queue") : group, o.reads); !s.ok())
      return s;
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
  c->batch_handler = std::move(batch_handler);
  if (t->is_queue && g->consumer_count.load(std::memory_order_relaxed) == 0) {
    // The first consumer of a queue sets its delivery options.
    g->options = o;
    g->idempotency = idem;
  }
  if (g->consumer_count.load(std::memory_order_relaxed) == 0 || t->is_queue) {
    // Fixed options of the group (set above for queues; at creation for
    // topic groups): the watchdog, a pause recorded by an earlier process.
    // (Parking space: reserved by the lane's owner on its first run with kp.)
    outages_.restore(g);
    if (g->options.attempt_timeout.count() > 0 &&
        std::find(watched_.begin(), watched_.end(), g) == watched_.end()) {
      watched_.push_back(g);
      if (!watchdog_.joinable()) {
        try {
          watchdog_ = std::thread([this] { watchdog_main(); });
        } catch (const std::exception& e) {
          return Status(Code::Internal, "bus \"" + options.name + "\": starting the watchdog: " + e.what());
        }
      }
    }
  }
  c->enabled.store(true, std::memory_order_seq_cst);
  if (g->consumer_count.fetch_add(1, std::memory_order_seq_cst) == 0) {
    for (auto& gl : g->lanes)
      if (gl->claim_ahead) gl->claim_ahead->open();
  }
  g->active.store(true, std::memory_order_seq_cst);
  // Lanes may hold messages that waited for a consumer (queues, durable logs,
  // a pending retry): let a worker look at each (an empty lane costs one
  // run-queue round trip). Lane state itself belongs to the worker running it.
  for (auto& gl : g->lanes) sched_.schedule(gl.get());
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
  GroupImpl* g = c->group;
  bool last = false;
  {
    MutexLock l(&mu_);
    Handler old = std::move(c->handler);
    TxHandler old_tx = std::move(c->tx_handler);
    c->handler = nullptr;
    c->tx_handler = nullptr;
    c->batch_handler = nullptr;
    c->in_use = false;
    last = g->consumer_count.fetch_sub(1, std::memory_order_seq_cst) == 1;
    if (last && !g->persistent) {
      // Last consumer of a topic group: it stops receiving; queued messages are
      // discarded by the workers (no consumer) and counted as dropped.
      g->active.store(false, std::memory_order_seq_cst);
      for (auto& gl : g->lanes) sched_.schedule(gl.get());
    }
  }
  if (last) return close_claims_ahead(g);
  return Status();
}

// A durable queue without consumers: its lanes' mailboxes close, and what the
// writer claimed for them goes back to the store at once (not after the
// claims' visibility). Outside mu_: it waits for a commit.
Status BusCore::close_claims_ahead(GroupImpl* g) noexcept {
  Status result;
  try {
    std::vector<ClaimedMessage> back;
    for (auto& gl : g->lanes) {
      if (!gl->claim_ahead) continue;
      back.clear();
      gl->claim_ahead->close(&back);
      if (back.empty()) continue;
      Status s = store_->give_back_claims(back, g->store_group, gl->lane);
      if (!s.ok() && result.ok()) result = s;
    }
  } catch (const std::exception& e) {
    result = Status(Code::Internal, std::string("giving back claims made ahead: ") + e.what());
  }
  return result;
}

// ---------------------------------------------------------------- reads over the registry

namespace {

// A handler call of the lane running past attempt_timeout now.
bool stuck_now(const GroupLane& gl) noexcept {
  const std::int64_t since = gl.running_since_ns.load(std::memory_order_acquire);
  const auto budget = gl.group->options.attempt_timeout;
  return since > kRunningUntimed && budget.count() > 0 &&
         RetryTimer::now_ns() - since > std::chrono::duration_cast<std::chrono::nanoseconds>(budget).count();
}

// A group lane's counters as the bus keeps them in memory (a durable lane's
// in_flight and skipped are then taken from the store: BusCore::stats).
LaneCounters live_counters(const GroupLane& gl) noexcept {
  LaneCounters lc;
  lc.delivered = gl.delivered.load(std::memory_order_relaxed);
  lc.acked = gl.acked.load(std::memory_order_relaxed);
  lc.retried = gl.retried.load(std::memory_order_relaxed);
  lc.rejected = gl.rejected.load(std::memory_order_relaxed);
  lc.failed = gl.failed.load(std::memory_order_relaxed);
  lc.timed_out = gl.timed_out.load(std::memory_order_relaxed);
  lc.stuck = gl.stuck.load(std::memory_order_relaxed);
  lc.stuck_now = stuck_now(gl) ? 1 : 0;
  lc.set_aside = gl.parked_count.load(std::memory_order_relaxed);
  lc.duplicates_skipped = gl.duplicates_skipped.load(std::memory_order_relaxed);
  lc.dropped = gl.dropped.load(std::memory_order_relaxed);
  lc.expired = gl.expired.load(std::memory_order_relaxed);
  lc.in_flight = gl.ring.size_approx();  // + the one being handled, not visible here
  lc.skipped = gl.skipped.load(std::memory_order_relaxed);
  return lc;
}

// A group's outage pause (GroupOptions::outage).
void outage_stats(const GroupImpl& g, GroupStats* gs) {
  OutageBreaker::Snapshot o = g.outage.snapshot();
  gs->paused = o.paused;
  gs->paused_since_ns = o.since_ns;
  gs->pause_reason = std::move(o.reason);
  gs->pause_last_error = std::move(o.last_error);
  gs->pauses = o.pauses;
  gs->probes = o.probes;
}

// The store's health and its writer's commits (BusStats::store).
void store_stats(const DurableStore& store, BusStats* out) {
  Status health = store.health();
  if (!health.ok()) out->store_error = health.to_string();
  if (store.options().read_only) return;
  const StoreCounters c = store.counters();
  out->store_available = true;
  out->store = StoreWriteStats{.commits = c.commits,
                               .operations = c.batched_ops,
                               .appends = c.appends,
                               .fsyncs = c.fsyncs,
                               .commit_ns = c.commit_ns,
                               .commit_write_ns = c.commit_call_ns,
                               .max_write_lock_wait_ns = c.max_write_lock_wait_ns};
}

}  // namespace

BusStats BusCore::stats() const {
  BusStats out;
  out.name = options.name;
  MutexLock l(&mu_);
  out.workers = static_cast<std::uint32_t>(sched_.running_workers());
  if (dlq_) {
    auto c = dlq_->counters();
    if (c.ok()) {
      out.dlq_available = true;
      out.dlq = *c;
    }
  }
  if (store_) store_stats(*store_, &out);
  if (tenancy_) {
    out.namespaces = tenancy_->list();
    // Stored bytes: the retained log bytes of the durable topics this bus opened.
    for (const auto& [name, t] : topics_) {
      if (!t->durable || !store_) continue;
      std::uint64_t bytes = 0;
      for (std::uint32_t i = 0; i < t->options.lanes; ++i)
        if (auto li = store_->lane_info(t->store_topic, i); li.ok()) bytes += li->bytes;
      const NamespaceState* ns = t->ns.load(std::memory_order_acquire);
      for (NamespaceInfo& n : out.namespaces)
        if (n.name == ns->name) n.usage.stored_bytes += bytes;
    }
  }
  for (const auto& [name, t] : topics_) {
    TopicStats ts;
    ts.name = name;
    ts.is_queue = t->is_queue;
    ts.durable = t->durable;
    ts.lanes = t->options.lanes;
    std::vector<LaneInfo> lane_infos;
    if (t->durable) {
      for (std::uint32_t i = 0; i < t->options.lanes; ++i) {
        auto li = store_->lane_info(t->store_topic, i);
        lane_infos.push_back(li.ok() ? *li : LaneInfo{});
      }
    }
    ts.unrouted = t->unrouted.load(std::memory_order_relaxed);
    ts.publish_refused = t->refused.load(std::memory_order_relaxed);
    ts.slots_in_use = t->durable ? 0 : static_cast<std::uint64_t>(std::max<std::int64_t>(t->pool.in_use(), 0));
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
        LaneCounters lc = live_counters(*gl);
        std::int64_t oldest = gl->oldest_ns.load(std::memory_order_relaxed);
        if (t->durable) {
          oldest = 0;
          if (gl->lane < persisted.size() && gl->lane < lane_infos.size()) {
            // The store's view, as `lanebus stats` reads it (read_group_lane).
            const GroupLaneInfo& pi = persisted[gl->lane];
            auto r = read_group_lane(*store_, t->store_topic, gl->lane, lane_infos[gl->lane], pi.committed);
            lc.in_flight = r.ok() ? r->lag : 0;
            oldest = r.ok() ? r->oldest_created_ns : 0;
            lc.skipped += pi.skipped;
            if (t->is_queue) {
              lc.claimed = pi.in_flight;
              lc.overdue = pi.overdue;
            }
          }
        }
        add_lane_counters(gs.total, lc);
        gs.lanes.push_back(lc);
        gl->latency.add_to(gs.latency);
        if (oldest != 0 && (gs.oldest_unprocessed_ns == 0 || oldest < gs.oldest_unprocessed_ns))
          gs.oldest_unprocessed_ns = oldest;
      }
      if (g->options.outage.enabled) outage_stats(*g, &gs);
      ts.groups.push_back(std::move(gs));
    }
    out.topics.push_back(std::move(ts));
  }
  // Bridges (lib/bridge/bridge.cpp) add theirs; they read the topic stats above for lag.
  {
    MutexLock bl(&bridges_mu_);
    for (const auto& [id, fn] : bridge_stats_) out.bridges.push_back(fn(out));
  }
  return out;
}

std::uint64_t BusCore::add_bridge_stats(std::function<BridgeStats(const BusStats&)> fn) {
  MutexLock l(&bridges_mu_);
  const std::uint64_t id = ++bridge_stats_next_;
  bridge_stats_.emplace(id, std::move(fn));
  return id;
}

void BusCore::remove_bridge_stats(std::uint64_t id) {
  MutexLock l(&bridges_mu_);
  bridge_stats_.erase(id);
}

void BusCore::for_each_usage_tap(const std::function<void(const TopicImpl&, const GroupImpl&, const UsageTap&)>& fn) {
  MutexLock l(&mu_);
  for (auto& [name, t] : topics_) {
    for (auto& g : t->owned_groups) {
      for (auto& gl : g->lanes) fn(*t, *g, gl->usage);
    }
  }
}

Result<std::string> BusCore::table_get(std::string_view table, std::string_view key) const {
  auto k = user_key_public(table, key);
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

// Shutdown: every in-memory topic's delayed slots not yet due are freed (delayed.cpp).
void BusCore::discard_delayed() noexcept {
  MutexLock l(&mu_);
  for (auto& [name, t] : topics_)
    if (!t->durable) t->timed.discard();
}

}  // namespace lanebus::detail
