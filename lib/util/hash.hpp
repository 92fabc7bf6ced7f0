// lanebus — MIT License.
// FNV-1a 64: the one copy. It picks a message's lane (lane_for_key), names
// fence and idempotency keys on disk, checks epoch files and names lease table
// entries in shared memory, so its results are part of on-disk and in-memory
// formats: never change the constants or the byte order of a caller's input.
//
// Two offset bases are in use, both kept for compatibility:
//   kFnv1a64Offset        14695981039346656037, FNV's published basis;
//   kFnv1a64ShortOffset   1469598103934665603, the basis with its last digit
//                         lost, which lease table segments and epoch files were
//                         written with (changing it would orphan existing
//                         segments and fail every epoch file's checksum).
#pragma once

#include <cstdint>
#include <string_view>

namespace lanebus::detail {

inline constexpr std::uint64_t kFnv1a64Offset = 14695981039346656037ull;
inline constexpr std::uint64_t kFnv1a64ShortOffset = 1469598103934665603ull;
inline constexpr std::uint64_t kFnv1a64Prime = 1099511628211ull;

/// One byte into the hash.
constexpr std::uint64_t fnv1a64_byte(std::uint64_t h, unsigned char c) noexcept { return (h ^ c) * kFnv1a64Prime; }

/// The bytes of `s` into the hash `h` (by default from the published basis).
constexpr std::uint64_t fnv1a64(std::string_view s, std::uint64_t h = kFnv1a64Offset) noexcept {
  for (unsigned char c : s) h = fnv1a64_byte(h, c);
  return h;
}

/// The lane of `key` among `lanes` (lanebus::lane_for_key, inline for the
/// publish path): FNV-1a 64 of the key, masked for a power-of-two count (the
/// default 8: no 64-bit division), else modulo. Part of the durable format.
inline std::uint32_t lane_index(std::string_view key, std::uint32_t lanes) noexcept {
  const std::uint64_t h = fnv1a64(key);
  if (lanes == 0) return 0;
  if ((lanes & (lanes - 1)) == 0) return static_cast<std::uint32_t>(h & (lanes - 1));
  return static_cast<std::uint32_t>(h % lanes);
}

}  // namespace lanebus::detail
