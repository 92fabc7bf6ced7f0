// lanebus — MIT License.
// Durable topics and queues through the Bus API (doc/durable.md): restart and resume,
// replay and seek, queue redelivery with persisted attempts, bad input.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bus_impl.hpp"
#include "lanebus/lanebus.hpp"
#include "scratch_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::wait_until;
using TempDir = lanebus::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

BusOptions durable_bus(const fs::path& dir, Durability d = Durability::Sync) {
  BusOptions o;
  o.name = "durable-test";
  o.workers = 2;
  o.store.directory = (dir / "store").string();
  o.store.durability = d;
  o.durable_poll = 10ms;
  return o;
}

struct Seen {
  std::mutex mu;
  std::map<std::string, std::vector<int>> by_key;
  std::vector<std::uint64_t> offsets;
  std::atomic<int> count{0};
  void add(const MessageView& m) {
    std::lock_guard l(mu);
    by_key[std::string(m.key())].push_back(std::stoi(std::string(m.payload())));
    offsets.push_back(m.offset());
    ++count;
  }
  bool ordered() {
    std::lock_guard l(mu);
    for (auto& [k, v] : by_key)
      for (std::size_t i = 1; i < v.size(); ++i)
        if (v[i] <= v[i - 1]) return false;
    return true;
  }
};

// A durable queue's claims in flight (from the store), summed over its lanes.
std::uint64_t claimed(Bus& bus, const std::string& queue) {
  for (const TopicStats& t : bus.stats().topics)
    if (t.name == queue) return t.groups.at(0).total.claimed;
  return ~0ull;
}

}  // namespace

TEST_CASE("publish_batch on a durable topic: runs go to the writer as one request; the published prefix survives a restart") {
  TempDir tmp;
  std::deque<std::string> storage;  // the messages' bytes (OutgoingMessage holds views)
  auto msg = [&](const std::string& key, int i) {
    storage.push_back(key);
    const std::string& k = storage.back();
    storage.push_back(std::to_string(i));
    return OutgoingMessage{.key = k, .payload = storage.back()};
  };
  {
    auto bus = Bus::open(durable_bus(tmp.path)).value();
    auto topic = bus->create_topic("batch.orders", {.lanes = 4, .durable = true}).value();
    std::vector<OutgoingMessage> batch;
    for (int i = 0; i < 200; ++i) batch.push_back(msg("c" + std::to_string(i % 7), i));
    BatchPublishResult r = topic.publish_batch(batch);
    CHECK(r.status.ok());
    CHECK(r.published == 200);
    // A refused message ends the batch: the three before it are published, nothing after it.
    batch.clear();
    for (int i = 200; i < 205; ++i) batch.push_back(msg("c" + std::to_string(i % 7), i));
    batch[3].payload = {};
    r = topic.publish_batch(batch);
    CHECK(r.published == 3);
    CHECK(r.status.code() == Code::InvalidArgument);
    // A delayed message inside a batch goes through the delayed index; the runs around it still go.
    batch.clear();
    for (int i = 205; i < 210; ++i) batch.push_back(msg("d" + std::to_string(i % 2), i));
    batch[2].key = "late";
    batch[2].delay = 50ms;
    r = bus->publisher().publish_batch(topic, batch);
    CHECK(r.status.ok());
    CHECK(r.published == 5);
    // An empty batch publishes nothing and is not an error.
    CHECK(topic.publish_batch({}).status.ok());
  }
  Seen seen;
  auto bus = Bus::open(durable_bus(tmp.path)).value();
  auto topic = bus->create_topic("batch.orders", {.lanes = 4, .durable = true}).value();
  auto sub = bus->subscribe(topic, "billing", [&](const MessageView& m) {
                   seen.add(m);
                   return Outcome::ack();
                 }).value();
  constexpr int kPublished = 200 + 3 + 5;
  REQUIRE(wait_until([&] { return seen.count == kPublished; }));
  std::this_thread::sleep_for(50ms);
  CHECK(seen.count == kPublished);
  CHECK(seen.ordered());
  std::lock_guard l(seen.mu);
  for (auto& [k, v] : seen.by_key)
    for (int p : v) CHECK((p < 203 || p >= 205));  // the refused message and the one after it: never stored
  CHECK(seen.by_key["late"] == std::vector<int>{207});
}

