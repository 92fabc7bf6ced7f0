// lanebus — MIT License.
// The durable store's value decoders (doc/storage-format.md), exposed for the
// verify walk (lib/ops/verify.cpp) and the fuzz targets (fuzz/). Each one takes
// untrusted bytes: it returns false / Corruption for anything lanebus did not
// write, and never reads outside the view it is given.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "durable_store.hpp"

namespace lanebus::detail {

/// A `log` value (message record). Corruption names topic, lane and offset
/// when the lengths do not add up or the CRC-32C fails.
Status decode_log_record(std::string_view value, std::string_view topic, std::uint32_t lane, std::uint64_t offset,
                         StoredMessage* out);
/// The records of the `log` value keyed by offset `first` of a lane: the value
/// itself, or the records of a record batch (format 16), offsets first, first
/// + 1, ... Corruption naming topic, lane and offset when a batch's records
/// do not fill it exactly. Each record is then for decode_log_record.
Status split_log_value(std::string_view value, std::string_view topic, std::uint32_t lane, std::uint64_t first,
                       std::vector<std::string_view>* records);
/// The bytes of a `log` value for `request` (header as given, index timestamp
/// `index_ts`): the inverse of decode_log_record (round-trip tests, seeds).
std::string encode_log_record(const AppendRequest& request, std::int64_t index_ts);

/// A `topics` value stored under key `name`. false when malformed.
bool decode_topic_record(std::string_view name, std::string_view value, TopicRef* out);

/// A `lanes` value (per-lane log bounds).
struct LaneRecord {
  std::uint64_t first = 0, next = 0, bytes = 0, count = 0;
  std::int64_t last_ts = 0;
};
/// false when malformed (size, first > next, count != next - first).
bool decode_lane_record(std::string_view value, LaneRecord* out);

/// A `groups` value: u32 format (1), u32 group id (non-zero), i64 created ns.
struct GroupRecord {
  std::uint32_t format = 0, group_id = 0;
  std::int64_t created_ns = 0;
};
bool decode_group_record(std::string_view value, GroupRecord* out);

/// A `cursors` value: u64 committed, u64 skipped-by-retention.
struct CursorRecord {
  std::uint64_t committed = 0, skipped = 0;
};
bool decode_cursor_record(std::string_view value, CursorRecord* out);

/// An `inflight` value: u32 attempt (>= 1), u32 state (0 claimed, 1 acked
/// out of order), i64 deadline ns, i64 first claim ns.
struct InflightRecord {
  std::uint32_t attempt = 0, state = 0;
  std::int64_t deadline_ns = 0, first_claim_ns = 0;
};
bool decode_inflight_record(std::string_view value, InflightRecord* out);

/// The layout record of `meta`: OK, Corruption (not lanebus's) or
/// VersionTooNew, as DurableStore::open judges it.
Status check_layout_record(std::string_view value);

}  // namespace lanebus::detail
