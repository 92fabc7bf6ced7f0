// lanebus — MIT License.
// Prometheus' own linter on our exposition: `promtool check metrics` (Debian
// package prometheus, scripts/deps.sh) accepts what /metrics serves for a live
// bus with every family populated — topics, groups and lanes, latency
// histogram and window summary, SLA, stuck handlers, durable topics and
// queues, the DLQ, namespaces and quotas — plus a bridge and a deprecated
// field added to the live stats (they need a NATS server and a schema). A
// negative control shows promtool rejects the old gauge-with-quantile shape.
// No promtool: exit 77 (skip), or a failure under CI=true.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "exposition_check.hpp"
#include "external_tool.hpp"
#include "lanebus/lanebus.hpp"
#include "scratch_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::wait_until;
using TempDir = lanebus::test::ScratchDir;

namespace {

/// The promtool binary, or a skip (exit 77) — a failure under CI=true.
std::string require_promtool() {
  std::string p = lanebus::test::find_tool("LANEBUS_PROMTOOL", "promtool");
  if (!p.empty()) return p;
  if (lanebus::test::tool_required()) {
    FAIL("promtool is not installed (apt-get install prometheus); CI=true makes this a failure");
  }
  MESSAGE("promtool not found: skipping");
  std::exit(77);
}

struct Verdict {
  int exit_code = -1;
  std::string output;
};

/// `promtool check metrics < file`, stdout and stderr together.
Verdict promtool_check(const std::string& promtool, const std::string& exposition, const TempDir& tmp) {
  const std::string in = (tmp.path / "metrics.txt").string();
  std::ofstream(in) << exposition;
  const std::string cmd = "'" + promtool + "' check metrics < '" + in + "' 2>&1";
  Verdict v;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) v.output.append(buf, n);
  const int st = ::pclose(p);
  v.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return v;
}

}  // namespace

TEST_CASE("promtool rejects a gauge with a quantile label, as our checker does (negative control)") {
  const std::string promtool = require_promtool();
  TempDir tmp;
  const std::string bad =
      "# HELP x_seconds A gauge that pretends to be a summary.\n# TYPE x_seconds gauge\nx_seconds{quantile=\"0.5\"} 1\n";
  const Verdict v = promtool_check(promtool, bad, tmp);
  MESSAGE("promtool on the bad exposition: exit " << v.exit_code << ": " << v.output);
  CHECK(v.exit_code != 0);
  CHECK_FALSE(lanebus::test::parse_prometheus(bad).errors.empty());
  const std::string good = "# HELP x_total A counter.\n# TYPE x_total counter\nx_total 1\n";
  CHECK(promtool_check(promtool, good, tmp).exit_code == 0);
}

