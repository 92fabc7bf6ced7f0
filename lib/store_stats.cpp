// lanebus — MIT License.
// read_store_stats: a durable store's offsets and DLQ as BusStats.
#include "store_stats.hpp"

#include <algorithm>

#include "dlq.hpp"
#include "durable_store.hpp"

namespace lanebus::detail {

void add_lane_counters(LaneCounters& into, const LaneCounters& c) noexcept {
  into.delivered += c.delivered;
  into.acked += c.acked;
  into.retried += c.retried;
  into.rejected += c.rejected;
  into.failed += c.failed;
  into.timed_out += c.timed_out;
  into.stuck += c.stuck;
  into.stuck_now += c.stuck_now;
  into.set_aside += c.set_aside;
  into.duplicates_skipped += c.duplicates_skipped;
  into.dropped += c.dropped;
  into.in_flight += c.in_flight;
  into.skipped += c.skipped;
  into.claimed += c.claimed;
  into.overdue += c.overdue;
}

Result<GroupLaneReading> read_group_lane(DurableStore& store, const TopicRef& topic, std::uint32_t lane,
                                         const LaneInfo& info, std::uint64_t committed) {
  GroupLaneReading out;
  const std::uint64_t from = std::max(committed, info.first_offset);
  out.lag = info.end_offset > from ? info.end_offset - from : 0;
  if (out.lag > 0) {
    ReadLimits one;
    one.max_messages = 1;
    auto m = store.read(topic, lane, from, one);
    if (!m.ok()) return m.status();
    if (!m->messages.empty()) out.oldest_created_ns = m->messages.front().header.created_at_ns;
  }
  return out;
}

Result<BusStats> read_store_stats(DurableStore& store) {
  BusStats out;
  out.name = store.options().directory;
  Status health = store.health();
  if (!health.ok()) out.store_error = health.to_string();
  auto topics = store.list_topics();
  if (!topics.ok()) return topics.status();
  for (const TopicRef& t : *topics) {
    TopicStats ts;
    ts.name = t.name;
    ts.is_queue = t.is_queue;
    ts.durable = true;
    ts.lanes = t.lanes;
    std::vector<LaneInfo> lanes;
    for (std::uint32_t lane = 0; lane < t.lanes; ++lane) {
      auto li = store.lane_info(t, lane);
      if (!li.ok()) return li.status();
      lanes.push_back(*li);
      ts.lane_published.push_back(li->end_offset);
      ts.published += li->end_offset;
    }
    auto groups = store.list_groups(t);
    if (!groups.ok()) return groups.status();
    for (const GroupRef& g : *groups) {
      auto info = store.group_info(g);
      if (!info.ok()) return info.status();
      GroupStats gs;
      gs.name = g.name;
      for (std::uint32_t lane = 0; lane < t.lanes && lane < info->size(); ++lane) {
        const GroupLaneInfo& gi = (*info)[lane];
        LaneCounters c;
        auto r = read_group_lane(store, t, lane, lanes[lane], gi.committed);
        if (!r.ok()) return r.status();
        c.in_flight = r->lag;
        c.acked = gi.committed;
        c.skipped = gi.skipped;
        if (t.is_queue) {
          c.claimed = gi.in_flight;
          c.overdue = gi.overdue;
        }
        const std::int64_t created = r->oldest_created_ns;
        if (created != 0 && (gs.oldest_unprocessed_ns == 0 || created < gs.oldest_unprocessed_ns))
          gs.oldest_unprocessed_ns = created;
        add_lane_counters(gs.total, c);
        gs.lanes.push_back(c);
      }
      ts.groups.push_back(std::move(gs));
    }
    out.topics.push_back(std::move(ts));
  }
  DlqStore dlq(store);
  auto counters = dlq.counters();
  if (counters.ok()) {
    out.dlq_available = true;
    out.dlq = *counters;
  }
  return out;
}

}  // namespace lanebus::detail
