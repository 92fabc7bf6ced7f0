// lanebus — MIT License.
// Delivery under a stuck handler and per-key retry (doc/retries.md), black
// box through the public API: a handler running past attempt_timeout is
// counted and shown as stuck while the other lanes flow, shutdown names the
// lane that held it up, and key_parallel_retry lets the other keys of a lane
// pass a key in backoff (per-key order kept, memory bounded by
// key_parallel_limit) — on ephemeral topics, durable topics and durable queues.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "scratch_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::ScratchDir;
using lanebus::test::wait_until;

namespace {

enum class Kind { EphemeralTopic, DurableTopic, DurableQueue };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::EphemeralTopic: return "ephemeral topic";
    case Kind::DurableTopic: return "durable topic";
    case Kind::DurableQueue: return "durable queue";
  }
  return "?";
}

/// A bus (two workers; with a store for the durable kinds, Async so that
/// publishing is not paced by fsync), one topic or queue and its group.
struct Setup {
  Kind kind;
  ScratchDir dir;
  std::unique_ptr<Bus> bus;
  Topic topic;
  std::string group;  // "" for a queue's consumers

  Setup(Kind k, const std::string& name, std::uint32_t lanes, const std::string& group_name) : kind(k) {
    BusOptions o = lanebus::test::store_bus(dir.path);
    o.name = "delivery-test";
    o.workers = 2;
    if (k == Kind::EphemeralTopic) o.store.directory.clear();
    o.store.durability = Durability::Async;
    bus = Bus::open(o).value();
    if (k == Kind::DurableQueue) {
      topic = bus->create_queue(name, {.lanes = lanes, .durable = true}).value();
      group = "";
    } else {
      topic = bus->create_topic(name, {.lanes = lanes, .durable = k == Kind::DurableTopic}).value();
      group = group_name;
    }
  }

  Result<Subscription> attach(Handler h, const GroupOptions& g) {
    if (kind == Kind::DurableQueue) return bus->consume(topic, std::move(h), g);
    return bus->subscribe(topic, group, std::move(h), g);
  }

  /// The group's counters in `lane` (nullopt until the group shows up in stats).
  std::optional<LaneCounters> lane(std::uint32_t lane_no) const {
    BusStats s = bus->stats();
    for (const auto& t : s.topics) {
      if (t.name != topic.name()) continue;
      for (const auto& g : t.groups)
        if (g.name == group && lane_no < g.lanes.size()) return g.lanes[lane_no];
    }
    return std::nullopt;
  }
};

/// A flag a handler waits on; opened by the test (or, on any exit path, by
/// GateOpener, so that a failed check never leaves a handler blocked while
/// the Subscription and the Bus wait for it).
struct Gate {
  std::atomic<bool> open{false};
  void wait() const { (void)wait_until([&] { return open.load(); }, 120s); }
};
struct GateOpener {
  Gate& gate;
  ~GateOpener() { gate.open = true; }
};

/// `count` keys, k0, k1, ..., that avoid lane `avoid` of `lanes`.
std::vector<std::string> keys_off_lane(std::uint32_t avoid, std::uint32_t lanes, int count) {
  std::vector<std::string> out;
  for (int i = 0; static_cast<int>(out.size()) < count; ++i) {
    std::string k = "other" + std::to_string(i);
    if (lane_for_key(k, lanes) != avoid) out.push_back(k);
  }
  return out;
}

// ---------------------------------------------------------------- stuck handler