TEST_CASE("a durable group resumes from its committed offset after a restart, in key order") {
  TempDir tmp;
  constexpr int kFirst = 300, kSecond = 200;
  Seen first;
  {
    auto bus = Bus::open(durable_bus(tmp.path)).value();
    auto topic = bus->create_topic("shop.orders", {.lanes = 4, .durable = true}).value();
    CHECK(topic.is_durable());
    auto sub = bus->subscribe(topic, "billing", [&](const MessageView& m) {
                     first.add(m);
                     return Outcome::ack();
                   }).value();
    for (int i = 0; i < kFirst; ++i)
      REQUIRE(topic.publish({.key = "c" + std::to_string(i % 7), .payload = std::to_string(i)}).ok());
    REQUIRE(wait_until([&] { return first.count == kFirst; }));
    REQUIRE(bus->shutdown(ShutdownMode::Drain, 10s).ok());
  }
  {
    // Published while nobody consumes.
    auto bus = Bus::open(durable_bus(tmp.path)).value();
    auto topic = bus->create_topic("shop.orders", {.lanes = 4, .durable = true}).value();
    for (int i = kFirst; i < kFirst + kSecond; ++i)
      REQUIRE(topic.publish({.key = "c" + std::to_string(i % 7), .payload = std::to_string(i)}).ok());
  }
  Seen second;
  auto bus = Bus::open(durable_bus(tmp.path)).value();
  auto topic = bus->create_topic("shop.orders", {.lanes = 4, .durable = true}).value();
  auto sub = bus->subscribe(topic, "billing", [&](const MessageView& m) {
                   second.add(m);
                   return Outcome::ack();
                 }).value();
  REQUIRE(wait_until([&] { return second.count == kSecond; }));
  std::this_thread::sleep_for(50ms);
  CHECK(second.count == kSecond);  // nothing from before the restart again
  CHECK(first.ordered());
  CHECK(second.ordered());
  std::lock_guard l(second.mu);
  for (auto& [k, v] : second.by_key) CHECK(v.front() >= kFirst);
  auto st = bus->stats();
  REQUIRE(st.topics.size() == 1);
  CHECK(st.topics[0].durable);
  REQUIRE(wait_until([&] { return bus->stats().topics[0].groups[0].total.in_flight == 0; }));
}

TEST_CASE("a group created later replays from offset 0; seek by timestamp lands on the right message") {
  TempDir tmp;
  auto bus = Bus::open(durable_bus(tmp.path)).value();
  auto topic = bus->create_topic("audit.events", {.lanes = 1, .durable = true}).value();
  std::int64_t mid_ts = 0;
  for (int i = 0; i < 100; ++i) {
    if (i == 60) {
      std::this_thread::sleep_for(5ms);
      mid_ts = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
      std::this_thread::sleep_for(5ms);
    }
    REQUIRE(topic.publish({.key = "k", .payload = std::to_string(i)}).ok());
  }
  Seen replay;
  auto sub = bus->subscribe(topic, "analytics", [&](const MessageView& m) {
                   replay.add(m);
                   return Outcome::ack();
                 },
                 {.start = StartPosition::earliest()})
                 .value();
  REQUIRE(wait_until([&] { return replay.count == 100; }));
  {
    std::lock_guard l(replay.mu);
    CHECK(replay.by_key["k"].front() == 0);
    CHECK(replay.offsets.front() == 0);
  }
  Seen late;
  auto sub2 = bus->subscribe(topic, "late", [&](const MessageView& m) {
                    late.add(m);
                    return Outcome::ack();
                  },
                  {.start = StartPosition::at_time(mid_ts)})
                  .value();
  REQUIRE(wait_until([&] { return late.count == 40; }));
  {
    std::lock_guard l(late.mu);
    CHECK(late.by_key["k"].front() == 60);
  }
  // Seek at run time: replay the whole log for "analytics" again.
  REQUIRE(bus->seek(topic, "analytics", StartPosition::earliest()).ok());
  REQUIRE(wait_until([&] { return replay.count == 200; }));
  CHECK(bus->seek(topic, "nobody", StartPosition::earliest()).code() == Code::NotFound);
}

TEST_CASE("a durable queue redelivers with a persisted attempt count and hands each message to one consumer") {
  TempDir tmp;
  auto bus = Bus::open(durable_bus(tmp.path)).value();
  auto queue = bus->create_queue("mail.outbox", {.lanes = 4, .durable = true}).value();
  constexpr int kMessages = 200;
  std::vector<std::atomic<int>> handled(kMessages);
  std::atomic<int> acks{0};
  std::mutex mu;
  std::vector<std::uint32_t> attempts_of_7;
  auto handler = [&](const MessageView& m) {
    int i = std::stoi(std::string(m.payload()));
    if (i == 7) {
      std::lock_guard l(mu);
      attempts_of_7.push_back(m.attempt());
      if (m.attempt() < 3) return Outcome::retry("smtp busy");
    }
    handled[i].fetch_add(1);
    ++acks;
    return Outcome::ack();
  };
  auto c1 = bus->consume(queue, handler, {.max_attempts = 5, .visibility = 5s}).value();
  auto c2 = bus->consume(queue, handler).value();
  for (int i = 0; i < kMessages; ++i)
    REQUIRE(queue.publish({.key = "m" + std::to_string(i), .payload = std::to_string(i)}).ok());
  REQUIRE(wait_until([&] { return acks == kMessages; }));
  for (int i = 0; i < kMessages; ++i) CHECK_MESSAGE(handled[i] == 1, "message " << i);
  std::lock_guard l(mu);
  CHECK(attempts_of_7 == std::vector<std::uint32_t>{1, 2, 3});
}

