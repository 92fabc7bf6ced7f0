// lanebus — MIT License.
// lib/util's one copy of each helper (hash.hpp, crc32c.hpp, coding.hpp,
// quote.hpp): their results are on-disk and shared-memory formats, so they are
// pinned here to values computed outside lanebus (FNV's and CRC-32C's
// published check values, and a Python reimplementation for the rest).
#include <doctest/doctest.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "coding.hpp"
#include "crc32c.hpp"
#include "errno_status.hpp"
#include "hash.hpp"
#include "lanebus/message.hpp"
#include "lease_table.hpp"
#include "quote.hpp"

using namespace lanebus;
using namespace lanebus::detail;

TEST_CASE("FNV-1a 64: published test vectors, both offset bases, lane_for_key") {
  CHECK(fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  CHECK(fnv1a64("foobar") == 0x85944171f73967e8ull);
  // The basis lease table segments were written with (never 0: lease_table.hpp).
  CHECK(fnv1a64("lease.alpha", kFnv1a64ShortOffset) == 0xa3fa8d206d619b8dull);
  CHECK(lease_name_hash("lease.alpha") == 0xa3fa8d206d619b8dull);
  // Durable lanes persist the key -> lane mapping: power-of-two mask and modulo.
  CHECK(lane_for_key("order-17", 8) == 6);
  CHECK(lane_for_key("k", 3) == 2);
  CHECK(lane_for_key("", 5) == 2);
  CHECK(lane_for_key("user-42", 12) == 3);
  CHECK(lane_for_key("anything", 0) == 0);
}

TEST_CASE("FNV-1a 64 at run time: every length of the unrolled loop and the tail, both bases, bytes >= 0x80") {
  // The static_asserts of hash.hpp check the constant-evaluated form; the
  // run-time form (an asm step on x86-64) is checked here, on bytes that
  // come from a std::string so nothing is folded at compile time.
  std::string bytes;
  for (int i = 0; i < 40; ++i) bytes.push_back(static_cast<char>(0x61 + i * 37));
  for (std::size_t n = 0; n <= bytes.size(); ++n) {
    const std::string_view s(bytes.data(), n);
    CHECK(fnv1a64(s) == fnv_check::reference(s));
    CHECK(fnv1a64(s, kFnv1a64ShortOffset) == fnv_check::reference(s, kFnv1a64ShortOffset));
    CHECK(lane_index(s, 8) == static_cast<std::uint32_t>(fnv_check::reference(s) & 7));
  }
}

TEST_CASE("CRC-32C: the check value, the empty input, and a length past the 8-byte steps") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
  char bytes[40];
  for (int i = 0; i < 40; ++i) bytes[i] = static_cast<char>(i);
  CHECK(crc32c(bytes, sizeof bytes) == 0x134ef083u);
}

TEST_CASE("CRC-32C: every length and alignment agrees with the bitwise definition (the 8-byte steps and each tail)") {
  auto bitwise = [](const char* p, std::size_t n) {
    std::uint32_t c = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < n; ++i) {
      c ^= static_cast<unsigned char>(p[i]);
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return c ^ 0xFFFFFFFFu;
  };
  char bytes[96];
  for (int i = 0; i < 96; ++i) bytes[i] = static_cast<char>(i * 37 + 11);
  for (std::size_t start = 0; start < 8; ++start) {
    for (std::size_t n = 0; n + start <= sizeof bytes; ++n) {
      INFO("start " << start << " length " << n);
      CHECK(crc32c(bytes + start, n) == bitwise(bytes + start, n));
    }
  }
}

