// lanebus — MIT License.
// The outage pause (GroupOptions::outage, doc/retries.md "Outage pause"): a
// gateway that is down for a while pauses the group instead of filling the
// DLQ, on ephemeral topics, durable topics and durable queues, and every
// payment is charged exactly once after recovery; a lone poison message among
// healthy ones is still dead-lettered; the pause shows in stats, the exports
// and `lanebus stats`; Bus::resume and `lanebus resume` end it; a durable
// group killed with SIGKILL while paused comes back paused with an empty DLQ;
// the delivery path with the option on allocates nothing.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "alloc_counter.hpp"
#include "lanebus/lanebus.hpp"
#include "lanebus/metrics.hpp"
#include "shell.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::wait_until;

namespace {

// Trips fast and probes often, so the tests run in well under a second of
// outage; the waits below are generous (wait_until), never assertions on time.
// The backoff gives the breaker room: a message's last attempt comes >= 120 ms
// after its first, by when failures of 3 keys are in the window even if the
// publisher is slow (a durable publish per message, a loaded machine).
GroupOptions outage_options(bool on) {
  GroupOptions g;
  g.max_attempts = 3;
  g.backoff_initial = 50ms;
  g.backoff_max = 200ms;
  g.outage.enabled = on;
  g.outage.threshold = 8;
  g.outage.distinct_keys = 3;
  g.outage.window = 10s;
  g.outage.probe_initial = 20ms;
  g.outage.probe_max = 100ms;
  return g;
}

// A payment gateway that can be down; counts each payment's charges.
struct Gateway {
  explicit Gateway(int n) : charged(static_cast<std::size_t>(n)) {}
  std::atomic<bool> down{true};
  std::vector<std::atomic<int>> charged;
  std::atomic<int> total{0};
  Outcome charge(const MessageView& m) {
    if (down.load(std::memory_order_acquire)) return Outcome::retry("gateway unavailable");
    const int id = std::stoi(std::string(m.payload()));
    charged[static_cast<std::size_t>(id)].fetch_add(1);
    total.fetch_add(1);
    return Outcome::ack();
  }
};

const GroupStats* group_of(const BusStats& s, std::string_view topic, std::string_view group) {
  for (const TopicStats& t : s.topics)
    if (t.name == topic)
      for (const GroupStats& g : t.groups)
        if (g.name == group || t.is_queue) return &g;
  return nullptr;
}

bool paused(Bus& bus, std::string_view topic, std::string_view group) {
  const BusStats s = bus.stats();
  const GroupStats* g = group_of(s, topic, group);
  return g != nullptr && g->paused;
}

std::uint64_t dlq_entries(Bus& bus) {
  auto dlq = bus.dead_letters();
  REQUIRE(dlq.ok());
  auto all = (*dlq)->list();
  REQUIRE(all.ok());
  if (all->size() <= 3)
    for (const DlqEntry& e : *all)
      MESSAGE("DLQ entry: " << to_string(e.error_class) << " " << e.topic << " key " << e.key << " attempts "
                            << e.attempts << ": " << e.reason << " (" << e.error_text << ")");
  return all->size();
}

// What a bus said through its log hook (BusOptions::log).
struct LogLines {
  std::mutex mu;
  std::vector<std::pair<LogLevel, std::string>> lines;
  LogHook hook() {
    return [this](LogLevel l, std::string_view m) {
      std::lock_guard g(mu);
      lines.emplace_back(l, std::string(m));
    };
  }
  bool has(LogLevel l, std::string_view part) {
    std::lock_guard g(mu);
    for (const auto& [level, text] : lines)
      if (level == l && text.find(part) != std::string::npos) return true;
    return false;
  }
};

// A bus with a store (so it has a DLQ) in `dir`, two workers.
std::unique_ptr<Bus> open_bus(const std::string& dir, LogLines* log = nullptr) {
  BusOptions bo;
  bo.workers = 2;
  if (log != nullptr) bo.log = log->hook();
  bo.store.directory = dir;
  auto bus = Bus::open(bo);
  REQUIRE(bus.ok());
  return std::move(*bus);
}

enum class Kind { Ephemeral, DurableTopic, DurableQueue };

const char* name_of(Kind k) {
  return k == Kind::Ephemeral ? "ephemeral topic" : k == Kind::DurableTopic ? "durable topic" : "durable queue";
}

Result<Topic> make_topic(Bus& bus, Kind k, std::string_view name) {
  TopicOptions t;
  t.lanes = 8;
  t.durable = k != Kind::Ephemeral;
  return k == Kind::DurableQueue ? bus.create_queue(name, t) : bus.create_topic(name, t);
}

Result<Subscription> attach(Bus& bus, Kind k, const Topic& t, const GroupOptions& o, Handler h) {
  return k == Kind::DurableQueue ? bus.consume(t, std::move(h), o) : bus.subscribe(t, "billing", std::move(h), o);
}

// The gateway scenario on one kind of group: down while payments flow, the
// group pauses, the gateway comes back, every payment is charged once.
void gateway_scenario(Kind kind) {
  INFO(std::string(name_of(kind)));
  lanebus::test::TempDir dir;
  LogLines log;
  auto bus = open_bus(dir.path(), &log);
  auto topic = make_topic(*bus, kind, "payments").value();
  constexpr int kPayments = 600;
  Gateway gw(kPayments);
  auto sub = attach(*bus, kind, topic, outage_options(true), [&](const MessageView& m) { return gw.charge(m); })
                 .value();
  for (int i = 0; i < kPayments; ++i)
    REQUIRE(topic.publish({.key = "acct-" + std::to_string(i % 40), .payload = std::to_string(i)}).ok());
  REQUIRE(wait_until([&] { return paused(*bus, "payments", "billing"); }));
  {
    const BusStats s = bus->stats();
    const GroupStats* g = group_of(s, "payments", "billing");
    REQUIRE(g != nullptr);
    CHECK(g->paused_since_ns > 0);
    CHECK(g->pause_reason.find("transient failures") != std::string::npos);
    CHECK(g->pause_last_error == "gateway unavailable");
    CHECK(g->pauses >= 1);
    CHECK(g->total.failed == 0);
  }
  // Probes go through while paused (and fail).
  REQUIRE(wait_until([&] {
    const BusStats s = bus->stats();
    const GroupStats* g = group_of(s, "payments", "billing");
    return g != nullptr && g->probes >= 2;
  }));
  CHECK(dlq_entries(*bus) == 0);
  gw.down = false;
  REQUIRE(wait_until([&] { return gw.total.load() >= kPayments; }, 60s));
  REQUIRE(wait_until([&] { return !paused(*bus, "payments", "billing"); }));
  // The log hook heard both: the pause (warn, with the last error) and the end of it.
  CHECK(log.has(LogLevel::Warn, "on \"payments\" paused (outage)"));
  CHECK(log.has(LogLevel::Warn, "last error: gateway unavailable"));
  CHECK(log.has(LogLevel::Info, "resumed: a probe succeeded"));
  for (int i = 0; i < kPayments; ++i) CHECK_MESSAGE(gw.charged[static_cast<std::size_t>(i)].load() == 1, "payment " << i);
  CHECK(dlq_entries(*bus) == 0);
  const BusStats s = bus->stats();
  CHECK(group_of(s, "payments", "billing")->total.failed == 0);
}

}  // namespace