void stuck_handler_is_counted_and_other_lanes_flow(Kind kind) {
  const std::string kind_s = kind_name(kind);
  CAPTURE(kind_s);
  constexpr std::uint32_t kLanes = 4;
  constexpr int kOthers = 20;
  Setup s(kind, "stuck.events", kLanes, "slow-group");
  const std::uint32_t lane_a = lane_for_key("a", kLanes);

  Gate gate;
  std::atomic<int> blocker_calls{0};
  std::atomic<bool> blocker_done{false};
  std::atomic<int> others{0};
  auto sub = s.attach(
                  [&](const MessageView& m) {
                    if (m.payload() == "block") {
                      // Only the first call blocks: a second one (a redelivery
                      // while the first still runs) is counted and checked below.
                      if (blocker_calls.fetch_add(1) == 0) gate.wait();
                      blocker_done = true;
                      return Outcome::ack();
                    }
                    ++others;
                    return Outcome::ack();
                  },
                  {.attempt_timeout = 100ms})
                 .value();
  GateOpener opener{gate};

  REQUIRE(s.topic.publish({.key = "a", .payload = "block"}).ok());
  REQUIRE(wait_until([&] { return blocker_calls.load() >= 1; }));
  // Other lanes keep flowing on the other worker while lane A is held.
  for (int i = 0; const std::string& k : keys_off_lane(lane_a, kLanes, kOthers))
    REQUIRE(s.topic.publish({.key = k, .payload = "m" + std::to_string(i++)}).ok());
  CHECK(wait_until([&] { return others.load() == kOthers; }, 10s));
  CHECK_FALSE(blocker_done.load());

  // The watchdog marks the call stuck once it runs past 100 ms.
  const bool seen = wait_until(
      [&] {
        auto c = s.lane(lane_a);
        return c && c->stuck >= 1 && c->stuck_now == 1;
      },
      5s);
  auto c = s.lane(lane_a);
  REQUIRE(c);
  CHECK_MESSAGE(seen, "lane " << lane_a << ": stuck=" << c->stuck << " stuck_now=" << c->stuck_now);
  for (std::uint32_t l = 0; l < kLanes; ++l) {
    if (l == lane_a) continue;
    auto o = s.lane(l);
    REQUIRE(o);
    CHECK_MESSAGE(o->stuck_now == 0, "lane " << l);
  }
  // One lane never runs on two workers of one bus at once (doc/topics.md), stuck or not.
  CHECK(blocker_calls.load() == 1);

  gate.open = true;
  CHECK(wait_until([&] { return blocker_done.load(); }, 10s));
  const bool cleared = wait_until(
      [&] {
        auto x = s.lane(lane_a);
        return x && x->stuck_now == 0;
      },
      5s);
  c = s.lane(lane_a);
  REQUIRE(c);
  CHECK_MESSAGE(cleared, "stuck_now=" << c->stuck_now);
  CHECK(c->stuck >= 1);
  CHECK(wait_until([&] { return others.load() == kOthers && blocker_done.load(); }));
}

// ---------------------------------------------------------------- shutdown

void shutdown_names_the_lane_that_held_it_up(Kind kind) {
  const std::string kind_s = kind_name(kind);
  CAPTURE(kind_s);
  constexpr std::uint32_t kLanes = 4;
  Setup s(kind, "hold.events", kLanes, "held-group");
  Gate gate;
  std::atomic<bool> entered{false};
  auto sub = s.attach(
                  [&](const MessageView&) {
                    entered = true;
                    gate.wait();
                    return Outcome::ack();
                  },
                  {.attempt_timeout = 100ms})
                 .value();
  GateOpener opener{gate};
  REQUIRE(s.topic.publish({.key = "a", .payload = "x"}).ok());
  REQUIRE(wait_until([&] { return entered.load(); }));

  // Release the handler 500 ms after shutdown was called (its drain timeout is
  // 200 ms), so that shutdown times out on it and then can join the worker.
  std::atomic<std::int64_t> called_at{0};
  std::thread releaser([&] {
    (void)wait_until([&] { return called_at.load() != 0; }, 60s);
    const std::chrono::steady_clock::time_point t0{std::chrono::steady_clock::duration(called_at.load())};
    (void)wait_until([&] { return std::chrono::steady_clock::now() - t0 >= 500ms; }, 60s);
    gate.open = true;
  });
  called_at = std::chrono::steady_clock::now().time_since_epoch().count();
  Status st = s.bus->shutdown(ShutdownMode::Drain, 200ms);
  releaser.join();

  CHECK_FALSE(st.ok());
  const std::string msg(st.message());
  CAPTURE(st.to_string());
  CHECK(msg.find("hold.events") != std::string::npos);
  if (!s.group.empty()) CHECK(msg.find("held-group") != std::string::npos);
  CHECK(msg.find("lane") != std::string::npos);
}

// ---------------------------------------------------------------- key-parallel retry

/// One handler call.
struct Call {
  std::string key;
  int seq = 0;
  std::uint32_t attempt = 0;
  bool acked = false;
};

/// Every handler call, in call order.
struct CallLog {
  std::mutex mu;
  std::vector<Call> calls;
  std::atomic<int> acked{0};
  void add(Call c) {
    std::lock_guard l(mu);
    calls.push_back(std::move(c));
    if (calls.back().acked) ++acked;
  }
  std::vector<Call> copy() {
    std::lock_guard l(mu);
    return calls;
  }
};