TEST_CASE("a durable queue's consumer never waits for a claim: the writer claims in the append's commit or on request") {
  TempDir tmp;
  auto bus = Bus::open(durable_bus(tmp.path)).value();
  auto queue = bus->create_queue("jobs", {.lanes = 4, .durable = true}).value();
  std::atomic<int> handled{0}, not_first{0};
  auto sub = bus->consume(queue, [&](const MessageView& m) {
                  if (m.attempt() != 1) ++not_first;
                  ++handled;
                  return Outcome::ack();
                }).value();
  // One at a time (each lane runs dry and arms its mailbox), then a burst.
  for (int i = 0; i < 40; ++i) {
    REQUIRE(queue.publish({.key = "k" + std::to_string(i % 7), .payload = std::to_string(i)}).ok());
    REQUIRE(wait_until([&] { return handled == i + 1; }));
  }
  for (int i = 40; i < 400; ++i)
    REQUIRE(queue.publish_async({.key = "k" + std::to_string(i % 7), .payload = std::to_string(i)},
                                [](const Status&, std::uint64_t) {}).ok());
  REQUIRE(wait_until([&] { return handled == 400; }));
  CHECK(not_first == 0);
  const auto c = detail::Access::core(*bus)->store()->counters();
  CHECK(c.claims == 400);
  CHECK(c.claims_ahead == c.claims);  // every claim made by the writer, none by a waiting worker
}

TEST_CASE("a durable queue's mailbox is pipelined: messages published while the lane's head is handled are claimed in their own commit, in order, and a retry of the head sends them back") {
  TempDir tmp;
  auto bus = Bus::open(durable_bus(tmp.path)).value();
  auto queue = bus->create_queue("jobs", {.lanes = 1, .durable = true}).value();
  auto* store = detail::Access::core(*bus)->store();
  std::mutex mu;
  std::vector<std::string> seen;  // payload@attempt, in handler order
  std::atomic<bool> head_in{false}, go{false};
  GroupOptions go_opts;
  go_opts.max_attempts = 5;
  go_opts.backoff_initial = 1ms;
  go_opts.visibility = 5min;
  auto sub = bus->consume(queue, [&](const MessageView& m) {
                  const std::string p(m.payload());
                  {
                    std::lock_guard l(mu);
                    seen.push_back(p + "@" + std::to_string(m.attempt()));
                  }
                  if (p == "h" && m.attempt() == 1) {
                    head_in = true;
                    while (!go) std::this_thread::sleep_for(1ms);
                    return Outcome::retry("once");  // the messages claimed behind it go back
                  }
                  if (p == "a" && m.attempt() == 1) {
                    head_in = true;
                    while (!go) std::this_thread::sleep_for(1ms);
                  }
                  return Outcome::ack();
                }, go_opts).value();

  // The head's handler is running; two publishes commit meanwhile. Each is
  // claimed in its own append's commit, behind the head (passed), before
  // publish returns.
  REQUIRE(queue.publish({.key = "k", .payload = "a"}).ok());
  REQUIRE(wait_until([&] { return head_in.load(); }));
  const auto before = store->counters();
  REQUIRE(queue.publish({.key = "k", .payload = "b"}).ok());
  REQUIRE(queue.publish({.key = "k", .payload = "c"}).ok());
  const auto after = store->counters();
  CHECK(after.claims_passed - before.claims_passed == 2);
  CHECK(after.claims - before.claims == 2);
  go = true;
  REQUIRE(wait_until([&] {
    std::lock_guard l(mu);
    return seen.size() == 3;
  }));
  {
    std::lock_guard l(mu);
    CHECK(seen == std::vector<std::string>{"a@1", "b@1", "c@1"});
    seen.clear();
  }

  // A head that is retried: what was claimed behind it is given back
  // uncounted and handled after the head's second attempt.
  head_in = false;
  go = false;
  REQUIRE(queue.publish({.key = "k", .payload = "h"}).ok());
  REQUIRE(wait_until([&] { return head_in.load(); }));
  REQUIRE(queue.publish({.key = "k", .payload = "x"}).ok());
  REQUIRE(queue.publish({.key = "k", .payload = "y"}).ok());
  go = true;
  REQUIRE(wait_until([&] {
    std::lock_guard l(mu);
    return seen.size() == 4;
  }));
  std::lock_guard l(mu);
  CHECK(seen == std::vector<std::string>{"h@1", "h@2", "x@1", "y@1"});
}

