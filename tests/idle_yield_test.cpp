// lanebus — MIT License.
// An idle worker's spin gives its CPU away when the bus has as many workers
// as CPUs (Scheduler::yield_when_idle, doc/performance.md "Thirteenth
// round"), and only then. The library is linked statically into this test, so
// the sched_yield defined below is the one its std::this_thread::yield calls
// reach: it counts each call and makes the real system call.
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <doctest/doctest.h>

#include "lanebus/lanebus.hpp"
#include "wait.hpp"

namespace {
std::atomic<unsigned long> g_yields{0};
}  // namespace

extern "C" int sched_yield() noexcept {
  g_yields.fetch_add(1, std::memory_order_relaxed);
  return static_cast<int>(syscall(SYS_sched_yield));
}

using namespace lanebus;
using namespace std::chrono_literals;

namespace {
/// Yields counted while a bus of `workers` sits idle for 150 ms inside its
/// spin (1 s, so no worker parks meanwhile), after it handled one message.
unsigned long idle_yields(std::size_t workers) {
  auto bus = Bus::open({.name = "idle-yield", .workers = workers, .spin = 1s}).value();
  auto topic = bus->create_topic("idle.events").value();
  std::atomic<int> got{0};
  auto sub = bus->subscribe(topic, "g", [&](const MessageView&) {
                   got.fetch_add(1);
                   return Outcome::ack();
                 }).value();
  REQUIRE(topic.publish({.key = "k", .payload = "x"}).ok());
  REQUIRE(lanebus::test::wait_until([&] { return got.load() == 1; }));
  const unsigned long before = g_yields.load();
  std::this_thread::sleep_for(150ms);
  return g_yields.load() - before;
}
}  // namespace

TEST_CASE("a bus with as many workers as CPUs yields the CPU while its workers spin idle") {
  const unsigned cpus = std::thread::hardware_concurrency();
  REQUIRE(cpus > 0);
  const unsigned long yields = idle_yields(cpus);
  MESSAGE("sched_yield calls in 150 ms of idle spinning, " << cpus << " workers on " << cpus << " CPUs: " << yields);
  CHECK(yields > 0);
}

TEST_CASE("a bus with fewer workers than CPUs spins idle without yielding") {
  const unsigned cpus = std::thread::hardware_concurrency();
  if (cpus < 2) {
    MESSAGE("one CPU: every bus has as many workers as CPUs; nothing to check");
    return;
  }
  const unsigned long yields = idle_yields(cpus - 1);
  MESSAGE("sched_yield calls in 150 ms of idle spinning, " << cpus - 1 << " workers on " << cpus << " CPUs: " << yields);
  CHECK(yields == 0);
}
