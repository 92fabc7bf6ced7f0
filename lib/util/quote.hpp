// lanebus — MIT License.
// The one quoting helper of error and report messages: `name "x" is ...`.
// Plain double quotes around the bytes, nothing escaped (messages name
// paths, topics and keys as they are; JSON has its own escaping in json.hpp).
#pragma once

#include <string>
#include <string_view>

namespace lanebus::detail {

/// `"` + s + `"`.
inline std::string quoted(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  out += s;
  out += '"';
  return out;
}

}  // namespace lanebus::detail
