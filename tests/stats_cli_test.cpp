// lanebus — MIT License.
// `lanebus stats` on a live store (held open read-write by this process): lag,
// committed offsets and oldest unprocessed age in every output format, rates
// from --watch readings, a clean exit on SIGINT, clear errors, the overdue
// claim of a queue handler stuck past attempt_timeout (`stats` and `stat`), and
// that the CLI and the library's MetricsWindow agree on the same store.
#include <doctest/doctest.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "durable_store.hpp"
#include "exposition_check.hpp"
#include "lanebus/lanebus.hpp"
#include "process.hpp"
#include "scratch_dir.hpp"
#include "shell.hpp"
#include "store_stats.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::Json;

namespace {

using lanebus::test::run_shell;

constexpr std::int64_t kSec = 1'000'000'000;

std::int64_t wall_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}


/// A store with topic "orders" (2 lanes): 10 messages in lane 0 created 30 s
/// ago, 4 in lane 1; group "billing" committed 6 of lane 0 and all of lane 1;
/// group "audit" committed nothing. Stays open read-write (a live store).
struct Fixture {
  lanebus::test::TempDir dir;
  std::string store_dir = dir.file("store");
  std::unique_ptr<detail::DurableStore> store;
  detail::TopicRef topic;
  detail::GroupRef billing;
  std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");

  Fixture() {
    StoreOptions o;
    o.directory = store_dir;
    o.durability = Durability::Async;
    store = detail::DurableStore::open(o).value();
    topic = store->open_topic("orders", detail::TopicSpec{2, false, {}}).value();
    append(0, 10, wall_now() - 30 * kSec);
    append(1, 4, 0);
    billing = store->open_group(topic, "billing").value();
    (void)store->open_group(topic, "audit").value();
    REQUIRE(store->commit_offset(billing, 0, 6).ok());
    REQUIRE(store->commit_offset(billing, 1, 4).ok());
  }
  void append(std::uint32_t lane, int n, std::int64_t created_at) {
    for (int i = 0; i < n; ++i) {
      detail::AppendRequest r;
      r.topic_id = topic.id;
      r.lane = lane;
      r.header.created_at_ns = created_at;
      r.payload = "m";
      REQUIRE(store->append(std::move(r)).ok());
    }
  }
};

const Json* group(const Json& topic, const std::string& name) {
  for (const Json& g : std::get<Json::Array>(topic["groups"].v))
    if (g["name"].str() == name) return &g;
  return nullptr;
}

}  // namespace

TEST_CASE("lanebus stats --json reads lag, committed offsets and the oldest unprocessed age of a live store") {
  Fixture f;
  if (f.tool.empty()) {
    MESSAGE("LANEBUS_TOOL not set (built without tools): skipped");
    return;
  }
  std::string out, error;
  REQUIRE(run_shell(f.tool + " stats " + f.store_dir + " --json", &out) == 0);
  auto j = lanebus::test::parse_json(out, &error);
  REQUIRE_MESSAGE(j, error << "\n" << out);
  const Json& t = (*j)["topics"][0];
  CHECK(t["name"].str() == "orders");
  CHECK(t["published"].num() == 14);
  CHECK((*j)["window_seconds"].num() == 0);  // one reading: no rates
  CHECK((*j)["samples"].num() == 1);
  CHECK(t["publish_rate"].num() == 0);
  CHECK(t["lane_load"][0]["published"].num() == 10);  // the lane's end offset
  const Json* b = group(t, "billing");
  REQUIRE(b);
  CHECK((*b)["lag"].num() == 4);
  CHECK((*b)["lanes"][0]["counters"]["acked"].num() == 6);  // the committed offset
  CHECK((*b)["lanes"][1]["lag"].num() == 0);
  CHECK((*b)["oldest_age_seconds"].num() >= 30.0);
  CHECK((*b)["oldest_age_seconds"].num() < 3600.0);
  CHECK((*b)["consume_rate"].num() == 0);
  CHECK((*b)["drain_seconds"].is_null());
  const Json* a = group(t, "audit");
  REQUIRE(a);
  CHECK((*a)["lag"].num() == 14);

  // The table names the same numbers.
  REQUIRE(run_shell(f.tool + " stats " + f.store_dir, &out) == 0);
  CHECK(out.find("billing") != std::string::npos);
  CHECK(out.find("no rates") != std::string::npos);
}