TEST_CASE("a message claimed behind a head whose settle then fails goes back, though it was in a later batch: the acks stay in lane order") {
  // The DLQ holds one entry and refuses more: a head's dead letter then
  // fails when the writer applies it (DlqFull), after its handler returned,
  // and the head stays in the queue for a second attempt. The message
  // claimed behind it meanwhile (pipelined, another batch) was handled
  // already; its ack is refused and it comes again after the head.
  TempDir tmp;
  BusOptions o = durable_bus(tmp.path);
  o.dlq.max_entries = 1;
  auto bus = Bus::open(o).value();
  auto queue = bus->create_queue("jobs", {.lanes = 1, .durable = true}).value();
  auto* store = detail::Access::core(*bus)->store();
  std::mutex mu;
  std::vector<std::string> seen, acked;
  std::atomic<bool> head_in{false}, go{false};
  auto sub = bus->consume(queue, [&](const MessageView& m) {
                  const std::string p(m.payload());
                  {
                    std::lock_guard l(mu);
                    seen.push_back(p);
                  }
                  if (p == "first") return Outcome::reject("fills the DLQ");
                  if (p == "x" && m.attempt() == 1) {
                    head_in = true;
                    while (!go) std::this_thread::sleep_for(1ms);
                    return Outcome::reject("the DLQ is full: stays");
                  }
                  std::lock_guard l(mu);
                  acked.push_back(p);
                  return Outcome::ack();
                }).value();
  REQUIRE(queue.publish({.key = "k", .payload = "first"}).ok());
  auto* dlq = bus->dead_letters().value();
  REQUIRE(wait_until([&] { return dlq->counters().value().pending == 1; }));
  REQUIRE(queue.publish({.key = "k", .payload = "x"}).ok());
  REQUIRE(wait_until([&] { return head_in.load(); }));
  const auto before = store->counters().claims_passed;
  REQUIRE(queue.publish({.key = "k", .payload = "y"}).ok());
  CHECK(store->counters().claims_passed - before == 1);  // y claimed behind x
  go = true;
  // y's first ack is refused (y was claimed before x failed to settle),
  // so y comes again after x's second attempt.
  const bool all = wait_until([&] {
    std::lock_guard l(mu);
    return seen.size() >= 5;
  }, 10s);
  std::lock_guard l(mu);
  std::string order;
  for (const std::string& p : seen) order += p + " ";
  INFO("handler calls: " << order);
  CHECK(all);
  CHECK(seen == std::vector<std::string>{"first", "x", "y", "x", "y"});
  CHECK(acked == std::vector<std::string>{"y", "x", "y"});
}

TEST_CASE("claims made ahead and never taken go back at a clean shutdown and when the last consumer leaves") {
  TempDir tmp;
  BusOptions o = durable_bus(tmp.path);
  o.workers = 1;
  {
    auto bus = Bus::open(o).value();
    auto blocker = bus->create_queue("blocker", {.lanes = 1, .durable = true}).value();
    auto jobs = bus->create_queue("jobs", {.lanes = 1, .durable = true}).value();
    std::atomic<int> jobs_handled{0};
    std::atomic<bool> release{false}, blocking{false};
    auto js = bus->consume(jobs, [&](const MessageView&) {
                    ++jobs_handled;
                    return Outcome::ack();
                  }, {.visibility = 10min}).value();
    REQUIRE(jobs.publish({.key = "a", .payload = "1"}).ok());
    REQUIRE(wait_until([&] { return jobs_handled == 1; }));
    // The one worker is held in another queue's handler; a message to "jobs"
    // is claimed for its mailbox by the commit that appends it.
    auto bs = bus->consume(blocker, [&](const MessageView&) {
                    blocking = true;
                    while (!release) std::this_thread::sleep_for(1ms);
                    return Outcome::ack();
                  }).value();
    REQUIRE(blocker.publish({.key = "b", .payload = "x"}).ok());
    REQUIRE(wait_until([&] { return blocking.load(); }));
    auto* store = detail::Access::core(*bus)->store();
    const auto before = store->counters().claims_ahead;
    REQUIRE(jobs.publish({.key = "a", .payload = "2"}).ok());
    MESSAGE("claimed ahead for the mailbox: " << store->counters().claims_ahead - before);
    std::thread releaser([&] {
      std::this_thread::sleep_for(100ms);
      release = true;
    });
    CHECK(bus->shutdown(ShutdownMode::Abandon, 2s).ok());
    releaser.join();
    CHECK(jobs_handled == 1);
  }
  {
    // Reopened: message 2 is not waiting out a 10-minute claim, and its
    // attempt was not counted.
    auto bus = Bus::open(o).value();
    auto jobs = bus->create_queue("jobs", {.lanes = 1, .durable = true}).value();
    CHECK(claimed(*bus, "jobs") == 0);
    std::atomic<int> handled{0};
    std::atomic<std::uint32_t> attempt{0};
    auto js = bus->consume(jobs, [&](const MessageView& m) {
                    attempt = m.attempt();
                    ++handled;
                    return Outcome::ack();
                  }, {.visibility = 10min}).value();
    REQUIRE(wait_until([&] { return handled == 1; }));
    CHECK(attempt == 1);
    // The last consumer leaves with its mailbox armed; a message appended
    // after that is not claimed for it, and one claimed before goes back.
    CHECK(js.close().ok());
    REQUIRE(jobs.publish({.key = "a", .payload = "3"}).ok());
    CHECK(claimed(*bus, "jobs") == 0);
  }
}

