// lanebus — MIT License.
// Key → lane mapping (64-bit FNV-1a): stable across processes and releases,
// because durable lanes persist it.
#include "lanebus/message.hpp"

#include "hash.hpp"

namespace lanebus {

std::uint32_t lane_for_key(std::string_view key, std::uint32_t lanes) noexcept {
  return detail::lane_index(key, lanes);
}

}  // namespace lanebus
