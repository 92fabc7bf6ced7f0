// lanebus — MIT License.
// How the tool prints bytes it did not write: escaped payloads, keys and
// message headers (lanebus tail, lanebus dlq show).
#pragma once

#include <string>
#include <string_view>

namespace lanebus::tool {

/// Printable ASCII as is; backslash, quote and everything else escaped (\xNN, \n, \t).
std::string escape(std::string_view s);

/// A stored header block (HeadersView) as `name="value" name="value"`, values
/// escaped; empty for no headers.
std::string headers_text(std::string_view block);

}  // namespace lanebus::tool