TEST_CASE("gateway outage: the group pauses, 0 DLQ entries, every payment charged once after recovery") {
  gateway_scenario(Kind::Ephemeral);
  gateway_scenario(Kind::DurableTopic);
  gateway_scenario(Kind::DurableQueue);
}

TEST_CASE("without the option the same outage dead-letters payments (the control)") {
  lanebus::test::TempDir dir;
  auto bus = open_bus(dir.path());
  // 40 lanes for 40 keys: a payment's three attempts wait out their backoffs
  // (150 ms) behind the payments of its lane only, a handful per lane
  // instead of 25 with 8 lanes (1.6 s for the test instead of 5.3 s).
  auto topic = bus->create_topic("payments", {.lanes = 40}).value();
  constexpr int kPayments = 200;
  Gateway gw(kPayments);
  auto sub = bus->subscribe(topic, "billing", [&](const MessageView& m) { return gw.charge(m); },
                            outage_options(false))
                 .value();
  for (int i = 0; i < kPayments; ++i)
    REQUIRE(topic.publish({.key = "acct-" + std::to_string(i % 40), .payload = std::to_string(i)}).ok());
  REQUIRE(wait_until([&] { return dlq_entries(*bus) == kPayments; }, 60s));
  CHECK(!paused(*bus, "payments", "billing"));
}

