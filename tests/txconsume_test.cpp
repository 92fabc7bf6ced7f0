// lanebus — MIT License.
// Transactional consume (SPEC §4): handler writes, outbox publishes, the dedup
// record and the ack commit together — including under kill -9 at random
// moments, with real processes.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "scratch_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::wait_until;
using TempDir = lanebus::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

std::uint64_t env_u64(const char* name, std::uint64_t dflt) {
  const char* v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 10) : dflt;
}

}  // namespace

TEST_CASE("writes, outbox publishes and the ack commit together; retried attempts leave no trace") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path, 5ms)).value();
  auto orders = bus->create_queue("shop.orders", {.lanes = 4, .durable = true}).value();
  auto confirmed = bus->create_topic("shop.confirmed", {.lanes = 2, .durable = true}).value();
  std::atomic<int> outbox_seen{0};
  auto watcher = bus->subscribe(confirmed, "audit", [&](const MessageView&) {
                       ++outbox_seen;
                       return Outcome::ack();
                     }).value();
  std::atomic<int> calls{0};
  auto sub = bus->consume_tx(orders, [&](const MessageView& m, Transaction& tx) {
                    ++calls;
                    auto total = tx.get("stock", "sold");
                    long sold = total.ok() ? std::stol(*total) : 0;
                    REQUIRE((total.ok() || total.code() == Code::NotFound));
                    REQUIRE(tx.put("stock", "sold", std::to_string(sold + 1)).ok());
                    REQUIRE(tx.publish(confirmed, {.key = m.key(), .payload = m.payload()}).ok());
                    // Every first attempt fails after writing: its writes and outbox must vanish.
                    if (m.attempt() == 1) return Outcome::retry("flaky payment gateway");
                    return Outcome::ack();
                  },
                  {.max_attempts = 3})
                 .value();
  constexpr int kOrders = 40;
  for (int i = 0; i < kOrders; ++i)
    REQUIRE(orders.publish({.key = "c" + std::to_string(i % 7), .payload = std::to_string(i)}).ok());
  REQUIRE(wait_until([&] {
    auto v = bus->table_get("stock", "sold");
    return v.ok() && *v == std::to_string(kOrders);
  }));
  REQUIRE(wait_until([&] { return outbox_seen == kOrders; }));
  std::this_thread::sleep_for(50ms);
  CHECK(outbox_seen == kOrders);
  CHECK(calls >= 2 * kOrders);  // more when lanes conflicted on the counter and were retried
  CHECK(bus->table_get("stock", "sold").value() == std::to_string(kOrders));

  SUBCASE("bad input") {
    CHECK(bus->table_get("Bad Table", "k").code() == Code::InvalidName);
    CHECK(bus->table_get("stock", "").code() == Code::InvalidArgument);
    CHECK(bus->table_get("stock", "missing").code() == Code::NotFound);
    auto eph = bus->create_topic("shop.ephemeral").value();
    auto r = bus->subscribe_tx(eph, "g", [](const MessageView&, Transaction&) { return Outcome::ack(); });
    CHECK(r.code() == Code::InvalidArgument);
    CHECK(r.status().message().find("durable") != std::string_view::npos);
    CHECK(bus->consume_tx(confirmed, [](const MessageView&, Transaction&) { return Outcome::ack(); }).code() ==
          Code::InvalidArgument);
  }
}

TEST_CASE("concurrent transactions on one counter from many lanes lose no update") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path, 5ms)).value();
  auto topic = bus->create_topic("votes.cast", {.lanes = 8, .durable = true}).value();
  auto sub = bus->subscribe_tx(topic, "tally", [&](const MessageView&, Transaction& tx) {
                    auto v = tx.get("tally", "votes");
                    long n = v.ok() ? std::stol(*v) : 0;
                    (void)tx.put("tally", "votes", std::to_string(n + 1));
                    return Outcome::ack();
                  }).value();
  constexpr int kVotes = 300;
  for (int i = 0; i < kVotes; ++i) REQUIRE(topic.publish({.key = "voter-" + std::to_string(i), .payload = "x"}).ok());
  REQUIRE(wait_until([&] {
    auto v = bus->table_get("tally", "votes");
    return v.ok() && *v == std::to_string(kVotes);
  }));
  // The counter commits before the worker bumps its `acked` counter: wait for both.
  REQUIRE(wait_until([&] { return bus->stats().topics[0].groups[0].total.acked == kVotes; }));
  auto g = bus->stats().topics[0].groups[0].total;
  MESSAGE("optimistic-concurrency retries: " << g.retried);
  CHECK(g.acked == kVotes);
}

