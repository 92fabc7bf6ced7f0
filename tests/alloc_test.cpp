// lanebus — MIT License.
// Zero allocation on the hot path (SPEC §2): after warm-up, 100,000 publishes
// and their deliveries (fan-out to two groups, and a queue) allocate nothing;
// neither do the hot-path failures.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>

#include "alloc_counter.hpp"
#include "lanebus/lanebus.hpp"
#include "wait.hpp"

using namespace lanebus;
using lanebus::test::wait_until;

namespace {
constexpr int kMessages = 100'000;
}

TEST_CASE("100k publishes and deliveries after warm-up allocate nothing") {
  lanebus::test::skip_if_sanitized();
  auto bus = Bus::open({.workers = 2}).value();
  auto topic = bus->create_topic("alloc.events", {.lanes = 8, .capacity = 8192}).value();
  auto queue = bus->create_queue("alloc.jobs", {.lanes = 4, .capacity = 8192}).value();
  std::atomic<std::uint64_t> a{0}, b{0}, q{0}, bytes{0};
  auto sa = bus->subscribe(topic, "a", [&](const MessageView& m) {
                  bytes.fetch_add(m.payload().size(), std::memory_order_relaxed);
                  a.fetch_add(1, std::memory_order_relaxed);
                  return Outcome::ack();
                }).value();
  auto sb = bus->subscribe(topic, "b", [&](const MessageView&) {
                  b.fetch_add(1, std::memory_order_relaxed);
                  return Outcome::ack();
                }).value();
  auto sq1 = bus->consume(queue, [&](const MessageView&) {
                   q.fetch_add(1, std::memory_order_relaxed);
                   return Outcome::ack();
                 }).value();
  auto sq2 = bus->consume(queue, [&](const MessageView&) {
                   q.fetch_add(1, std::memory_order_relaxed);
                   return Outcome::ack();
                 }).value();
  Publisher pub = bus->publisher();
  char key[16];
  char payload[64];
  std::memset(payload, 'x', sizeof(payload));

  auto run = [&](int n, std::uint64_t base) {
    for (int i = 0; i < n; ++i) {
      int k = i % 97;
      key[0] = 'k';
      key[1] = static_cast<char>('0' + k / 10);
      key[2] = static_cast<char>('0' + k % 10);
      std::string_view ks(key, 3);
      std::string_view ps(payload, sizeof(payload));
      Status s = (i % 2) ? pub.publish(topic, {.key = ks, .payload = ps}) : topic.publish({.key = ks, .payload = ps});
      REQUIRE(s.ok());
      REQUIRE(queue.publish({.key = ks, .payload = ps}).ok());
    }
    REQUIRE(wait_until([&] { return a.load() == base + n && b.load() == base + n && q.load() == base + n; }));
  };

  run(20'000, 0);  // warm-up: moodycamel producers, thread-locals, first-touch
  lanebus::test::alloc_counting(true);
  run(kMessages, 20'000);
  // Hot-path failures allocate nothing either.
  static char big_bytes[300] = {'x'};
  std::string_view big(big_bytes, sizeof(big_bytes));
  bool too_large = topic.publish({.key = "k", .payload = big}).code() == Code::PayloadTooLarge;
  bool empty = topic.publish({.key = "k", .payload = ""}).code() == Code::InvalidArgument;
  lanebus::test::alloc_counting(false);
  std::uint64_t allocs = lanebus::test::alloc_count();
  INFO("allocations during 100k publishes + 300k deliveries: " << allocs);
  CHECK(allocs == 0);
  CHECK(too_large);
  CHECK(empty);
  CHECK(bytes.load() == (20'000ull + kMessages) * sizeof(payload));
}

TEST_CASE("a full fail-fast topic refuses without allocating") {
  lanebus::test::skip_if_sanitized();
  auto bus = Bus::open({.workers = 1}).value();
  auto topic = bus->create_topic("alloc.full", {.lanes = 1, .backpressure = Backpressure::FailFast, .capacity = 4})
                   .value();
  std::atomic<bool> gate{false};
  auto sub = bus->subscribe(topic, "g", [&](const MessageView&) {
                   while (!gate.load()) std::this_thread::yield();
                   return Outcome::ack();
                 }).value();
  int accepted = 0;
  while (topic.publish({.key = "k", .payload = "p"}).ok()) ++accepted;
  lanebus::test::alloc_counting(true);
  std::uint64_t before = lanebus::test::alloc_count();
  for (int i = 0; i < 10'000; ++i) CHECK(topic.try_publish({.key = "k", .payload = "p"}).code() == Code::WouldBlock);
  std::uint64_t after = lanebus::test::alloc_count();
  lanebus::test::alloc_counting(false);
  CHECK(accepted == 4);
  CHECK(after - before == 0);
  gate = true;
}
