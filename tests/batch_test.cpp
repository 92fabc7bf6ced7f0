// lanebus — MIT License.
// Topic::publish_batch (include/lanebus/bus.hpp, doc/performance.md): per-key
// order across chunks and producer threads, fan-out, ids and created_at,
// validation, and the partial-batch result under Block, FailFast and
// DropOldest with the counters it leaves.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "acked.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::all_groups_acked;
using lanebus::test::wait_until;

namespace {

/// What a group saw of payloads "<key>:<seq>": per key the numbers must
/// increase (DropOldest's drops leave gaps, never reorder).
struct SeenInOrder {
  std::mutex mu;
  std::map<std::string, int> last;
  int violations = 0;
  std::atomic<std::uint64_t> handled{0};
  void see(const MessageView& m) {
    std::string p(m.payload());
    const int seq = std::stoi(p.substr(p.rfind(':') + 1));
    std::lock_guard l(mu);
    auto [it, fresh] = last.try_emplace(std::string(m.key()), seq);
    if (!fresh) {
      if (seq <= it->second) ++violations;
      it->second = seq;
    }
    ++handled;
  }
};

/// Payloads and keys that outlive the OutgoingMessage views of a batch.
struct Batch {
  std::vector<std::string> keys, payloads;
  std::vector<OutgoingMessage> msgs;
  void add(std::string key, std::string payload) {
    keys.push_back(std::move(key));
    payloads.push_back(std::move(payload));
  }
  std::span<const OutgoingMessage> span() {
    msgs.clear();
    for (std::size_t i = 0; i < keys.size(); ++i) msgs.push_back({.key = keys[i], .payload = payloads[i]});
    return msgs;
  }
};

/// Handler side: per key, payloads "<key>:<seq>" must arrive as 0, 1, 2, ...
struct Order {
  std::mutex mu;
  std::map<std::string, int> next;
  int violations = 0;
  std::atomic<int> seen{0};
  void see(const MessageView& m) {
    std::string p(m.payload());
    const int seq = std::stoi(p.substr(p.rfind(':') + 1));
    std::lock_guard l(mu);
    int& n = next[std::string(m.key())];
    if (seq != n) ++violations;
    n = seq + 1;
    ++seen;
  }
};

}  // namespace

