// lanebus — MIT License.
// A small JSON reader and writer for schema files (doc/schemas.md): objects,
// arrays, strings (with \uXXXX escapes, BMP and surrogate pairs), numbers
// (kept as text so 64-bit integers are exact), true/false/null. Depth is
// limited to 64. Internal; not a general-purpose JSON library.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lanebus/status.hpp"

namespace lanebus::detail {

struct Json {
  enum class Kind : std::uint8_t { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool b = false;
  std::string text;  // String: the value; Number: the literal
  std::vector<Json> items;  // Array: the items; Object: the member values
  std::vector<std::string> keys;  // Object: member names, in order (values in `items`)

  /// Member `key` of an object, or nullptr.
  const Json* get(std::string_view key) const noexcept;
  /// Number as int64 / uint64 / double: false when not a number of that kind
  /// (an int64 must be an integer literal in range).
  bool as_int64(std::int64_t* out) const noexcept;
  bool as_uint64(std::uint64_t* out) const noexcept;
  bool as_double(double* out) const noexcept;
};

/// Errors: InvalidArgument "JSON: <what> at line L column C".
Result<Json> parse_json(std::string_view text);
/// `s` as a JSON string literal (quotes, escapes).
std::string json_quote(std::string_view s);

}  // namespace lanebus::detail