TEST_CASE("kill -9 at random moments: every booking is applied exactly once") {
  const char* child = std::getenv("LANEBUS_TXCONSUME_CHILD");
  REQUIRE_MESSAGE(child != nullptr, "LANEBUS_TXCONSUME_CHILD is not set (run through meson test)");
  const std::uint64_t seed = env_u64("LANEBUS_SEED", std::random_device{}());
  const std::uint64_t cycles = env_u64("LANEBUS_CRASH_CYCLES", 25);
  MESSAGE("txconsume kill loop: LANEBUS_SEED=" << seed << " cycles=" << cycles);
  std::mt19937_64 rng(seed);
  TempDir tmp;
  constexpr int kSeats = 1000, kBookings = 300, kDuplicates = 60;
  {
    auto bus = Bus::open(lanebus::test::store_bus(tmp.path, 5ms)).value();
    auto queue = bus->create_queue("tickets.bookings", {.lanes = 4, .durable = true}).value();
    auto seed_table = bus->create_queue("tickets.setup", {.lanes = 1, .durable = true}).value();
    // Initialise the counter through a transaction.
    std::atomic<bool> ready{false};
    auto init = bus->consume_tx(seed_table, [&](const MessageView&, Transaction& tx) {
                       (void)tx.put("venue", "seats-left", std::to_string(kSeats));
                       ready = true;
                       return Outcome::ack();
                     }).value();
    REQUIRE(seed_table.publish({.key = "init", .payload = "init"}).ok());
    REQUIRE(wait_until([&] { return bus->table_get("venue", "seats-left").ok(); }));
    for (int i = 0; i < kBookings; ++i) {
      std::string id = "booking-" + std::to_string(i);
      REQUIRE(queue.publish({.key = "seat-" + std::to_string(i % 17), .payload = id, .idempotency_key = id}).ok());
    }
    // Forced redeliveries: a producer retry sends some bookings twice.
    for (int i = 0; i < kDuplicates; ++i) {
      std::string id = "booking-" + std::to_string((i * 7) % kBookings);
      REQUIRE(queue.publish({.key = "seat-" + std::to_string(i % 17), .payload = id, .idempotency_key = id}).ok());
    }
    REQUIRE(bus->shutdown(ShutdownMode::Drain, 10s).ok());
  }
  const std::string store = (tmp.path / "store").string();
  const std::string expected = std::to_string(kBookings);
  int kills = 0, finished = 0;
  for (std::uint64_t cycle = 0; cycle < cycles + 200 && finished == 0; ++cycle) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::execl(child, child, store.c_str(), expected.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    bool kill_it = cycle < cycles;
    if (kill_it) {
      std::this_thread::sleep_for(std::chrono::microseconds(2000 + rng() % 60000));
      ::kill(pid, SIGKILL);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status)) {
      REQUIRE_MESSAGE(WEXITSTATUS(status) == 0, "child exited with " << WEXITSTATUS(status));
      finished = 1;
    } else {
      REQUIRE(WIFSIGNALED(status));
      ++kills;
    }
  }
  MESSAGE("killed " << kills << " consumers mid-flight");
  REQUIRE(finished == 1);
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path, 5ms)).value();
  CHECK(bus->table_get("venue", "bookings").value() == std::to_string(kBookings));
  CHECK(bus->table_get("venue", "seats-left").value() == std::to_string(kSeats - kBookings));
  for (int i = 0; i < kBookings; i += 37) {
    std::string id = "booking-" + std::to_string(i);
    CHECK(bus->table_get("booked", id).value() == id);
  }
  CHECK(kills > 0);
}
