// lanebus — MIT License.
// Key → lane mapping (64-bit FNV-1a): stable across processes and releases,
// because durable lanes persist it.
#include "lanebus/message.hpp"

#include "hash.hpp"

namespace lanebus {

std::uint32_t lane_for_key(std::string_view key, std::uint32_t lanes) noexcept {
  const std::uint64_t h = detail::fnv1a64(key);  // inline: this runs on every publish
  if (lanes == 0) return 0;
  // A power-of-two lane count (the default 8) takes a mask: the same result
  // as the modulo without a 64-bit division on every publish.
  if ((lanes & (lanes - 1)) == 0) return static_cast<std::uint32_t>(h & (lanes - 1));
  return static_cast<std::uint32_t>(h % lanes);
}

}  // namespace lanebus