TEST_CASE("publish_async completes after the commit, with the offset") {
  TempDir tmp;
  auto bus = Bus::open(durable_bus(tmp.path)).value();
  auto topic = bus->create_topic("async.events", {.lanes = 1, .durable = true}).value();
  constexpr int kMessages = 500;
  std::atomic<int> done{0}, failed{0};
  std::mutex mu;
  std::vector<std::uint64_t> offsets;
  for (int i = 0; i < kMessages; ++i) {
    Status s = topic.publish_async({.key = "k", .payload = std::to_string(i)},
                                   [&](const Status& st, std::uint64_t offset) {
                                     if (!st.ok()) ++failed;
                                     std::lock_guard l(mu);
                                     offsets.push_back(offset);
                                     ++done;
                                   });
    REQUIRE(s.ok());
  }
  REQUIRE(wait_until([&] { return done == kMessages; }));
  CHECK(failed == 0);
  std::lock_guard l(mu);
  std::sort(offsets.begin(), offsets.end());
  for (int i = 0; i < kMessages; ++i) CHECK(offsets[i] == static_cast<std::uint64_t>(i));
  CHECK(topic.publish_async({.key = "k", .payload = "x"}, nullptr).code() == Code::InvalidArgument);
}

TEST_CASE("durable bad input gets a clear error") {
  TempDir tmp;
  SUBCASE("a durable topic on an in-memory bus") {
    auto bus = Bus::open({.workers = 1}).value();
    auto r = bus->create_topic("x.events", {.durable = true});
    CHECK(r.code() == Code::InvalidArgument);
    CHECK(r.status().message().find("store.directory") != std::string_view::npos);
    auto t = bus->create_topic("y.events").value();
    CHECK(bus->seek(t, "g", StartPosition::earliest()).code() == Code::InvalidArgument);
  }
  SUBCASE("a file where the store directory should be") {
    fs::path file = tmp.path / "store";
    std::ofstream(file) << "not a directory";
    auto r = Bus::open(durable_bus(tmp.path));
    CHECK_FALSE(r.ok());
    CHECK(r.status().message().find(file.string()) != std::string_view::npos);
  }
  SUBCASE("ephemeral and durable topics of one name conflict; lane counts are fixed") {
    auto bus = Bus::open(durable_bus(tmp.path)).value();
    REQUIRE(bus->create_topic("z.events", {.lanes = 4, .durable = true}).ok());
    CHECK(bus->create_topic("z.events", {.lanes = 4}).code() == Code::Conflict);
    REQUIRE(bus->shutdown(ShutdownMode::Drain).ok());
    auto bus2 = Bus::open(durable_bus(tmp.path)).value();
    auto r = bus2->create_topic("z.events", {.lanes = 8, .durable = true});
    CHECK(r.code() == Code::Conflict);
  }
  SUBCASE("the same store twice in one process is Busy") {
    auto bus = Bus::open(durable_bus(tmp.path)).value();
    auto again = Bus::open(durable_bus(tmp.path));
    CHECK(again.code() == Code::Busy);
  }
  SUBCASE("publish after shutdown") {
    auto bus = Bus::open(durable_bus(tmp.path)).value();
    auto t = bus->create_topic("late.events", {.durable = true}).value();
    REQUIRE(bus->shutdown(ShutdownMode::Drain).ok());
    CHECK(t.publish({.key = "k", .payload = "x"}).code() == Code::ShutDown);
  }
}

TEST_CASE("a fenced durable topic: barrier, stale token, forged token, missing token") {
  TempDir tmp;
  auto table = LeaseTable::open((tmp.path / "leases").string(), {}).value();
  auto a = LeaseOwner::generate().value();
  auto b = LeaseOwner::generate().value();
  BusOptions o = durable_bus(tmp.path);
  o.lease_table = table.get();
  auto bus = Bus::open(o).value();
  auto topic = bus->create_topic("ledger.entries", {.lanes = 2, .durable = true, .fence = "ledger.writer"}).value();
  auto la = table->acquire("ledger.writer", a, 10s).value();
  REQUIRE(topic.publish({.key = "k", .payload = "from A", .fencing_token = la.token}).ok());  // A's barrier
  REQUIRE(table->release("ledger.writer", a, la.token).ok());
  auto lb = table->acquire("ledger.writer", b, 10s).value();
  REQUIRE(lb.token > la.token);
  REQUIRE(topic.publish({.key = "k", .payload = "from B", .fencing_token = lb.token}).ok());  // B's barrier
  Status stale = topic.publish({.key = "k", .payload = "late A", .fencing_token = la.token});
  CHECK(stale.code() == Code::StaleToken);
  Status forged = topic.publish({.key = "k", .payload = "forged", .fencing_token = lb.token + 1000});
  CHECK(forged.code() == Code::FenceViolation);
  CHECK(topic.publish({.key = "k", .payload = "no token"}).code() == Code::InvalidArgument);
  CHECK(topic.publish({.key = "k", .payload = "B again", .fencing_token = lb.token}).ok());
  std::atomic<int> count{0};
  std::mutex mu;
  std::vector<std::string> payloads;
  auto sub = bus->subscribe(topic, "reader", [&](const MessageView& m) {
                   std::lock_guard l(mu);
                   payloads.emplace_back(m.payload());
                   ++count;
                   return Outcome::ack();
                 }).value();
  REQUIRE(wait_until([&] { return count == 3; }));
  std::this_thread::sleep_for(50ms);
  CHECK(count == 3);  // "from A", "from B", "B again": nothing stale or forged got in
  CHECK(bus->create_topic("ledger.entries", {.lanes = 2, .durable = true, .fence = "other"}).code() ==
        Code::Conflict);
}