TEST_CASE("lanebus stats --prom passes the exposition checker and carries per-lane lag") {
  Fixture f;
  if (f.tool.empty()) return;
  std::string out;
  REQUIRE(run_shell(f.tool + " stats " + f.store_dir + " --prom --sla 60", &out) == 0);
  const auto d = lanebus::test::parse_prometheus(out);
  for (const auto& e : d.errors) FAIL_CHECK(e);
  auto lag = d.find("lanebus_consumer_lag_messages", {{"topic", "orders"}, {"group", "billing"}, {"lane", "0"}});
  REQUIRE(lag.size() == 1);
  CHECK(lag[0]->value == 4);
  auto age = d.find("lanebus_oldest_unprocessed_age_seconds", {{"group", "billing"}});
  REQUIRE(age.size() == 1);
  CHECK(age[0]->value >= 30.0);
  // One reading: no rate, so the SLA state is unknown (not a guessed ok).
  auto unknown = d.find("lanebus_sla_state", {{"group", "billing"}, {"state", "unknown"}});
  REQUIRE(unknown.size() == 1);
  CHECK(unknown[0]->value == 1);
  auto span = d.find("lanebus_metrics_window_seconds");
  REQUIRE(span.size() == 1);
  CHECK(span[0]->value == 0);
  CHECK(d.find("lanebus_projected_drain_seconds", {{"group", "billing"}}).empty());  // unknown: left out
}

TEST_CASE("lanebus stats --watch derives rates from consecutive readings and exits 0 on SIGINT") {
  Fixture f;
  if (f.tool.empty()) return;
  lanebus::test::Child c({f.tool, "stats", f.store_dir, "--json", "--watch", "0.2"});
  REQUIRE(c.started());
  std::string error;
  auto first = lanebus::test::parse_json(c.read_line(), &error);
  REQUIRE_MESSAGE(first, error);
  CHECK((*first)["window_seconds"].num() == 0);
  // Between readings: 50 new messages in lane 1, billing consumes 20 of them.
  f.append(1, 50, 0);
  REQUIRE(f.store->commit_offset(f.billing, 1, 24).ok());
  // The change may straddle readings; the commit comes last, so the first
  // reading with a consume rate shows the final lag.
  bool saw_publish_rate = false, saw_consume_rate = false;
  for (int i = 0; i < 50 && !saw_consume_rate; ++i) {
    auto j = lanebus::test::parse_json(c.read_line(), &error);
    REQUIRE_MESSAGE(j, error);
    const Json& t = (*j)["topics"][0];
    CHECK((*j)["window_seconds"].num() > 0);
    if (!t["publish_rate"].is_null() && t["publish_rate"].num() > 0) saw_publish_rate = true;
    const Json* b = group(t, "billing");
    REQUIRE(b);
    if ((*b)["consume_rate"].is_null() || (*b)["consume_rate"].num() == 0) continue;
    saw_consume_rate = true;
    CHECK((*b)["lag"].num() == 4 + 30);
    CHECK((*b)["drain_seconds"].num() > 0);
  }
  CHECK(saw_publish_rate);
  CHECK(saw_consume_rate);
  c.signal(SIGINT);
  CHECK(c.wait() == 0);
}

TEST_CASE("lanebus stats on something that is not a store fails with a clear message; bad usage exits 2") {
  lanebus::test::TempDir dir;
  const std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");
  if (tool.empty()) return;
  std::string out;
  CHECK(run_shell(tool + " stats " + dir.path(), &out) == 1);
  CHECK(out.find("cannot read") != std::string::npos);
  CHECK(out.find("not a lanebus store") != std::string::npos);
  CHECK(run_shell(tool + " stats " + dir.path() + "/missing", &out) == 1);
  CHECK(out.find("not a lanebus store") != std::string::npos);
  CHECK(run_shell(tool + " stats", &out) == 2);
  CHECK(run_shell(tool + " stats " + dir.path() + " --watch 0", &out) == 2);
  CHECK(out.find("--watch") != std::string::npos);
  CHECK(run_shell(tool + " stats " + dir.path() + " --json --prom", &out) == 2);
  CHECK(run_shell(tool + " stats --help", &out) == 0);
  CHECK(out.find("usage: lanebus stats") != std::string::npos);
}

