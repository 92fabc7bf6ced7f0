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

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace lanebus::detail {

inline constexpr std::uint64_t kFnv1a64Offset = 14695981039346656037ull;
inline constexpr std::uint64_t kFnv1a64ShortOffset = 1469598103934665603ull;
inline constexpr std::uint64_t kFnv1a64Prime = 1099511628211ull;

/// One byte into the hash.
constexpr std::uint64_t fnv1a64_byte(std::uint64_t h, unsigned char c) noexcept { return (h ^ c) * kFnv1a64Prime; }

/// fnv1a64_byte with the prime passed in (fnv1a64 below). At run time on
/// x86-64 the xor goes into the hash's own register: GCC 12 otherwise xors
/// into the byte's register and copies it back before the multiply, a fourth
/// instruction per byte (doc/performance.md, fifteenth round).
constexpr std::uint64_t fnv_step(std::uint64_t h, unsigned char c, std::uint64_t prime) noexcept {
#if defined(__x86_64__) && defined(__GNUC__)
  if (!std::is_constant_evaluated()) {
    const std::uint64_t b = c;
    __asm__("xorq %1, %0\n\timulq %2, %0" : "+r"(h) : "r"(b), "r"(prime) : "cc");
    return h;
  }
#endif
  return (h ^ c) * prime;
}

/// The bytes of `s` into the hash `h` (by default from the published basis).
/// Byte by byte in order, as FNV-1a defines it; unrolled by eight, and the
/// last (up to seven) bytes through a switch, so a short key (the common
/// case) costs its load, xor and multiply per byte and no loop (three
/// instructions a byte instead of six: doc/performance.md, sixth round).
constexpr std::uint64_t fnv1a64(std::string_view s, std::uint64_t h = kFnv1a64Offset) noexcept {
  const char* p = s.data();
  std::size_t n = s.size();
  // The prime in a register (or a stack slot): without the empty asm GCC
  // rematerialises the 64-bit constant before every multiply of the tail.
  std::uint64_t prime = kFnv1a64Prime;
  if (!std::is_constant_evaluated()) __asm__("" : "+r"(prime));
  for (; n >= 8; p += 8, n -= 8) {
    h = fnv_step(h, static_cast<unsigned char>(p[0]), prime);
    h = fnv_step(h, static_cast<unsigned char>(p[1]), prime);
    h = fnv_step(h, static_cast<unsigned char>(p[2]), prime);
    h = fnv_step(h, static_cast<unsigned char>(p[3]), prime);
    h = fnv_step(h, static_cast<unsigned char>(p[4]), prime);
    h = fnv_step(h, static_cast<unsigned char>(p[5]), prime);
    h = fnv_step(h, static_cast<unsigned char>(p[6]), prime);
    h = fnv_step(h, static_cast<unsigned char>(p[7]), prime);
  }
  // The tail by its offsets from the end: each case one load, xor and multiply.
  const char* const e = p + n;
  switch (n) {
    case 7: h = fnv_step(h, static_cast<unsigned char>(e[-7]), prime); [[fallthrough]];
    case 6: h = fnv_step(h, static_cast<unsigned char>(e[-6]), prime); [[fallthrough]];
    case 5: h = fnv_step(h, static_cast<unsigned char>(e[-5]), prime); [[fallthrough]];
    case 4: h = fnv_step(h, static_cast<unsigned char>(e[-4]), prime); [[fallthrough]];
    case 3: h = fnv_step(h, static_cast<unsigned char>(e[-3]), prime); [[fallthrough]];
    case 2: h = fnv_step(h, static_cast<unsigned char>(e[-2]), prime); [[fallthrough]];
    case 1: h = fnv_step(h, static_cast<unsigned char>(e[-1]), prime); break;
    default: break;
  }
  return h;
}

namespace fnv_check {
// The unrolled loop against the definition, byte by byte: every length of
// the switch, one pass of the unrolled loop and a tail, and bytes >= 0x80.
constexpr std::uint64_t reference(std::string_view s, std::uint64_t h = kFnv1a64Offset) noexcept {
  for (unsigned char c : s) h = fnv1a64_byte(h, c);
  return h;
}
constexpr bool all_lengths() noexcept {
  constexpr char bytes[] = "key-15\x80\xff lanebus fnv-1a 0123456789";
  for (std::size_t n = 0; n + 1 < sizeof bytes; ++n) {
    const std::string_view s(bytes, n);
    if (fnv1a64(s) != reference(s) || fnv1a64(s, kFnv1a64ShortOffset) != reference(s, kFnv1a64ShortOffset))
      return false;
  }
  return true;
}
static_assert(all_lengths(), "fnv1a64: the unrolled form must equal FNV-1a byte by byte");
// Known answers (FNV's published test vectors).
static_assert(fnv1a64("") == 0xcbf29ce484222325ull);
static_assert(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
static_assert(fnv1a64("foobar") == 0x85944171f73967e8ull);
}  // namespace fnv_check

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