namespace {
// What a durable batch handler saw: one record per call.
struct SpanCall {
  std::uint32_t lane = 0;
  std::vector<int> payloads;
  std::vector<std::uint64_t> offsets;
  std::vector<std::uint32_t> attempts;
};
struct Spans {
  std::mutex mu;
  std::vector<SpanCall> calls;
  std::map<int, int> acked;  // payload -> times acked
  std::atomic<int> acked_total{0};
  SpanCall record(std::span<const MessageView> ms) {
    SpanCall c;
    c.lane = ms.empty() ? 0 : ms[0].lane();
    for (const MessageView& m : ms) {
      c.payloads.push_back(std::stoi(std::string(m.payload())));
      c.offsets.push_back(m.offset());
      c.attempts.push_back(m.attempt());
      CHECK(m.lane() == c.lane);  // one lane per call
    }
    std::lock_guard l(mu);
    calls.push_back(c);
    return c;
  }
  void ack(const SpanCall& c, std::size_t upto) {
    std::lock_guard l(mu);
    for (std::size_t i = 0; i < upto && i < c.payloads.size(); ++i) {
      ++acked[c.payloads[i]];
      ack_order.push_back(c.payloads[i]);
    }
    acked_total += static_cast<int>(std::min(upto, c.payloads.size()));
  }
  // Per-key order of the acks (key = payload % keys): each key's payloads rise. Caller holds mu.
  void check_key_order(int keys) {
    std::map<int, int> last;
    for (int p : ack_order) {
      if (last.count(p % keys) != 0) CHECK_MESSAGE(p > last[p % keys], "payload " << p);
      last[p % keys] = p;
    }
  }
  std::vector<int> ack_order;
  // Every call: consecutive offsets of its lane, at most `span_max`; and
  // some call carried more than one message. Returns the largest span.
  std::size_t check_calls(std::size_t span_max) {
    std::lock_guard l(mu);
    std::size_t largest = 0;
    for (const SpanCall& c : calls) {
      largest = std::max(largest, c.offsets.size());
      CHECK(c.offsets.size() <= span_max);
      for (std::size_t i = 1; i < c.offsets.size(); ++i) CHECK(c.offsets[i] == c.offsets[i - 1] + 1);
    }
    CHECK(largest > 1);
    return largest;
  }
};
}  // namespace