TEST_CASE("publish_batch keeps per-key order across chunks, producer threads and groups") {
  // Each way publish_batch groups a chunk by lane (publish.cpp,
  // sort_into_runs): a bucket per lane (up to 16), a counting sort (up to
  // 256), a scan per lane (more).
  std::uint32_t lanes = 8;
  SUBCASE("8 lanes") { lanes = 8; }
  SUBCASE("40 lanes") { lanes = 40; }
  SUBCASE("300 lanes") { lanes = 300; }
  CAPTURE(lanes);
  auto bus = Bus::open({.workers = 2}).value();
  auto topic = bus->create_topic("batch.order", {.lanes = lanes, .capacity = 1024}).value();
  Order a, b;
  std::atomic<int> wrong_lane{0};
  auto sa = bus->subscribe(topic, "a", [&](const MessageView& m) {
                  a.see(m);
                  if (m.lane() != lane_for_key(m.key(), lanes)) wrong_lane.fetch_add(1);
                  return Outcome::ack();
                }).value();
  auto sb = bus->subscribe(topic, "b", [&](const MessageView& m) {
                  b.see(m);
                  return Outcome::ack();
                }).value();
  constexpr int kThreads = 3, kBatches = 200, kPerBatch = 150;  // 150: chunks of 64, 64 and 22
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Publisher pub = bus->publisher();
      int seq[10] = {};
      for (int i = 0; i < kBatches; ++i) {
        Batch batch;
        for (int j = 0; j < kPerBatch; ++j) {
          const int k = (i * 7 + j) % 10;  // keys interleave within a batch
          std::string key = "t" + std::to_string(t) + "k" + std::to_string(k);
          batch.add(key, key + ":" + std::to_string(seq[k]++));
        }
        auto r = (i % 2) ? pub.publish_batch(topic, batch.span()) : topic.publish_batch(batch.span());
        if (!r.ok() || r.published != kPerBatch) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  const int total = kThreads * kBatches * kPerBatch;
  REQUIRE(wait_until([&] { return a.seen.load() == total && b.seen.load() == total; }));
  REQUIRE(all_groups_acked(*bus, static_cast<std::uint64_t>(total)));  // acks counted after the handler returns
  CHECK(failures.load() == 0);
  CHECK(wrong_lane.load() == 0);
  CHECK(a.violations == 0);
  CHECK(b.violations == 0);
  BusStats st = bus->stats();
  REQUIRE(st.topics.size() == 1);
  CHECK(st.topics[0].published == static_cast<std::uint64_t>(total));
  std::uint64_t lane_sum = 0;
  for (auto v : st.topics[0].lane_published) lane_sum += v;
  CHECK(lane_sum == static_cast<std::uint64_t>(total));
  // Each lane counted the messages of its keys: every run went to its lane.
  std::vector<std::uint64_t> expected(lanes, 0);
  for (int t = 0; t < kThreads; ++t)
    for (int k = 0; k < 10; ++k)
      expected[lane_for_key("t" + std::to_string(t) + "k" + std::to_string(k), lanes)] += kBatches * kPerBatch / 10;
  REQUIRE(st.topics[0].lane_published.size() == lanes);
  for (std::uint32_t l = 0; l < lanes; ++l) CHECK(st.topics[0].lane_published[l] == expected[l]);
  for (const auto& g : st.topics[0].groups) CHECK(g.total.acked == static_cast<std::uint64_t>(total));
}

TEST_CASE("publish_batch: ids are unique, created_at is set, an empty span is OK, bad input publishes nothing") {
  auto bus = Bus::open({.workers = 1}).value();
  auto topic = bus->create_topic("batch.ids", {.lanes = 4, .slot_bytes = 32, .max_payload = 32}).value();
  std::mutex mu;
  std::set<std::uint64_t> ids;
  std::vector<std::int64_t> created;
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                   std::lock_guard l(mu);
                   ids.insert(m.id());
                   created.push_back(m.created_at_ns());
                   return Outcome::ack();
                 }).value();
  const std::int64_t before = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
  Batch batch;
  for (int i = 0; i < 100; ++i) batch.add("k" + std::to_string(i), "p" + std::to_string(i));
  Publisher pub = bus->publisher();
  CHECK(pub.publish_batch(topic, batch.span()).published == 100);
  CHECK(topic.publish_batch(batch.span()).published == 100);
  REQUIRE(topic.publish({.key = "x", .payload = "y"}).ok());
  REQUIRE(wait_until([&] {
    std::lock_guard l(mu);
    return created.size() == 201;
  }));
  {
    std::lock_guard l(mu);
    CHECK(ids.size() == 201);
    for (auto c : created) CHECK(c >= before);
  }

  auto empty = topic.publish_batch({});
  CHECK(empty.ok());
  CHECK(empty.published == 0);

  Batch bad;
  bad.add("a", "fine");
  bad.add("b", "");  // empty payload
  auto r = topic.publish_batch(bad.span());
  CHECK(r.status.code() == Code::InvalidArgument);
  CHECK(r.published == 0);
  Batch big;
  big.add("a", "fine");
  big.add("b", std::string(40, 'x'));  // > max_payload
  r = topic.publish_batch(big.span());
  CHECK(r.status.code() == Code::PayloadTooLarge);
  CHECK(r.status.message().find("max_payload") != std::string_view::npos);
  CHECK(r.published == 0);
  CHECK(Topic().publish_batch(batch.span()).status.code() == Code::InvalidArgument);
  std::this_thread::sleep_for(20ms);
  BusStats st = bus->stats();
  CHECK(st.topics[0].published == 201);  // the refused batches published nothing
  CHECK(st.topics[0].publish_refused == 0);

  REQUIRE(bus->shutdown(ShutdownMode::Drain).ok());
  r = topic.publish_batch(batch.span());
  CHECK(r.status.code() == Code::ShutDown);
  CHECK(r.published == 0);
}

