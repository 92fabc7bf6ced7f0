// lanebus — MIT License.
// An idle worker's spin gives its CPU away when the bus has as many workers
// as CPUs (Scheduler::yield_when_idle, doc/performance.md "Thirteenth
// round"), and only then; and it never does so with a lane taken ("Fourteenth
// round"). The library is linked statically into this test, so the
// sched_yield defined below is the one its std::this_thread::yield calls
// reach: it counts each call and makes the real system call, or, while a
// trap is set, keeps the trapped thread off its CPU the way a preemption
// behind a busy publisher would.
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include <doctest/doctest.h>

#include "lanebus/lanebus.hpp"
#include "wait.hpp"

namespace {
std::atomic<unsigned long> g_yields{0};
// The trap: the thread whose id is g_trap_thread, at its next sched_yield,
// sets g_trapped and sleeps until g_trap_open.
std::atomic<bool> g_trap_armed{false};
std::atomic<std::thread::id> g_trap_thread{};
std::atomic<bool> g_trapped{false};
std::atomic<bool> g_trap_open{false};
}  // namespace

extern "C" int sched_yield() noexcept {
  g_yields.fetch_add(1, std::memory_order_relaxed);
  if (g_trap_armed.load() && g_trap_thread.load() == std::this_thread::get_id()) {
    g_trap_armed.store(false);
    g_trapped.store(true);
    while (!g_trap_open.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return static_cast<int>(syscall(SYS_sched_yield));
}

using namespace lanebus;
using namespace std::chrono_literals;

namespace {
/// A bus of `workers` with a 1 s spin, idle after it handled one message: for
/// that second no worker parks.
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

TEST_CASE("a worker that yields its CPU has no lane taken: another worker delivers the lane's next message") {
  // A worker that yielded inside a run (lingering on the lane it had just
  // emptied) kept the lane from every other worker until it ran again: behind
  // a publisher that never yields, a scheduler tick (4 ms), latency1to1's
  // p99 with two workers. Now an oversubscribed worker ends the run before
  // it yields; the lane is held, and an idle worker steals it. A 5 s spin:
  // the trapped worker reaches a yield long before it could park.
  const unsigned cpus = std::thread::hardware_concurrency();
  if (cpus < 2) {
    MESSAGE("one CPU: one worker, nobody to take over; nothing to check");
    return;
  }
  std::unique_ptr<Bus> bus = Bus::open({.name = "yield-trap", .workers = cpus, .spin = 5s}).value();
  Topic topic = bus->create_topic("trap.events", {.lanes = 1}).value();
  std::atomic<int> got{0};
  std::atomic<std::thread::id> runner{};
  Subscription sub = bus->subscribe(topic, "g", [&](const MessageView&) {
                           runner.store(std::this_thread::get_id());
                           got.fetch_add(1);
                           return Outcome::ack();
                         }).value();
  REQUIRE(topic.publish({.key = "k", .payload = "first"}).ok());
  REQUIRE(lanebus::test::wait_until([&] { return got.load() == 1; }));
  // The worker that ran the lane is caught at its next yield. However this
  // test ends, the trap is disarmed and opened (a later thread may reuse the
  // trapped thread's id).
  g_trap_thread.store(runner.load());
  g_trapped.store(false);
  g_trap_open.store(false);
  g_trap_armed.store(true);
  struct Disarm {
    ~Disarm() {
      g_trap_armed.store(false);
      g_trap_open.store(true);
    }
  } disarm;
  REQUIRE(lanebus::test::wait_until([&] { return g_trapped.load(); }));
  // Same key, same lane, while that worker is off its CPU.
  REQUIRE(topic.publish({.key = "k", .payload = "second"}).ok());
  const bool delivered = lanebus::test::wait_until([&] { return got.load() == 2; }, 5s);
  const bool by_other = runner.load() != g_trap_thread.load();
  g_trap_open.store(true);
  CHECK(delivered);
  CHECK(by_other);
  REQUIRE(lanebus::test::wait_until([&] { return got.load() == 2; }));
  CHECK(sub.close().ok());
}

TEST_CASE("closing a subscription does not wait out a worker lingering on its emptied lane") {
  // A worker that empties a lane lingers on it for up to BusOptions::spin,
  // and close() waits for the run to end. The linger used to watch only the
  // bus's closing, so close() took up to the whole spin (here 30 s).
  const unsigned cpus = std::thread::hardware_concurrency();
  // Fewer workers than CPUs where there are two: the linger lasts the spin
  // (an oversubscribed worker ends it after 64 PAUSEs anyway).
  std::unique_ptr<Bus> bus = Bus::open({.name = "linger-close", .workers = 1, .spin = 30s}).value();
  Topic topic = bus->create_topic("linger.events", {.lanes = 1}).value();
  std::atomic<int> got{0};
  Subscription sub = bus->subscribe(topic, "g", [&](const MessageView&) {
                           got.fetch_add(1);
                           return Outcome::ack();
                         }).value();
  REQUIRE(topic.publish({.key = "k", .payload = "x"}).ok());
  REQUIRE(lanebus::test::wait_until([&] { return got.load() == 1; }));
  std::atomic<bool> closed{false};
  auto closing = std::async(std::launch::async, [&] {
    Status st = sub.close();
    closed.store(true);
    return st;
  });
  CHECK(lanebus::test::wait_until([&] { return closed.load(); }, 10s));
  MESSAGE(cpus << " CPUs; close() returned: " << closed.load());
  CHECK(closing.get().ok());
}
