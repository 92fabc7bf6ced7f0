// lanebus — MIT License.
// `lanebus usage DIR [--since T] [--until T] [--json]`: per-namespace usage
// persisted by minute in a store's `tenancy` table (doc/tenancy.md).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "args.hpp"
#include "commands.hpp"
#include "durable_store.hpp"
#include "json.hpp"
#include "tenancy.hpp"

namespace lanebus::tool {

namespace {

const CommandSpec kSpec{
    "usage",
    "DIR",
    1,
    1,
    {{"--since", "T", "from T: seconds since the Unix epoch, or an age such as 90s, 30m, 2h, 7d"},
     {"--until", "T", "up to T (same forms)"},
     {"--json", nullptr, "one JSON document instead of the table"}},
    "Per-namespace usage (messages and bytes in and out, throttled and refused\n"
    "publishes, seconds at the quota ceiling, peak rate vs quota), summed over the\n"
    "minutes the bus persisted. Opens the store read-only, as the OS user\n"
    "running it (no credential: doc/tenancy.md).\n"};

/// Minute since the epoch for T, or false.
bool parse_time(const char* s, std::uint64_t* minute) {
  if (s == nullptr || *s == '\0') return false;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || v < 0) return false;
  const auto now_s = static_cast<double>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  double at;
  if (*end == '\0') {
    at = v;
  } else if (end[1] != '\0') {
    return false;
  } else {
    double unit = *end == 's' ? 1 : *end == 'm' ? 60 : *end == 'h' ? 3600 : *end == 'd' ? 86400 : 0;
    if (unit == 0) return false;
    at = now_s - v * unit;
  }
  if (at < 0) at = 0;
  *minute = static_cast<std::uint64_t>(at / 60);
  return true;
}

}  // namespace

int cmd_usage(int argc, char** argv) {
  std::string dir;
  bool json = false;
  std::uint64_t since = 0, until = UINT64_MAX;
  ParsedArgs args;
  std::string error;
  if (parse_options(kSpec, argc, argv, &args, &error) != 0) return usage_error(kSpec, error);
  if (args.help) return print_help(kSpec);
  dir = args.operands[0];
  json = args.has("--json");
  for (const char* name : {"--since", "--until"}) {
    const std::string* t = args.get(name);
    if (t == nullptr) continue;
    std::uint64_t m;
    if (!parse_time(t->c_str(), &m)) {
      return usage_error(kSpec, std::string(name) + " needs seconds since the epoch or an age like 30m, 2h, 7d");
    }
    (name[2] == 's' ? since : until) = m;
  }
  StoreOptions o;
  o.directory = dir;
  o.read_only = true;
  auto store = detail::DurableStore::open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "lanebus usage: %s\n", store.status().to_string().c_str());
    return 1;
  }
  struct Row {
    NamespaceUsage u;
    std::uint64_t minutes = 0;
    std::uint64_t first = 0, last = 0;
    NamespacePolicy policy;
    bool declared = false;
  };
  std::map<std::string, Row> rows;
  Status s = (*store)->read([&](detail::StoreTxn& t) {
    rows.clear();
    return t.scan(detail::StoreTable::Tenancy, std::string_view("\0", 1), {},
                  [&](std::string_view k, std::string_view v) {
                    std::string ns;
                    std::uint64_t minute = 0;
                    NamespaceUsage u;
                    if (k.substr(0, 2) == "n/") {
                      Row& r = rows[std::string(k.substr(2))];
                      r.declared = detail::decode_policy(v, &r.policy);
                    } else if (detail::parse_usage_key(k, &ns, &minute) && detail::decode_usage(v, &u) &&
                               minute >= since && minute <= until) {
                      Row& r = rows[ns];
                      r.u.msgs_in += u.msgs_in;
                      r.u.bytes_in += u.bytes_in;
                      r.u.msgs_out += u.msgs_out;
                      r.u.bytes_out += u.bytes_out;
                      r.u.throttled += u.throttled;
                      r.u.refused += u.refused;
                      r.u.seconds_at_ceiling += u.seconds_at_ceiling;
                      if (u.peak_in_per_s > r.u.peak_in_per_s) r.u.peak_in_per_s = u.peak_in_per_s;
                      if (r.minutes == 0 || minute < r.first) r.first = minute;
                      if (minute > r.last) r.last = minute;
                      ++r.minutes;
                    }
                    return true;
                  });
  });
  if (!s.ok()) {
    std::fprintf(stderr, "lanebus usage: %s\n", s.to_string().c_str());
    return 1;
  }
  if (json) {
    std::printf("{\"namespaces\":[");
    bool first = true;
    for (const auto& [name, r] : rows) {
      const double span_s = r.minutes ? static_cast<double>(r.last - r.first + 1) * 60 : 0;
      std::printf(
          "%s{\"name\":%s,\"declared\":%s,\"msgs_in\":%llu,\"bytes_in\":%llu,\"msgs_out\":%llu,\"bytes_out\":%llu,"
          "\"throttled\":%llu,\"refused\":%llu,\"seconds_at_ceiling\":%llu,\"peak_in_per_s\":%.0f,"
          "\"avg_in_per_s\":%.3f,\"quota_in_per_s\":%.3f,\"minutes\":%llu}",
          first ? "" : ",", detail::json_quote(name).c_str(), r.declared ? "true" : "false",
          static_cast<unsigned long long>(r.u.msgs_in), static_cast<unsigned long long>(r.u.bytes_in),
          static_cast<unsigned long long>(r.u.msgs_out), static_cast<unsigned long long>(r.u.bytes_out),
          static_cast<unsigned long long>(r.u.throttled), static_cast<unsigned long long>(r.u.refused),
          static_cast<unsigned long long>(r.u.seconds_at_ceiling), r.u.peak_in_per_s,
          span_s > 0 ? static_cast<double>(r.u.msgs_in) / span_s : 0.0, r.policy.publish.msgs_per_s,
          static_cast<unsigned long long>(r.minutes));
      first = false;
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("%-24s %12s %12s %12s %12s %9s %9s %8s %10s %10s\n", "NAMESPACE", "MSGS_IN", "BYTES_IN", "MSGS_OUT",
              "BYTES_OUT", "THROTTLED", "REFUSED", "CEIL_S", "PEAK/S", "QUOTA/S");
  for (const auto& [name, r] : rows) {
    char quota[32] = "-";
    if (r.policy.publish.msgs_per_s > 0) std::snprintf(quota, sizeof quota, "%.0f", r.policy.publish.msgs_per_s);
    std::printf("%-24s %12llu %12llu %12llu %12llu %9llu %9llu %8llu %10.0f %10s\n", name.c_str(),
                static_cast<unsigned long long>(r.u.msgs_in), static_cast<unsigned long long>(r.u.bytes_in),
                static_cast<unsigned long long>(r.u.msgs_out), static_cast<unsigned long long>(r.u.bytes_out),
                static_cast<unsigned long long>(r.u.throttled), static_cast<unsigned long long>(r.u.refused),
                static_cast<unsigned long long>(r.u.seconds_at_ceiling), r.u.peak_in_per_s, quota);
  }
  return 0;
}

}  // namespace lanebus::tool
