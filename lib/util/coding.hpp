// lanebus — MIT License.
// Fixed-width integer coding: the one copy (LevelDB keeps the same in
// util/coding.h). Little-endian for values, big-endian for keys, so that LMDB's
// byte order sorts keys by number. The results are on-disk formats (records,
// keys of every table, the fence and DLQ encodings): never change the byte
// order of a function.
//
//   put_le32(char* p, v)         writes 4 bytes at p
//   put_le32(std::string& s, v)  appends 4 bytes to s
//   get_le32(const char* p)      reads 4 bytes at p
// and the same for le16, le64, be32, be64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lanebus::detail {

// ---- little-endian

inline void put_le16(char* p, std::uint16_t v) noexcept {
  p[0] = static_cast<char>(v);
  p[1] = static_cast<char>(v >> 8);
}
inline void put_le32(char* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline void put_le64(char* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline std::uint16_t get_le16(const char* p) noexcept {
  return static_cast<std::uint16_t>(static_cast<unsigned char>(p[0]) | (static_cast<unsigned char>(p[1]) << 8));
}
inline std::uint32_t get_le32(const char* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
inline std::uint64_t get_le64(const char* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// ---- big-endian (keys)

inline void put_be16(char* p, std::uint16_t v) noexcept {
  p[0] = static_cast<char>(v >> 8);
  p[1] = static_cast<char>(v);
}
inline void put_be32(char* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (24 - 8 * i));
}
inline void put_be64(char* p, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (56 - 8 * i));
}
inline std::uint16_t get_be16(const char* p) noexcept {
  return static_cast<std::uint16_t>((static_cast<unsigned char>(p[0]) << 8) | static_cast<unsigned char>(p[1]));
}
inline std::uint32_t get_be32(const char* p) noexcept {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
inline std::uint64_t get_be64(const char* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// ---- appending to a string

template <std::size_t N, typename U>
inline void append_fixed(std::string& s, U v, void (*put)(char*, U) noexcept) {
  char b[N];
  put(b, v);
  s.append(b, N);
}
inline void put_le32(std::string& s, std::uint32_t v) { append_fixed<4>(s, v, put_le32); }
inline void put_le64(std::string& s, std::uint64_t v) { append_fixed<8>(s, v, put_le64); }
inline void put_be16(std::string& s, std::uint16_t v) { append_fixed<2>(s, v, put_be16); }
inline void put_be32(std::string& s, std::uint32_t v) { append_fixed<4>(s, v, put_be32); }
inline void put_be64(std::string& s, std::uint64_t v) { append_fixed<8>(s, v, put_be64); }

}  // namespace lanebus::detail
