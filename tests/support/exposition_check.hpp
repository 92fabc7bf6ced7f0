// lanebus — MIT License.
// Independent readers of the two export formats, written from their
// specifications (Prometheus text exposition 0.0.4, RFC 8259 JSON) for tests:
// they must not share code with lib/ops/exposition.hpp.
#pragma once

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace lanebus::test {

/// A checker for the Prometheus text exposition format 0.0.4, written from the
/// specification: line grammar, metric and label name syntax, label value
/// escapes (\\ \" \n only), HELP/TYPE at most once per family and before its
/// samples, families contiguous, `le` only in histograms and `quantile` only
/// in summaries, histogram series named _bucket/_sum/_count
/// with cumulative, increasing `le` buckets ending at +Inf == _count.
struct PromSeries {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct PromDoc {
  std::map<std::string, std::string> type, help;
  std::vector<PromSeries> series;
  std::vector<std::string> errors;

  std::vector<const PromSeries*> find(const std::string& name, const std::map<std::string, std::string>& match = {}) const {
    std::vector<const PromSeries*> out;
    for (const auto& s : series) {
      if (s.name != name) continue;
      bool ok = true;
      for (const auto& [k, v] : match) ok &= s.labels.count(k) && s.labels.at(k) == v;
      if (ok) out.push_back(&s);
    }
    return out;
  }
};

inline bool name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }
inline bool name_char(char c) { return name_start(c) || std::isdigit(static_cast<unsigned char>(c)); }

inline std::optional<double> parse_value(const std::string& v) {
  if (v == "+Inf" || v == "Inf") return INFINITY;
  if (v == "-Inf") return -INFINITY;
  if (v == "NaN") return NAN;
  if (v.empty()) return std::nullopt;
  for (char c : v)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
      return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(v.c_str(), &end);
  if (end != v.c_str() + v.size()) return std::nullopt;
  return d;
}

inline std::string family_of(const std::string& name, const std::map<std::string, std::string>& type) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      std::string base = name.substr(0, name.size() - s.size());
      auto it = type.find(base);
      if (it != type.end() && (it->second == "histogram" || it->second == "summary")) return base;
    }
  }
  return name;
}