TEST_CASE("publish_batch on a partly full topic: FailFast publishes the prefix that fits") {
  auto bus = Bus::open({.workers = 1}).value();
  auto topic =
      bus->create_topic("batch.failfast", {.lanes = 2, .backpressure = Backpressure::FailFast, .capacity = 16})
          .value();
  std::atomic<bool> gate{false};
  std::atomic<int> handled{0};
  std::mutex mu;
  std::vector<std::string> got;
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                   while (!gate.load()) std::this_thread::sleep_for(100us);
                   std::lock_guard l(mu);
                   got.emplace_back(m.payload());
                   ++handled;
                   return Outcome::ack();
                 }).value();
  // 10 single publishes hold 10 of 16 slots (the worker is stuck in the first).
  for (int i = 0; i < 10; ++i) REQUIRE(topic.publish({.key = "k", .payload = "s" + std::to_string(i)}).ok());
  Batch batch;
  for (int i = 0; i < 20; ++i) batch.add("k", "b" + std::to_string(i));
  auto r = topic.publish_batch(batch.span());
  CHECK(r.status.code() == Code::WouldBlock);
  CHECK(r.published == 6);
  // The rest of the batch was not attempted: one refused result, as publish's loop would have had.
  BusStats st = bus->stats();
  CHECK(st.topics[0].published == 16);
  CHECK(st.topics[0].publish_refused == 1);
  gate = true;
  REQUIRE(wait_until([&] { return handled.load() == 16; }));
  // The caller goes on from messages[published] once there is room.
  auto rest = topic.publish_batch(batch.span().subspan(r.published));
  CHECK(rest.ok());
  CHECK(rest.published == 14);
  REQUIRE(wait_until([&] { return handled.load() == 30; }));
  std::lock_guard l(mu);
  std::vector<std::string> want;
  for (int i = 0; i < 10; ++i) want.push_back("s" + std::to_string(i));
  for (int i = 0; i < 20; ++i) want.push_back("b" + std::to_string(i));
  CHECK(got == want);  // one key: span order, after the earlier publishes
}

TEST_CASE("publish_batch on a partly full topic: Block waits per message, then times out with the prefix") {
  auto bus = Bus::open({.workers = 1}).value();
  auto topic = bus->create_topic("batch.block", {.lanes = 1, .backpressure = Backpressure::Block,
                                                 .block_timeout = 50ms, .capacity = 8})
                   .value();
  std::atomic<bool> gate{false};
  std::atomic<int> handled{0};
  auto sub = bus->subscribe(topic, "g", [&](const MessageView&) {
                   while (!gate.load()) std::this_thread::sleep_for(100us);
                   ++handled;
                   return Outcome::ack();
                 }).value();
  Batch batch;
  for (int i = 0; i < 12; ++i) batch.add("k", std::to_string(i));
  auto r = topic.publish_batch(batch.span());
  CHECK(r.status.code() == Code::TimedOut);
  CHECK(r.published == 8);
  CHECK(bus->stats().topics[0].publish_refused == 1);
  gate = true;
  REQUIRE(wait_until([&] { return handled.load() == 8; }));

  // A blocked batch goes on as the consumer frees slots: all 40 messages of a
  // batch five times the capacity get through within the timeout.
  auto topic2 = bus->create_topic("batch.block2", {.lanes = 1, .backpressure = Backpressure::Block,
                                                   .block_timeout = 20s, .capacity = 8})
                    .value();
  std::atomic<int> h2{0};
  std::vector<int> order;
  auto sub2 = bus->subscribe(topic2, "g", [&](const MessageView& m) {
                    order.push_back(std::stoi(std::string(m.payload())));  // one lane: one worker at a time
                    ++h2;
                    return Outcome::ack();
                  }).value();
  Batch big;
  for (int i = 0; i < 40; ++i) big.add("k", std::to_string(i));
  auto r2 = topic2.publish_batch(big.span());
  CHECK(r2.ok());
  CHECK(r2.published == 40);
  REQUIRE(wait_until([&] { return h2.load() == 40; }));
  std::vector<int> want(40);
  for (int i = 0; i < 40; ++i) want[i] = i;
  CHECK(order == want);
}

TEST_CASE("publish_batch on a partly full topic: DropOldest publishes everything and counts the drops") {
  auto bus = Bus::open({.workers = 1}).value();
  auto topic =
      bus->create_topic("batch.drop", {.lanes = 1, .backpressure = Backpressure::DropOldest, .capacity = 8}).value();
  std::atomic<bool> gate{false};
  std::atomic<bool> first_in{false};
  std::mutex mu;
  std::vector<std::string> got;
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                   first_in = true;
                   while (!gate.load()) std::this_thread::sleep_for(100us);
                   std::lock_guard l(mu);
                   got.emplace_back(m.payload());
                   return Outcome::ack();
                 }).value();
  REQUIRE(topic.publish({.key = "k", .payload = "0"}).ok());
  REQUIRE(wait_until([&] { return first_in.load(); }));  // "0" is in the handler, holding a slot
  Batch batch;
  constexpr int kN = 30;
  for (int i = 1; i <= kN; ++i) batch.add("k", std::to_string(i));
  auto r = topic.publish_batch(batch.span());
  CHECK(r.ok());
  CHECK(r.published == kN);
  gate = true;
  // 8 slots: "0" in hand + the 7 newest; everything between was dropped.
  REQUIRE(wait_until([&] {
    std::lock_guard l(mu);
    return got.size() == 8;
  }));
  std::this_thread::sleep_for(20ms);
  std::lock_guard l(mu);
  std::vector<std::string> want{"0"};
  for (int i = kN - 6; i <= kN; ++i) want.push_back(std::to_string(i));
  CHECK(got == want);
  BusStats st = bus->stats();
  CHECK(st.topics[0].groups[0].total.dropped == kN - 7);
  CHECK(st.topics[0].published == kN + 1);
  CHECK(st.topics[0].publish_refused == 0);
}

