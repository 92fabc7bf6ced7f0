// lanebus — MIT License.
// The schema files' JSON reader (lib/util/json.hpp).
#include "json.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace lanebus::detail {

const Json* Json::get(std::string_view key) const noexcept {
  if (kind != Kind::Object) return nullptr;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] == key) return &items[i];
  }
  return nullptr;
}

bool Json::as_int64(std::int64_t* out) const noexcept {
  if (kind != Kind::Number || text.find_first_of(".eE") != std::string::npos) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *out = v;
  return true;
}

bool Json::as_uint64(std::uint64_t* out) const noexcept {
  if (kind != Kind::Number || text.find_first_of(".eE-") != std::string::npos) return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *out = v;
  return true;
}

bool Json::as_double(double* out) const noexcept {
  if (kind != Kind::Number) return false;
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

namespace {

class Parser {
 public:
  explicit Parser(std::string_view in) : in_(in) {}

  Status run(Json* out) {
    skip_ws();
    if (!value(out, 0)) return error();
    skip_ws();
    if (pos_ != in_.size()) {
      why_ = "trailing characters after the value";
      return error();
    }
    return Status();
  }

 private:
  Status error() const {
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < pos_ && i < in_.size(); ++i) {
      if (in_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return Status(Code::InvalidArgument, std::string("JSON: ") + why_ + " at line " + std::to_string(line) +
                                             " column " + std::to_string(col));
  }
  void skip_ws() {
    while (pos_ < in_.size() && (in_[pos_] == ' ' || in_[pos_] == '\t' || in_[pos_] == '\n' || in_[pos_] == '\r'))
      ++pos_;
  }
  bool literal(std::string_view word) {
    if (in_.substr(pos_, word.size()) != word) {
      why_ = "unexpected word";
      return false;
    }
    pos_ += word.size();
    return true;
  }
  bool value(Json* out, int depth) {
    if (depth > 64) {
      why_ = "nested deeper than 64 levels";
      return false;
    }
    if (pos_ >= in_.size()) {
      why_ = "unexpected end of input";
      return false;
    }
    const char c = in_[pos_];
    if (c == '{') return object(out, depth);
    if (c == '[') return array(out, depth);
    if (c == '"') {
      out->kind = Json::Kind::String;
      return string(&out->text);
    }
    if (c == 't') {
      out->kind = Json::Kind::Bool;
      out->b = true;
      return literal("true");
    }
    if (c == 'f') {
      out->kind = Json::Kind::Bool;
      out->b = false;
      return literal("false");
    }
    if (c == 'n') {
      out->kind = Json::Kind::Null;
      return literal("null");
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number(out);
    why_ = "unexpected character";
    return false;
  }
  bool number(Json* out) {
    const std::size_t start = pos_;
    if (in_[pos_] == '-') ++pos_;
    auto digits = [&] {
      const std::size_t s = pos_;
      while (pos_ < in_.size() && in_[pos_] >= '0' && in_[pos_] <= '9') ++pos_;
      return pos_ > s;
    };
    if (!digits()) {
      why_ = "bad number";
      return false;
    }
    if (pos_ < in_.size() && in_[pos_] == '.') {
      ++pos_;
      if (!digits()) {
        why_ = "bad number";
        return false;
      }
    }
    if (pos_ < in_.size() && (in_[pos_] == 'e' || in_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < in_.size() && (in_[pos_] == '+' || in_[pos_] == '-')) ++pos_;
      if (!digits()) {
        why_ = "bad number";
        return false;
      }
    }
    out->kind = Json::Kind::Number;
    out->text.assign(in_.substr(start, pos_ - start));
    return true;
  }
  static void utf8(std::string* s, std::uint32_t cp) {
    if (cp < 0x80) {
      s->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      s->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      s->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      s->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  bool hex4(std::uint32_t* out) {
    if (in_.size() - pos_ < 4) {
      why_ = "truncated \\u escape";
      return false;
    }
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = in_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= h - '0';
      } else if (h >= 'a' && h <= 'f') {
        v |= h - 'a' + 10;
      } else if (h >= 'A' && h <= 'F') {
        v |= h - 'A' + 10;
      } else {
        why_ = "bad \\u escape";
        return false;
      }
    }
    *out = v;
    return true;
  }
  bool string(std::string* out) {
    ++pos_;  // "
    out->clear();
    while (pos_ < in_.size()) {
      const char c = in_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) {
        why_ = "control character in a string";
        return false;
      }
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= in_.size()) break;
      const char e = in_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          std::uint32_t cp;
          if (!hex4(&cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00) {
            std::uint32_t lo;
            if (in_.substr(pos_, 2) != "\\u") {
              why_ = "unpaired surrogate";
              return false;
            }
            pos_ += 2;
            if (!hex4(&lo)) return false;
            if (lo < 0xDC00 || lo > 0xDFFF) {
              why_ = "unpaired surrogate";
              return false;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            why_ = "unpaired surrogate";
            return false;
          }
          utf8(out, cp);
          break;
        }
        default:
          why_ = "bad escape";
          return false;
      }
    }
    why_ = "unterminated string";
    return false;
  }
  bool array(Json* out, int depth) {
    ++pos_;
    out->kind = Json::Kind::Array;
    skip_ws();
    if (pos_ < in_.size() && in_[pos_] == ']') {
      ++pos_;
      return true;
    }
    for (;;) {
      skip_ws();
      out->items.emplace_back();
      if (!value(&out->items.back(), depth + 1)) return false;
      skip_ws();
      if (pos_ >= in_.size()) break;
      if (in_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (in_[pos_] == ']') {
        ++pos_;
        return true;
      }
      why_ = "expected ',' or ']'";
      return false;
    }
    why_ = "unterminated array";
    return false;
  }
  bool object(Json* out, int depth) {
    ++pos_;
    out->kind = Json::Kind::Object;
    skip_ws();
    if (pos_ < in_.size() && in_[pos_] == '}') {
      ++pos_;
      return true;
    }
    for (;;) {
      skip_ws();
      if (pos_ >= in_.size() || in_[pos_] != '"') {
        why_ = "expected a member name";
        return false;
      }
      std::string key;
      if (!string(&key)) return false;
      for (const auto& k : out->keys) {
        if (k == key) {
          why_ = "duplicate member name";
          return false;
        }
      }
      skip_ws();
      if (pos_ >= in_.size() || in_[pos_] != ':') {
        why_ = "expected ':'";
        return false;
      }
      ++pos_;
      skip_ws();
      out->keys.push_back(std::move(key));
      out->items.emplace_back();
      if (!value(&out->items.back(), depth + 1)) return false;
      skip_ws();
      if (pos_ >= in_.size()) break;
      if (in_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (in_[pos_] == '}') {
        ++pos_;
        return true;
      }
      why_ = "expected ',' or '}'";
      return false;
    }
    why_ = "unterminated object";
    return false;
  }

  std::string_view in_;
  std::size_t pos_ = 0;
  const char* why_ = "";
};

}  // namespace

Result<Json> parse_json(std::string_view text) {
  Json j;
  Parser p(text);
  Status s = p.run(&j);
  if (!s.ok()) return s;
  return j;
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", static_cast<unsigned char>(c));
          out += b;
        } else {
          out.push_back(c);
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace lanebus::detail