namespace {

/// A flag the stuck handler waits on; opened by the test, or on any exit path
/// by GateOpener, so a failed check never leaves the handler blocked while the
/// Subscription and the Bus wait for it.
struct Gate {
  std::atomic<bool> open{false};
  void wait() const { (void)lanebus::test::wait_until([&] { return open.load(); }, 120s); }
};
struct GateOpener {
  Gate& gate;
  ~GateOpener() { gate.open = true; }
};

/// The bus's counters of the queue's consumers in `lane` (nullopt until they show up).
std::optional<LaneCounters> queue_lane(Bus& bus, const std::string& queue, std::uint32_t lane) {
  BusStats s = bus.stats();
  for (const auto& t : s.topics) {
    if (t.name != queue) continue;
    for (const auto& g : t.groups)
      if (g.name.empty() && lane < g.lanes.size()) return g.lanes[lane];
  }
  return std::nullopt;
}

/// What `lanebus stats DIR --json` says about the queue's only group ("queue"
/// in the store); found = false when the CLI failed or the group is missing.
struct QueueReading {
  bool found = false;
  double lag = -1;
  std::vector<double> in_flight, overdue;  // by lane
};
QueueReading read_queue(const std::string& tool, const std::string& store_dir, const std::string& queue) {
  QueueReading r;
  std::string out, error;
  if (run_shell(tool + " stats " + store_dir + " --json", &out) != 0) return r;
  auto j = lanebus::test::parse_json(out, &error);
  if (!j) return r;
  for (const Json& t : std::get<Json::Array>((*j)["topics"].v)) {
    if (t["name"].str() != queue) continue;
    const Json* g = group(t, "queue");
    if (g == nullptr) return r;
    r.found = true;
    r.lag = (*g)["lag"].num();
    for (const Json& l : std::get<Json::Array>((*g)["lanes"].v)) {
      r.in_flight.push_back(l["counters"]["claimed"].num());
      r.overdue.push_back(l["counters"]["overdue"].num());
    }
  }
  return r;
}

}  // namespace

TEST_CASE("lanebus stats and stat show the overdue claim of a queue handler stuck past attempt_timeout") {
  const std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");
  if (tool.empty()) {
    MESSAGE("LANEBUS_TOOL not set (built without tools): skipped");
    return;
  }
  constexpr std::uint32_t kLanes = 2;
  const std::string kQueue = "jobs";
  lanebus::test::ScratchDir dir;
  BusOptions o = lanebus::test::store_bus(dir.path);
  o.name = "stats-cli-test";
  o.store.durability = Durability::Async;
  const std::string store_dir = o.store.directory;
  auto bus = Bus::open(o).value();
  Topic q = bus->create_queue(kQueue, {.lanes = kLanes, .durable = true}).value();
  const std::uint32_t lane = lane_for_key("a", kLanes);
  const std::uint32_t other = 1 - lane;
  CAPTURE(lane);

  // The first call blocks until the test opens the gate; its redelivery acks.
  Gate gate;
  std::atomic<int> calls{0};
  auto sub = bus->consume(
                    q,
                    [&](const MessageView&) {
                      if (calls.fetch_add(1) == 0) gate.wait();
                      return Outcome::ack();
                    },
                    {.attempt_timeout = 100ms})
                 .value();
  GateOpener opener{gate};
  REQUIRE(q.publish({.key = "a", .payload = "block"}).ok());

  // The watchdog sees the call past 100 ms and ends its claim (an async write,
  // so the store may show it a moment after the counter).
  REQUIRE(lanebus::test::wait_until(
      [&] {
        auto c = queue_lane(*bus, kQueue, lane);
        return c && c->stuck_now == 1;
      },
      10s));
  QueueReading r;
  const bool shown = lanebus::test::wait_until(
      [&] {
        r = read_queue(tool, store_dir, kQueue);
        return r.found && r.overdue.size() == kLanes && r.overdue[lane] == 1;
      },
      10s);
  REQUIRE_MESSAGE(r.found, "no group \"queue\" on " << kQueue << " in lanebus stats --json");
  REQUIRE(r.overdue.size() == kLanes);
  CHECK_MESSAGE(shown, "overdue=" << r.overdue[lane]);
  CHECK(r.in_flight[lane] == 1);
  CHECK(r.overdue[lane] == 1);
  CHECK(r.in_flight[other] == 0);
  CHECK(r.overdue[other] == 0);
  CHECK(calls.load() == 1);  // still the stuck call: nothing redelivered it in this process

  // The table: the lane's row has in_flight 1, overdue 1 and the mark; the
  // other lane's row has no mark.
  std::string out;
  REQUIRE(run_shell(tool + " stats " + store_dir, &out) == 0);
  CAPTURE(out);
  CHECK(out.find("queue " + kQueue + "  lanes=2") != std::string::npos);
  CHECK(out.find("in_flight    overdue") != std::string::npos);
  const std::size_t mark = out.find("overdue: stuck or dead consumer");
  REQUIRE(mark != std::string::npos);
  CHECK(out.find("overdue: stuck or dead consumer", mark + 1) == std::string::npos);  // one lane only
  const std::size_t row = out.rfind('\n', mark) + 1;
  const std::string line = out.substr(row, mark - row);
  CHECK(line.rfind("    " + std::to_string(lane) + " ", 0) == 0);
  CHECK(line.find("          1          1") != std::string::npos);  // in_flight, overdue

  // Prometheus: one gauge per queue lane, and the document passes the checker.
  REQUIRE(run_shell(tool + " stats " + store_dir + " --prom", &out) == 0);
  const auto d = lanebus::test::parse_prometheus(out);
  for (const auto& e : d.errors) FAIL_CHECK(e);
  CHECK(d.type.count("lanebus_overdue_claims") == 1);
  CHECK(d.type.at("lanebus_overdue_claims") == "gauge");
  auto stuck = d.find("lanebus_overdue_claims", {{"topic", kQueue}, {"group", "queue"}, {"lane", std::to_string(lane)}});
  REQUIRE(stuck.size() == 1);
  CHECK(stuck[0]->value == 1);
  auto calm = d.find("lanebus_overdue_claims", {{"topic", kQueue}, {"group", "queue"}, {"lane", std::to_string(other)}});
  REQUIRE(calm.size() == 1);
  CHECK(calm[0]->value == 0);

  // `lanebus stat` marks the same lane.
  REQUIRE(run_shell(tool + " stat " + store_dir, &out) == 0);
  CHECK(out.find("in_flight      overdue") != std::string::npos);
  CHECK(out.find("overdue: stuck or dead consumer") != std::string::npos);

  // Released, the call's late ack commits (nobody took the message while its
  // claim was ended: the claim's attempt is unchanged), and the store shows
  // nothing overdue.
  gate.open = true;
  const bool settled = lanebus::test::wait_until(
      [&] {
        r = read_queue(tool, store_dir, kQueue);
        return r.found && r.in_flight.size() == kLanes && r.in_flight[lane] == 0 && r.overdue[lane] == 0 &&
               r.lag == 0;
      },
      20s);
  CHECK(settled);
  CHECK(calls.load() >= 1);
  REQUIRE(run_shell(tool + " stats " + store_dir, &out) == 0);
  CHECK(out.find("overdue: stuck or dead consumer") == std::string::npos);
}