TEST_CASE("fixed-width coding: byte order on the wire and round trips") {
  char b[8];
  put_le32(b, 0x01020304u);
  CHECK(std::memcmp(b, "\x04\x03\x02\x01", 4) == 0);
  CHECK(get_le32(b) == 0x01020304u);
  put_be32(b, 0x01020304u);
  CHECK(std::memcmp(b, "\x01\x02\x03\x04", 4) == 0);
  CHECK(get_be32(b) == 0x01020304u);
  put_le16(b, 0xA1B2);
  CHECK(std::memcmp(b, "\xB2\xA1", 2) == 0);
  CHECK(get_le16(b) == 0xA1B2);
  put_be16(b, 0xA1B2);
  CHECK(std::memcmp(b, "\xA1\xB2", 2) == 0);
  CHECK(get_be16(b) == 0xA1B2);
  const std::uint64_t v = 0x0102030405060708ull;
  put_le64(b, v);
  CHECK(std::memcmp(b, "\x08\x07\x06\x05\x04\x03\x02\x01", 8) == 0);
  CHECK(get_le64(b) == v);
  put_be64(b, v);
  CHECK(std::memcmp(b, "\x01\x02\x03\x04\x05\x06\x07\x08", 8) == 0);
  CHECK(get_be64(b) == v);
  // Big-endian keys sort as their numbers; appending writes the same bytes.
  std::string lo, hi;
  put_be64(lo, 255);
  put_be64(hi, 256);
  CHECK(lo < hi);
  std::string s = "x";
  put_be32(s, 0x01020304u);
  put_le64(s, v);
  CHECK(s == std::string("x\x01\x02\x03\x04\x08\x07\x06\x05\x04\x03\x02\x01", 13));
}