TEST_CASE("promtool check metrics accepts the exposition of a live bus with every family populated") {
  const std::string promtool = require_promtool();
  TempDir tmp;
  BusOptions o = lanebus::test::store_bus(tmp.path);
  o.name = "promtool-bus";
  o.dlq.max_entries = 1;  // the second rejected message is refused: DLQ rejected counter
  auto bus = Bus::open(o).value();
  NamespacePolicy tight;
  tight.publish = {.msgs_per_s = 1, .bytes_per_s = 0, .burst_s = 0.01};
  REQUIRE(bus->namespaces()->create("tight", tight).ok());
  REQUIRE(bus->namespaces()->create("shop", {}).ok());

  auto orders = bus->create_topic("shop.orders", {.lanes = 4}).value();
  auto audit = bus->create_topic("shop.audit", {.lanes = 2, .durable = true}).value();
  auto jobs = bus->create_queue("shop.jobs", {.lanes = 2, .durable = true}).value();
  auto limited = bus->create_topic("tight.events", {.backpressure = Backpressure::FailFast}).value();
  std::atomic<int> handled{0};
  std::atomic<bool> release{false};
  auto billing = bus->subscribe(orders, "billing", [&](const MessageView& m) {
                      if (m.key() == "slow") wait_until([&] { return release.load(); }, 60s);  // stuck
                      handled.fetch_add(1);
                      return m.key() == "retry-me" && m.attempt() == 1 ? Outcome::retry("once") : Outcome::ack();
                    }, {.attempt_timeout = 20ms}).value();
  auto shipping = bus->subscribe(orders, "shipping", [&](const MessageView&) {
                       handled.fetch_add(1);
                       return Outcome::ack();
                     }).value();
  auto reader = bus->subscribe(audit, "reader", [&](const MessageView&) {
                     handled.fetch_add(1);
                     return Outcome::ack();
                   }).value();
  auto worker = bus->consume(jobs, [&](const MessageView& m) {
                     handled.fetch_add(1);
                     return m.key() == "bad" ? Outcome::reject("bad input") : Outcome::ack();
                   }).value();
  auto sub_tight = bus->subscribe(limited, "g", [](const MessageView&) { return Outcome::ack(); }).value();

  auto monitor = Monitor::create(
                     [&] {
                       BusStats s = bus->stats();
                       // Families a live bus shows only with a NATS server or a schema.
                       BridgeStats b;
                       b.name = "nats";
                       b.state = BridgeState::Connected;
                       b.total = {.direction = "", .published = 10, .acked = 10};
                       b.mirrors.push_back({.direction = "out", .topic = "shop.audit", .stream = "AUDIT",
                                            .via = "audit.{key}", .published = 10, .acked = 10});
                       s.bridges.push_back(b);
                       DeprecatedField f{.topic = "shop.orders", .field = "total", .replacement = "amount",
                                         .since_ns = 1, .window_ends_ns = 2'000'000'000'000'000'000};
                       f.readers.push_back({.group = "billing", .reads = 3, .last_read_ns = 1, .contract_declares = true});
                       s.deprecated_fields.push_back(f);
                       return s;
                     },
                     {.window = 5s})
                     .value();
  REQUIRE(monitor->set_sla("shop.orders", "billing", {.sla = 10s}).ok());
  REQUIRE(monitor->sample().ok());

  REQUIRE(orders.publish({.key = "slow", .payload = "p"}).ok());
  for (int i = 0; i < 200; ++i) REQUIRE(orders.publish({.key = "k" + std::to_string(i % 16), .payload = "order"}).ok());
  REQUIRE(orders.publish({.key = "retry-me", .payload = "p"}).ok());
  for (int i = 0; i < 20; ++i) REQUIRE(audit.publish({.key = "a" + std::to_string(i), .payload = "audit"}).ok());
  for (int i = 0; i < 20; ++i) REQUIRE(jobs.publish({.key = "j" + std::to_string(i), .payload = "job"}).ok());
  for (int i = 0; i < 3; ++i) REQUIRE(jobs.publish({.key = "bad", .payload = "poison " + std::to_string(i)}).ok());
  int refused = 0;
  for (int i = 0; i < 100; ++i) refused += limited.try_publish({.key = "k", .payload = "x"}).code() == Code::QuotaExceeded;
  CHECK(refused > 0);
  auto stuck = [&] {
    for (const auto& t : bus->stats().topics)
      for (const auto& g : t.groups)
        for (const auto& l : g.lanes)
          if (l.stuck_now > 0) return true;
    return false;
  };
  REQUIRE(wait_until(stuck, 20s));
  REQUIRE(wait_until([&] { return bus->dead_letters().value()->counters().value().rejected > 0; }, 30s));
  std::this_thread::sleep_for(50ms);  // two samples must differ in time (rates)
  REQUIRE(monitor->sample().ok());
  const std::string text = monitor->prometheus();
  release = true;

  // Every family is there, with the shapes the types call for.
  const auto doc = lanebus::test::parse_prometheus(text);
  CHECK_MESSAGE(doc.errors.empty(), (doc.errors.empty() ? std::string() : doc.errors.front()));
  for (const char* fam : {"lanebus_published_total", "lanebus_acked_total", "lanebus_retried_total",
                          "lanebus_stuck_handlers", "lanebus_consumer_lag_messages", "lanebus_e2e_latency_seconds",
                          "lanebus_sla_state", "lanebus_namespace_refused_total", "lanebus_bridge_state",
                          "lanebus_deprecated_field_reads_total"})
    CHECK_MESSAGE(doc.type.count(fam) == 1, fam);
  CHECK(doc.type.at("lanebus_e2e_latency_window_seconds") == "summary");
  CHECK_FALSE(doc.find("lanebus_e2e_latency_window_seconds", {{"quantile", "0.99"}}).empty());
  CHECK_FALSE(doc.find("lanebus_e2e_latency_window_seconds_count").empty());
  bool dlq = false;
  for (const auto& [name, type] : doc.type) dlq = dlq || name.rfind("lanebus_dlq_", 0) == 0;
  CHECK(dlq);
  MESSAGE(doc.type.size() << " families, " << doc.series.size() << " series");

  const Verdict v = promtool_check(promtool, text, tmp);
  CHECK_MESSAGE(v.exit_code == 0, "promtool check metrics: exit " << v.exit_code << ":\n" << v.output);
  CHECK_MESSAGE(v.output.empty(), v.output);
}
