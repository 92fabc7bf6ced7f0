// lanebus — MIT License.
// Commit wake across processes (lib/store/commit_wake.hpp, doc/durable.md):
// a consumer process is woken by another process's commit; a consumer killed
// (kill -9) asleep on its wake word, a publisher killed or frozen (SIGSTOP)
// between its bump and its FUTEX_WAKE, hold no other process up. The
// consumers poll only every 10 s, so the wake-ups carry the deliveries; the
// cases assert delivery and the wake count, never timing (the latencies are
// printed). Helper: wake_child.
#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "process.hpp"
#include "temp_dir.hpp"

using lanebus::test::Child;
using lanebus::test::TempDir;
using namespace std::chrono_literals;

namespace {

constexpr const char* kQueue = "wake.jobs";
constexpr const char* kPollMs = "10000";  // the safety net, far beyond the time a case takes

std::string helper() {
  std::string h = lanebus::test::helper_path("LANEBUS_WAKE_CHILD");
  REQUIRE_MESSAGE(!h.empty(), "LANEBUS_WAKE_CHILD is not set (run through meson test)");
  return h;
}

// What one consumer process reported.
struct Seen {
  std::set<std::string> got;  // "NAME:SEQ"
  std::vector<std::uint64_t> latency_us;
  std::int64_t wakes = -1;
  bool closed = false;
};

// Read every line the consumer has written so far (waiting up to `first` for the first one).
void pump(Child& c, Seen& s, std::chrono::milliseconds first = 1ms) {
  for (std::string l = c.read_line(first); !l.empty(); l = c.read_line(1ms)) {
    std::istringstream in(l);
    std::string what;
    in >> what;
    if (what == "got") {
      std::string id;
      std::uint64_t us = 0;
      in >> id >> us;
      CHECK_MESSAGE(s.got.insert(id).second, "delivered twice: " << id);
      s.latency_us.push_back(us);
    } else if (what == "wakes") {
      in >> s.wakes;
    } else if (what == "closed") {
      s.closed = true;
    } else {
      FAIL("consumer: " << l);
    }
  }
}

bool has_all(const Seen& s, const std::string& name, int from, int to) {
  for (int i = from; i < to; ++i) {
    if (!s.got.count(name + ":" + std::to_string(i))) return false;
  }
  return true;
}

// Pump until `done` holds or 60 s pass (a hang guard, not a timing assertion:
// even a lost wake is delivered by the 10 s poll).
template <typename Done>
bool pump_until(Child& c, Seen& s, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!done() && std::chrono::steady_clock::now() < deadline) pump(c, s, 20ms);
  return done();
}

void expect_lines(Child& p, const std::string& name, int count) {
  REQUIRE(p.read_line() == "ready");
  for (int i = 0; i < count; ++i) REQUIRE(p.read_line() == "ack " + name + " " + std::to_string(i));
  REQUIRE(p.read_line() == "sent");
}

void print_latency(const char* what, std::vector<std::uint64_t> v) {
  if (v.empty()) return;
  std::sort(v.begin(), v.end());
  std::printf("%s: %zu deliveries, publish->handler p50 %llu us, max %llu us (printed, not judged)\n", what, v.size(),
              static_cast<unsigned long long>(v[v.size() / 2]), static_cast<unsigned long long>(v.back()));
  std::fflush(stdout);
}

void stop_consumer(Child& c, Seen& s, const std::string& stop_file) {
  std::ofstream(stop_file).put('x');
  REQUIRE(pump_until(c, s, [&] { return s.closed; }));
  CHECK(c.wait() == 0);
}

}  // namespace

