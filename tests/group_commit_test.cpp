// lanebus — MIT License.
// Consumer-side group commit on durable queues: competing consumers of a Sync
// queue must share fsyncs between their claims and acks (and between their
// transactional-consume commits) instead of paying one or two per message.
// The syncs are the real fsync/fdatasync/msync calls of the process, counted
// by the LD_PRELOAD shim in tests/support/fsync_counter.cpp.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "fsync_counter.hpp"
#include "lanebus/lanebus.hpp"
#include "scratch_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::real_sync_count;
using lanebus::test::wait_until;
using TempDir = lanebus::test::ScratchDir;

namespace {

constexpr int kMessages = 2000;
constexpr std::uint32_t kLanes = 8;
constexpr const char* kQueue = "gc.orders";
constexpr const char* kTable = "gc_rows";

std::uint64_t acked(const Bus& bus) {
  for (const auto& t : bus.stats().topics) {
    if (t.name == kQueue && !t.groups.empty()) return t.groups[0].total.acked;
  }
  return 0;
}

struct Burst {
  unsigned long long syncs = 0;  ///< real sync calls from the first consume() to "all acked"
  std::uint64_t acks = 0;
  double seconds = 0;
};

// A Sync durable queue of kLanes lanes pre-filled with kMessages messages, then
// consumed by `consumers` subscriptions on a bus of `workers` workers;
// `tx`: through consume_tx, one table row per message.
Burst consume_burst(std::size_t workers, int consumers, bool tx) {
  TempDir tmp;
  BusOptions o = lanebus::test::store_bus(tmp.path);
  o.workers = workers;
  o.store.durability = Durability::Sync;
  auto bus = Bus::open(o).value();
  auto queue = bus->create_queue(kQueue, {.lanes = kLanes, .durable = true}).value();

  // Pre-fill with many publishes in flight so the fill itself is group-committed.
  std::atomic<int> published{0}, publish_failed{0};
  for (int i = 0; i < kMessages; ++i) {
    std::string key = "k" + std::to_string(i % 64), payload = std::to_string(i);
    REQUIRE(queue
                .publish_async({.key = key, .payload = payload},
                               [&](const Status& st, std::uint64_t) {
                                 if (!st.ok()) publish_failed.fetch_add(1);
                                 published.fetch_add(1);
                               })
                .ok());
  }
  REQUIRE(wait_until([&] { return published.load() == kMessages; }, 120s));
  REQUIRE(publish_failed.load() == 0);
  REQUIRE(acked(*bus) == 0);

  std::vector<std::atomic<int>> handled(kMessages);
  auto note = [&](const MessageView& m) { handled[std::stoi(std::string(m.payload()))].fetch_add(1); };

  const unsigned long long syncs_before = real_sync_count();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Subscription> subs;
  for (int c = 0; c < consumers; ++c) {
    if (tx) {
      subs.push_back(bus->consume_tx(queue, [&](const MessageView& m, Transaction& t) {
                           note(m);
                           std::string k = "row-" + std::string(m.payload());
                           if (!t.put(kTable, k, m.key()).ok()) return Outcome::retry("put failed");
                           return Outcome::ack();
                         }).value());
    } else {
      subs.push_back(bus->consume(queue, [&](const MessageView& m) {
                           note(m);
                           return Outcome::ack();
                         }).value());
    }
  }
  const bool all = wait_until([&] { return acked(*bus) >= static_cast<std::uint64_t>(kMessages); }, 240s);
  Burst b;
  b.syncs = real_sync_count() - syncs_before;
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  b.acks = acked(*bus);
  for (auto& s : subs) REQUIRE(s.close().ok());
  REQUIRE_MESSAGE(all, "only " << b.acks << " of " << kMessages << " acked");

  int missing = 0, twice = 0;
  for (int i = 0; i < kMessages; ++i) {
    if (handled[i].load() == 0) ++missing;
    if (!tx && handled[i].load() > 1) ++twice;  // tx: an optimistic-concurrency retry may repeat a call
  }
  CHECK(missing == 0);
  CHECK(twice == 0);
  CHECK(b.acks == static_cast<std::uint64_t>(kMessages));
  if (tx) {
    for (int i : {0, kMessages / 2, kMessages - 1}) {
      auto row = bus->table_get(kTable, "row-" + std::to_string(i));
      CHECK_MESSAGE(row.ok(), "row " << i << ": " << row.status().to_string());
    }
  }
  REQUIRE(bus->shutdown(ShutdownMode::Drain, 10s).ok());
  return b;
}

void report(const char* what, const Burst& b) {
  const double ratio = b.acks > 0 ? static_cast<double>(b.syncs) / static_cast<double>(b.acks) : 0.0;
  MESSAGE(std::string(what) << ": real_syncs=" << b.syncs << " acks=" << b.acks << " syncs_per_ack=" << ratio
               << " seconds=" << b.seconds << " msg_per_s=" << (b.seconds > 0 ? b.acks / b.seconds : 0.0));
  std::printf("group_commit case=\"%s\" real_syncs=%llu acks=%llu syncs_per_ack=%.3f seconds=%.2f\n", what, b.syncs,
              static_cast<unsigned long long>(b.acks), ratio, b.seconds);
  std::fflush(stdout);
}

// Both bounds of a burst's real syncs. Ceiling: group commit, many acks share
// one fsync (before it: about 1 per ack). Floor: the acks of a Sync queue are
// durable only once fsynced, and one commit holds at most StoreOptions::max_batch
// operations, so the acks need at least acks / max_batch real syncs (here 1):
// zero fails, whether the shim stopped counting or the store stopped syncing.
void check_sync_bounds(const Burst& b) {
  const std::uint64_t max_batch = StoreOptions{}.max_batch;
  const unsigned long long floor = (b.acks + max_batch - 1) / max_batch;
  CHECK(floor >= 1);
  CHECK(b.syncs >= floor);
  CHECK(b.syncs * 4 <= b.acks);
}

}  // namespace

TEST_CASE("the fsync counter shim is preloaded and counts a real fdatasync") {
  const bool preloaded = lanebus::test::fsync_counter() != nullptr;
  REQUIRE(preloaded);
  const unsigned long long before = real_sync_count();
  TempDir tmp;
  std::string path = (tmp.path / "f").string();
  FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs("x", f);
  std::fflush(f);
  CHECK(::fdatasync(::fileno(f)) == 0);
  CHECK(::fsync(::fileno(f)) == 0);
  std::fclose(f);
  CHECK(real_sync_count() - before == 2);
}

TEST_CASE("competing workers of a Sync durable queue share fsyncs: fewer syncs than acks") {
  SUBCASE("one consume() subscription, workers = 4") {
    Burst b = consume_burst(4, 1, false);
    report("consume workers=4", b);
    check_sync_bounds(b);
  }
  SUBCASE("two consume() subscriptions on one bus") {
    Burst b = consume_burst(2, 2, false);
    report("consume 2 consumers", b);
    check_sync_bounds(b);
  }
}

TEST_CASE("transactional consumers of a Sync durable queue share fsyncs: fewer syncs than acks") {
  SUBCASE("one consume_tx() subscription, workers = 4, one table row per message") {
    Burst b = consume_burst(4, 1, true);
    report("consume_tx workers=4", b);
    check_sync_bounds(b);
  }
  SUBCASE("two consume_tx() subscriptions on one bus") {
    Burst b = consume_burst(2, 2, true);
    report("consume_tx 2 consumers", b);
    check_sync_bounds(b);
  }
}
