// lanebus — MIT License.
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial and final
// value 0xFFFFFFFF): the checksum of every durable record (its 4-byte
// little-endian trailer, doc/storage-format.md). The one copy; crc32c.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lanebus::detail {

/// CRC-32C of n bytes at data; crc32c("123456789", 9) == 0xE3069283.
std::uint32_t crc32c(const char* data, std::size_t n);

}  // namespace lanebus::detail