TEST_CASE("fixed-width coding: whole-word loads and stores agree with the byte-by-byte definition at every alignment") {
  // The definition, one byte at a time: byte i of a little-endian value is
  // bits 8i..8i+7; a big-endian one is the reverse.
  auto le_bytes = [](std::uint64_t v, int n, char* out) {
    for (int i = 0; i < n; ++i) out[i] = static_cast<char>(v >> (8 * i));
  };
  auto be_bytes = [](std::uint64_t v, int n, char* out) {
    for (int i = 0; i < n; ++i) out[i] = static_cast<char>(v >> (8 * (n - 1 - i)));
  };
  const std::uint64_t values[] = {0, 1, 0x80, 0xFF, 0x0100, 0x8000'0000ull, 0xFFFF'FFFFull, 0x0123'4567'89AB'CDEFull,
                                  0xFEDC'BA98'7654'3210ull, ~0ull};
  alignas(16) char buf[32];
  char want[8];
  for (std::uint64_t v : values) {
    for (int at = 0; at < 8; ++at) {
      char* p = buf + at;  // every alignment: the words are read and written unaligned
      CAPTURE(v);
      CAPTURE(at);
      put_le16(p, static_cast<std::uint16_t>(v));
      le_bytes(v, 2, want);
      CHECK(std::memcmp(p, want, 2) == 0);
      CHECK(get_le16(p) == static_cast<std::uint16_t>(v));
      put_le32(p, static_cast<std::uint32_t>(v));
      le_bytes(v, 4, want);
      CHECK(std::memcmp(p, want, 4) == 0);
      CHECK(get_le32(p) == static_cast<std::uint32_t>(v));
      put_le64(p, v);
      le_bytes(v, 8, want);
      CHECK(std::memcmp(p, want, 8) == 0);
      CHECK(get_le64(p) == v);
      put_be16(p, static_cast<std::uint16_t>(v));
      be_bytes(v & 0xFFFF, 2, want);
      CHECK(std::memcmp(p, want, 2) == 0);
      CHECK(get_be16(p) == static_cast<std::uint16_t>(v));
      put_be32(p, static_cast<std::uint32_t>(v));
      be_bytes(v & 0xFFFF'FFFFull, 4, want);
      CHECK(std::memcmp(p, want, 4) == 0);
      CHECK(get_be32(p) == static_cast<std::uint32_t>(v));
      put_be64(p, v);
      be_bytes(v, 8, want);
      CHECK(std::memcmp(p, want, 8) == 0);
      CHECK(get_be64(p) == v);
      // Reading what the byte-by-byte definition wrote.
      le_bytes(v, 8, p);
      CHECK(get_le64(p) == v);
      be_bytes(v, 8, p);
      CHECK(get_be64(p) == v);
    }
  }
}

TEST_CASE("ByteWriter and ByteReader: the bytes of a record, round trips, reads past the end") {
  ByteWriter w;
  w.u8(0x7F);
  w.u16(0xA1B2);
  w.u32(0x01020304u);
  w.u64(0x0102030405060708ull);
  w.i64(-2);
  w.str32("ab");
  w.str16("xyz");
  const std::string bytes = w.take();
  // Every field little-endian; str32 after a u32 count, str16 after a u16 one
  // (the DLQ, schema registry and bridge status records depend on these bytes).
  const std::string want("\x7F"
                         "\xB2\xA1"
                         "\x04\x03\x02\x01"
                         "\x08\x07\x06\x05\x04\x03\x02\x01"
                         "\xFE\xFF\xFF\xFF\xFF\xFF\xFF\xFF"
                         "\x02\x00\x00\x00"
                         "ab"
                         "\x03\x00"
                         "xyz",
                         1 + 2 + 4 + 8 + 8 + 4 + 2 + 2 + 3);
  CHECK(bytes == want);

  ByteReader r(bytes);
  CHECK(r.u8() == 0x7F);
  CHECK(r.u16() == 0xA1B2);
  CHECK(r.u32() == 0x01020304u);
  CHECK(r.u64() == 0x0102030405060708ull);
  CHECK(r.i64() == -2);
  CHECK(r.str32() == "ab");
  CHECK(r.str16() == "xyz");
  CHECK(r.ok());
  CHECK(r.done());

  // Trailing bytes: ok but not done.
  const std::string with_tail = bytes + "!";  // a reader views its bytes: they must outlive it
  ByteReader more(with_tail);
  (void)more.u8();
  CHECK(more.ok());
  CHECK_FALSE(more.done());

  // A read past the end returns 0 or "" and the reader stays failed, even for
  // a later read that would fit.
  ByteReader short_read(std::string_view("\x01\x02\x03", 3));
  CHECK(short_read.u32() == 0);
  CHECK_FALSE(short_read.ok());
  CHECK(short_read.u8() == 0);
  CHECK_FALSE(short_read.ok());
  CHECK_FALSE(short_read.done());
  // A string whose count runs past the end.
  ByteReader long_count(std::string_view("\x09\x00\x00\x00" "abc", 7));
  CHECK(long_count.str32().empty());
  CHECK_FALSE(long_count.ok());
  ByteReader empty(std::string_view{});
  CHECK(empty.done());
  CHECK(empty.str16().empty());
  CHECK_FALSE(empty.ok());

  // get_le64_prefix: up to 8 bytes, missing high bytes read as 0.
  CHECK(get_le64_prefix(std::string_view("\x08\x07\x06\x05\x04\x03\x02\x01\xFF", 9)) == 0x0102030405060708ull);
  CHECK(get_le64_prefix(std::string_view("\x01\x02", 2)) == 0x0201u);
  CHECK(get_le64_prefix(std::string_view{}) == 0);
}

TEST_CASE("quoted: double quotes around the bytes, nothing escaped") {
  CHECK(quoted("orders") == "\"orders\"");
  CHECK(quoted("") == "\"\"");
  CHECK(quoted("a\"b") == "\"a\"b\"");
}

TEST_CASE("errno_status: the code each errno names, the call and the quoted path in the message") {
  const Status denied = errno_status("open", "/var/lib/x", EACCES);
  CHECK(denied.code() == Code::PermissionDenied);
  CHECK(std::string(denied.message()) == std::string("open \"/var/lib/x\": ") + std::strerror(EACCES));
  CHECK(errno_status("open", "p", EPERM).code() == Code::PermissionDenied);
  const Status link = errno_status("open", "/run/lease", ELOOP);
  CHECK(link.code() == Code::PermissionDenied);
  CHECK(std::string(link.message()).find("(the path is a symlink; refusing it)") != std::string::npos);
  CHECK(errno_status("pwrite", "p", ENOSPC).code() == Code::DiskFull);
  CHECK(errno_status("pwrite", "p", EDQUOT).code() == Code::DiskFull);
  const Status io = errno_status("fsync", "p", EIO);
  CHECK(io.code() == Code::IOError);
  CHECK(std::string(io.message()).rfind("fsync \"p\": ", 0) == 0);
}
