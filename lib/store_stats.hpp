// lanebus — MIT License.
// read_store_stats: the counters a durable store knows (offsets, lag, oldest
// unprocessed message, DLQ) as a BusStats, so a MetricsWindow can judge a store
// that another process writes (`lanebus serve`).
#pragma once

#include "lanebus/stats.hpp"
#include "lanebus/status.hpp"

namespace lanebus::detail {

class DurableStore;

/// One reading of `store` (read transactions only; safe on a read-only open
/// while other processes write). Per topic: lane_published[i] = the lane's end
/// offset, published = their sum, durable = true. Per group and lane:
/// in_flight = lag (end offset minus max(committed, first retained offset)),
/// acked = committed offset (so the consume rate is the committed offset's
/// progress), skipped = lost to retention, and for queues claimed / overdue
/// (claims not yet acked / past their deadline); oldest_unprocessed_ns =
/// created_at of the oldest message at a committed offset. What only the consuming process
/// knows (handler outcomes, latency, stuck calls) stays 0. The DLQ counters are
/// read from the store's DLQ. store_error is set when the store is unusable.
/// Errors: storage codes of the reads.
Result<BusStats> read_store_stats(DurableStore& store);

}  // namespace lanebus::detail
