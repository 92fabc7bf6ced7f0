// lanebus — MIT License.
// Transactional consume (doc/idempotency.md): handler writes, outbox publishes, the dedup
// record and the ack commit together — including under kill -9 at random
// moments, with real processes.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "scratch_dir.hpp"
#include "seed.hpp"
#include "sizes.hpp"
#include "txconsume_probe.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::wait_until;
using TempDir = lanebus::test::ScratchDir;
using lanebus::test::TxProbe;
namespace fs = std::filesystem;

namespace {

pid_t spawn(const char* exe, const std::vector<std::string>& args) {
  pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv{const_cast<char*>(exe)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(exe, argv.data());
    ::_exit(127);
  }
  return pid;
}

// The TxProbe file shared with txconsume_child (MAP_SHARED): still readable
// after the child is killed, showing what it was doing when it died.
class ProbeFile {
 public:
  explicit ProbeFile(const fs::path& path) : path_(path.string()) {
    int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return;
    if (::ftruncate(fd, sizeof(TxProbe)) == 0) {
      void* p = ::mmap(nullptr, sizeof(TxProbe), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) probe_ = static_cast<TxProbe*>(p);
    }
    ::close(fd);
  }
  ~ProbeFile() {
    if (probe_ != nullptr) ::munmap(probe_, sizeof(TxProbe));
  }
  ProbeFile(const ProbeFile&) = delete;
  ProbeFile& operator=(const ProbeFile&) = delete;
  TxProbe* get() const { return probe_; }
  const std::string& path() const { return path_; }
  /// Zero every word (between children only: no child maps it then).
  void reset() { std::memset(static_cast<void*>(probe_), 0, sizeof(TxProbe)); }
  static std::uint32_t load(const std::uint32_t& v) {
    return std::atomic_ref<std::uint32_t>(const_cast<std::uint32_t&>(v)).load();
  }
  static void set(std::uint32_t& v, std::uint32_t x) { std::atomic_ref<std::uint32_t>(v).store(x); }

 private:
  std::string path_;
  TxProbe* probe_ = nullptr;
};

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
  const std::uint64_t seed = lanebus::test::test_seed("txconsume kill loop");
  const std::uint64_t cycles = lanebus::test::env_size("LANEBUS_CRASH_CYCLES", 25);
  const auto loop_start = std::chrono::steady_clock::now();
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
  ProbeFile probe(tmp.path / "probe");
  REQUIRE(probe.get() != nullptr);
  // The parent's own bus on the store (no consumers): reads committed state at
  // kill time and at the end. One env per process, so it is the only one here.
  auto obs_options = lanebus::test::store_bus(tmp.path, 5ms);
  obs_options.workers = 1;
  auto observer = Bus::open(obs_options).value();
  auto committed = [&](std::uint32_t tag) {
    return observer->table_get("booked", "booking-" + std::to_string(tag - 1)).ok();
  };

  // Each cycle starts a consumer and kills it, at a moment chosen by the seed:
  //  - random-time: 2..60 ms after the start (anywhere: open, claim, handler, commit);
  //  - after-entries: as soon as it has entered its k-th handler call (k = 1..8);
  //  - held: its k-th handler call blocks for good, holding its transaction
  //    and idempotency claim; killed while it is inside (in flight by construction).
  // After the kill the probe tells whether a transaction was in flight: a
  // handler call running, or a call that returned ack whose commit is not in
  // the store.
  const std::string kModeName[] = {"random-time", "after-entries", "held"};
  int kills = 0, kills_in_handler = 0, kills_commit_pending = 0, kills_in_flight = 0;
  int mode_kills[3] = {0, 0, 0}, mode_in_flight[3] = {0, 0, 0};
  bool drained_early = false, stalled = false;
  for (std::uint64_t cycle = 0; cycle < cycles; ++cycle) {
    int mode = static_cast<int>(rng() % 3);
    if (cycle + 1 == cycles && mode_kills[2] == 0) mode = 2;  // at least one held kill per run
    const std::uint32_t k = 1 + static_cast<std::uint32_t>(rng() % 8);
    const auto random_delay = std::chrono::microseconds(2000 + rng() % 58000);
    probe.reset();
    if (mode == 2) probe.set(probe.get()->hold_at, k);
    pid_t pid = spawn(child, {store, expected, probe.path()});
    REQUIRE(pid > 0);
    int status = 0;
    bool exited = false;
    if (mode == 0) {
      std::this_thread::sleep_for(random_delay);  // the nemesis' seeded moment, not a wait for a condition
      exited = ::waitpid(pid, &status, WNOHANG) == pid;
    } else {
      // Bounded: a consumer that enters no handler for 20 s is stalled (the
      // queue is far from drained), which the final liveness check reports.
      bool reached = wait_until(
          [&] {
            if (::waitpid(pid, &status, WNOHANG) == pid) return exited = true;
            return mode == 2 ? probe.load(probe.get()->held) != 0 : probe.load(probe.get()->entered) >= k;
          },
          20s);
      if (!reached) stalled = true;
    }
    if (!exited) {
      ::kill(pid, SIGKILL);
      REQUIRE(::waitpid(pid, &status, 0) == pid);
    }
    if (WIFEXITED(status)) {
      REQUIRE_MESSAGE(WEXITSTATUS(status) == 0, "child exited with " << WEXITSTATUS(status));
      drained_early = true;  // it finished the queue before the kill: nothing left to kill
      break;
    }
    REQUIRE(WIFSIGNALED(status));
    ++kills;
    ++mode_kills[mode];
    bool in_handler = false, commit_pending = false;
    const TxProbe* p = probe.get();
    for (std::uint32_t s = 0; s < TxProbe::kSlots; ++s) {
      if (probe.load(p->inside[s]) != 0) in_handler = true;
      if (std::uint32_t tag = probe.load(p->returned_ack[s]); tag != 0 && !committed(tag)) commit_pending = true;
    }
    kills_in_handler += in_handler;
    kills_commit_pending += commit_pending && !in_handler;
    if (in_handler || commit_pending) {
      ++kills_in_flight;
      ++mode_in_flight[mode];
    }
    if (stalled) {
      MESSAGE("cycle " << cycle << " (" << kModeName[mode] << ", k=" << k << "): the consumer entered "
                       << probe.load(p->entered) << " handler calls in 20 s and was killed; ending the kill loop");
      break;
    }
  }
  MESSAGE("seed=" << seed << " cycles=" << cycles << " kills=" << kills << " kills_in_flight=" << kills_in_flight
                  << " (in handler " << kills_in_handler << ", ack returned but commit not stored "
                  << kills_commit_pending << ") by mode: random-time " << mode_in_flight[0] << "/" << mode_kills[0]
                  << ", after-entries " << mode_in_flight[1] << "/" << mode_kills[1] << ", held "
                  << mode_in_flight[2] << "/" << mode_kills[2] << std::string(drained_early ? "; the queue drained early" : ""));

