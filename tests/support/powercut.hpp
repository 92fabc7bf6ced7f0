// lanebus — MIT License.
// What the power-cut test and its child processes agree on: the payload of
// message (tag, seq) and its checksum, and the clock both read.
#pragma once

#include <time.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace lanebus::test::powercut {

/// CRC-32 (IEEE, bitwise): independent of the library's own record CRC.
inline std::uint32_t crc32(std::string_view s) {
  std::uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

/// "TAG:SEQ:" and 16..400 bytes of filler derived from both (so payloads
/// span pages and differ in length).
inline std::string payload(std::string_view tag, std::uint64_t seq) {
  std::string p(tag);
  p += ':';
  p += std::to_string(seq);
  p += ':';
  std::uint64_t x = (std::hash<std::string_view>{}(tag) ^ (seq * 0x9e3779b97f4a7c15ull)) | 1;
  const std::size_t n = 16 + x % 385;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p += static_cast<char>('a' + x % 26);
  }
  return p;
}

/// (tag, seq) from a payload; false when it is not one of ours.
inline bool parse(std::string_view p, std::string* tag, std::uint64_t* seq) {
  auto a = p.find(':');
  if (a == std::string_view::npos) return false;
  auto b = p.find(':', a + 1);
  if (b == std::string_view::npos) return false;
  *tag = std::string(p.substr(0, a));
  *seq = std::stoull(std::string(p.substr(a + 1, b - a - 1)));
  return true;
}

/// CLOCK_MONOTONIC in ms: the parent and its children share it.
inline std::int64_t now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace lanebus::test::powercut