/// Position of the ack of key:seq in `calls`; -1 when it was never acked.
std::ptrdiff_t ack_at(const std::vector<Call>& calls, const std::string& key, int seq) {
  for (std::size_t i = 0; i < calls.size(); ++i)
    if (calls[i].acked && calls[i].key == key && calls[i].seq == seq) return static_cast<std::ptrdiff_t>(i);
  return -1;
}

/// Per-key order: each key's calls walk its messages in publish order, each
/// acked exactly once, none called before the previous one of its key was acked.
void check_per_key_order(const std::vector<Call>& calls, const std::map<std::string, int>& published) {
  for (const auto& [key, n] : published) {
    int next = 0;  // the key's first message not yet acked
    for (const Call& c : calls) {
      if (c.key != key) continue;
      CHECK_MESSAGE(c.seq == next, key << ":" << c.seq << " (attempt " << c.attempt << ") called while " << key << ":"
                                        << next << " was not acked");
      if (c.acked && c.seq == next) ++next;
    }
    CHECK_MESSAGE(next == n, key << ": " << next << " of " << n << " acked in order");
  }
}

struct Plan {
  bool key_parallel = true;
  std::uint32_t limit = 256;
  int rounds = 3;        // each of k1..k9 gets `rounds` messages
  int k0_per_round = 1;  // later messages of k0 per round
};

struct RunResult {
  std::vector<Call> calls;
  std::map<std::string, int> published;  // messages per key
  std::uint64_t max_set_aside = 0;       // sampled while running
  bool finished = false;
};

/// One lane, keys k0..k9. k0:0 goes first and is retried at its attempts 1 and
/// 2 (backoff 300 ms, then 600 ms: no jitter), acked at attempt 3; then
/// `rounds` rounds of k1..k9 (one message each) followed by k0_per_round more
/// k0 messages. A sampler reads set_aside all along.
RunResult run_key_parallel(Kind kind, const Plan& plan) {
  Setup s(kind, "kp.events", 1, "kp-group");
  CallLog log;
  auto sub = s.attach(
                  [&](const MessageView& m) {
                    const std::string key(m.key());
                    const std::string p(m.payload());
                    const int seq = std::stoi(p.substr(p.find(':') + 1));
                    const bool retry = key == "k0" && seq == 0 && m.attempt() < 3;
                    log.add(Call{key, seq, m.attempt(), !retry});
                    return retry ? Outcome::retry("dependency unavailable") : Outcome::ack();
                  },
                  {.max_attempts = 5,
                   .backoff_initial = 300ms,
                   .backoff_jitter = 0.0,
                   .key_parallel_retry = plan.key_parallel,
                   .key_parallel_limit = plan.limit})
                 .value();

  RunResult r;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> max_set_aside{0};
  std::thread sampler([&] {
    while (!stop) {
      if (auto c = s.lane(0); c && c->set_aside > max_set_aside) max_set_aside = c->set_aside;
      (void)wait_until([&] { return stop.load(); }, 1ms);  // pacing only
    }
  });
  struct Joiner {  // joins the sampler on every exit path, a failed REQUIRE included
    std::atomic<bool>& stop;
    std::thread& t;
    ~Joiner() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } joiner{stop, sampler};

  auto publish = [&](const std::string& key) {
    const int seq = r.published[key]++;
    REQUIRE(s.topic.publish({.key = key, .payload = key + ":" + std::to_string(seq)}).ok());
  };
  publish("k0");
  for (int round = 0; round < plan.rounds; ++round) {
    for (int k = 1; k <= 9; ++k) publish("k" + std::to_string(k));
    for (int j = 0; j < plan.k0_per_round; ++j) publish("k0");
  }
  int total = 0;
  for (const auto& [k, n] : r.published) total += n;
  r.finished = wait_until([&] { return log.acked.load() >= total; }, 30s);
  stop = true;
  sampler.join();
  CAPTURE(total);
  r.max_set_aside = max_set_aside.load();
  r.calls = log.copy();
  // Nothing stays set aside once everything is done.
  CHECK(wait_until([&] {
    auto c = s.lane(0);
    return c && c->set_aside == 0;
  }, 5s));
  return r;
}

void other_keys_pass_a_key_in_backoff(Kind kind) {
  const std::string kind_s = kind_name(kind);
  CAPTURE(kind_s);
  const RunResult r = run_key_parallel(kind, {.key_parallel = true});
  REQUIRE(r.finished);
  check_per_key_order(r.calls, r.published);
  const std::ptrdiff_t k0_done = ack_at(r.calls, "k0", 0);
  REQUIRE(k0_done >= 0);
  int before = 0, other = 0;
  for (const auto& [key, n] : r.published) {
    if (key == "k0") continue;
    for (int seq = 0; seq < n; ++seq, ++other)
      if (ack_at(r.calls, key, seq) < k0_done) ++before;
  }
  // Handling takes microseconds, k0:0's backoff 900 ms: every other key
  // finished while k0:0 waited.
  CHECK_MESSAGE(before == other, before << " of " << other << " messages of k1..k9 were handled before k0:0 completed");
}