  // Liveness: after the last kill a consumer left alone drains the queue
  // (a dead consumer's claims must not hold it up). 60 s is far above what a
  // loaded CI machine needs; it turns a hang into a failure with a diagnosis.
  constexpr auto kDrainBound = 60s;
  double drain_s = 0;
  bool finished = drained_early;
  if (!drained_early) {
    probe.reset();
    const auto t0 = std::chrono::steady_clock::now();
    pid_t pid = spawn(child, {store, expected, probe.path()});
    REQUIRE(pid > 0);
    int status = 0;
    finished = wait_until([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, kDrainBound);
    drain_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!finished) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      auto idem = observer->idempotency("tickets").value();
      int in_progress = 0;
      std::string examples;
      for (int i = 0; i < kBookings; ++i) {
        auto st = idem->status("booking-" + std::to_string(i));
        if (st.ok() && st->state == ClaimState::InProgress) {
          if (in_progress++ < 5) examples += " booking-" + std::to_string(i);
        }
      }
      auto n = observer->table_get("venue", "bookings");
      FAIL_CHECK("the consumer started after the last kill did not drain in " << drain_s << " s: "
                 << (n.ok() ? *n : std::string("no")) << "/" << kBookings << " bookings stored, " << in_progress
                 << " idempotency keys still in progress:" << examples);
    } else {
      REQUIRE_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "final child status " << status);
    }
  }
  MESSAGE("drain after the last kill: " << drain_s << " s (bound " << kDrainBound.count() << " s)");
  MESSAGE("{\"test\":\"txconsume_kill_loop\",\"seed\":" << seed << ",\"cycles\":" << cycles << ",\"kills\":" << kills
          << ",\"kills_in_flight\":" << kills_in_flight << ",\"kills_in_handler\":" << kills_in_handler
          << ",\"drain_s\":" << drain_s << ",\"drained\":" << std::string(finished ? "true" : "false") << "}");
  lanebus::test::print_figures("txconsume_kill_loop", static_cast<std::uint64_t>(kills), kBookings, loop_start);
  REQUIRE(finished);
  CHECK(drain_s < std::chrono::duration<double>(kDrainBound).count());
  CHECK(observer->table_get("venue", "bookings").value() == std::to_string(kBookings));
  CHECK(observer->table_get("venue", "seats-left").value() == std::to_string(kSeats - kBookings));
  for (int i = 0; i < kBookings; i += 37) {
    std::string id = "booking-" + std::to_string(i);
    CHECK(observer->table_get("booked", id).value() == id);
  }
  CHECK(kills > 0);
  // The point of the loop: kills must land while transactions are in flight,
  // not only before the first handler call (random-time kills mostly hit the
  // child's start-up). Every run has at least one held kill, inside a handler
  // by construction and confirmed by the probe; the other modes add kills at
  // arbitrary points, counted but not judged (that share depends on timing).
  if (!drained_early && !stalled) REQUIRE(kills_in_handler >= 1);
  REQUIRE(kills_in_flight >= 1);
}
