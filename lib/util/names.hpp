// lanebus — MIT License.
// The naming rule (doc/topics.md): dotted paths of [a-z0-9_-] segments, at most 200 bytes.
#pragma once

#include <string_view>

#include "lanebus/status.hpp"

namespace lanebus::detail {

inline constexpr std::size_t kMaxNameBytes = 200;

/// OK, or InvalidName with a message saying what is wrong with `name`.
/// `what` names the thing in the message ("topic", "group", ...).
Status check_name(std::string_view name, std::string_view what);

}  // namespace lanebus::detail
