// lanebus — MIT License.
// Argument parsers of the lanebus tool (see args.hpp).
#include "args.hpp"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
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

const std::string* ParsedArgs::get(std::string_view name) const {
  const std::string* found = nullptr;
  for (const auto& [n, v] : options) {
    if (n == name) found = &v;
  }
  return found;
}

int parse_options(const CommandSpec& spec, int argc, char** argv, ParsedArgs* out, std::string* error) {
  bool options_end = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (!options_end && (a == "--help" || a == "-h")) {
      out->help = true;
      return 0;
    }
    if (!options_end && a == "--") {
      options_end = true;
      continue;
    }
    if (!options_end && a.size() > 1 && a[0] == '-') {
      const OptionSpec* o = nullptr;
      for (const OptionSpec& c : spec.options) {
        if (a == c.name || (c.alias != nullptr && a == c.alias)) o = &c;
      }
      if (o == nullptr) {
        *error = "unknown option \"" + std::string(a) + "\"";
        return 2;
      }
      if (o->value == nullptr) {
        out->options.emplace_back(o->name, "");
      } else if (i + 1 < argc) {
        out->options.emplace_back(o->name, argv[++i]);
      } else {
        *error = std::string(o->name) + " needs " + o->value;
        return 2;
      }
      continue;
    }
    if (a.empty()) {
      *error = "empty argument";
      return 2;
    }
    if (out->operands.size() == spec.max_operands) {
      *error = "unexpected argument \"" + std::string(a) + "\"";
      return 2;
    }
    out->operands.emplace_back(a);
  }
  if (out->operands.size() < spec.min_operands) {
    *error = std::string("needs ") + spec.operands;
    return 2;
  }
  return 0;
}

std::string help_text(const CommandSpec& spec) {
  std::string t = std::string("usage: lanebus ") + spec.name;
  if (!spec.options.empty()) t += " [options]";
  t += std::string(" ") + spec.operands + "\n";
  if (!spec.options.empty()) {
    t += "\noptions:\n";
    for (const OptionSpec& o : spec.options) {
      std::string left = std::string("  ") + o.name;
      if (o.alias != nullptr) left += std::string(", ") + o.alias;
      if (o.value != nullptr) left += std::string(" ") + o.value;
      if (left.size() < 24) left.resize(24, ' ');
      else left += "  ";
      t += left + o.help + "\n";
    }
  }
  if (spec.about != nullptr && *spec.about != '\0') t += std::string("\n") + spec.about;
  return t;
}

int print_help(const CommandSpec& spec) {
  std::fputs(help_text(spec).c_str(), stdout);
  return 0;
}

int usage_error(const CommandSpec& spec, const std::string& error) {
  std::fprintf(stderr, "lanebus %s: %s\n\n%s", spec.name, error.c_str(), help_text(spec).c_str());
  return 2;
}

int read_sla_options(const CommandSpec& spec, const ParsedArgs& args, std::optional<double>* sla_seconds,
                     double* page_fraction) {
  double v = 0;
  if (const std::string* w = args.get("--sla")) {
    if (!parse_seconds(w->c_str(), &v)) return usage_error(spec, "--sla needs a number of seconds > 0");
    *sla_seconds = v;
  }
  if (const std::string* w = args.get("--page-fraction")) {
    if (!parse_seconds(w->c_str(), &v) || v > 1) return usage_error(spec, "--page-fraction needs a number in (0, 1]");
    *page_fraction = v;
  }
  return 0;
}

// ---------------------------------------------------------------- tail and verify

const CommandSpec& tail_spec() {
  static const CommandSpec spec{
      "tail",
      "DIR TOPIC",
      2,
      2,
      {{"--from", "POSITION",
        "where to start in each lane: earliest (default), latest, OFFSET, or @T = the first\n"
        "                        message at or after T nanoseconds since the Unix epoch"},
       {"--lane", "N", "only this lane (default all)"},
       {"--count", "N", "at most N messages per lane (default 100; 0 = no limit)"}},
      "Prints messages of TOPIC (a durable topic or queue) in the store in DIR, lane by\n"
      "lane in offset order, one line each: lane, offset, id, created_at (ns), attempt,\n"
      "key and payload (non-printable bytes as \\xNN). DIR and TOPIC come first.\n"
      "Opens the store read-only; safe while another process uses it.\n"};
  return spec;
}

