// lanebus — MIT License.
// CRC-32C (Castagnoli), see crc32c.hpp: the SSE4.2 instruction where the CPU
// has it (about 20x faster than the table on replay), else a table.
#include "crc32c.hpp"

#include <cstring>

namespace lanebus::detail {

namespace {

struct Crc32cTable {
  std::uint32_t t[256];
  Crc32cTable() {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};
std::uint32_t crc32c_table(const char* data, std::size_t n) {
  static const Crc32cTable table;
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) c = table.t[(c ^ static_cast<unsigned char>(data[i])) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}
#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(const char* data, std::size_t n) {
  std::uint64_t c = 0xFFFFFFFFu;
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, data, 8);
    c = __builtin_ia32_crc32di(c, v);
    data += 8;
    n -= 8;
  }
  // The tail in at most three steps (4, 2, 1 bytes), not one per byte: each
  // step waits for the one before (3 cycles), and a log record's CRC ends
  // in a tail most of the time.
  auto c32 = static_cast<std::uint32_t>(c);
  if (n >= 4) {
    std::uint32_t v;
    std::memcpy(&v, data, 4);
    c32 = __builtin_ia32_crc32si(c32, v);
    data += 4;
    n -= 4;
  }
  if (n >= 2) {
    std::uint16_t v;
    std::memcpy(&v, data, 2);
    c32 = __builtin_ia32_crc32hi(c32, v);
    data += 2;
    n -= 2;
  }
  if (n > 0) c32 = __builtin_ia32_crc32qi(c32, static_cast<unsigned char>(*data));
  return c32 ^ 0xFFFFFFFFu;
}
#endif

}  // namespace

std::uint32_t crc32c(const char* data, std::size_t n) {
#if defined(__x86_64__)
  static const bool hw = __builtin_cpu_supports("sse4.2");
  if (hw) return crc32c_sse42(data, n);
#endif
  return crc32c_table(data, n);
}

}  // namespace lanebus::detail
