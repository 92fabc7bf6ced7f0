// lanebus — MIT License.
// Bus::stats(): counter snapshots of every topic, group and lane.
#include <algorithm>
#include <bit>
#include <cassert>
#include <exception>
#include <string>

#include "bus_impl.hpp"
#include "store_stats.hpp"

namespace lanebus::detail {

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
  if (store_) {
    Status health = store_->health();
    if (!health.ok()) out.store_error = health.to_string();
  }
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

}  // namespace lanebus::detail
