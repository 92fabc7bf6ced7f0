// lanebus — MIT License.
// `lanebus serve DIR [--listen HOST:PORT] [--sla SECONDS]`: a MetricsServer
// (/metrics, /stats.json, /healthz, the dashboard) over a durable store that
// other processes use, read through a read-only open.
#include <signal.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "args.hpp"
#include "commands.hpp"
#include "durable_store.hpp"
#include "lanebus/metrics_server.hpp"
#include "store_stats.hpp"

namespace lanebus::tool {
namespace {

const CommandSpec kSpec{
    "serve",
    "DIR",
    1,
    1,
    {{"--listen", "HOST:PORT", "address to listen on (default 127.0.0.1:9464; port 0 = any free)"},
     {"--sla", "SECONDS", "judge every group against this SLA (ok / at_risk / breached)"},
     {"--page-fraction", "F", "fraction of the SLA that is at risk (default 0.75)"},
     {"--window", "SECONDS", "span of the rates (default 15)"},
     {"--interval", "SECONDS", "how often the store is read (default 1)"}},
    "Serve the metrics of the lanebus store in DIR over HTTP until SIGINT or SIGTERM:\n"
    "  /metrics     Prometheus text exposition 0.0.4\n"
    "  /stats.json  the same as JSON, with health and server counters\n"
    "  /healthz     200, or 503 when a group's SLA is breached or the store is unusable\n"
    "  /            a live dashboard (lag, drain time against the SLA, DLQ, lane load)\n"
    "The store shows what it knows: offsets, lag, the age of the oldest unprocessed message\n"
    "and the DLQ; handler outcomes and latency live in the consuming process (serve those\n"
    "with lanebus::MetricsServer in that process). Opens the store read-only. The first line\n"
    "on stdout names the URL. Exit status: 0 after a signal, 1 when the store cannot be read\n"
    "or the address cannot be bound, 2 for a usage error.\n"};

std::chrono::nanoseconds to_ns(double s) { return std::chrono::nanoseconds(static_cast<std::int64_t>(s * 1e9)); }

}  // namespace

int cmd_serve(int argc, char** argv) {
  std::string dir;
  MetricsServerOptions options;
  std::optional<double> sla_seconds;
  double page_fraction = 0.75;
  ParsedArgs args;
  std::string error;
  if (parse_options(kSpec, argc, argv, &args, &error) != 0) return usage_error(kSpec, error);
  if (args.help) return print_help(kSpec);
  dir = args.operands[0];
  double v = 0;
  if (const std::string* l = args.get("--listen")) options.listen = *l;
  if (int rc = read_sla_options(kSpec, args, &sla_seconds, &page_fraction); rc != 0) return rc;
  if (const std::string* w = args.get("--window")) {
    if (!parse_seconds(w->c_str(), &v)) return usage_error(kSpec, "--window needs a number of seconds > 0");
    options.metrics.window = to_ns(v);
  }
  if (const std::string* w = args.get("--interval")) {
    if (!parse_seconds(w->c_str(), &v) || v < 0.001) {
      return usage_error(kSpec, "--interval needs a number of seconds >= 0.001");
    }
    options.sample_interval = std::chrono::milliseconds(static_cast<std::int64_t>(v * 1e3));
  }
  if (sla_seconds) options.metrics.default_sla = SlaPolicy{to_ns(*sla_seconds), page_fraction, std::chrono::nanoseconds(0)};

  // Block the stop signals before any thread starts, so every thread inherits
  // the mask and sigwait below receives them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  StoreOptions so;
  so.directory = dir;
  so.read_only = true;
  auto store = detail::DurableStore::open(so);
  if (!store.ok()) {
    std::fprintf(stderr, "lanebus serve: cannot read %s as a lanebus store: %s\n", dir.c_str(),
                 store.status().to_string().c_str());
    return 1;
  }
  detail::DurableStore* s = store->get();
  auto server = MetricsServer::start([s] { return detail::read_store_stats(*s); }, options);
  if (!server.ok()) {
    const bool usage = server.status().code() == Code::InvalidArgument;
    std::fprintf(stderr, "lanebus serve: %s\n", server.status().to_string().c_str());
    return usage ? 2 : 1;
  }
  std::printf("lanebus serve: %s at %s (/metrics, /stats.json, /healthz)\n", dir.c_str(), (*server)->url().c_str());
  std::fflush(stdout);
  int sig = 0;
  while (sigwait(&stop, &sig) != 0) {
  }
  (*server)->stop();
  return 0;
}

}  // namespace lanebus::tool