inline PromDoc parse_prometheus(const std::string& text) {
  PromDoc d;
  auto err = [&](std::size_t line, const std::string& what) { d.errors.push_back("line " + std::to_string(line) + ": " + what); };
  if (!text.empty() && text.back() != '\n') err(0, "document does not end with a newline");
  std::set<std::string> families_done;  // families whose block has ended
  std::string current;
  std::set<std::string> sampled;  // families with samples so far
  std::set<std::string> series_keys;
  std::size_t pos = 0, lineno = 0;
  auto switch_to = [&](const std::string& fam, std::size_t ln) {
    if (fam == current) return;
    if (families_done.count(fam)) err(ln, "family " + fam + " is not contiguous");
    if (!current.empty()) families_done.insert(current);
    current = fam;
  };
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++lineno;
    if (line.empty()) continue;
    if (line[0] == '#') {
      // "# HELP name text" / "# TYPE name type" / any other comment.
      std::size_t p = 1;
      while (p < line.size() && line[p] == ' ') ++p;
      std::size_t kw_end = line.find(' ', p);
      std::string kw = line.substr(p, kw_end == std::string::npos ? std::string::npos : kw_end - p);
      if (kw != "HELP" && kw != "TYPE") continue;
      if (kw_end == std::string::npos) {
        err(lineno, "bare " + kw);
        continue;
      }
      p = kw_end + 1;
      std::size_t n_end = p;
      if (n_end >= line.size() || !name_start(line[n_end])) err(lineno, "bad metric name in " + kw);
      while (n_end < line.size() && name_char(line[n_end])) ++n_end;
      std::string name = line.substr(p, n_end - p);
      std::string rest = n_end < line.size() ? line.substr(n_end + 1) : "";
      if (n_end < line.size() && line[n_end] != ' ') err(lineno, "junk after the metric name");
      switch_to(name, lineno);
      if (kw == "TYPE") {
        static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary", "untyped"};
        if (!kTypes.count(rest)) err(lineno, "unknown type " + rest);
        if (d.type.count(name)) err(lineno, "second TYPE for " + name);
        if (sampled.count(name)) err(lineno, "TYPE after samples of " + name);
        d.type[name] = rest;
      } else {
        if (d.help.count(name)) err(lineno, "second HELP for " + name);
        // Only \\ and \n are escapes in HELP.
        std::string h;
        for (std::size_t i = 0; i < rest.size(); ++i) {
          if (rest[i] == '\\' && i + 1 < rest.size()) {
            char c = rest[++i];
            if (c == '\\') h += '\\';
            else if (c == 'n') h += '\n';
            else err(lineno, "bad escape in HELP");
          } else {
            h += rest[i];
          }
        }
        d.help[name] = h;
      }
      continue;
    }
    // Sample: name [{labels}] value [timestamp]
    PromSeries s;
    std::size_t p = 0;
    if (!name_start(line[p])) {
      err(lineno, "bad metric name");
      continue;
    }
    while (p < line.size() && name_char(line[p])) ++p;
    s.name = line.substr(0, p);
    if (p < line.size() && line[p] == '{') {
      ++p;
      bool closed = false;
      while (p < line.size()) {
        if (line[p] == '}') {
          closed = true;
          ++p;
          break;
        }
        std::size_t ln = p;
        if (!(std::isalpha(static_cast<unsigned char>(line[p])) || line[p] == '_')) {
          err(lineno, "bad label name");
          break;
        }
        while (p < line.size() && (std::isalnum(static_cast<unsigned char>(line[p])) || line[p] == '_')) ++p;
        std::string lname = line.substr(ln, p - ln);
        if (p >= line.size() || line[p] != '=' || p + 1 >= line.size() || line[p + 1] != '"') {
          err(lineno, "expected =\" after label " + lname);
          break;
        }
        p += 2;
        std::string value;
        bool done = false;
        while (p < line.size()) {
          char c = line[p++];
          if (c == '"') {
            done = true;
            break;
          }
          if (c == '\\') {
            if (p >= line.size()) break;
            char e = line[p++];
            if (e == '\\') value += '\\';
            else if (e == '"') value += '"';
            else if (e == 'n') value += '\n';
            else err(lineno, "bad escape in label value");
          } else {
            value += c;
          }
        }
        if (!done) {
          err(lineno, "unterminated label value");
          break;
        }
        if (s.labels.count(lname)) err(lineno, "duplicate label " + lname);
        s.labels[lname] = value;
        if (p < line.size() && line[p] == ',') ++p;
      }
      if (!closed) {
        err(lineno, "unterminated label set");
        continue;
      }
    }
    if (p >= line.size() || line[p] != ' ') {
      err(lineno, "expected a space before the value");
      continue;
    }
    ++p;
    std::size_t vend = line.find(' ', p);
    std::string v = line.substr(p, vend == std::string::npos ? std::string::npos : vend - p);
    auto val = parse_value(v);
    if (!val) {
      err(lineno, "bad value '" + v + "'");
      continue;
    }
    if (vend != std::string::npos) {
      std::string ts = line.substr(vend + 1);
      if (ts.empty() || ts.find_first_not_of("-0123456789") != std::string::npos) err(lineno, "bad timestamp");
    }
    s.value = *val;
    const std::string fam = family_of(s.name, d.type);
    switch_to(fam, lineno);
    sampled.insert(fam);
    if (!d.type.count(fam)) err(lineno, "sample of " + fam + " without a TYPE line before it");
    std::string key = s.name;
    for (const auto& [k, lv] : s.labels) key += "\x1f" + k + "=" + lv;
    if (!series_keys.insert(key).second) err(lineno, "duplicate series " + s.name);
    const std::string& ty = d.type.count(fam) ? d.type[fam] : std::string();
    if (ty == "histogram") {
      if (s.name == fam) err(lineno, "histogram sample without _bucket/_sum/_count suffix");
      if (s.name == fam + "_bucket" && !s.labels.count("le")) err(lineno, "_bucket without le");
    }
    // `le` and `quantile` are reserved for the types that define them (what
    // promtool rejects: a gauge carrying a quantile label).
    if (ty != "histogram" && s.labels.count("le")) err(lineno, "label le outside a histogram");
    if (ty != "summary" && s.labels.count("quantile")) err(lineno, "label quantile outside a summary");
    if (ty == "summary" && s.name != fam && s.labels.count("quantile"))
      err(lineno, "summary _sum/_count with a quantile label");
    if (ty == "counter" && !(s.value >= 0)) err(lineno, "negative or NaN counter");
    d.series.push_back(std::move(s));
  }
  // Histogram invariants per label set (le excluded).
  for (const auto& [fam, ty] : d.type) {
    if (ty != "histogram") continue;
    std::map<std::string, std::vector<std::pair<double, double>>> buckets;
    std::map<std::string, double> counts;
    std::map<std::string, bool> has_sum;
    for (const auto& s : d.series) {
      std::string key;
      for (const auto& [k, v] : s.labels)
        if (k != "le") key += k + "=" + v + ",";
      if (s.name == fam + "_bucket") {
        auto le = parse_value(s.labels.at("le"));
        if (!le) d.errors.push_back(fam + ": bad le " + s.labels.at("le"));
        else buckets[key].push_back({*le, s.value});
      } else if (s.name == fam + "_count") {
        counts[key] = s.value;
      } else if (s.name == fam + "_sum") {
        has_sum[key] = true;
      }
    }
    for (const auto& [key, b] : buckets) {
      for (std::size_t i = 1; i < b.size(); ++i) {
        if (!(b[i].first > b[i - 1].first)) d.errors.push_back(fam + "{" + key + "}: le not increasing");
        if (b[i].second < b[i - 1].second) d.errors.push_back(fam + "{" + key + "}: buckets not cumulative");
      }
      if (b.empty() || !std::isinf(b.back().first)) d.errors.push_back(fam + "{" + key + "}: no +Inf bucket");
      if (!counts.count(key)) d.errors.push_back(fam + "{" + key + "}: no _count");
      else if (b.back().second != counts[key]) d.errors.push_back(fam + "{" + key + "}: +Inf bucket != _count");
      if (!has_sum[key]) d.errors.push_back(fam + "{" + key + "}: no _sum");
    }
  }
  return d;
}