void other_keys_wait_without_key_parallel(Kind kind) {
  const std::string kind_s = kind_name(kind);
  CAPTURE(kind_s);
  const RunResult r = run_key_parallel(kind, {.key_parallel = false});
  REQUIRE(r.finished);
  check_per_key_order(r.calls, r.published);
  const std::ptrdiff_t k0_done = ack_at(r.calls, "k0", 0);
  REQUIRE(k0_done >= 0);
  int after = 0, other = 0;
  for (const auto& [key, n] : r.published) {
    if (key == "k0") continue;
    for (int seq = 0; seq < n; ++seq, ++other)
      if (ack_at(r.calls, key, seq) > k0_done) ++after;
  }
  CHECK_MESSAGE(after == other, after << " of " << other << " messages of k1..k9 waited behind k0:0");
  CHECK(r.max_set_aside == 0);
}

void set_aside_is_bounded_by_the_limit(Kind kind) {
  const std::string kind_s = kind_name(kind);
  CAPTURE(kind_s);
  // 40 later messages of k0 against a limit of 8.
  const RunResult r = run_key_parallel(kind, {.key_parallel = true, .limit = 8, .rounds = 4, .k0_per_round = 10});
  REQUIRE(r.finished);
  check_per_key_order(r.calls, r.published);
  CHECK(r.max_set_aside <= 8);
  CHECK_MESSAGE(r.max_set_aside == 8, "the limit was reached (max set_aside seen " << r.max_set_aside << ")");
}

}  // namespace

TEST_CASE("a handler running past attempt_timeout is stuck (counter and gauge) while other lanes flow: ephemeral topic") {
  stuck_handler_is_counted_and_other_lanes_flow(Kind::EphemeralTopic);
}

TEST_CASE("a handler running past attempt_timeout is stuck (counter and gauge) while other lanes flow: durable queue") {
  stuck_handler_is_counted_and_other_lanes_flow(Kind::DurableQueue);
}

TEST_CASE("shutdown held up by a stuck handler fails naming its topic, group and lane: ephemeral topic") {
  shutdown_names_the_lane_that_held_it_up(Kind::EphemeralTopic);
}

TEST_CASE("shutdown held up by a stuck handler fails naming its topic, group and lane: durable topic") {
  shutdown_names_the_lane_that_held_it_up(Kind::DurableTopic);
}

TEST_CASE("key_parallel_retry: the other keys of a lane pass a key in backoff, per-key order kept: ephemeral topic") {
  other_keys_pass_a_key_in_backoff(Kind::EphemeralTopic);
}

TEST_CASE("key_parallel_retry: the other keys of a lane pass a key in backoff, per-key order kept: durable topic") {
  other_keys_pass_a_key_in_backoff(Kind::DurableTopic);
}

TEST_CASE("key_parallel_retry: the other keys of a lane pass a key in backoff, per-key order kept: durable queue") {
  other_keys_pass_a_key_in_backoff(Kind::DurableQueue);
}

TEST_CASE("without key_parallel_retry the other keys wait behind a key in backoff (negative control): ephemeral topic") {
  other_keys_wait_without_key_parallel(Kind::EphemeralTopic);
}

TEST_CASE("without key_parallel_retry the other keys wait behind a key in backoff (negative control): durable topic") {
  other_keys_wait_without_key_parallel(Kind::DurableTopic);
}

TEST_CASE("without key_parallel_retry the other keys wait behind a key in backoff (negative control): durable queue") {
  other_keys_wait_without_key_parallel(Kind::DurableQueue);
}

TEST_CASE("key_parallel_limit bounds the messages set aside; everything still finishes in key order: ephemeral topic") {
  set_aside_is_bounded_by_the_limit(Kind::EphemeralTopic);
}

TEST_CASE("key_parallel_limit bounds the messages set aside; everything still finishes in key order: durable topic") {
  set_aside_is_bounded_by_the_limit(Kind::DurableTopic);
}

TEST_CASE("key_parallel_limit bounds the messages set aside; everything still finishes in key order: durable queue") {
  set_aside_is_bounded_by_the_limit(Kind::DurableQueue);
}
