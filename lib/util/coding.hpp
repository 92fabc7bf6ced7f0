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
// and the same for le16, le64, be32, be64. ByteWriter and ByteReader build
// and parse records of little-endian fields and length-prefixed strings (the
// DLQ's entries and audit, the schema registry's records, the bridge status
// record); the reader never reads past its input.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace lanebus::detail {

// Each value is read and written as one unaligned word (memcpy) and its bytes
// swapped where the machine's order is not the format's. GCC 12 compiled the
// byte-at-a-time loops these replace into one load, shift and or per byte
// (decode_record alone held 53 byte loads: doc/performance.md, "Fixed-width
// coding"). util_test checks both orders against the byte-by-byte definition
// at every alignment.
namespace coding {
template <typename U>
constexpr U byte_swap(U v) noexcept {
  if constexpr (sizeof(U) == 2) {
    return static_cast<U>(__builtin_bswap16(v));
  } else if constexpr (sizeof(U) == 4) {
    return static_cast<U>(__builtin_bswap32(v));
  } else {
    static_assert(sizeof(U) == 8);
    return static_cast<U>(__builtin_bswap64(v));
  }
}
/// `v` in byte order `Order` (its own inverse): unchanged where the machine
/// uses that order, else with its bytes swapped.
template <std::endian Order, typename U>
constexpr U in_order(U v) noexcept {
  if constexpr (std::endian::native == Order) {
    return v;
  } else {
    return byte_swap(v);
  }
}
template <typename U>
constexpr U little(U v) noexcept {
  return in_order<std::endian::little>(v);
}
template <typename U>
constexpr U big(U v) noexcept {
  return in_order<std::endian::big>(v);
}
template <typename U>
inline U load(const char* p) noexcept {
  U v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename U>
inline void store(char* p, U v) noexcept {
  std::memcpy(p, &v, sizeof v);
}
}  // namespace coding

// ---- little-endian

inline void put_le16(char* p, std::uint16_t v) noexcept { coding::store(p, coding::little(v)); }
inline void put_le32(char* p, std::uint32_t v) noexcept { coding::store(p, coding::little(v)); }
inline void put_le64(char* p, std::uint64_t v) noexcept { coding::store(p, coding::little(v)); }
inline std::uint16_t get_le16(const char* p) noexcept { return coding::little(coding::load<std::uint16_t>(p)); }
inline std::uint32_t get_le32(const char* p) noexcept { return coding::little(coding::load<std::uint32_t>(p)); }
inline std::uint64_t get_le64(const char* p) noexcept { return coding::little(coding::load<std::uint64_t>(p)); }

// ---- big-endian (keys)

inline void put_be16(char* p, std::uint16_t v) noexcept { coding::store(p, coding::big(v)); }
inline void put_be32(char* p, std::uint32_t v) noexcept { coding::store(p, coding::big(v)); }
inline void put_be64(char* p, std::uint64_t v) noexcept { coding::store(p, coding::big(v)); }
inline std::uint16_t get_be16(const char* p) noexcept { return coding::big(coding::load<std::uint16_t>(p)); }
inline std::uint32_t get_be32(const char* p) noexcept { return coding::big(coding::load<std::uint32_t>(p)); }
inline std::uint64_t get_be64(const char* p) noexcept { return coding::big(coding::load<std::uint64_t>(p)); }

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

/// The first min(8, s.size()) bytes of `s` as a little-endian number (missing
/// high bytes read as 0): for values that may have been stored shorter.
inline std::uint64_t get_le64_prefix(std::string_view s) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8 && i < s.size(); ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[i])) << (8 * i);
  return v;
}

// ---- records: little-endian fields and length-prefixed strings

/// Appends fields to a string: integers little-endian, strings after a u32
/// (str32) or u16 (str16) byte count. REQUIRES: str16's string is at most
/// 65535 bytes, str32's at most 2^32 - 1.
/// Thread safety: one thread at a time.
class ByteWriter {
 public:
  void u8(std::uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u16(std::uint16_t v) { append_fixed<2>(out_, v, put_le16); }
  void u32(std::uint32_t v) { put_le32(out_, v); }
  void u64(std::uint64_t v) { put_le64(out_, v); }
  void i64(std::int64_t v) { put_le64(out_, static_cast<std::uint64_t>(v)); }
  void str32(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    out_.append(s);
  }
  void str16(std::string_view s) {
    u16(static_cast<std::uint16_t>(s.size()));
    out_.append(s);
  }
  void reserve(std::size_t n) { out_.reserve(n); }
  const std::string& bytes() const noexcept { return out_; }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

/// Reads what ByteWriter wrote, bounds-checked: a read that would go past
/// the end returns 0 (or "") and turns ok() false for good, so a caller may
/// read a whole record and check ok() once (and done() for trailing bytes).
/// The view must outlive the reader. Thread safety: one thread at a time.
class ByteReader {
 public:
  explicit ByteReader(std::string_view in) noexcept : in_(in) {}
  bool ok() const noexcept { return ok_; }
  /// ok() and every byte read.
  bool done() const noexcept { return ok_ && pos_ == in_.size(); }
  std::uint8_t u8() noexcept { return take(1) ? static_cast<std::uint8_t>(in_[pos_ - 1]) : 0; }
  std::uint16_t u16() noexcept { return take(2) ? get_le16(in_.data() + pos_ - 2) : 0; }
  std::uint32_t u32() noexcept { return take(4) ? get_le32(in_.data() + pos_ - 4) : 0; }
  std::uint64_t u64() noexcept { return take(8) ? get_le64(in_.data() + pos_ - 8) : 0; }
  std::int64_t i64() noexcept { return static_cast<std::int64_t>(u64()); }
  std::string str32() { return bytes(u32()); }
  std::string str16() { return bytes(u16()); }

 private:
  bool take(std::size_t n) noexcept {
    if (!ok_ || in_.size() - pos_ < n) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }
  std::string bytes(std::size_t n) {
    if (!take(n)) return {};
    return std::string(in_.substr(pos_ - n, n));
  }
  std::string_view in_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace lanebus::detail