/// A strict RFC 8259 parser: no trailing commas, no leading zeros, escapes
/// checked, nothing after the value.
struct Json {
  using Object = std::map<std::string, Json>;
  using Array = std::vector<Json>;
  std::variant<std::nullptr_t, bool, double, std::string, Array, Object> v;
  bool is_null() const { return std::holds_alternative<std::nullptr_t>(v); }
  const Json& operator[](const std::string& k) const { return std::get<Object>(v).at(k); }
  const Json& operator[](std::size_t i) const { return std::get<Array>(v).at(i); }
  double num() const { return std::get<double>(v); }
  const std::string& str() const { return std::get<std::string>(v); }
  bool boolean() const { return std::get<bool>(v); }
  std::size_t size() const {
    return std::holds_alternative<Array>(v) ? std::get<Array>(v).size() : std::get<Object>(v).size();
  }
};

struct JsonParser {
  const std::string& s;
  std::size_t p = 0;
  std::string error{};
  void ws() {
    while (p < s.size() && (s[p] == ' ' || s[p] == '\t' || s[p] == '\n' || s[p] == '\r')) ++p;
  }
  bool fail(const std::string& e) {
    if (error.empty()) error = e + " at " + std::to_string(p);
    return false;
  }
  bool lit(const char* w) {
    std::string x(w);
    if (s.compare(p, x.size(), x) != 0) return fail("expected " + x);
    p += x.size();
    return true;
  }
  bool str(std::string& out) {
    if (p >= s.size() || s[p] != '"') return fail("expected string");
    ++p;
    while (p < s.size() && s[p] != '"') {
      unsigned char c = static_cast<unsigned char>(s[p++]);
      if (c < 0x20) return fail("raw control character in string");
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (p >= s.size()) return fail("dangling escape");
      char e = s[p++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (p + 4 > s.size()) return fail("short \\u");
          unsigned cp = 0;
          for (int i = 0; i < 4; ++i) {
            char h = s[p++];
            if (!std::isxdigit(static_cast<unsigned char>(h))) return fail("bad \\u");
            cp = cp * 16 + static_cast<unsigned>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
          }
          if (cp >= 0x80) return fail("test parser handles ASCII \\u only");
          out += static_cast<char>(cp);
          break;
        }
        default: return fail("bad escape");
      }
    }
    if (p >= s.size()) return fail("unterminated string");
    ++p;
    return true;
  }
  bool number(double& out) {
    std::size_t b = p;
    if (s[p] == '-') ++p;
    if (p >= s.size()) return fail("bad number");
    if (s[p] == '0') {
      ++p;
    } else if (s[p] >= '1' && s[p] <= '9') {
      while (p < s.size() && std::isdigit(static_cast<unsigned char>(s[p]))) ++p;
    } else {
      return fail("bad number");
    }
    if (p < s.size() && s[p] == '.') {
      ++p;
      if (p >= s.size() || !std::isdigit(static_cast<unsigned char>(s[p]))) return fail("bad fraction");
      while (p < s.size() && std::isdigit(static_cast<unsigned char>(s[p]))) ++p;
    }
    if (p < s.size() && (s[p] == 'e' || s[p] == 'E')) {
      ++p;
      if (p < s.size() && (s[p] == '+' || s[p] == '-')) ++p;
      if (p >= s.size() || !std::isdigit(static_cast<unsigned char>(s[p]))) return fail("bad exponent");
      while (p < s.size() && std::isdigit(static_cast<unsigned char>(s[p]))) ++p;
    }
    out = std::strtod(s.substr(b, p - b).c_str(), nullptr);
    return true;
  }
  bool value(Json& out, int depth = 0) {
    if (depth > 64) return fail("too deep");
    ws();
    if (p >= s.size()) return fail("unexpected end");
    char c = s[p];
    if (c == '{') {
      ++p;
      Json::Object o;
      ws();
      if (p < s.size() && s[p] == '}') {
        ++p;
        out.v = std::move(o);
        return true;
      }
      for (;;) {
        ws();
        std::string k;
        if (!str(k)) return false;
        if (o.count(k)) return fail("duplicate key " + k);
        ws();
        if (p >= s.size() || s[p] != ':') return fail("expected :");
        ++p;
        Json v;
        if (!value(v, depth + 1)) return false;
        o.emplace(k, std::move(v));
        ws();
        if (p < s.size() && s[p] == ',') {
          ++p;
          continue;
        }
        if (p < s.size() && s[p] == '}') {
          ++p;
          break;
        }
        return fail("expected , or }");
      }
      out.v = std::move(o);
      return true;
    }
    if (c == '[') {
      ++p;
      Json::Array a;
      ws();
      if (p < s.size() && s[p] == ']') {
        ++p;
        out.v = std::move(a);
        return true;
      }
      for (;;) {
        Json v;
        if (!value(v, depth + 1)) return false;
        a.push_back(std::move(v));
        ws();
        if (p < s.size() && s[p] == ',') {
          ++p;
          continue;
        }
        if (p < s.size() && s[p] == ']') {
          ++p;
          break;
        }
        return fail("expected , or ]");
      }
      out.v = std::move(a);
      return true;
    }
    if (c == '"') {
      std::string x;
      if (!str(x)) return false;
      out.v = std::move(x);
      return true;
    }
    if (c == 't') return lit("true") && (out.v = true, true);
    if (c == 'f') return lit("false") && (out.v = false, true);
    if (c == 'n') return lit("null") && (out.v = nullptr, true);
    double d = 0;
    if (!number(d)) return false;
    out.v = d;
    return true;
  }
};

inline std::optional<Json> parse_json(const std::string& text, std::string* error) {
  JsonParser jp{text};
  Json j;
  if (!jp.value(j)) {
    *error = jp.error;
    return std::nullopt;
  }
  jp.ws();
  if (jp.p != text.size()) {
    *error = "trailing data at " + std::to_string(jp.p);
    return std::nullopt;
  }
  return j;
}

}  // namespace lanebus::test
