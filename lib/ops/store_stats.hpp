// lanebus — MIT License.
// read_store_stats: the counters a durable store knows (offsets, lag, oldest
// unprocessed message, DLQ) as a BusStats, so a MetricsWindow can judge a store
// that another process writes (`lanebus serve`).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lanebus/stats.hpp"
#include "lanebus/status.hpp"

namespace lanebus::detail {

class DurableStore;
struct LaneInfo;
struct TopicRef;

/// A group's totals: the sum of its lanes' counters, field by field.
void add_lane_counters(LaneCounters& into, const LaneCounters& c) noexcept;

/// What the metrics know of one durable group lane, from the store.
struct GroupLaneReading {
  /// Retained messages at or after the committed offset (what retention
  /// deleted before the group read it is skipped, not waiting).
  std::uint64_t lag = 0;
  /// created_at of the oldest of them; 0 when none waits (or it is unknown).
  std::int64_t oldest_created_ns = 0;
};

/// The one derivation of a durable group lane's lag and oldest unprocessed
/// message, used by read_store_stats and by Bus::stats (so a Monitor in the
/// process and `lanebus stats` on the store agree). `lane` is read as `info`
/// (lane_info); `committed` is the group's committed offset in it. Errors:
/// storage codes of the read of the oldest message.
Result<GroupLaneReading> read_group_lane(DurableStore& store, const TopicRef& topic, std::uint32_t lane,
                                         const LaneInfo& info, std::uint64_t committed);

/// One reading of `store` (read transactions only; safe on a read-only open
/// while other processes write). Per topic: lane_published[i] = the lane's end
/// offset, published = their sum, durable = true. Per group and lane:
/// in_flight = lag (read_group_lane),
/// acked = committed offset (so the consume rate is the committed offset's
/// progress), skipped = lost to retention, and for queues claimed / overdue
/// (claims not yet acked / past their deadline); oldest_unprocessed_ns =
/// the oldest over the lanes (read_group_lane). What only the consuming process
/// knows (handler outcomes, latency, stuck calls) stays 0. The DLQ counters are
/// read from the store's DLQ. store_error is set when the store is unusable.
/// Errors: storage codes of the reads.
/// (Also fills BusStats::bridges from the bridges' status records, below.)
Result<BusStats> read_store_stats(DurableStore& store);

// ---- bridge status records (doc/storage-format.md, `user` db, key
// "bridge\0status/<bridge name>"): a Bridge writes its state and counters
// there every BridgeOptions::status_interval and at each state change, so
// another process can show them.

/// The record's value. `written_ns` = now, wall clock.
std::string encode_bridge_status(const BridgeStats& s, std::uint32_t pid, std::int64_t interval_ms,
                                 std::int64_t written_ns, bool stopped);
/// Decode a record (sets the status_* fields, stopped; stale from now_ns).
/// Errors: Corruption naming the cause.
Result<BridgeStats> decode_bridge_status(std::string_view value, std::int64_t now_ns);
/// The user-table key of a bridge's record.
std::string bridge_status_key(std::string_view bridge_name);
/// Every bridge status record in the store, by name. Errors: storage codes.
Result<std::vector<BridgeStats>> read_bridge_status(DurableStore& store, std::int64_t now_ns);
/// Text lines for `lanebus stats` ("" when there is no record).
std::string bridge_status_text(const std::vector<BridgeStats>& bridges, std::int64_t now_ns);
/// The "bridges" JSON array (also the JSON export's, metrics.cpp); the status_*
/// fields appear only for records read from the store.
std::string bridges_json(const std::vector<BridgeStats>& bridges, std::int64_t now_ns);

}  // namespace lanebus::detail
