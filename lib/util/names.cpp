// lanebus — MIT License.
// Name validation (doc/topics.md).
#include "names.hpp"

#include <string>

namespace lanebus::detail {

Status check_name(std::string_view name, std::string_view what) {
  auto fail = [&](std::string_view why) {
    std::string shown(name.substr(0, 64));
    if (name.size() > 64) shown += "...";
    return Status(Code::InvalidName,
                  std::string(what) + " name \"" + shown + "\": " + std::string(why) +
                      " (names are dotted paths of [a-z0-9_-] segments, at most 200 bytes)");
  };
  if (name.empty()) return fail("is empty");
  if (name.size() > kMaxNameBytes) return fail("is longer than 200 bytes");
  bool segment_empty = true;
  for (char c : name) {
    if (c == '.') {
      if (segment_empty) return fail("has an empty segment");
      segment_empty = true;
      continue;
    }
    bool okc = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!okc) {
      std::string msg = "contains the character ";
      if (static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f) {
        msg += '\'';
        msg += c;
        msg += '\'';
      } else {
        msg += "0x";
        const char* hex = "0123456789abcdef";
        msg += hex[(static_cast<unsigned char>(c) >> 4) & 0xf];
        msg += hex[static_cast<unsigned char>(c) & 0xf];
      }
      return fail(msg);
    }
    segment_empty = false;
  }
  if (segment_empty) return fail("has an empty segment");
  return Status();
}

}  // namespace lanebus::detail