const CommandSpec& verify_spec() {
  static const CommandSpec spec{
      "verify",
      "DIR",
      1,
      1,
      {{"--quiet", nullptr, "print only problems and the summary", "-q"},
       {"--progress", "N", "a progress line every N records of a database (default 50000)"}},
      "Reads every page and every record of the durable store in DIR and checks it:\n"
      "every LMDB database (the free list included) and LMDB's page accounting;\n"
      "every message record's CRC-32C and lengths; lane bounds against the log keys,\n"
      "message counts and bytes; topic, group, cursor and in-flight records; DLQ\n"
      "entries, marks and audit records; idempotency records.\n"
      "The walk runs in a child process: a page LMDB cannot read kills the child,\n"
      "and is reported as damage. Safe while another process uses the store (it\n"
      "reads one snapshot).\n"
      "Exit status: 0 intact, 1 damaged (or the store cannot be read), 2 usage error.\n"};
  return spec;
}

int parse_tail_args(int argc, char** argv, TailArgs* out, std::string* error) {
  if (argc < 3) {
    *error = "needs DIR and TOPIC";
    return 2;
  }
  out->dir = argv[1];
  out->topic = argv[2];
  // The options after DIR and TOPIC, read with tail's spec and no operands.
  CommandSpec options_only = tail_spec();
  options_only.min_operands = options_only.max_operands = 0;
  ParsedArgs p;
  if (int rc = parse_options(options_only, argc - 2, argv + 2, &p, error); rc != 0) return rc;
  if (p.help) {
    *error = "--help goes alone: lanebus tail --help";
    return 2;
  }
  for (const auto& [name, value] : p.options) {
    std::uint64_t n = 0;
    if (name == "--from") {
      if (value == "earliest") {
        out->from = StartPosition::earliest();
      } else if (value == "latest") {
        out->from = StartPosition::latest();
      } else if (!value.empty() && value[0] == '@' && parse_u64(value.c_str() + 1, &n) &&
                 n <= static_cast<std::uint64_t>(INT64_MAX)) {
        out->from = StartPosition::at_time(static_cast<std::int64_t>(n));
      } else if (parse_u64(value.c_str(), &n)) {
        out->from = StartPosition::at_offset(n);
      } else {
        *error = "bad --from \"" + value + "\"";
        return 2;
      }
    } else if (name == "--lane") {
      if (!parse_u64(value.c_str(), &n) || n > static_cast<std::uint64_t>(INT64_MAX)) {
        *error = "bad --lane \"" + value + "\"";
        return 2;
      }
      out->only_lane = static_cast<long long>(n);
    } else if (name == "--count") {
      if (!parse_u64(value.c_str(), &n)) {
        *error = "bad --count \"" + value + "\"";
        return 2;
      }
      out->count = n;
    }
  }
  return 0;
}

int parse_verify_args(int argc, char** argv, VerifyArgs* out, std::string* error) {
  ParsedArgs p;
  if (int rc = parse_options(verify_spec(), argc, argv, &p, error); rc != 0) return rc;
  if (p.help) {
    *error = "--help goes alone: lanebus verify --help";
    return 2;
  }
  out->dir = p.operands[0];
  out->quiet = p.has("--quiet");
  if (const std::string* v = p.get("--progress")) {
    std::uint64_t n = 0;
    if (!parse_u64(v->c_str(), &n)) {
      *error = "bad --progress \"" + *v + "\"";
      return 2;
    }
    out->progress_every = n;
  }
  return 0;
}

}  // namespace lanebus::tool
