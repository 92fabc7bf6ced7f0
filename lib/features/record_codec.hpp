// lanebus — MIT License.
// Byte helpers of the record encoding (doc/schemas.md) and the schema field
// lookups RecordView and the registry share. Internal.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "coding.hpp"
#include "lanebus/record.hpp"
#include "lanebus/schema.hpp"

namespace lanebus::detail {

using FieldList = std::vector<FieldDef>;

inline std::uint64_t zigzag(std::int64_t v) noexcept {
  return (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63);
}
inline std::int64_t unzigzag(std::uint64_t v) noexcept {
  return static_cast<std::int64_t>(v >> 1) ^ -static_cast<std::int64_t>(v & 1);
}

/// LEB128; false when truncated or longer than 64 bits.
bool get_varint(std::string_view in, std::size_t* pos, std::uint64_t* out) noexcept;
/// Magic, tags, lengths, bools, varints and nesting of an untrusted record;
/// *why names the first problem (a string literal).
bool check_record(std::string_view bytes, const char** why) noexcept;

/// One value of type `t` at in[*pos] of an untrusted record, bounds-checked:
/// its extent (a record: its body; a list: element tag, u32 length, u32
/// count, elements), or false with *why naming the problem. Nested content is
/// not checked.
bool value_extent(std::string_view in, std::size_t* pos, FieldType t, std::string_view* value,
                  const char** why) noexcept;

/// One value of type `t` at body[*pos] of a checked record: its bytes (a
/// record: its body; a list: element tag, u32 length, u32 count, elements).
bool value_at(std::string_view body, std::size_t* pos, FieldType t, std::string_view* v) noexcept;

/// Fields are kept sorted by id.
inline const FieldDef* find_field(const FieldList& fields, std::uint32_t id) noexcept {
  // Ids are usually 1..n: then field id sits at index id - 1.
  if (id - 1 < fields.size() && fields[id - 1].id == id) return &fields[id - 1];
  std::size_t lo = 0, hi = fields.size();
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (fields[mid].id == id) return &fields[mid];
    if (fields[mid].id < id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return nullptr;
}
inline const FieldDef* find_field(const FieldList& fields, std::string_view name) noexcept {
  const std::size_t n = name.size();
  for (const FieldDef& f : fields) {
    // Size and first byte first: most names differ there, without a memcmp call.
    if (f.name.size() != n || (n != 0 && f.name[0] != name[0])) continue;
    if (std::char_traits<char>::compare(f.name.data(), name.data(), n) == 0) return &f;
  }
  return nullptr;
}

/// A value written as `have` can be read as `want`: the same type or one of
/// the widenings int64 -> double, uint64 -> double, string <-> bytes.
inline bool readable_as(FieldType have, FieldType want) noexcept {
  if (have == want) return true;
  if (want == FieldType::Double) return have == FieldType::Int64 || have == FieldType::Uint64;
  if (want == FieldType::String) return have == FieldType::Bytes;
  if (want == FieldType::Bytes) return have == FieldType::String;
  return false;
}

}  // namespace lanebus::detail
