// lanebus — MIT License.
// Argument parsers of the lanebus tool (see args.hpp).
#include "args.hpp"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace lanebus::tool {

bool parse_u64(const char* s, std::uint64_t* out) {
  if (s == nullptr || *s < '0' || *s > '9') return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_seconds(const char* s, double* out) {
  if (s == nullptr || *s == '\0') return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (errno != 0 || *end != '\0' || !(v > 0) || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

int parse_tail_args(int argc, char** argv, TailArgs* out, std::string* error) {
  if (argc < 3) {
    *error = "needs DIR and TOPIC";
    return 2;
  }
  out->dir = argv[1];
  out->topic = argv[2];
  for (int i = 3; i < argc; ++i) {
    const std::string_view a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    std::uint64_t n = 0;
    if (a == "--from" && v != nullptr) {
      const std::string_view f = v;
      if (f == "earliest") {
        out->from = StartPosition::earliest();
      } else if (f == "latest") {
        out->from = StartPosition::latest();
      } else if (!f.empty() && f[0] == '@' && parse_u64(v + 1, &n) && n <= static_cast<std::uint64_t>(INT64_MAX)) {
        out->from = StartPosition::at_time(static_cast<std::int64_t>(n));
      } else if (parse_u64(v, &n)) {
        out->from = StartPosition::at_offset(n);
      } else {
        *error = "bad --from \"" + std::string(f) + "\"";
        return 2;
      }
      ++i;
    } else if (a == "--lane" && parse_u64(v, &n) && n <= static_cast<std::uint64_t>(INT64_MAX)) {
      out->only_lane = static_cast<long long>(n);
      ++i;
    } else if (a == "--count" && parse_u64(v, &n)) {
      out->count = n;
      ++i;
    } else {
      *error = "bad argument \"" + std::string(a) + "\"";
      return 2;
    }
  }
  return 0;
}

int parse_verify_args(int argc, char** argv, VerifyArgs* out, std::string* error) {
  bool have_dir = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    std::uint64_t n = 0;
    if (a == "--quiet" || a == "-q") {
      out->quiet = true;
    } else if (a == "--progress" && i + 1 < argc && parse_u64(argv[i + 1], &n)) {
      out->progress_every = n;
      ++i;
    } else if (!a.empty() && a[0] != '-' && !have_dir) {
      out->dir = std::string(a);
      have_dir = true;
    } else {
      *error = "bad argument \"" + std::string(a) + "\"";
      return 2;
    }
  }
  if (!have_dir) {
    *error = "needs DIR";
    return 2;
  }
  return 0;
}

}  // namespace lanebus::tool