TEST_CASE("a consumer process is woken by another process's commits: every message arrives, by wake-ups") {
  const std::string exe = helper();
  TempDir dir;
  const std::string store = dir.file("store"), stop = dir.file("stop");
  Child consumer({exe, "consume", store, kQueue, kPollMs, stop});
  REQUIRE(consumer.read_line() == "ready");
  constexpr int kCount = 200;  // one commit each
  Child publisher({exe, "publish", store, kQueue, "A", std::to_string(kCount), "0", stop});
  expect_lines(publisher, "A", kCount);
  Seen s;
  CHECK(pump_until(consumer, s, [&] { return has_all(s, "A", 0, kCount); }));
  stop_consumer(consumer, s, stop);
  CHECK(publisher.wait() == 0);
  CHECK(s.got.size() == kCount);
  CHECK(s.wakes >= 1);  // the poller was woken by the publisher's commits (its poll is 10 s)
  print_latency("woken consumer", s.latency_us);
}

TEST_CASE("kill -9 of a consumer asleep on its wake word and of a publisher between bump and wake stall no one") {
  const std::string exe = helper();
  TempDir dir;
  const std::string store = dir.file("store"), stop = dir.file("stop");
  // Two competing consumers of one queue group; the first is killed while it
  // sleeps (nothing published yet, so it holds no claim).
  Child doomed({exe, "consume", store, kQueue, kPollMs, stop});
  REQUIRE(doomed.read_line() == "ready");
  Child consumer({exe, "consume", store, kQueue, kPollMs, stop});
  REQUIRE(consumer.read_line() == "ready");
  doomed.signal(SIGKILL);
  CHECK(doomed.wait() == 128 + SIGKILL);
  // A publisher that stops itself between bumping the words and waking their
  // sleepers, and is then killed there: its message is committed, its wake lost.
  Child dying({exe, "publish", store, kQueue, "D", "1", "1", stop});
  REQUIRE(dying.read_line() == "ready");
  REQUIRE(dying.wait_stopped());
  dying.signal(SIGKILL);
  dying.signal(SIGCONT);
  CHECK(dying.wait() == 128 + SIGKILL);
  // Another publisher's commits still wake the surviving consumer.
  constexpr int kCount = 100;
  Child publisher({exe, "publish", store, kQueue, "B", std::to_string(kCount), "0", stop});
  expect_lines(publisher, "B", kCount);
  Seen s;
  CHECK(pump_until(consumer, s, [&] { return has_all(s, "B", 0, kCount) && has_all(s, "D", 0, 1); }));
  stop_consumer(consumer, s, stop);
  CHECK(publisher.wait() == 0);
  CHECK(s.got.size() == kCount + 1);
  CHECK(s.wakes >= 1);
  print_latency("survivor of two kills", s.latency_us);
}

TEST_CASE("a publisher frozen (SIGSTOP) between bump and wake does not hide other publishers' commits") {
  const std::string exe = helper();
  TempDir dir;
  const std::string store = dir.file("store"), stop = dir.file("stop");
  Child consumer({exe, "consume", store, kQueue, kPollMs, stop});
  REQUIRE(consumer.read_line() == "ready");
  Child frozen({exe, "publish", store, kQueue, "F", "3", "1", stop});
  REQUIRE(frozen.read_line() == "ready");
  REQUIRE(frozen.wait_stopped());  // its first message is committed, its wake not sent
  constexpr int kCount = 100;
  Child publisher({exe, "publish", store, kQueue, "B", std::to_string(kCount), "0", stop});
  expect_lines(publisher, "B", kCount);
  Seen s;
  CHECK(pump_until(consumer, s, [&] { return has_all(s, "B", 0, kCount) && has_all(s, "F", 0, 1); }));
  print_latency("consumer beside a frozen publisher", s.latency_us);
  // Thawed, the frozen publisher finishes its own publishes.
  frozen.signal(SIGCONT);
  for (int i = 0; i < 3; ++i) REQUIRE(frozen.read_line() == "ack F " + std::to_string(i));
  REQUIRE(frozen.read_line() == "sent");
  CHECK(pump_until(consumer, s, [&] { return has_all(s, "F", 0, 3); }));
  stop_consumer(consumer, s, stop);
  CHECK(publisher.wait() == 0);
  CHECK(frozen.wait() == 0);
  CHECK(s.got.size() == kCount + 3);
  CHECK(s.wakes >= 1);
}