TEST_CASE("a batch handler on a durable topic gets spans of one lane in order; stop_at retries or rejects one message, the rest come again") {
  TempDir tmp;
  constexpr int kMessages = 400;
  constexpr std::uint32_t kSpan = 32;
  Spans seen;
  std::atomic<bool> threw{false};
  const GroupOptions options{.backoff_initial = 1ms, .backoff_max = 5ms, .batch_max = kSpan};
  {
    auto bus = Bus::open(durable_bus(tmp.path)).value();
    auto topic = bus->create_topic("spans.orders", {.lanes = 2, .durable = true}).value();
    // Published before the group exists: its first reads find full buffers.
    for (int i = 0; i < kMessages; ++i)
      REQUIRE(topic.publish({.key = "k" + std::to_string(i % 5), .payload = std::to_string(i)}).ok());
    auto sub = bus->subscribe_batch(
                      topic, "billing",
                      [&](std::span<const MessageView> ms) {
                        const SpanCall c = seen.record(ms);
                        for (std::size_t j = 0; j < c.payloads.size(); ++j) {
                          if (c.payloads[j] == 50 && c.attempts[j] == 1) {
                            seen.ack(c, j);
                            return BatchOutcome::stop_at(j, Outcome::retry("not yet"));
                          }
                          if (c.payloads[j] == 90) {
                            seen.ack(c, j);
                            return BatchOutcome::stop_at(j, Outcome::reject("bad order"));
                          }
                          if (c.payloads[j] == 130 && !threw.exchange(true)) throw std::runtime_error("boom");
                        }
                        seen.ack(c, c.payloads.size());
                        return BatchOutcome::all_acked();
                      },
                      options)
                   .value();
    REQUIRE(wait_until([&] { return seen.acked_total == kMessages - 1; }));
    auto dead = (*bus->dead_letters())->list({});
    REQUIRE(dead.ok());
    REQUIRE(dead->size() == 1);
    CHECK(dead->front().payload == "90");
    CHECK(dead->front().reason == "bad order");
    auto st = bus->stats();
    REQUIRE(wait_until([&] {
      auto s = bus->stats();
      return s.topics[0].groups[0].total.acked == static_cast<std::uint64_t>(kMessages - 1);
    }));
    CHECK(st.topics[0].groups[0].total.rejected == 1);
    // Each message settled once (ack or reject), plus the two retries (50's stop, the exception's head);
    // the messages behind a stop count when they come again.
    CHECK(bus->stats().topics[0].groups[0].total.delivered == static_cast<std::uint64_t>(kMessages + 2));
    REQUIRE(bus->shutdown(ShutdownMode::Drain, 10s).ok());
  }
  {
    // After a restart the group resumes past everything it settled: only new messages come.
    Spans after;
    auto bus = Bus::open(durable_bus(tmp.path)).value();
    auto topic = bus->create_topic("spans.orders", {.lanes = 2, .durable = true}).value();
    auto sub = bus->subscribe_batch(
                      topic, "billing",
                      [&](std::span<const MessageView> ms) {
                        after.ack(after.record(ms), ms.size());
                        return BatchOutcome::all_acked();
                      },
                      options)
                   .value();
    for (int i = kMessages; i < kMessages + 10; ++i)
      REQUIRE(topic.publish({.key = "k" + std::to_string(i % 5), .payload = std::to_string(i)}).ok());
    REQUIRE(wait_until([&] { return after.acked_total == 10; }));
    std::this_thread::sleep_for(50ms);
    std::lock_guard l(after.mu);
    CHECK(after.acked_total == 10);
    for (int p : after.ack_order) CHECK(p >= kMessages);
  }
  const std::size_t largest = seen.check_calls(kSpan);
  MESSAGE("largest span " << largest << " in " << seen.calls.size() << " calls");
  std::lock_guard l(seen.mu);
  for (int i = 0; i < kMessages; ++i) CHECK_MESSAGE(seen.acked[i] == (i == 90 ? 0 : 1), "message " << i);
  // 50 came again as the head of a later call, at attempt 2; what followed it at attempt 1.
  bool again = false;
  for (const SpanCall& c : seen.calls) {
    if (c.payloads[0] == 50 && c.attempts[0] == 2) {
      again = true;
      for (std::size_t j = 1; j < c.attempts.size(); ++j) CHECK(c.attempts[j] == 1);
    }
    for (std::size_t j = 1; j < c.payloads.size(); ++j) CHECK((c.payloads[j] != 50 || c.attempts[j] == 1));
  }
  CHECK(again);
  seen.check_key_order(5);
}

TEST_CASE("a batch handler on a durable topic reads in place: its views point into the store's map, and it may publish durably while it holds them") {
  TempDir tmp;
  constexpr int kMessages = 3000;
  auto bus = Bus::open(durable_bus(tmp.path)).value();
  auto* store = detail::Access::core(*bus)->store();
  REQUIRE(store->map_at_max());
  auto topic = bus->create_topic("inplace.orders", {.lanes = 2, .durable = true}).value();
  auto audit = bus->create_topic("inplace.audit", {.lanes = 1, .durable = true}).value();
  std::vector<std::string> keys, payloads;  // the messages' bytes (OutgoingMessage holds views)
  for (int i = 0; i < kMessages; ++i) {
    keys.push_back("k" + std::to_string(i % 7));
    payloads.push_back("order-" + std::to_string(i));
  }
  std::vector<OutgoingMessage> batch;
  for (int i = 0; i < kMessages; ++i) batch.push_back({.key = keys[static_cast<std::size_t>(i)], .payload = payloads[static_cast<std::size_t>(i)]});
  REQUIRE(topic.publish_batch(batch).published == batch.size());
  std::mutex mu;
  std::vector<int> got;
  std::atomic<int> in_map{0}, copied{0}, published{0}, tries{0};
  auto sub = bus->subscribe_batch(
                    topic, "billing",
                    [&](std::span<const MessageView> ms) {
                      // (in_map reads /proc/self/maps: the first and last view of each call)
                      const bool mapped = store->in_map(ms.front().payload().data()) &&
                                          store->in_map(ms.back().payload().data());
                      (mapped ? in_map : copied) += static_cast<int>(ms.size());
                      {
                        std::lock_guard l(mu);
                        for (const MessageView& m : ms) got.push_back(std::stoi(std::string(m.payload().substr(6))));
                      }
                      // A Sync publish waits for the writer's commit while this
                      // call holds its read: the map never moves, so the writer
                      // never waits for the read to end.
                      if (tries.fetch_add(1) < 20) {
                        Status s = audit.publish({.key = "a", .payload = std::string(ms.front().payload())});
                        CHECK(s.ok());
                        published++;
                      }
                      // The views are still the messages after that commit.
                      for (const MessageView& m : ms) CHECK(m.payload().substr(0, 6) == "order-");
                      return BatchOutcome::all_acked();
                    },
                    {.batch_max = 64})
                 .value();
  const bool all = wait_until([&] {
    std::lock_guard l(mu);
    return got.size() >= static_cast<std::size_t>(kMessages);
  });
  {
    std::lock_guard l(mu);
    MESSAGE("got " << got.size() << ", in the map " << in_map.load() << ", copies " << copied.load());
  }
  REQUIRE(all);
  REQUIRE(sub.close().ok());
  std::lock_guard l(mu);
  CHECK(got.size() == static_cast<std::size_t>(kMessages));  // each once
  std::sort(got.begin(), got.end());
  for (int i = 0; i < kMessages; ++i) CHECK(got[static_cast<std::size_t>(i)] == i);
  CHECK(in_map.load() == kMessages);  // read in place: no message went through a copy
  CHECK(published.load() == 20);
  auto audit_ref = store->find_topic("inplace.audit");
  REQUIRE(audit_ref.ok());
  CHECK((*store->lane_info(*audit_ref, 0)).count == 20);
}

