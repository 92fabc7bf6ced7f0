// lanebus — MIT License.
// The log hook (BusOptions::log, lanebus/log.hpp): a recording hook sees each
// event class, each caused for real — a stuck handler, a store at
// map_size_max, a DLQ quota refusal, a namespace at its publish ceiling, an
// idempotency claim of a process killed with kill -9 — at most once a second
// per source; no hook is silent; the hot path never calls it; a throwing hook
// is harmless. (Bridge lines: bridge_test.cpp; allocations: alloc_test.cpp.)
#include <doctest/doctest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "log.hpp"
#include "process.hpp"
#include "scratch_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::wait_until;
using TempDir = lanebus::test::ScratchDir;

namespace {

/// Every line the hook was given. Thread-safe (the hook runs on lanebus threads).
struct Recorder {
  std::mutex mu;
  std::vector<std::pair<LogLevel, std::string>> lines;
  std::atomic<std::uint64_t> calls{0};

  LogHook hook() {
    return [this](LogLevel level, std::string_view message) {
      calls.fetch_add(1);
      std::lock_guard l(mu);
      lines.emplace_back(level, std::string(message));
    };
  }
  /// Lines at `level` that contain every one of `parts`.
  std::size_t count(LogLevel level, std::initializer_list<std::string_view> parts) {
    std::lock_guard l(mu);
    std::size_t n = 0;
    for (const auto& [lv, text] : lines) {
      bool all = lv == level;
      for (std::string_view p : parts) all = all && text.find(p) != std::string::npos;
      n += all ? 1 : 0;
    }
    return n;
  }
  bool has(LogLevel level, std::initializer_list<std::string_view> parts) { return count(level, parts) > 0; }
  std::string dump() {
    std::lock_guard l(mu);
    std::string out;
    for (const auto& [lv, text] : lines) out += std::string(to_string(lv)) + ": " + text + "\n";
    return out;
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("LogLimiter lets one line a second through and counts the suppressed repeats") {
  detail::LogLimiter lim;
  std::uint64_t suppressed = 99;
  CHECK(lim.admit(5'000'000'000, &suppressed));
  CHECK(suppressed == 0);
  CHECK_FALSE(lim.admit(5'000'000'001, &suppressed));
  CHECK_FALSE(lim.admit(5'500'000'000, &suppressed));
  CHECK_FALSE(lim.admit(5'999'999'999, &suppressed));
  CHECK(lim.admit(6'000'000'000, &suppressed));
  CHECK(suppressed == 3);
  CHECK_FALSE(lim.admit(6'000'000'001, &suppressed));
}

TEST_CASE("Logger prefixes the bus name, truncates long lines, notes suppressed repeats and drops hook exceptions") {
  Recorder rec;
  detail::Logger log(rec.hook(), "orders");
  CHECK(log.enabled());
  log.log(LogLevel::Info, "hello %d", 42);
  const std::string long_text(5000, 'x');
  log.log(LogLevel::Warn, "%s", long_text.c_str());
  detail::LogLimiter lim;
  log.limited(lim, LogLevel::Error, "first");
  for (int i = 0; i < 10; ++i) log.limited(lim, LogLevel::Error, "repeat");  // within the same second
  {
    std::lock_guard l(rec.mu);
    REQUIRE(rec.lines.size() == 3);
    CHECK(rec.lines[0].first == LogLevel::Info);
    CHECK(rec.lines[0].second == "bus \"orders\": hello 42");
    CHECK(rec.lines[1].second.size() == detail::Logger::kMaxLine - 1);
    CHECK(rec.lines[2].second == "bus \"orders\": first");
  }
  detail::Logger silent;
  CHECK_FALSE(silent.enabled());
  silent.log(LogLevel::Error, "nobody hears this");
  detail::Logger thrower([](LogLevel, std::string_view) { throw std::runtime_error("hook failed"); }, "b");
  thrower.log(LogLevel::Error, "dropped");  // must not throw
  CHECK(std::string(to_string(LogLevel::Debug)) == "debug");
  CHECK(std::string(to_string(LogLevel::Info)) == "info");
  CHECK(std::string(to_string(LogLevel::Warn)) == "warn");
  CHECK(std::string(to_string(LogLevel::Error)) == "error");
}

TEST_CASE("a handler stuck past attempt_timeout is reported at warn, naming the group, topic and lane") {
  Recorder rec;
  BusOptions o;
  o.workers = 2;
  o.name = "stuck-bus";
  o.log = rec.hook();
  auto bus = Bus::open(o).value();
  auto topic = bus->create_topic("ops.slow", {.lanes = 1}).value();
  std::atomic<bool> release{false};
  auto sub = bus->subscribe(topic, "slowpoke", [&](const MessageView&) {
                  // Held until the watchdog has reported the call.
                  wait_until([&] { return release.load(); }, 30s);
                  return Outcome::ack();
                }, {.attempt_timeout = 20ms}).value();
  REQUIRE(topic.publish({.key = "k", .payload = "p"}).ok());
  const bool seen = wait_until(
      [&] { return rec.has(LogLevel::Warn, {"bus \"stuck-bus\"", "group \"slowpoke\"", "\"ops.slow\" lane 0",
                                            "past attempt_timeout (20 ms)"}); },
      10s);
  release = true;
  CHECK_MESSAGE(seen, rec.dump());
  CHECK(rec.count(LogLevel::Warn, {"past attempt_timeout"}) == 1);  // one call, one line
}

TEST_CASE("without a hook the bus is silent and works; a throwing hook does not disturb it") {
  BusOptions quiet;
  CHECK_FALSE(static_cast<bool>(quiet.log));
  std::atomic<int> thrown{0};
  BusOptions loud;
  loud.log = [&](LogLevel, std::string_view) {
    thrown.fetch_add(1);
    throw std::runtime_error("the hook fails");
  };
  for (BusOptions* o : {&quiet, &loud}) {
    o->workers = 2;
    auto bus = Bus::open(*o).value();
    auto topic = bus->create_topic("ops.quiet", {.lanes = 2}).value();
    std::atomic<int> handled{0};
    std::atomic<bool> release{false};
    auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                    if (m.key() == "slow") wait_until([&] { return release.load(); }, 30s);
                    handled.fetch_add(1);
                    return Outcome::ack();
                  }, {.attempt_timeout = 20ms}).value();
    REQUIRE(topic.publish({.key = "slow", .payload = "p"}).ok());
    auto stuck = [&] {
      auto st = bus->stats();
      for (const auto& t : st.topics)
        for (const auto& g : t.groups)
          for (const auto& l : g.lanes)
            if (l.stuck > 0) return true;
      return false;
    };
    CHECK(wait_until(stuck, 10s));  // the event happened either way
    release = true;
    for (int i = 0; i < 100; ++i) REQUIRE(topic.publish({.key = "k" + std::to_string(i), .payload = "p"}).ok());
    CHECK(wait_until([&] { return handled.load() == 101; }));
  }
  CHECK(thrown.load() == 1);  // the loud bus's stuck line, its exception dropped
}

TEST_CASE("100k publishes and deliveries with a hook installed never call it") {
  Recorder rec;
  TempDir tmp;
  BusOptions o = lanebus::test::store_bus(tmp.path);
  o.log = rec.hook();
  auto bus = Bus::open(o).value();
  auto topic = bus->create_topic("hot.events", {.lanes = 8, .capacity = 8192}).value();
  auto queue = bus->create_queue("hot.jobs", {.lanes = 4, .durable = true}).value();
  std::atomic<std::uint64_t> got{0}, jobs{0};
  auto sub = bus->subscribe(topic, "g", [&](const MessageView&) {
                  got.fetch_add(1, std::memory_order_relaxed);
                  return Outcome::ack();
                }).value();
  auto con = bus->consume(queue, [&](const MessageView&) {
                  jobs.fetch_add(1, std::memory_order_relaxed);
                  return Outcome::ack();
                }).value();
  Publisher pub = bus->publisher();
  constexpr int kMessages = 100'000;
  for (int i = 0; i < kMessages; ++i) {
    const char key[2] = {static_cast<char>('a' + i % 26), 0};
    REQUIRE(pub.publish(topic, {.key = std::string_view(key, 1), .payload = "payload"}).ok());
    if (i % 100 == 0) REQUIRE(queue.publish({.key = std::string_view(key, 1), .payload = "job"}).ok());
  }
  REQUIRE(wait_until([&] { return got.load() == kMessages && jobs.load() == kMessages / 100; }, 60s));
  CHECK_MESSAGE(rec.calls.load() == 0, rec.dump());
}

TEST_CASE("a store at map_size_max reports its refused appends at error, at most once a second") {
  Recorder rec;
  TempDir tmp;
  BusOptions o = lanebus::test::store_bus(tmp.path);
  o.log = rec.hook();
  o.store.durability = Durability::Async;
  o.store.map_size_initial = 1 << 20;
  o.store.map_size_max = 1 << 20;
  auto bus = Bus::open(o).value();
  auto topic = bus->create_topic("fill.up", {.lanes = 1, .durable = true}).value();
  const std::string payload(4000, 'x');
  const auto t0 = std::chrono::steady_clock::now();
  int refused = 0;
  Status last;
  for (int i = 0; i < 5000 && refused < 200; ++i) {
    Status s = topic.publish({.key = "k", .payload = payload});
    if (!s.ok()) {
      last = s;
      ++refused;
    }
  }
  const double elapsed = seconds_since(t0);
  REQUIRE_MESSAGE(refused == 200, last.to_string());
  CHECK(last.code() == Code::MapFull);
  const std::size_t lines = rec.count(LogLevel::Error, {"store \"", "failed", "MapFull"});
  INFO(rec.dump());
  CHECK(lines >= 1);
  // 200 refusals in `elapsed` seconds: one line a second at most (plus the first).
  CHECK(static_cast<double>(lines) <= elapsed + 2);
  MESSAGE("200 refused appends in " << elapsed << " s gave " << lines << " log line(s):\n" << rec.dump());
}

TEST_CASE("a DLQ quota refusal is reported with the count and the quota") {
  Recorder rec;
  TempDir tmp;
  BusOptions o = lanebus::test::store_bus(tmp.path);
  o.log = rec.hook();
  o.dlq.max_entries = 1;
  auto bus = Bus::open(o).value();
  auto queue = bus->create_queue("dlq.work", {.lanes = 1, .durable = true}).value();
  auto con = bus->consume(queue, [](const MessageView&) { return Outcome::reject("bad input"); }).value();
  for (int i = 0; i < 3; ++i) REQUIRE(queue.publish({.key = "k", .payload = "m" + std::to_string(i)}).ok());
  const bool seen = wait_until(
      [&] { return rec.has(LogLevel::Warn, {"the DLQ refused", "over its quota", "max_entries 1"}); }, 20s);
  CHECK_MESSAGE(seen, rec.dump());
}

TEST_CASE("a namespace at its publish quota ceiling is reported by the ticker with the refused count") {
  Recorder rec;
  BusOptions o;
  o.workers = 1;
  o.log = rec.hook();
  auto bus = Bus::open(o).value();
  NamespacePolicy tight;
  tight.publish = {.msgs_per_s = 1, .bytes_per_s = 0, .burst_s = 0.01};
  REQUIRE(bus->namespaces()->create("tight", tight).ok());
  auto topic = bus->create_topic("tight.events", {.backpressure = Backpressure::FailFast}).value();
  const auto t0 = std::chrono::steady_clock::now();
  int refused = 0;
  for (int i = 0; i < 10'000; ++i) refused += topic.try_publish({.key = "k", .payload = "x"}).code() == Code::QuotaExceeded;
  REQUIRE(refused > 9'000);
  const bool seen = wait_until(
      [&] { return rec.has(LogLevel::Warn, {"namespace \"tight\"", "publish quota ceiling", "refused with QuotaExceeded"}); },
      10s);
  CHECK_MESSAGE(seen, rec.dump());
  const double elapsed = seconds_since(t0);
  const std::size_t lines = rec.count(LogLevel::Warn, {"namespace \"tight\""});
  CHECK(static_cast<double>(lines) <= elapsed + 2);  // the ticker's pace: one a second
  MESSAGE(refused << " refusals gave " << lines << " line(s) in " << elapsed << " s");
}

TEST_CASE("an idempotency claim of a process killed with kill -9 is taken over and reported") {
  const char* child = std::getenv("LANEBUS_IDEMPOTENCY_CHILD");
  REQUIRE_MESSAGE(child != nullptr, "LANEBUS_IDEMPOTENCY_CHILD is not set (run through meson test)");
  Recorder rec;
  TempDir tmp;
  BusOptions o = lanebus::test::store_bus(tmp.path);
  o.log = rec.hook();
  auto bus = Bus::open(o).value();
  IdempotencyTable* t = bus->idempotency("race", {.claim_timeout = 5min}).value();
  lanebus::test::Child c({child, (tmp.path / "store").string(), "hold", "payment-7"});
  REQUIRE(c.started());
  REQUIRE(c.read_line() == "Claimed");
  const std::string pid = std::to_string(c.pid());
  // Negative control: a live owner's claim is neither taken nor reported.
  CHECK(t->claim("payment-7").value().state == ClaimState::InProgress);
  CHECK(rec.calls.load() == 0);
  c.signal(SIGKILL);
  CHECK(c.wait() == 128 + SIGKILL);
  CHECK(t->claim("payment-7").value().state == ClaimState::Claimed);
  CHECK_MESSAGE(rec.has(LogLevel::Warn, {"idempotency scope \"race\"", "key \"payment-7\"", "process " + pid,
                                         "which is dead: claim taken over"}),
                rec.dump());
}