TEST_CASE("a lone poison message among healthy ones still goes to the DLQ; the group never pauses") {
  for (Kind kind : {Kind::Ephemeral, Kind::DurableTopic, Kind::DurableQueue}) {
    INFO(std::string(name_of(kind)));
    lanebus::test::TempDir dir;
    auto bus = open_bus(dir.path());
    auto topic = make_topic(*bus, kind, "orders").value();
    GroupOptions o = outage_options(true);
    o.outage.threshold = 3;  // the poison message alone fails max_attempts = 3 times
    o.outage.distinct_keys = 2;
    std::atomic<int> acked{0};
    auto sub = attach(*bus, kind, topic, o, [&](const MessageView& m) {
                 if (m.payload() == "poison") return Outcome::retry("cannot parse");
                 acked.fetch_add(1);
                 return Outcome::ack();
               }).value();
    constexpr int kOrders = 400;
    for (int i = 0; i < kOrders; ++i) {
      const std::string p = i == 150 ? "poison" : "order-" + std::to_string(i);
      REQUIRE(topic.publish({.key = "cust-" + std::to_string(i % 16), .payload = p}).ok());
    }
    REQUIRE(wait_until([&] { return acked.load() == kOrders - 1 && dlq_entries(*bus) == 1; }, 60s));
    auto entries = (*bus->dead_letters())->list().value();
    REQUIRE(entries.size() == 1);
    CHECK(entries[0].payload == "poison");
    CHECK(entries[0].error_class == ErrorClass::Transient);
    CHECK(entries[0].attempts == 3);
    const BusStats s = bus->stats();
    CHECK(group_of(s, "orders", "billing")->pauses == 0);
  }
}

TEST_CASE("a reject is permanent, not an outage: still dead-lettered with the option on") {
  lanebus::test::TempDir dir;
  auto bus = open_bus(dir.path());
  auto topic = bus->create_topic("payments", {.lanes = 8}).value();
  std::atomic<bool> down{true};
  auto sub = bus->subscribe(topic, "billing", [&](const MessageView& m) {
                   if (m.payload() == "bad") return Outcome::reject("invalid card number");
                   return down.load() ? Outcome::retry("gateway unavailable") : Outcome::ack();
                 }, outage_options(true))
                 .value();
  for (int i = 0; i < 40; ++i)
    REQUIRE(topic.publish({.key = "acct-" + std::to_string(i), .payload = "p" + std::to_string(i)}).ok());
  REQUIRE(wait_until([&] { return paused(*bus, "payments", "billing"); }));
  REQUIRE(topic.publish({.key = "acct-x", .payload = "bad"}).ok());
  // Probes reach it sooner or later (it is the only head of its lane that is new).
  down = false;
  REQUIRE(wait_until([&] { return dlq_entries(*bus) == 1; }, 30s));
  auto entries = (*bus->dead_letters())->list().value();
  CHECK(entries[0].error_class == ErrorClass::Permanent);
}

TEST_CASE("the pause shows in stats and both exports; the SLA report calls it at risk; Bus::resume ends it") {
  lanebus::test::TempDir dir;
  auto bus = open_bus(dir.path());
  auto topic = bus->create_topic("payments", {.lanes = 8}).value();
  Gateway gw(100);
  GroupOptions o = outage_options(true);
  o.outage.probe_initial = 60s;  // no probe during the test: only resume ends the pause
  o.outage.probe_max = 60s;
  auto sub = bus->subscribe(topic, "billing", [&](const MessageView& m) { return gw.charge(m); }, o).value();
  for (int i = 0; i < 100; ++i)
    REQUIRE(topic.publish({.key = "acct-" + std::to_string(i % 20), .payload = std::to_string(i)}).ok());
  REQUIRE(wait_until([&] { return paused(*bus, "payments", "billing"); }));

  MetricsOptions mo;
  mo.default_sla = SlaPolicy{.sla = std::chrono::hours(1)};
  auto mon = Monitor::create(*bus, mo).value();
  REQUIRE(mon->sample().ok());
  std::this_thread::sleep_for(2ms);  // the steady clock must advance between samples (not a timing assertion)
  REQUIRE(mon->sample().ok());
  const MetricsSnapshot snap = mon->snapshot();
  REQUIRE(snap.topics.size() == 1);
  const GroupMetrics& gm = snap.topics[0].groups[0];
  CHECK(gm.paused);
  REQUIRE(gm.sla.has_value());
  CHECK(gm.sla->state == SlaState::AtRisk);
  const std::string json = mon->json();
  CHECK(json.find("\"paused\":true") != std::string::npos);
  CHECK(json.find("gateway unavailable") != std::string::npos);
  const std::string prom = mon->prometheus();
  CHECK(prom.find("lanebus_group_paused{") != std::string::npos);
  CHECK(prom.find("group=\"billing\"} 1") != std::string::npos);

  CHECK(bus->resume(topic, "nobody").code() == Code::NotFound);
  CHECK(bus->resume(Topic{}, "billing").code() == Code::InvalidArgument);
  gw.down = false;
  REQUIRE(bus->resume(topic, "billing").ok());
  CHECK(!paused(*bus, "payments", "billing"));
  REQUIRE(wait_until([&] { return gw.total.load() == 100; }, 30s));
  CHECK(dlq_entries(*bus) == 0);
}