TEST_CASE("a batch handler on a durable queue gets spans of one lane's claims; stop_at retries one claim, the rest come again") {
  TempDir tmp;
  constexpr int kMessages = 300;
  constexpr std::uint32_t kSpan = 16;
  Spans seen;
  auto bus = Bus::open(durable_bus(tmp.path)).value();
  auto queue = bus->create_queue("spans.mail", {.lanes = 4, .durable = true}).value();
  for (int i = 0; i < kMessages; ++i)
    REQUIRE(queue.publish({.key = "k" + std::to_string(i % 7), .payload = std::to_string(i)}).ok());
  auto sub = bus->consume_batch(
                    queue,
                    [&](std::span<const MessageView> ms) {
                      const SpanCall c = seen.record(ms);
                      for (std::size_t j = 0; j < c.payloads.size(); ++j) {
                        if (c.payloads[j] == 77 && c.attempts[j] == 1) {
                          seen.ack(c, j);
                          return BatchOutcome::stop_at(j, Outcome::retry("smtp busy"));
                        }
                      }
                      seen.ack(c, c.payloads.size());
                      return BatchOutcome::all_acked();
                    },
                    {.backoff_initial = 1ms, .backoff_max = 5ms, .batch_max = kSpan})
                 .value();
  REQUIRE(wait_until([&] { return seen.acked_total == kMessages; }));
  REQUIRE(wait_until([&] {
    auto s = bus->stats();
    return s.topics[0].groups[0].total.acked == static_cast<std::uint64_t>(kMessages) &&
           s.topics[0].groups[0].total.in_flight == 0;
  }));
  CHECK(bus->stats().topics[0].groups[0].total.delivered == static_cast<std::uint64_t>(kMessages + 1));  // + 77's retry
  seen.check_calls(kSpan);
  std::lock_guard l(seen.mu);
  for (int i = 0; i < kMessages; ++i) CHECK_MESSAGE(seen.acked[i] == 1, "message " << i);
  std::vector<std::uint32_t> attempts_of_77;
  for (const SpanCall& c : seen.calls)
    for (std::size_t j = 0; j < c.payloads.size(); ++j)
      if (c.payloads[j] == 77) attempts_of_77.push_back(c.attempts[j]);
  CHECK(attempts_of_77 == std::vector<std::uint32_t>{1, 2});
  seen.check_key_order(7);
}

TEST_CASE("a durable topic group closed in the middle of a read resumes after a restart where it stopped: nothing handled comes again") {
  // A run that leaves read messages in its buffer may leave its offset
  // commit to a later run (durable_lane.cpp, topic_run_end); a consumer that
  // leaves meanwhile must still get its position committed.
  TempDir tmp;
  constexpr int kMessages = 2000;
  std::atomic<int> handled{0};
  std::atomic<bool> slow{false};
  {
    auto bus = Bus::open(durable_bus(tmp.path)).value();
    auto topic = bus->create_topic("resume.mid", {.lanes = 1, .durable = true}).value();
    for (int i = 0; i < kMessages; ++i) REQUIRE(topic.publish({.key = "k", .payload = std::to_string(i)}).ok());
    auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                     CHECK(std::stoi(std::string(m.payload())) == handled.load());  // in order, each once
                     if (handled.fetch_add(1) + 1 >= 300) {
                       slow = true;
                       std::this_thread::sleep_for(50us);  // a run of 64 stays well under the commit's 20 ms wait
                     }
                     return Outcome::ack();
                   }).value();
    REQUIRE(wait_until([&] { return slow.load(); }));
    REQUIRE(sub.close().ok());
    REQUIRE(bus->shutdown(ShutdownMode::Drain, 10s).ok());
  }
  const int before = handled.load();
  CHECK(before < kMessages);
  std::atomic<int> first{-1};
  std::atomic<int> again{0};
  auto bus = Bus::open(durable_bus(tmp.path)).value();
  auto topic = bus->create_topic("resume.mid", {.lanes = 1, .durable = true}).value();
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                   const int p = std::stoi(std::string(m.payload()));
                   int none = -1;
                   first.compare_exchange_strong(none, p);
                   again.fetch_add(1);
                   return Outcome::ack();
                 }).value();
  REQUIRE(wait_until([&] { return again.load() >= kMessages - before; }));
  std::this_thread::sleep_for(50ms);
  CHECK(first == before);
  CHECK(again.load() == kMessages - before);
}
