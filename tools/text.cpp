// lanebus — MIT License.
#include "text.hpp"

#include <cstdio>

#include "lanebus/message.hpp"

namespace lanebus::tool {

std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c >= 0x20 && c < 0x7f) out.push_back(static_cast<char>(c));
    else {
      char b[5];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    }
  }
  return out;
}

std::string headers_text(std::string_view block) {
  std::string out;
  for (Header h : HeadersView(block)) {
    if (!out.empty()) out += ' ';
    out.append(h.name);  // visible ASCII without ':' (checked at publish)
    out += "=\"";
    out += escape(h.value);
    out += '"';
  }
  return out;
}

}  // namespace lanebus::tool