TEST_CASE("with the option on, 100k deliveries after warm-up allocate nothing") {
  if (lanebus::test::sanitized()) {
    MESSAGE("allocation counting needs the real malloc; sanitizers replace it: this case only");
    return;
  }
  auto bus = Bus::open({.workers = 2}).value();
  auto topic = bus->create_topic("alloc.outage", {.lanes = 8, .capacity = 8192}).value();
  std::atomic<std::uint64_t> n{0};
  GroupOptions o = outage_options(true);
  o.backoff_initial = 1ms;  // the flaky retries below hold their lane only briefly
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                   // Every 97th message fails once (transient, a lone key: no pause).
                   if (m.attempt() == 1 && m.id() % 97 == 0) return Outcome::retry("flaky");
                   n.fetch_add(1, std::memory_order_relaxed);
                   return Outcome::ack();
                 }, o)
                 .value();
  char payload[64];
  std::memset(payload, 'x', sizeof(payload));
  char key[4] = {'k', '0', '0', 0};
  auto run = [&](int count) {
    const std::uint64_t start = n.load();
    for (int i = 0; i < count; ++i) {
      key[1] = static_cast<char>('0' + (i % 97) / 10);
      key[2] = static_cast<char>('0' + (i % 97) % 10);
      REQUIRE(topic.publish({.key = std::string_view(key, 3), .payload = std::string_view(payload, 64)}).ok());
    }
    REQUIRE(wait_until([&] { return n.load() >= start + static_cast<std::uint64_t>(count); }, 120s));
  };
  run(20'000);  // warm-up
  lanebus::test::alloc_count_reset();
  lanebus::test::alloc_counting(true);
  run(100'000);
  lanebus::test::alloc_counting(false);
  CHECK(lanebus::test::alloc_count() == 0);
  const BusStats s = bus->stats();
  CHECK(group_of(s, "alloc.outage", "g")->pauses == 0);
}

namespace {

std::string tool() {
  const char* t = std::getenv("LANEBUS_TOOL");
  return t != nullptr ? std::string(t) : std::string();
}

// `lanebus stats DIR --json` says the group is paused.
bool cli_says_paused(const std::string& dir) {
  std::string out;
  if (lanebus::test::run_shell(tool() + " stats " + dir + " --json", &out) != 0) return false;
  return out.find("\"paused\":true") != std::string::npos;
}

// The consumer process of the crash test: the gateway is down, the group
// pauses; it runs until the parent kills it with SIGKILL.
[[noreturn]] void paused_consumer(const std::string& dir, Kind kind, int payments) {
  BusOptions bo;
  bo.workers = 2;
  bo.store.directory = dir;
  auto bus = Bus::open(bo);
  if (!bus.ok()) ::_exit(3);
  auto topic = make_topic(**bus, kind, "payments");
  if (!topic.ok()) ::_exit(4);
  for (int i = 0; i < payments; ++i)  // all stored before the consumer starts (the kill may come early)
    if (!topic->publish({.key = "acct-" + std::to_string(i % 40), .payload = std::to_string(i)}).ok()) ::_exit(6);
  GroupOptions o = outage_options(true);
  o.visibility = 500ms;
  auto sub = attach(**bus, kind, *topic, o, [](const MessageView&) { return Outcome::retry("gateway unavailable"); });
  if (!sub.ok()) ::_exit(5);
  for (;;) ::pause();
}

void crash_while_paused(Kind kind) {
  INFO(std::string(name_of(kind)));
  lanebus::test::TempDir dir;
  constexpr int kPayments = 300;
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) paused_consumer(dir.path(), kind, kPayments);
  // The pause is in the store (another process reads it) before the kill.
  const bool seen = wait_until([&] { return cli_says_paused(dir.path()); }, 60s);
  ::kill(pid, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(seen);
  CHECK(WIFSIGNALED(status));
  CHECK(cli_says_paused(dir.path()));  // a dead process's pause stays on record

  auto bus = open_bus(dir.path());
  auto topic = make_topic(*bus, kind, "payments").value();
  Gateway gw(kPayments);
  GroupOptions o = outage_options(true);
  o.visibility = 500ms;
  auto sub = attach(*bus, kind, topic, o, [&](const MessageView& m) { return gw.charge(m); }).value();
  CHECK(paused(*bus, "payments", "billing"));  // back paused, probing
  REQUIRE(wait_until([&] {
    const BusStats s = bus->stats();
    const GroupStats* g = group_of(s, "payments", "billing");
    return g != nullptr && g->probes >= 2;
  }, 30s));
  CHECK(dlq_entries(*bus) == 0);
  gw.down = false;
  const bool all = wait_until([&] { return gw.total.load() >= kPayments; }, 20s);
  if (!all) {
    const BusStats s = bus->stats();
    const GroupStats* g = group_of(s, "payments", "billing");
    MESSAGE("charged " << gw.total.load() << " paused " << g->paused << " probes " << g->probes);
    for (const LaneCounters& l : g->lanes)
      MESSAGE("lane delivered " << l.delivered << " acked " << l.acked << " retried " << l.retried << " lag "
                                << l.in_flight << " failed " << l.failed);
  }
  REQUIRE(all);
  REQUIRE(wait_until([&] { return !paused(*bus, "payments", "billing"); }));
  for (int i = 0; i < kPayments; ++i) CHECK_MESSAGE(gw.charged[static_cast<std::size_t>(i)].load() == 1, "payment " << i);
  CHECK(dlq_entries(*bus) == 0);
  REQUIRE(wait_until([&] { return !cli_says_paused(dir.path()); }));  // the record is gone
}

}  // namespace

TEST_CASE("a durable group killed with SIGKILL while paused comes back paused, probing, with 0 DLQ entries") {
  if (tool().empty()) {
    MESSAGE("LANEBUS_TOOL is not set (tools not built): skipped");
    return;
  }
  crash_while_paused(Kind::DurableTopic);
  crash_while_paused(Kind::DurableQueue);
}

TEST_CASE("lanebus stats shows the pause; lanebus resume ends it in the live process") {
  if (tool().empty()) {
    MESSAGE("LANEBUS_TOOL is not set (tools not built): skipped");
    return;
  }
  lanebus::test::TempDir dir;
  auto bus = open_bus(dir.path());
  auto topic = bus->create_topic("payments", {.lanes = 8, .durable = true}).value();
  Gateway gw(100);
  GroupOptions o = outage_options(true);
  o.outage.probe_initial = 60s;  // only a resume ends this pause
  o.outage.probe_max = 60s;
  auto sub = bus->subscribe(topic, "billing", [&](const MessageView& m) { return gw.charge(m); }, o).value();
  for (int i = 0; i < 100; ++i)
    REQUIRE(topic.publish({.key = "acct-" + std::to_string(i % 20), .payload = std::to_string(i)}).ok());
  REQUIRE(wait_until([&] { return cli_says_paused(dir.path()); }, 30s));
  std::string out;
  CHECK(lanebus::test::run_shell(tool() + " stats " + dir.path(), &out) == 0);
  INFO(out);
  CHECK(lanebus::test::contains(out, "PAUSED (outage)"));
  CHECK(lanebus::test::contains(out, "gateway unavailable"));
  CHECK(lanebus::test::run_shell(tool() + " stats " + dir.path() + " --prom", &out) == 0);
  CHECK(lanebus::test::contains(out, "lanebus_group_paused{topic=\"payments\",group=\"billing\"} 1"));

  CHECK(lanebus::test::run_shell(tool() + " resume " + dir.path() + " payments nobody", &out) == 1);
  CHECK(lanebus::test::contains(out, "not paused"));
  CHECK(lanebus::test::run_shell(tool() + " resume", &out) == 2);
  gw.down = false;
  CHECK(lanebus::test::run_shell(tool() + " resume " + dir.path() + " payments billing", &out) == 0);
  REQUIRE(wait_until([&] { return !paused(*bus, "payments", "billing"); }, 30s));
  REQUIRE(wait_until([&] { return gw.total.load() == 100; }, 30s));
  CHECK(dlq_entries(*bus) == 0);
  CHECK(!cli_says_paused(dir.path()));
}
