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
    return c.acked + c.rejected + c.failed == total && plain_acks.load() == total;
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
