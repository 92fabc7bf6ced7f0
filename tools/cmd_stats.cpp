// lanebus — MIT License.
// `lanebus stats DIR [--json|--prom] [--watch SECONDS] [--sla SECONDS]`: lag, the
// age of the oldest unprocessed message, rates and drain time of a live durable
// store, and the overdue claims of its queues, read through a read-only open;
// --watch redraws every N seconds. The numbers and the SLA verdict are the
// library's: each reading (read_store_stats) is added to a MetricsWindow, and
// --json / --prom print its to_json / to_prometheus. Only the table is drawn here.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <thread>

#include "args.hpp"
#include "commands.hpp"
#include "durable_store.hpp"
#include "lanebus/metrics.hpp"
#include "store_stats.hpp"

namespace lanebus::tool {
namespace {

const CommandSpec kSpec{
    "stats",
    "DIR",
    1,
    1,
    {{"--json", nullptr, "one JSON document per reading (one line each under --watch)"},
     {"--prom", nullptr, "Prometheus text exposition per reading (blank line between readings)"},
     {"--watch", "SECONDS",
      "read again every SECONDS (> 0, fractions allowed) until Ctrl-C;\n"
      "                        the table redraws in place on a terminal"},
     {"--sla", "SECONDS",
      "judge each group against this SLA: ok / at_risk / breached from the\n"
      "                        oldest age + drain time; at_risk needs the condition at two\n"
      "                        consecutive readings (a blip within one interval is not a page)"},
     {"--page-fraction", "F", "fraction of the SLA that is at risk (default 0.75)"}},
    "Consumer lag of every durable topic and queue in the store in DIR, per group and lane:\n"
    "end offset, committed offset, lag in messages, and the age of the oldest unprocessed\n"
    "message (one at a committed offset). Rates (published and consumed messages per second)\n"
    "and the projected drain time (lag / consume rate) need two readings: with --watch they\n"
    "come from consecutive readings SECONDS apart; without it they are shown as '-' (the\n"
    "exports then say window_seconds 0, rates 0, drain time unknown). The numbers and the\n"
    "SLA verdict are the library's MetricsWindow over the store's counters; --json and\n"
    "--prom print its exports (the same layout as lanebus::to_json / to_prometheus).\n"
    "For queues, each lane also shows in_flight (claimed, not acked) and overdue: claims\n"
    "whose deadline has passed, held by a consumer that died with them or by a handler that\n"
    "overran attempt_timeout (the bus ends such a claim at once). A lane with overdue > 0 is\n"
    "marked 'overdue: stuck or dead consumer' in the table (counters \"claimed\" and\n"
    "\"overdue\" in JSON, lanebus_claimed_messages and lanebus_overdue_claims in Prometheus).\n"
    "A group paused through a dependency outage (GroupOptions::outage) shows a PAUSED line with\n"
    "its age, reason and last error (\"paused\" in JSON, lanebus_group_paused in Prometheus;\n"
    "`lanebus resume` ends it).\n"
    "Opens the store read-only; safe while other processes use it. Exit status: 0, or 1 when\n"
    "the store cannot be read, 2 for a usage error.\n"
    "The CLI shows what the store knows (offsets, claims, overdue claims), not the counters\n"
    "of the processes using it: handler outcomes, latency, stuck handlers (attempt_timeout)\n"
    "and messages set aside by key_parallel_retry are exported by the in-process Monitor\n"
    "(lanebus_stuck_total, lanebus_stuck_handlers, lanebus_set_aside_messages; JSON stuck,\n"
    "stuck_now, set_aside).\n"
    "Deprecated fields of typed topics (doc/schemas.md) are listed with the groups that read\n"
    "them since the deprecation (audited reads, last read) and the groups whose contract still\n"
    "declares them (flagged); JSON deprecated_fields, Prometheus lanebus_deprecated_field_*.\n"};

volatile sig_atomic_t g_stop = 0;
extern "C" void on_signal(int) { g_stop = 1; }

std::int64_t steady_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
std::chrono::nanoseconds to_ns(double seconds) {
  return std::chrono::nanoseconds(static_cast<std::int64_t>(seconds * 1e9));
}
std::int64_t wall_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------- output

std::string fmt_rate(std::optional<double> r) {
  if (!r) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", *r);
  return b;
}

std::string fmt_secs(std::optional<double> s, bool stalled = false) {
  if (stalled) return "stalled";
  if (!s) return "-";
  if (std::isinf(*s)) return "inf";
  char b[32];
  if (*s < 1) {
    std::snprintf(b, sizeof b, "%.0fms", *s * 1e3);
  } else if (*s < 120) {
    std::snprintf(b, sizeof b, "%.1fs", *s);
  } else if (*s < 7200) {
    std::snprintf(b, sizeof b, "%.1fm", *s / 60);
  } else {
    std::snprintf(b, sizeof b, "%.1fh", *s / 3600);
  }
  return b;
}

std::optional<double> rate_if(const MetricsSnapshot& s, double r) {
  return s.window_seconds > 0 ? std::optional<double>(r) : std::nullopt;  // one reading: no rate
}

// The table: one block per topic, a row per group and under it a row per lane.
// For a store reading, a lane's end offset is its published count and a group
// lane's committed offset its acked count (read_store_stats).
void print_table(const std::string& dir, const MetricsSnapshot& s, const std::optional<SlaPolicy>& sla) {
  char when[64] = "?";
  std::time_t secs = static_cast<std::time_t>(s.wall_ns / 1'000'000'000);
  std::tm tm{};
  if (localtime_r(&secs, &tm) != nullptr) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
  std::printf("lanebus stats %s   %s   %s\n", dir.c_str(), when,
              s.window_seconds > 0 ? ("rates over " + fmt_secs(s.window_seconds)).c_str()
                                   : "single reading: no rates (use --watch)");
  if (sla)
    std::printf("SLA %.1fs, at risk from %.0f%% (%.1fs)\n", static_cast<double>(sla->sla.count()) / 1e9,
                sla->page_fraction * 100, sla->page_fraction * static_cast<double>(sla->sla.count()) / 1e9);
  if (s.topics.empty()) std::printf("(no durable topics)\n");
  for (const TopicMetrics& t : s.topics) {
    std::printf("\n%s %s  lanes=%zu  published=%llu  pub/s=%s%s\n", t.is_queue ? "queue" : "topic", t.name.c_str(),
                t.lane_load.size(), static_cast<unsigned long long>(t.published),
                fmt_rate(rate_if(s, t.publish_rate)).c_str(),
                t.hot_lane ? ("  HOT lane " + std::to_string(*t.hot_lane)).c_str() : "");
    if (t.groups.empty()) {
      std::printf("  (no consumer groups)\n");
      continue;
    }
    std::printf("  %-20s %10s %10s %10s %10s %10s\n", "GROUP", "LAG", "OLDEST", "CONS/S", "DRAIN", sla ? "SLA" : "");
    for (const GroupMetrics& g : t.groups) {
      std::printf("  %-20s %10llu %10s %10s %10s %10s\n", g.name.c_str(), static_cast<unsigned long long>(g.lag),
                  fmt_secs(g.oldest_age_seconds).c_str(), fmt_rate(rate_if(s, g.consume_rate)).c_str(),
                  fmt_secs(g.drain_seconds, g.stalled).c_str(), g.sla ? to_string(g.sla->state) : "");
      if (g.paused)  // outage pause (GroupOptions::outage): nothing is dead-lettered; `lanebus resume` ends it
        std::printf("    PAUSED (outage) since %s: %s; last error: %s\n",
                    fmt_secs(static_cast<double>(s.wall_ns - g.paused_since_ns) / 1e9).c_str(),
                    g.pause_reason.c_str(), g.pause_last_error.c_str());
      std::printf("    %-6s %12s %12s %10s %10s %10s%s\n", "lane", "end", "committed", "lag", "pub/s", "cons/s",
                  t.is_queue ? "  in_flight    overdue" : "");
      for (std::size_t i = 0; i < g.lanes.size() && i < t.lane_load.size(); ++i) {
        const GroupLaneMetrics& l = g.lanes[i];
        std::printf("    %-6zu %12llu %12llu %10llu %10s %10s", i,
                    static_cast<unsigned long long>(t.lane_load[i].published),
                    static_cast<unsigned long long>(l.counters.acked), static_cast<unsigned long long>(l.lag),
                    fmt_rate(rate_if(s, t.lane_load[i].publish_rate)).c_str(),
                    fmt_rate(rate_if(s, l.consume_rate)).c_str());
        if (t.is_queue)
          std::printf(" %10llu %10llu", static_cast<unsigned long long>(l.counters.claimed),
                      static_cast<unsigned long long>(l.counters.overdue));
        std::printf("%s%s\n", t.hot_lane && *t.hot_lane == i ? "  <- hot" : "",
                    l.counters.overdue > 0 ? "  overdue: stuck or dead consumer" : "");
      }
    }
  }
  // Deprecated fields of typed topics (doc/schemas.md): who still reads them.
  for (const DeprecatedField& f : s.deprecated_fields) {
    const std::time_t ends = static_cast<std::time_t>(f.window_ends_ns / 1'000'000'000);
    char day[32];
    std::tm tm{};
    gmtime_r(&ends, &tm);
    std::strftime(day, sizeof day, "%Y-%m-%d", &tm);
    std::printf("\ndeprecated field %s.%s  window ends %s%s%s\n", f.topic.c_str(), f.field.c_str(), day,
                f.replacement.empty() ? "" : "  replacement ", f.replacement.c_str());
    if (f.readers.empty()) std::printf("  (no reads since the deprecation, no contract declares it)\n");
    for (const DeprecatedFieldReader& r : f.readers) {
      char last[32] = "-";
      if (r.last_read_ns != 0) {
        const std::time_t lt = static_cast<std::time_t>(r.last_read_ns / 1'000'000'000);
        gmtime_r(&lt, &tm);
        std::strftime(last, sizeof last, "%Y-%m-%d", &tm);
      }
      std::printf("  %-20s reads=%llu  last read %s%s\n", r.group.c_str(), static_cast<unsigned long long>(r.reads),
                  last, r.contract_declares ? "  CONTRACT DECLARES IT (flagged)" : "");
    }
  }
}

}  // namespace

int cmd_stats(int argc, char** argv) {
  enum class Format { Table, Json, Prom } format = Format::Table;
  std::string dir;
  std::optional<double> watch;
  double page_fraction = 0.75;
  std::optional<double> sla_seconds;
  ParsedArgs args;
  std::string error;
  if (parse_options(kSpec, argc, argv, &args, &error) != 0) return usage_error(kSpec, error);
  if (args.help) return print_help(kSpec);
  dir = args.operands[0];
  if (args.has("--json") && args.has("--prom")) return usage_error(kSpec, "--json and --prom are exclusive");
  if (args.has("--json")) format = Format::Json;
  if (args.has("--prom")) format = Format::Prom;
  double v = 0;
  if (const std::string* w = args.get("--watch")) {
    if (!parse_seconds(w->c_str(), &v)) return usage_error(kSpec, "--watch needs a number of seconds > 0");
    watch = v;
  }
  if (int rc = read_sla_options(kSpec, args, &sla_seconds, &page_fraction); rc != 0) return rc;
  // A window of the last two readings: rates are between consecutive readings, and
  // the SLA hold is one interval, so at_risk needs the risk at two readings in a row.
  MetricsOptions mo;
  mo.max_samples = 2;
  mo.window = std::chrono::hours(24 * 365);
  std::optional<SlaPolicy> sla;
  if (sla_seconds) {
    sla = SlaPolicy{to_ns(*sla_seconds), page_fraction, watch ? to_ns(*watch) : std::chrono::nanoseconds(0)};
    mo.default_sla = sla;
  }
  auto window = MetricsWindow::create(mo);
  if (!window.ok()) {
    std::fprintf(stderr, "lanebus stats: %s\n", window.status().to_string().c_str());
    return 2;
  }

  StoreOptions o;
  o.directory = dir;
  o.read_only = true;
  auto store = detail::DurableStore::open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "lanebus stats: cannot read %s as a lanebus store: %s\n", dir.c_str(),
                 store.status().to_string().c_str());
    return 1;
  }

  if (watch) {
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
  }
  const bool tty = isatty(STDOUT_FILENO) == 1;
  for (bool first = true;; first = false) {
    auto reading = detail::read_store_stats(**store);
    if (!reading.ok()) {
      std::fprintf(stderr, "lanebus stats: reading %s: %s\n", dir.c_str(), reading.status().to_string().c_str());
      return 1;
    }
    if (Status added = window->add(std::move(*reading), steady_now(), wall_now()); !added.ok()) {
      std::fprintf(stderr, "lanebus stats: %s\n", added.to_string().c_str());
      return 1;
    }
    const MetricsSnapshot& snap = window->snapshot();
    switch (format) {
      case Format::Table:
        if (watch && tty) std::printf("\x1b[H\x1b[2J");  // home + clear: redraw in place
        print_table(dir, snap, sla);
        // Bridges' status records (read_store_stats reads them; doc/bridge.md).
        std::fputs(detail::bridge_status_text(snap.bridges, wall_now()).c_str(), stdout);
        if (watch) std::printf(tty ? "\n(every %gs; Ctrl-C to quit)\n" : "\n", *watch);
        break;
      case Format::Json:
        std::printf("%s\n", to_json(snap).c_str());
        break;
      case Format::Prom:
        std::printf("%s%s", first ? "" : "\n", to_prometheus(snap).c_str());
        break;
    }
    std::fflush(stdout);
    if (!watch) return 0;
    // Sleep in short steps so Ctrl-C exits promptly.
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(*watch);
    while (g_stop == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_stop != 0) return 0;
  }
}

}  // namespace lanebus::tool