TEST_CASE("publish_batch with no group counts the messages as unrouted") {
  auto bus = Bus::open({.workers = 1}).value();
  auto topic = bus->create_topic("batch.unrouted", {.lanes = 4}).value();
  Batch batch;
  for (int i = 0; i < 70; ++i) batch.add("k" + std::to_string(i), "p");
  CHECK(topic.publish_batch(batch.span()).published == 70);
  BusStats st = bus->stats();
  CHECK(st.topics[0].published == 70);
  CHECK(st.topics[0].unrouted == 70);
}

TEST_CASE("publish_batch from 3 threads into a DropOldest topic with 2 groups: order kept, every message accounted for") {
  auto bus = Bus::open({.workers = 2}).value();
  auto topic =
      bus->create_topic("batch.dropmt", {.lanes = 4, .backpressure = Backpressure::DropOldest, .capacity = 64}).value();
  SeenInOrder slow, fast;
  auto s1 = bus->subscribe(topic, "slow", [&](const MessageView& m) {
                  for (int i = 0; i < 3000; ++i) asm volatile("" ::: "memory");
                  slow.see(m);
                  return Outcome::ack();
                }).value();
  auto s2 = bus->subscribe(topic, "fast", [&](const MessageView& m) {
                  fast.see(m);
                  return Outcome::ack();
                }).value();
  constexpr int kThreads = 3, kBatches = 150, kPerBatch = 40;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Publisher pub = bus->publisher();
      int seq[6] = {};
      for (int i = 0; i < kBatches; ++i) {
        Batch batch;
        for (int j = 0; j < kPerBatch; ++j) {
          const int k = (i + j) % 6;
          std::string key = "t" + std::to_string(t) + "k" + std::to_string(k);
          batch.add(key, key + ":" + std::to_string(seq[k]++));
        }
        auto r = pub.publish_batch(topic, batch.span());
        if (!r.ok() || r.published != kPerBatch) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  const std::uint64_t total = kThreads * kBatches * kPerBatch;
  // Every message is handled or dropped, per group.
  auto settled = [&](const char* name, const SeenInOrder& s) {
    const std::uint64_t handled = s.handled.load();
    const BusStats st = bus->stats();
    for (const auto& g : st.topics[0].groups)
      if (g.name == name) return handled + g.total.dropped == total;
    return false;
  };
  REQUIRE(wait_until([&] { return settled("slow", slow) && settled("fast", fast); }));
  CHECK(failures.load() == 0);
  CHECK(slow.violations == 0);
  CHECK(fast.violations == 0);
  BusStats st = bus->stats();
  CHECK(st.topics[0].published == total);
  CHECK(st.topics[0].publish_refused == 0);
  CHECK(bus->shutdown(ShutdownMode::Drain).ok());
}

// Solo ownership ending under contention (bus_impl.hpp, "Solo publishers"):
// the first publisher of each topic owns it, the others make it shared while
// its window may be open. make_shared once stored "shared" before the old
// owner's window closed, and a third publisher that read it appended at once:
// two tails for one ring, messages lost and a publisher spinning forever on a
// cell (a 60 s hang of the DropOldest case above in CI). A DropOldest ring
// with a slow group keeps the owner's window open longest (its appends wait
// for the cells a drop frees); six publishers on two cores get preempted
// inside it; 16 fresh topics give 16 hand-overs. Per group, every message is
// handled or dropped, in order per key.
TEST_CASE("solo ownership handed over under contention: 6 publishers, 16 DropOldest topics, nothing lost or reordered") {
  auto bus = Bus::open({.workers = 2}).value();
  constexpr int kTopics = 16, kThreads = 6, kBatches = 40, kPerBatch = 24;
  std::vector<Topic> topics;
  std::vector<std::unique_ptr<SeenInOrder>> sinks;  // two per topic: slow, fast
  std::vector<Subscription> subs;
  for (int i = 0; i < kTopics; ++i) {
    topics.push_back(bus->create_topic("handover." + std::to_string(i),
                                       {.lanes = 2, .backpressure = Backpressure::DropOldest, .capacity = 64})
                         .value());
    sinks.push_back(std::make_unique<SeenInOrder>());
    SeenInOrder* slow = sinks.back().get();
    sinks.push_back(std::make_unique<SeenInOrder>());
    SeenInOrder* fast = sinks.back().get();
    subs.push_back(bus->subscribe(topics.back(), "slow", [slow](const MessageView& m) {
                         for (int k = 0; k < 3000; ++k) asm volatile("" ::: "memory");
                         slow->see(m);
                         return Outcome::ack();
                       }).value());
    subs.push_back(bus->subscribe(topics.back(), "fast", [fast](const MessageView& m) {
                         fast->see(m);
                         return Outcome::ack();
                       }).value());
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Publisher pub = bus->publisher();
      for (int i = 0; i < kTopics; ++i) {
        std::string keys[3];
        for (int k = 0; k < 3; ++k) keys[k] = "t" + std::to_string(t) + "k" + std::to_string(k);
        int seq[3] = {};
        for (int b = 0; b < kBatches; ++b) {
          Batch batch;
          for (int j = 0; j < kPerBatch; ++j) batch.add(keys[j % 3], keys[j % 3] + ":" + std::to_string(seq[j % 3]++));
          auto res = pub.publish_batch(topics[i], batch.span());
          if (!res.ok() || res.published != kPerBatch) failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
  constexpr std::uint64_t kPerTopic = std::uint64_t{kThreads} * kBatches * kPerBatch;
  const char* names[2] = {"slow", "fast"};
  for (int i = 0; i < kTopics; ++i) {
    for (int g = 0; g < 2; ++g) {
      INFO("topic " << i << " group " << names[g]);
      SeenInOrder& s = *sinks[2 * i + g];
      auto settled = [&] {
        const BusStats st = bus->stats();
        for (const auto& ts : st.topics)
          if (ts.name == "handover." + std::to_string(i))
            for (const auto& gs : ts.groups)
              if (gs.name == names[g]) return s.handled.load() + gs.total.dropped == kPerTopic;
        return false;
      };
      REQUIRE(wait_until(settled));
      std::lock_guard l(s.mu);
      CHECK(s.violations == 0);
    }
  }
  CHECK(bus->shutdown(ShutdownMode::Drain).ok());
}

TEST_CASE("a batch handler's latency histogram counts each acked message once, whether its span shares a stamp or not") {
  // run_plain_batch counts messages with the same created_at (a
  // publish_batch chunk is stamped once) in their bucket together: the
  // histogram must still hold one count per message and the sum of every
  // message's latency. Each call sleeps 2 ms before it acks, so every
  // latency is at least that.
  auto bus = Bus::open({.workers = 1}).value();
  auto topic = bus->create_topic("batch.latency", {.lanes = 2}).value();
  std::atomic<std::uint64_t> handled{0};
  auto sub = bus->subscribe_batch(topic, "g", [&](std::span<const MessageView> ms) {
                   std::this_thread::sleep_for(2ms);
                   handled.fetch_add(ms.size());
                   return BatchOutcome::all_acked();
                 }).value();
  const auto started = std::chrono::steady_clock::now();
  Publisher pub = bus->publisher();
  std::uint64_t total = 0;
  for (int i = 0; i < 100; ++i, ++total)  // one stamp per message
    REQUIRE(pub.publish(topic, {.key = "k" + std::to_string(i % 4), .payload = "one"}).ok());
  for (int b = 0; b < 3; ++b) {  // one stamp per chunk of 64
    Batch batch;
    for (int j = 0; j < 64; ++j) batch.add("k" + std::to_string(j % 4), "many");
    REQUIRE(pub.publish_batch(topic, batch.span()).published == 64);
    total += 64;
  }
  REQUIRE(wait_until([&] { return handled.load() == total; }));
  REQUIRE(wait_until([&] { return bus->stats().topics[0].groups[0].latency.count == total; }));
  const auto elapsed_ns = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count());
  const LatencyHistogram h = bus->stats().topics[0].groups[0].latency;
  std::uint64_t in_buckets = 0;
  for (std::uint64_t c : h.counts) in_buckets += c;
  CHECK(in_buckets == total);
  CHECK(h.sum_ns >= total * 2'000'000);  // every message waited out at least one sleep
  CHECK(h.sum_ns <= total * elapsed_ns);
}
