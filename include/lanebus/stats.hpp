// lanebus — MIT License.
// Counter snapshots, read from relaxed atomics without stopping the bus.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lanebus {

/// Counters of one consumer group in one lane (or summed over lanes).
/// Each value is read with a relaxed load: a snapshot taken while the bus runs
/// is approximate across counters but every counter only ever grows (except
/// in_flight, a gauge).
struct LaneCounters {
  std::uint64_t delivered = 0;  ///< Handler calls (every attempt counts).
  std::uint64_t acked = 0;      ///< Messages the handler acked.
  std::uint64_t retried = 0;    ///< retry outcomes and caught handler exceptions.
  std::uint64_t rejected = 0;   ///< reject outcomes.
  std::uint64_t failed = 0;     ///< Messages that used up max_attempts.
  std::uint64_t dropped = 0;    ///< Discarded by DropOldest backpressure, or with no consumer.
  std::uint64_t skipped = 0;    ///< Durable: messages deleted by retention before the group read them.
  std::uint64_t in_flight = 0;  ///< Gauge: queued for the group in this lane (ephemeral), or
                                ///< stored and not yet consumed (durable: lag in messages).
};

struct GroupStats {
  std::string name;
  std::uint32_t consumers = 0;      ///< Subscriptions currently attached.
  LaneCounters total;               ///< Sum over lanes.
  std::vector<LaneCounters> lanes;  ///< Indexed by lane.
};

struct TopicStats {
  std::string name;
  bool is_queue = false;
  bool durable = false;
  std::uint32_t lanes = 0;
  std::uint64_t published = 0;                ///< Messages accepted by publish.
  std::uint64_t unrouted = 0;                 ///< Accepted while the topic had no group.
  std::uint64_t publish_refused = 0;          ///< WouldBlock / TimedOut results.
  std::vector<std::uint64_t> lane_published;  ///< Per-lane load: a hot key shows as one big lane.
  std::vector<GroupStats> groups;
};

struct BusStats {
  std::string name;
  std::uint32_t workers = 0;
  std::vector<TopicStats> topics;
};

}  // namespace lanebus
