// lanebus — MIT License.
// The plain worker fast path (lib/core/ephemeral_lane.cpp, doc/performance.md):
// acks, retries, handler exceptions, rejects and exhausted retries mixed in
// the same runs of a lane keep per-key order and leave exactly the counters
// the general loop leaves, with two producer threads, two workers, two
// groups and stats() read while the lanes run.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "wait.hpp"

using namespace lanebus;
using lanebus::test::wait_until;

namespace {

enum class Fate { Ack, RetryOnce, ThrowOnce, Reject, RetryAlways };

/// Deterministic per message: about one message in 10 is not acked at first.
Fate fate_of(int producer, int key, int seq) {
  const unsigned h = static_cast<unsigned>(producer * 7919 + key * 104729 + seq * 2654435761u) % 50;
  if (h == 0) return Fate::RetryOnce;
  if (h == 1) return Fate::ThrowOnce;
  if (h == 2) return Fate::Reject;
  if (h == 3) return Fate::RetryAlways;
  return Fate::Ack;
}

/// Per key: every call is the previous message again (attempt + 1) or the
/// next message (attempt 1), and a message comes again only if it was not
/// acked.
struct KeyOrder {
  std::mutex mu;
  std::map<std::string, std::pair<int, std::uint32_t>> last;  // key -> (seq, attempt)
  int violations = 0;
  std::atomic<std::uint64_t> calls{0};
  void see(const std::string& key, int seq, std::uint32_t attempt) {
    std::lock_guard l(mu);
    auto it = last.find(key);
    const bool ok = it == last.end() ? (seq == 0 && attempt == 1)
                                     : ((seq == it->second.first && attempt == it->second.second + 1) ||
                                        (seq == it->second.first + 1 && attempt == 1));
    if (!ok) ++violations;
    last[key] = {seq, attempt};
    calls.fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace

TEST_CASE("plain groups: acks, retries, exceptions and rejects in one run keep per-key order and the counters") {
  auto bus = Bus::open({.workers = 2}).value();
  auto topic = bus->create_topic("fast.mixed", {.lanes = 8, .capacity = 512}).value();
  const GroupOptions opts{.max_attempts = 3};
  KeyOrder order;
  auto sub = bus->subscribe(
                    topic, "mixed",
                    [&](const MessageView& m) {
                      const std::string p(m.payload());  // "<producer>:<key>:<seq>"
                      const auto c1 = p.find(':'), c2 = p.rfind(':');
                      const int producer = std::stoi(p.substr(0, c1));
                      const int key = std::stoi(p.substr(c1 + 1, c2 - c1 - 1));
                      const int seq = std::stoi(p.substr(c2 + 1));
                      order.see(std::string(m.key()), seq, m.attempt());
                      switch (fate_of(producer, key, seq)) {
                        case Fate::RetryOnce:
                          return m.attempt() == 1 ? Outcome::retry("once") : Outcome::ack();
                        case Fate::ThrowOnce:
                          if (m.attempt() == 1) throw std::runtime_error("once");
                          return Outcome::ack();
                        case Fate::Reject:
                          return Outcome::reject("no");
                        case Fate::RetryAlways:
                          return Outcome::retry("always");
                        case Fate::Ack:
                          break;
                      }
                      return Outcome::ack();
                    },
                    opts)
                 .value();
  std::atomic<std::uint64_t> plain_acks{0};
  auto other = bus->subscribe(topic, "acks", [&](const MessageView&) {
                     plain_acks.fetch_add(1, std::memory_order_relaxed);
                     return Outcome::ack();
                   }).value();

  constexpr int kProducers = 2, kKeys = 8, kPerKey = 400;
  std::uint64_t want_delivered = 0, want_acked = 0, want_retried = 0, want_rejected = 0, want_failed = 0;
  for (int p = 0; p < kProducers; ++p) {
    for (int k = 0; k < kKeys; ++k) {
      for (int s = 0; s < kPerKey; ++s) {
        switch (fate_of(p, k, s)) {
          case Fate::Ack: want_delivered += 1, want_acked += 1; break;
          case Fate::RetryOnce:
          case Fate::ThrowOnce: want_delivered += 2, want_retried += 1, want_acked += 1; break;
          case Fate::Reject: want_delivered += 1, want_rejected += 1; break;
          case Fate::RetryAlways: want_delivered += 3, want_retried += 3, want_failed += 1; break;
        }
      }
    }
  }
  REQUIRE(want_retried > 0);
  REQUIRE(want_rejected > 0);
  REQUIRE(want_failed > 0);

  // stats() while the lanes run: every counter only grows.
  std::atomic<bool> stop{false};
  std::atomic<int> went_back{0};
  std::thread reader([&] {
    std::uint64_t prev_delivered = 0, prev_acked = 0;
    while (!stop.load()) {
      BusStats st = bus->stats();
      for (const auto& g : st.topics.at(0).groups) {
        if (g.name != "mixed") continue;
        if (g.total.delivered < prev_delivered || g.total.acked < prev_acked) went_back.fetch_add(1);
        prev_delivered = g.total.delivered;
        prev_acked = g.total.acked;
      }
      std::this_thread::yield();
    }
  });

  std::vector<std::thread> producers;
  std::atomic<int> failures{0};
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      Publisher pub = bus->publisher();
      for (int s = 0; s < kPerKey; ++s) {
        for (int k = 0; k < kKeys; ++k) {
          const std::string key = "p" + std::to_string(p) + "k" + std::to_string(k);
          const std::string payload = std::to_string(p) + ":" + std::to_string(k) + ":" + std::to_string(s);
          if (!pub.publish(topic, {.key = key, .payload = payload}).ok()) failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : producers) t.join();
  const std::uint64_t total = std::uint64_t{kProducers} * kKeys * kPerKey;
  auto mixed_counters = [&] {
    const BusStats st = bus->stats();
    for (const auto& g : st.topics.at(0).groups)
      if (g.name == "mixed") return g.total;
    return LaneCounters{};
  };
  const bool done = wait_until([&] {
    const LaneCounters c = mixed_counters();
    if (c.acked + c.rejected + c.failed != total || plain_acks.load() != total) return false;
    // The "acks" group's handler counts before it returns, its ack after.
    const BusStats now = bus->stats();  // a named object: the loop below reads into it
    for (const auto& g : now.topics.at(0).groups)
      if (g.name == "acks" && g.total.acked != total) return false;
    return true;
  });
  stop.store(true);
  reader.join();
  {
    const LaneCounters c = mixed_counters();
    INFO("acked=" << c.acked << " rejected=" << c.rejected << " failed=" << c.failed << " delivered=" << c.delivered
                  << " retried=" << c.retried << " total=" << total << " acks group=" << plain_acks.load());
    REQUIRE(done);
  }

  CHECK(failures.load() == 0);
  CHECK(order.violations == 0);
  CHECK(went_back.load() == 0);
  CHECK(order.calls.load() == want_delivered);
  const LaneCounters c = mixed_counters();
  CHECK(c.delivered == want_delivered);
  CHECK(c.acked == want_acked);
  CHECK(c.retried == want_retried);
  CHECK(c.rejected == want_rejected);
  CHECK(c.failed == want_failed);
  const BusStats st = bus->stats();
  for (const auto& g : st.topics.at(0).groups) {
    if (g.name != "acks") continue;
    CHECK(g.total.delivered == total);
    CHECK(g.total.acked == total);
    CHECK(g.total.retried == 0);
  }
  CHECK(bus->shutdown(ShutdownMode::Drain).ok());
}

// ---------------------------------------------------------------- solo publishers
// A topic published to through one Publisher only is owned by it (bus_impl.hpp,
// "Solo publishers"): plain ring appends, no locked instruction. Another
// publisher takes it over for good; the owner gives it back when destroyed.

#include "bus_impl.hpp"
#include "clock_bound.hpp"
#include "wall_clock.hpp"

namespace {
std::uintptr_t owner_of(Bus& bus, std::string_view topic) {
  return lanebus::detail::Access::core(bus)->find(topic)->owner.load();
}

/// Per key: sequence numbers arrive as 0, 1, 2, ... exactly once.
struct Sequences {
  std::mutex mu;
  std::map<std::string, int> next;
  int violations = 0;
  std::atomic<std::uint64_t> seen{0};
  void see(std::string_view key, int seq) {
    std::lock_guard l(mu);
    int& n = next[std::string(key)];
    if (seq != n) ++violations;
    n = seq + 1;
    seen.fetch_add(1, std::memory_order_relaxed);
  }
};

std::string payload_of(int seq) { return std::to_string(seq); }
}  // namespace

TEST_CASE("a solo publisher's topic is taken over by a second Publisher and by Topic::publish, losing nothing") {
  const bool asym = lanebus::detail::AsymmetricFence::available();
  auto bus = std::move(*Bus::open({.name = "solo", .workers = 2}));
  // 256 slots: magazines of 8, and the publishers meet backpressure often.
  Topic topic = *bus->create_topic("solo.t", {.lanes = 4, .block_timeout = std::chrono::seconds(30), .capacity = 256});
  Sequences seqs;
  auto sub = *bus->subscribe(topic, "g", [&](const MessageView& m) {
    seqs.see(m.key(), std::stoi(std::string(m.payload())));
    return Outcome::ack();
  });
  constexpr int kPerKey = 2500, kKeys = 8;
  std::atomic<int> first_done{0}, owner_checked{0}, b_started{0}, c_started{0};
  std::thread a([&, pub = bus->publisher()]() mutable {
    for (int i = 0; i < kPerKey; ++i)
      for (int k = 0; k < kKeys; ++k) {
        const std::string key = "a" + std::to_string(k), p = payload_of(i);
        REQUIRE(pub.publish(topic, {.key = key, .payload = p}).ok());
        if (i == kPerKey / 4 && k == 0) {
          // Wait for the check below: a that ran to its end meanwhile would
          // have given the topic back (its Publisher destroyed), and the
          // check would see an unowned topic (seen in 1 run of 2 once a
          // publish got fast enough to finish while the main thread yielded).
          first_done.store(1);
          while (owner_checked.load() == 0) std::this_thread::yield();
        }
        if (i == kPerKey / 2 && k == 0) {
          // b and c publish while a still owns the topic: on a loaded machine
          // they could otherwise start only after a ended and gave it back,
          // and nobody would ever contend (owner 0 at the end: seen with two
          // copies of this test running side by side).
          while (b_started.load() == 0 || c_started.load() == 0) std::this_thread::yield();
        }
      }
  });
  while (first_done.load() == 0) std::this_thread::yield();
  if (asym) CHECK(owner_of(*bus, "solo.t") >= 2);  // owned by a's publisher
  owner_checked.store(1);
  std::thread b([&, pub = bus->publisher()]() mutable {
    for (int i = 0; i < kPerKey; ++i)
      for (int k = 0; k < kKeys; ++k) {
        const std::string key = "b" + std::to_string(k), p = payload_of(i);
        REQUIRE(pub.publish(topic, {.key = key, .payload = p}).ok());
        b_started.store(1);
      }
  });
  std::thread c([&] {
    for (int i = 0; i < kPerKey / 5; ++i) {
      const std::string p = payload_of(i);
      REQUIRE(topic.publish({.key = "c", .payload = p}).ok());
      c_started.store(1);
    }
  });
  a.join();
  b.join();
  c.join();
  const std::uint64_t total = std::uint64_t{2} * kPerKey * kKeys + kPerKey / 5;
  REQUIRE(wait_until([&] { return seqs.seen.load() == total; }, std::chrono::seconds(30)));
  CHECK(seqs.violations == 0);
  CHECK(owner_of(*bus, "solo.t") == 1);  // shared for good
  // The publishers are gone: their magazines are back, nothing is in use.
  REQUIRE(wait_until([&] { return bus->stats().topics.at(0).slots_in_use == 0; }, std::chrono::seconds(10)));
  CHECK(bus->stats().topics.at(0).published == total);
}

TEST_CASE("a destroyed Publisher gives its topic back, its cached slots do not hold up a drain, and it may outlive its bus") {
  const bool asym = lanebus::detail::AsymmetricFence::available();
  auto bus = std::move(*Bus::open({.name = "solo2", .workers = 1}));
  Topic topic = *bus->create_topic("solo2.t", {.lanes = 2, .capacity = 1024});
  std::atomic<int> handled{0};
  auto sub = *bus->subscribe(topic, "g", [&](const MessageView&) {
    handled.fetch_add(1);
    return Outcome::ack();
  });
  std::uintptr_t first_owner = 0;
  {
    Publisher p = bus->publisher();
    for (int i = 0; i < 100; ++i) REQUIRE(p.publish(topic, {.key = "k", .payload = "x"}).ok());
    first_owner = owner_of(*bus, "solo2.t");
    if (asym) CHECK(first_owner >= 2);
  }
  CHECK(owner_of(*bus, "solo2.t") == (asym ? 0u : 1u));  // given back (without membarrier: shared from the start)
  Publisher q = bus->publisher();
  REQUIRE(q.publish(topic, {.key = "k", .payload = "y"}).ok());
  if (asym) CHECK(owner_of(*bus, "solo2.t") >= 2);
  REQUIRE(wait_until([&] { return handled.load() == 101; }, std::chrono::seconds(10)));
  // q's magazine still caches free slots: they are not "in use". (The
  // worker gives the slots it freed back in a chain once it is idle: wait.)
  CHECK(wait_until([&] { return bus->stats().topics.at(0).slots_in_use == 0; }, std::chrono::seconds(10)));
  sub = Subscription();
  CHECK(bus->shutdown(ShutdownMode::Drain, std::chrono::milliseconds(2000)).ok());
  CHECK(q.publish(topic, {.key = "k", .payload = "z"}).code() == Code::ShutDown);
  bus.reset();  // q outlives the bus: its destructor hands its slots back to live memory (ASan)
}

TEST_CASE("delayed messages: the timer routes a paused stream's tail without taking the topic from its publisher") {
  // The timer thread routes due messages while the topic is lent to it
  // (TopicImpl::lend_to_timer): it must neither take solo ownership nor end
  // it, so a publisher's delayed stream stays solo across its pauses
  // (delayed.hpp, "Solo publishers"). A second Publisher taking the topic
  // over while the timer routes, and the owner's Publisher destroyed after,
  // lose nothing and keep each key's order.
  const bool asym = lanebus::detail::AsymmetricFence::available();
  auto bus = std::move(*Bus::open({.name = "solo-delay", .workers = 2}));
  Topic topic = *bus->create_topic("solo.delay", {.lanes = 4, .capacity = 4096});
  Sequences seqs;
  auto sub = *bus->subscribe(topic, "g", [&](const MessageView& m) {
    seqs.see(m.key(), std::stoi(std::string(m.payload())));
    return Outcome::ack();
  });
  std::uint64_t total = 0;
  std::uintptr_t owner = 0;
  {
    Publisher a = bus->publisher();
    int next_a = 0;
    for (int round = 0; round < 5; ++round) {
      // A burst delayed 1 ms, then a pause: the timer routes every message of it.
      for (int i = 0; i < 200; ++i, ++next_a) {
        const std::string key = "a" + std::to_string(next_a % 4), p = payload_of(next_a / 4);
        OutgoingMessage m{.key = key, .payload = p};
        m.delay = std::chrono::milliseconds(1);
        REQUIRE(a.publish(topic, m).ok());
      }
      total += 200;
      REQUIRE(wait_until([&] { return seqs.seen.load() == total; }, std::chrono::seconds(10)));
      // The timer may not have given its last lend back yet (it routes the
      // last message, then gives back): the kLent bit is masked off.
      constexpr std::uintptr_t kLent = lanebus::detail::TopicImpl::kLent;
      if (round == 0) owner = owner_of(*bus, "solo.delay") & ~kLent;
      if (asym) {
        CHECK(owner >= 2);
        CHECK((owner_of(*bus, "solo.delay") & ~kLent) == owner);  // still a's, never taken for good
      }
    }
    // b takes the topic over while a's delayed messages come due (the timer
    // routes some of them with the topic lent): shared for good.
    std::thread b([&, pub = bus->publisher()]() mutable {
      for (int i = 0; i < 2000; ++i) {
        // Undelayed messages pass delayed ones of their key (the order
        // rule): the delayed half gets a key of its own.
        const std::string p = payload_of(i / 2);
        OutgoingMessage m{.key = i % 2 == 0 ? "bd" : "b", .payload = p};
        if (i % 2 == 0) m.delay = std::chrono::microseconds(300);
        REQUIRE(pub.publish(topic, m).ok());
      }
    });
    for (int i = 0; i < 2000; ++i, ++next_a) {
      const std::string key = "a" + std::to_string(next_a % 4), p = payload_of(next_a / 4);
      OutgoingMessage m{.key = key, .payload = p};
      m.delay = std::chrono::microseconds(200);
      REQUIRE(a.publish(topic, m).ok());
    }
    b.join();
    total += 4000;
  }  // a's Publisher destroyed: nothing waits on a lend
  REQUIRE(wait_until([&] { return seqs.seen.load() == total; }, std::chrono::seconds(10)));
  CHECK(seqs.violations == 0);
  CHECK(owner_of(*bus, "solo.delay") == 1);
  CHECK(wait_until([&] { return bus->stats().topics.at(0).slots_in_use == 0; }, std::chrono::seconds(10)));
  CHECK(bus->shutdown(ShutdownMode::Drain, std::chrono::milliseconds(2000)).ok());
}

TEST_CASE("Topic::publish goes through the thread's own publisher: solo for one thread, shared for two, given back when the thread exits") {
  const bool asym = lanebus::detail::AsymmetricFence::available();
  auto bus = std::move(*Bus::open({.name = "implicit", .workers = 2}));
  // 256 slots: magazines of 8; 80 threads' magazines would hold 640 if a
  // thread's exit did not give them back.
  Topic topic = *bus->create_topic("implicit.t", {.lanes = 4, .block_timeout = std::chrono::seconds(30), .capacity = 256});
  Sequences seqs;
  auto sub = *bus->subscribe(topic, "g", [&](const MessageView& m) {
    seqs.see(m.key(), std::stoi(std::string(m.payload())));
    return Outcome::ack();
  });
  // One thread publishing: its publisher owns the topic (the solo path).
  for (int i = 0; i < 1000; ++i) REQUIRE(topic.publish({.key = "main", .payload = payload_of(i)}).ok());
  if (asym) CHECK(owner_of(*bus, "implicit.t") >= 2);
  // 80 threads (more than the bus's 64 publisher slots), 8 at a time, each
  // with a key of its own: every message arrives in its key's order, and
  // the topic is shared from the second publishing thread on.
  constexpr int kThreads = 80, kPer = 50;
  for (int wave = 0; wave < kThreads / 8; ++wave) {
    std::vector<std::thread> ts;
    for (int t = 0; t < 8; ++t)
      ts.emplace_back([&, t, wave] {
        const std::string key = "t" + std::to_string(wave * 8 + t);
        for (int i = 0; i < kPer; ++i) REQUIRE(topic.publish({.key = key, .payload = payload_of(i)}).ok());
        // try_publish never blocks: a full topic (256 slots, 8 threads) is WouldBlock.
        Status st;
        while ((st = topic.try_publish({.key = key + "x", .payload = payload_of(0)})).code() == Code::WouldBlock)
          std::this_thread::yield();
        REQUIRE(st.ok());
      });
    for (auto& t : ts) t.join();
  }
  const std::uint64_t total = 1000 + std::uint64_t{kThreads} * (kPer + 1);
  REQUIRE(wait_until([&] { return seqs.seen.load() == total; }, std::chrono::seconds(30)));
  CHECK(seqs.violations == 0);
  CHECK(owner_of(*bus, "implicit.t") == 1);
  // Every exited thread gave its magazine back; the main thread's holds free
  // slots, which are not in use.
  CHECK(wait_until([&] { return bus->stats().topics.at(0).slots_in_use == 0; }, std::chrono::seconds(10)));
  CHECK(bus->stats().topics.at(0).published == total);
  // A thread's publisher outlives its bus, and the thread then publishes to
  // other buses: three in turn (its cache keeps two), then back to the first.
  std::thread survivor([&] {
    auto b1 = std::move(*Bus::open({.name = "implicit1", .workers = 1}));
    Topic t1 = *b1->create_topic("x", {.capacity = 64});
    std::atomic<int> got{0};
    auto s1 = *b1->subscribe(t1, "g", [&](const MessageView&) {
      got.fetch_add(1);
      return Outcome::ack();
    });
    for (int i = 0; i < 10; ++i) REQUIRE(t1.publish({.key = "k", .payload = "a"}).ok());
    REQUIRE(wait_until([&] { return got.load() == 10; }, std::chrono::seconds(10)));
    s1 = Subscription();
    CHECK(b1->shutdown(ShutdownMode::Drain, std::chrono::milliseconds(2000)).ok());
    CHECK(t1.publish({.key = "k", .payload = "late"}).code() == Code::ShutDown);
    b1.reset();  // this thread's publisher for b1 went with it (ASan: nothing left dangling)
    std::vector<std::unique_ptr<Bus>> others;
    std::vector<Topic> topics;
    for (int b = 0; b < 3; ++b) {
      others.push_back(std::move(*Bus::open({.name = "implicit-o" + std::to_string(b), .workers = 1})));
      topics.push_back(*others.back()->create_topic("y", {.capacity = 64}));
      REQUIRE(topics.back().publish({.key = "k", .payload = "b"}).ok());
    }
    REQUIRE(topics[0].publish({.key = "k", .payload = "c"}).ok());  // its publisher was dropped: a new one
    for (auto& o : others) CHECK(o->stats().topics.at(0).published == (o == others[0] ? 2u : 1u));
  });
  survivor.join();
}

TEST_CASE("publish_batch through a Publisher appends solo, and keeps order when Topic::publish takes the topic over") {
  const bool asym = lanebus::detail::AsymmetricFence::available();
  auto bus = std::move(*Bus::open({.name = "solo3", .workers = 2}));
  Topic topic = *bus->create_topic("solo3.t", {.lanes = 4, .block_timeout = std::chrono::seconds(30), .capacity = 512});
  Sequences seqs;
  auto sub = *bus->subscribe(topic, "g", [&](const MessageView& m) {
    seqs.see(m.key(), std::stoi(std::string(m.payload())));
    return Outcome::ack();
  });
  constexpr int kRounds = 400, kSpan = 40;  // keys k0..k7, five messages of each per span
  std::atomic<int> round{0}, owner_checked{0};
  std::thread a([&, pub = bus->publisher()]() mutable {
    std::vector<std::string> keys(kSpan), payloads(kSpan);
    std::vector<OutgoingMessage> span(kSpan);
    for (int r = 0; r < kRounds; ++r) {
      for (int j = 0; j < kSpan; ++j) {
        keys[j] = "k" + std::to_string(j % 8);
        payloads[j] = std::to_string(r * (kSpan / 8) + j / 8);
        span[j] = {.key = keys[j], .payload = payloads[j]};
      }
      const BatchPublishResult res = pub.publish_batch(topic, span);
      REQUIRE(res.ok());
      round.store(r + 1);
      // Still publishing (so still the owner) when the check below runs.
      if (r + 1 == kRounds / 4)
        while (owner_checked.load() == 0) std::this_thread::yield();
    }
  });
  while (round.load() < kRounds / 4) std::this_thread::yield();
  if (asym) CHECK(owner_of(*bus, "solo3.t") >= 2);
  owner_checked.store(1);
  for (int i = 0; i < 500; ++i) REQUIRE(topic.publish({.key = "other", .payload = std::to_string(i)}).ok());
  CHECK(owner_of(*bus, "solo3.t") == 1);
  a.join();
  REQUIRE(wait_until([&] { return seqs.seen.load() == std::uint64_t{kRounds} * kSpan + 500; }, std::chrono::seconds(30)));
  CHECK(seqs.violations == 0);
}

TEST_CASE("WallClock stays within 50 us of CLOCK_REALTIME on every thread") {
  using lanebus::detail::WallClock;
  // Past the first calibration (5 ms; tests/wall_clock_test.cpp checks it from a fresh process).
  const std::int64_t start = WallClock::realtime_ns();
  while (WallClock::realtime_ns() - start < 20'000'000) (void)WallClock::now_ns();
  lanebus::test::check_clock_bound();
}

// ---------------------------------------------------------------- batch handlers

TEST_CASE("batch handlers: spans keep lane order, a stop retries or rejects one message and the rest come again") {
  auto bus = std::move(*Bus::open({.name = "batch", .workers = 1}));
  Topic topic = *bus->create_topic("batch.t", {.lanes = 2, .block_timeout = std::chrono::seconds(30), .capacity = 4096});
  Sequences seqs;
  std::atomic<bool> gate{false};
  std::atomic<std::size_t> biggest{0};
  std::atomic<int> stops{0}, rejects{0}, throws{0};
  auto sub = *bus->subscribe_batch(
      topic, "g",
      [&](std::span<const MessageView> ms) -> BatchOutcome {
        while (!gate.load()) std::this_thread::yield();  // the first call waits: later spans are long
        if (ms.size() > biggest.load()) biggest.store(ms.size());
        for (std::size_t j = 0; j < ms.size(); ++j) {
          const MessageView& m = ms[j];
          const int seq = std::stoi(std::string(m.payload()));
          if (seq % 97 == 5 && m.attempt() == 1) {
            stops.fetch_add(1);
            return BatchOutcome::stop_at(j, Outcome::retry("try again"));
          }
          if (seq % 101 == 7 && m.attempt() == 1) {
            throws.fetch_add(1);
            if (j == 0) throw std::runtime_error("boom");  // an exception stops at the span's first message
            return BatchOutcome::stop_at(j, Outcome::retry("before the throw"));
          }
          if (seq % 89 == 3) {
            rejects.fetch_add(1);
            seqs.see(m.key(), seq);  // rejected: done with, in order
            return BatchOutcome::stop_at(j, Outcome::reject("bad"));
          }
          seqs.see(m.key(), seq);
        }
        return BatchOutcome::all_acked();
      },
      {.max_attempts = 3, .batch_max = 32});
  Publisher pub = bus->publisher();
  constexpr int kPerKey = 1500;
  for (int i = 0; i < kPerKey; ++i) {
    if (i == 500) gate.store(true);  // 2,000 messages wait for the first call: long spans
    for (const char* key : {"a", "b", "c", "d"}) {
      const std::string p = std::to_string(i);
      const Status st = pub.publish(topic, {.key = key, .payload = p});
      if (!st.ok()) gate.store(true);
      REQUIRE(st.ok());
    }
  }
  REQUIRE(wait_until([&] { return seqs.seen.load() == 4u * kPerKey; }, std::chrono::seconds(30)));
  CHECK(seqs.violations == 0);
  CHECK(biggest.load() > 1);
  CHECK(biggest.load() <= 32);
  const TopicStats ts = bus->stats().topics.at(0);
  const LaneCounters& gs = ts.groups.at(0).total;
  CHECK(gs.rejected == static_cast<std::uint64_t>(rejects.load()));
  CHECK(gs.retried == static_cast<std::uint64_t>(stops.load() + throws.load()));
  CHECK(gs.acked + gs.rejected == 4u * kPerKey);
}

TEST_CASE("batch handlers: bad options and handles are refused with a named cause") {
  auto bus = std::move(*Bus::open({.name = "batch2", .workers = 1}));
  Topic topic = *bus->create_topic("batch2.t");
  Topic queue = *bus->create_queue("batch2.q");
  auto ok = [](std::span<const MessageView>) { return BatchOutcome::all_acked(); };
  auto r0 = bus->subscribe_batch(topic, "g", ok, {.batch_max = 0});
  CHECK(r0.status().code() == Code::InvalidArgument);
  CHECK(r0.status().message().find("batch_max") != std::string_view::npos);
  auto r1 = bus->subscribe_batch(topic, "g", ok, {.batch_max = 5000});
  CHECK(r1.status().code() == Code::InvalidArgument);
  auto r2 = bus->subscribe_batch(topic, "g", BatchHandler{});
  CHECK(r2.status().code() == Code::InvalidArgument);
  auto r3 = bus->consume_batch(topic, ok);
  CHECK(r3.status().code() == Code::InvalidArgument);
  CHECK(r3.status().message().find("is a topic") != std::string_view::npos);
  auto r4 = bus->subscribe_batch(queue, "g", ok);
  CHECK(r4.status().code() == Code::InvalidArgument);
  // A queue's competing batch consumer, with DropOldest's general loop (spans of one).
  Topic dq = *bus->create_queue("batch2.dq", {.backpressure = Backpressure::DropOldest, .capacity = 64});
  std::atomic<int> got{0};
  auto sub = *bus->consume_batch(dq, [&](std::span<const MessageView> ms) {
    CHECK(ms.size() == 1);
    got.fetch_add(static_cast<int>(ms.size()));
    return BatchOutcome::all_acked();
  });
  for (int i = 0; i < 10; ++i) REQUIRE(dq.publish({.key = "k", .payload = "x"}).ok());
  CHECK(wait_until([&] { return got.load() == 10; }, std::chrono::seconds(10)));
}

TEST_CASE("held lanes: a message on a lane held by a worker inside a long handler call is run by another worker") {
  // Streams on lanes y and z keep both workers awake and holding lanes
  // (scheduler.cpp, "Held lanes"); now and then y's handler publishes a slow
  // message of lane x, which y's holder may take next (it looks at the run
  // queue first after a held lane's run). y's next messages then find y
  // scheduled and wait for their holder, unless the other worker steals y:
  // without stealing, the worst wait here is the whole slow call.
  auto bus = Bus::open({.name = "held", .workers = 2}).value();
  auto topic = bus->create_topic("held.t", {.lanes = 3}).value();
  std::string key_x = "x", key_y, key_z;
  for (int i = 0; key_y.empty() || lane_for_key(key_y, 3) == lane_for_key(key_x, 3); ++i) key_y = "y" + std::to_string(i);
  for (int i = 0; key_z.empty() || lane_for_key(key_z, 3) == lane_for_key(key_x, 3) ||
                  lane_for_key(key_z, 3) == lane_for_key(key_y, 3);
       ++i)
    key_z = "z" + std::to_string(i);
  constexpr auto kSlow = std::chrono::milliseconds(600);
  constexpr int kRounds = 4;
  std::atomic<int> slow_done{0};
  std::atomic<std::int64_t> worst_ns{0};
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                   if (m.key() == key_x) {
                     std::this_thread::sleep_for(kSlow);
                     slow_done.fetch_add(1);
                     return Outcome::ack();
                   }
                   if (m.payload() == "trigger") REQUIRE(topic.publish({.key = key_x, .payload = "slow"}).ok());
                   const std::int64_t waited =
                       std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count() -
                       m.created_at_ns();
                   std::int64_t w = worst_ns.load();
                   while (waited > w && !worst_ns.compare_exchange_weak(w, waited)) {
                   }
                   return Outcome::ack();
                 })
                 .value();
  std::atomic<bool> stop{false}, trigger{false};
  // Two streams (y, and z to keep the other worker awake and holding too).
  std::thread stream([&] {
    Publisher pub = bus->publisher();
    for (std::uint64_t i = 0; !stop.load(); ++i) {
      const bool y = (i & 1) == 0;
      const char* what = y && trigger.exchange(false) ? "trigger" : "fast";
      REQUIRE(pub.publish(topic, {.key = y ? key_y : key_z, .payload = what}).ok());
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(10);
      while (std::chrono::steady_clock::now() < until) {
      }
    }
  });
  for (int round = 0; round < kRounds; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    trigger.store(true);
    REQUIRE(wait_until([&] { return slow_done.load() == round + 1; }));
  }
  stop.store(true);
  stream.join();
  MESSAGE("worst wait of a stream's message while another lane's " << kSlow.count()
                                                                   << " ms call ran: " << worst_ns.load() / 1'000'000
                                                                   << " ms");
  CHECK(worst_ns.load() < 300'000'000);
}
