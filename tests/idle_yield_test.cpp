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
#include <memory>
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
/// A bus of `workers` with a 1 s spin, idle after it handled one message: for
/// that second no worker parks. (Not longer: the subscription's close waits
/// for a worker lingering on the emptied lane, for up to the spin.)
struct IdleBus {
  std::unique_ptr<Bus> bus;
  Topic topic;
  std::atomic<int> got{0};
  Subscription sub;
  explicit IdleBus(std::size_t workers)
      : bus(Bus::open({.name = "idle-yield", .workers = workers, .spin = 1s}).value()),
        topic(bus->create_topic("idle.events").value()),
        sub(bus->subscribe(topic, "g", [this](const MessageView&) {
                  got.fetch_add(1);
                  return Outcome::ack();
                }).value()) {
    REQUIRE(topic.publish({.key = "k", .payload = "x"}).ok());
    REQUIRE(lanebus::test::wait_until([&] { return got.load() == 1; }));
  }
};
}  // namespace

TEST_CASE("a bus with as many workers as CPUs yields the CPU while its workers spin idle") {
  const unsigned cpus = std::thread::hardware_concurrency();
  REQUIRE(cpus > 0);
  IdleBus idle(cpus);
  const unsigned long before = g_yields.load();
  // A condition, not a window: on a loaded machine the workers may wait for a
  // CPU first (they spin, and so yield, for the first second).
  CHECK(lanebus::test::wait_until([&] { return g_yields.load() > before; }));
  MESSAGE(cpus << " workers on " << cpus << " CPUs: " << g_yields.load() - before << " sched_yield calls so far");
}

TEST_CASE("a bus with fewer workers than CPUs spins idle without yielding") {
  const unsigned cpus = std::thread::hardware_concurrency();
  if (cpus < 2) {
    MESSAGE("one CPU: every bus has as many workers as CPUs; nothing to check");
    return;
  }
  IdleBus idle(cpus - 1);
  const unsigned long before = g_yields.load();
  // An absence needs a window: 150 ms of idle spinning (within the 1 s spin).
  std::this_thread::sleep_for(150ms);
  const unsigned long yields = g_yields.load() - before;
  MESSAGE((cpus - 1) << " workers on " << cpus << " CPUs: " << yields << " sched_yield calls in 150 ms");
  CHECK(yields == 0);
}