namespace {

/// The library's view of the fixture's store: read_store_stats readings added to
/// a MetricsWindow the way `lanebus stats` does (the last two readings; the SLA
/// hold is the reading interval), one reading per entry of `steady_ns`. Returns
/// the snapshot after each reading.
std::vector<MetricsSnapshot> library_view(detail::DurableStore& store, std::optional<SlaPolicy> sla,
                                          const std::vector<std::int64_t>& steady_ns) {
  MetricsOptions mo;
  mo.max_samples = 2;
  mo.window = std::chrono::hours(24 * 365);
  mo.default_sla = sla;
  auto window = MetricsWindow::create(mo).value();
  std::vector<MetricsSnapshot> out;
  for (std::int64_t t : steady_ns) {
    REQUIRE(window.add(detail::read_store_stats(store).value(), t, wall_now()).ok());
    out.push_back(window.snapshot());
  }
  return out;
}

std::string sla_state(const Json& g) { return g["sla"].is_null() ? "none" : g["sla"]["state"].str(); }

}  // namespace

TEST_CASE("lanebus stats and the library's MetricsWindow agree on lag, oldest age and SLA verdicts of one store") {
  Fixture f;
  if (f.tool.empty()) return;
  // A third group that is done: lag 0, so ok under any SLA.
  detail::GroupRef ledger = f.store->open_group(f.topic, "ledger").value();
  REQUIRE(f.store->commit_offset(ledger, 0, 10).ok());
  REQUIRE(f.store->commit_offset(ledger, 1, 4).ok());

  // One reading under two SLAs: 25 s (the 30 s old message breaches it) and 60 s
  // (nothing breached; with one reading billing and audit are unknown, ledger ok).
  for (const int sla_s : {25, 60}) {
    CAPTURE(sla_s);
    const SlaPolicy policy{std::chrono::seconds(sla_s), 0.75, std::chrono::nanoseconds(0)};
    const MetricsSnapshot lib = library_view(*f.store, policy, {kSec}).back();
    std::string out, error;
    REQUIRE(run_shell(f.tool + " stats " + f.store_dir + " --json --sla " + std::to_string(sla_s), &out) == 0);
    auto j = lanebus::test::parse_json(out, &error);
    REQUIRE_MESSAGE(j, error << "\n" << out);
    REQUIRE(run_shell(f.tool + " stats " + f.store_dir + " --prom --sla " + std::to_string(sla_s), &out) == 0);
    const auto prom = lanebus::test::parse_prometheus(out);
    for (const auto& e : prom.errors) FAIL_CHECK(e);

    const TopicMetrics* lt = lib.find_topic("orders");
    REQUIRE(lt);
    const Json& t = (*j)["topics"][0];
    REQUIRE(t["groups"].size() == lt->groups.size());
    for (const GroupMetrics& lg : lt->groups) {
      CAPTURE(lg.name);
      const Json* g = group(t, lg.name);
      REQUIRE(g);
      REQUIRE(lg.sla);
      // The verdict: JSON and Prometheus both say the library's state.
      CHECK(sla_state(*g) == to_string(lg.sla->state));
      auto st = prom.find("lanebus_sla_state", {{"topic", "orders"}, {"group", lg.name}, {"state", to_string(lg.sla->state)}});
      REQUIRE(st.size() == 1);
      CHECK(st[0]->value == 1);
      // Lag, in total and per lane.
      CHECK((*g)["lag"].num() == static_cast<double>(lg.lag));
      for (const GroupLaneMetrics& ll : lg.lanes) {
        CHECK((*g)["lanes"][ll.lane]["lag"].num() == static_cast<double>(ll.lag));
        auto lag = prom.find("lanebus_consumer_lag_messages",
                             {{"topic", "orders"}, {"group", lg.name}, {"lane", std::to_string(ll.lane)}});
        REQUIRE(lag.size() == 1);
        CHECK(lag[0]->value == static_cast<double>(ll.lag));
      }
      // The oldest age: the same message, read a moment apart.
      REQUIRE(lg.oldest_age_seconds);
      CHECK(std::abs((*g)["oldest_age_seconds"].num() - *lg.oldest_age_seconds) < 10.0);
    }
    const std::string want_billing = sla_s == 25 ? "breached" : "unknown";
    CHECK(to_string(lib.find_group("orders", "billing")->sla->state) == want_billing);
    CHECK(to_string(lib.find_group("orders", "audit")->sla->state) == want_billing);
    CHECK(to_string(lib.find_group("orders", "ledger")->sla->state) == std::string("ok"));
  }

  // Under --watch the SLA hold is one interval: a stalled group (messages wait,
  // nothing is committed) is unknown at the first reading (no rate yet), ok at
  // the second (the risk is new) and at_risk from the third, in the CLI and in
  // the library fed the same readings.
  constexpr std::int64_t kInterval = 200'000'000;  // --watch 0.2
  const SlaPolicy watched{std::chrono::seconds(600), 0.75, std::chrono::nanoseconds(kInterval)};
  const auto lib = library_view(*f.store, watched, {kSec, kSec + kInterval, kSec + 2 * kInterval});
  lanebus::test::Child c({f.tool, "stats", f.store_dir, "--json", "--watch", "0.2", "--sla", "600"});
  REQUIRE(c.started());
  for (std::size_t reading = 0; reading < lib.size(); ++reading) {
    CAPTURE(reading);
    std::string error;
    auto j = lanebus::test::parse_json(c.read_line(), &error);
    REQUIRE_MESSAGE(j, error);
    const Json& t = (*j)["topics"][0];
    for (const char* name : {"billing", "audit", "ledger"}) {
      CAPTURE(name);
      const Json* g = group(t, name);
      REQUIRE(g);
      const GroupMetrics* lg = lib[reading].find_group("orders", name);
      REQUIRE(lg);
      REQUIRE(lg->sla);
      CHECK(sla_state(*g) == to_string(lg->sla->state));
      CHECK((*g)["stalled"].boolean() == lg->stalled);
      CHECK((*g)["lag"].num() == static_cast<double>(lg->lag));
    }
  }
  CHECK(to_string(lib[0].find_group("orders", "audit")->sla->state) == std::string("unknown"));
  CHECK(to_string(lib[1].find_group("orders", "audit")->sla->state) == std::string("ok"));
  CHECK(to_string(lib[2].find_group("orders", "audit")->sla->state) == std::string("at_risk"));
  CHECK(to_string(lib[2].find_group("orders", "ledger")->sla->state) == std::string("ok"));
  c.signal(SIGINT);
  CHECK(c.wait() == 0);
}
