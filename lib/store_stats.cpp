// lanebus — MIT License.
// read_store_stats: a durable store's offsets and DLQ as BusStats.
#include "store_stats.hpp"

#include <algorithm>

#include "dlq.hpp"
#include "durable_store.hpp"

namespace lanebus::detail {

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
        // Retention may have deleted messages the group never read: they are
        // skipped, not waiting.
        const std::uint64_t from = std::max(gi.committed, lanes[lane].first_offset);
        c.in_flight = lanes[lane].end_offset > from ? lanes[lane].end_offset - from : 0;
        c.acked = gi.committed;
        c.skipped = gi.skipped;
        if (t.is_queue) {
          c.claimed = gi.in_flight;
          c.overdue = gi.overdue;
        }
        if (c.in_flight > 0) {
          ReadLimits one;
          one.max_messages = 1;
          auto m = store.read(t, lane, from, one);
          if (!m.ok()) return m.status();
          if (!m->messages.empty()) {
            const std::int64_t created = m->messages.front().header.created_at_ns;
            if (gs.oldest_unprocessed_ns == 0 || created < gs.oldest_unprocessed_ns) gs.oldest_unprocessed_ns = created;
          }
        }
        gs.total.in_flight += c.in_flight;
        gs.total.acked += c.acked;
        gs.total.skipped += c.skipped;
        gs.total.claimed += c.claimed;
        gs.total.overdue += c.overdue;
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
