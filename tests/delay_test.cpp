// lanebus — MIT License.
// Delayed delivery and expiry (issue 25 items 1 and 2, doc/delays.md) on
// in-memory topics: due-time accuracy (lateness printed, asserted loosely),
// the order rule, delayed messages holding slots under backpressure and
// ending with the bus, TTL expiry (counted, dead-lettered with class
// `expired` when asked, a retry never outliving it, default_ttl, batch
// handlers), and the refusals of bad delays and TTLs.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::wait_until;

namespace {

std::int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const LaneCounters& totals(const BusStats& s, std::string_view topic, std::string_view group) {
  static const LaneCounters none{};
  for (const TopicStats& t : s.topics)
    if (t.name == topic)
      for (const GroupStats& g : t.groups)
        if (g.name == group || t.is_queue) return g.total;
  return none;
}

std::uint64_t slots_of(Bus& bus, std::string_view topic) {
  for (const TopicStats& t : bus.stats().topics)
    if (t.name == topic) return t.slots_in_use;
  return ~std::uint64_t{0};
}

std::uint64_t expired_of(Bus& bus, std::string_view topic, std::string_view group) {
  return totals(bus.stats(), topic, group).expired;
}

}  // namespace

TEST_CASE("bad delays and TTLs are refused with InvalidArgument naming the value") {
  auto bus = Bus::open({.workers = 1}).value();
  auto topic = bus->create_topic("bad.times", {.lanes = 2}).value();
  auto code_and_text = [&](const OutgoingMessage& m) {
    Status s = topic.publish(m);
    return std::make_pair(s.code(), std::string(s.message()));
  };
  OutgoingMessage m{.key = "k", .payload = "p"};
  m.delay = -1ms;
  auto [c1, t1] = code_and_text(m);
  CHECK(c1 == Code::InvalidArgument);
  CHECK(t1.find("delay is negative") != std::string::npos);
  m.delay = 1s;
  m.deliver_at = wall_ns() + 1'000'000'000;
  auto [c2, t2] = code_and_text(m);
  CHECK(c2 == Code::InvalidArgument);
  CHECK(t2.find("not both") != std::string::npos);
  m.delay = 0ns;
  m.deliver_at = 9'000'000'000'000'000'000;  // year 2255
  auto [c3, t3] = code_and_text(m);
  CHECK(c3 == Code::InvalidArgument);
  CHECK(t3.find("2200") != std::string::npos);
  m.deliver_at = -5;
  CHECK(code_and_text(m).first == Code::InvalidArgument);
  m.deliver_at = 0;
  m.ttl = 0ns;
  auto [c4, t4] = code_and_text(m);
  CHECK(c4 == Code::InvalidArgument);
  CHECK(t4.find("ttl") != std::string::npos);
  m.ttl = -1s;
  CHECK(code_and_text(m).first == Code::InvalidArgument);
  m.ttl = std::chrono::hours(24 * 365 * 101);
  CHECK(code_and_text(m).first == Code::InvalidArgument);
  // A delayed message that would expire before it is due names both values.
  m.ttl = 100ms;
  m.delay = 2s;
  auto [c5, t5] = code_and_text(m);
  CHECK(c5 == Code::InvalidArgument);
  MESSAGE("refusal: " << t5);
  CHECK(t5.find("ttl 100000000 ns") != std::string::npos);
  CHECK(t5.find("delay 2000000000 ns") != std::string::npos);
  // The same through a Publisher and publish_batch.
  Publisher pub = bus->publisher();
  CHECK(pub.publish(topic, m).code() == Code::InvalidArgument);
  OutgoingMessage batch[2] = {{.key = "a", .payload = "p"}, m};
  BatchPublishResult br = topic.publish_batch(batch);
  CHECK(br.published == 1);
  CHECK(br.status.code() == Code::InvalidArgument);
  // default_ttl at creation.
  TopicOptions bad;
  bad.default_ttl = -1s;
  auto r = bus->create_topic("bad.default", bad);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == Code::InvalidArgument);
  CHECK(std::string(r.status().message()).find("default_ttl") != std::string::npos);
}

TEST_CASE("delayed messages are delivered at their due time, never early (lateness printed)") {
  auto bus = Bus::open({.workers = 2}).value();
  auto topic = bus->create_topic("delay.accuracy", {.lanes = 4}).value();
  constexpr int kN = 400;
  std::mutex mu;
  std::vector<std::int64_t> lateness;  // handler start - due, ns
  std::atomic<int> early{0};
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                  const std::int64_t now = wall_ns();
                  if (m.payload().size() != sizeof(std::int64_t)) return Outcome::ack();  // the noise
                  std::int64_t due;
                  std::memcpy(&due, m.payload().data(), sizeof due);
                  // The bus's wall clock is the TSC scaled to CLOCK_REALTIME (within 50 µs).
                  if (now + 100'000 < due) early.fetch_add(1);
                  std::lock_guard l(mu);
                  lateness.push_back(now - due);
                  return Outcome::ack();
                }).value();
  // Undelayed traffic beside the delayed messages (the load).
  std::atomic<bool> stop{false};
  std::thread noise([&] {
    while (!stop.load()) {
      (void)topic.publish({.key = "noise", .payload = "noise"});
      std::this_thread::sleep_for(50us);
    }
  });
  for (int i = 0; i < kN; ++i) {
    const auto delay = std::chrono::milliseconds(5 + (i * 37) % 50);
    const std::int64_t due = wall_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(delay).count();
    char payload[sizeof due];
    std::memcpy(payload, &due, sizeof due);
    const std::string key = "k" + std::to_string(i % 16);  // outlives the message view
    OutgoingMessage m{.key = key, .payload = std::string_view(payload, sizeof payload)};
    m.deliver_at = due;
    REQUIRE(topic.publish(m).ok());
  }
  REQUIRE(wait_until([&] {
    std::lock_guard l(mu);
    return lateness.size() >= static_cast<std::size_t>(kN);
  }));
  stop = true;
  noise.join();
  std::vector<std::int64_t> late;
  {
    std::lock_guard l(mu);
    late = lateness;
  }
  std::sort(late.begin(), late.end());
  const auto pct = [&](double p) { return late[static_cast<std::size_t>(p * static_cast<double>(late.size() - 1))]; };
  MESSAGE("lateness of " << late.size() << " delayed messages under load: p50 " << pct(0.5) / 1000 << " µs, p99 "
                         << pct(0.99) / 1000 << " µs, max " << late.back() / 1000 << " µs");
  CHECK(early.load() == 0);
  CHECK(pct(0.99) < 500'000'000);  // loose: a loaded 2-core machine
}

TEST_CASE("the order rule: due-time order within a key, undelayed messages not held back") {
  auto bus = Bus::open({.workers = 2}).value();
  auto topic = bus->create_topic("delay.order", {.lanes = 1}).value();
  std::mutex mu;
  std::vector<std::string> seen;
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                  std::lock_guard l(mu);
                  seen.emplace_back(m.payload());
                  return Outcome::ack();
                }).value();
  const std::int64_t now = wall_ns();
  auto at = [&](std::string_view payload, std::int64_t due) {
    OutgoingMessage m{.key = "order-1", .payload = payload};
    m.deliver_at = due;
    REQUIRE(topic.publish(m).ok());
  };
  // E's delay counts from its own publish: the margins leave a loaded machine 400 ms for the publishes.
  at("A", now + 700'000'000);  // published first, due last
  at("B", now + 500'000'000);
  REQUIRE(topic.publish({.key = "order-1", .payload = "C"}).ok());  // undelayed: not held back
  at("D", now + 500'000'000);  // same due time as B: publish order
  OutgoingMessage e{.key = "order-1", .payload = "E"};
  e.delay = 100ms;
  REQUIRE(topic.publish(e).ok());
  REQUIRE(wait_until([&] {
    std::lock_guard l(mu);
    return seen.size() == 5;
  }));
  std::lock_guard l(mu);
  CHECK(seen == std::vector<std::string>{"C", "E", "B", "D", "A"});
}

TEST_CASE("a steady stream of delayed messages: publishers route the due ones, the timer takes the tail") {
  // While a publisher keeps publishing delayed messages it routes the ones
  // that came due itself and the timer defers to it (delayed.hpp,
  // "Publishers release"); once it stops, the timer must deliver the rest.
  // Every message arrives, none early, each key in publish order (one delay:
  // due order is publish order), and every slot comes back.
  auto bus = Bus::open({.workers = 1}).value();
  auto topic = bus->create_topic("delay.stream", {.lanes = 8, .capacity = 1u << 15}).value();
  constexpr std::uint64_t kN = 20'000;
  constexpr int kKeys = 8;
  std::atomic<std::uint64_t> got{0};
  std::atomic<int> early{0}, out_of_order{0};
  std::atomic<std::int64_t> max_late{0};
  std::uint64_t last_seq[kKeys] = {};  // the one worker's
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                  const std::int64_t now = wall_ns();
                  std::int64_t due;
                  std::uint64_t seq;
                  std::memcpy(&due, m.payload().data(), sizeof due);
                  std::memcpy(&seq, m.payload().data() + sizeof due, sizeof seq);
                  if (now + 100'000 < due) early.fetch_add(1);
                  const int k = static_cast<int>(seq % kKeys);
                  if (seq + 1 <= last_seq[k]) out_of_order.fetch_add(1);  // seq + 1 of the key's last, 0: none
                  last_seq[k] = seq + 1;
                  if (now - due > max_late.load()) max_late.store(now - due);
                  got.fetch_add(1);
                  return Outcome::ack();
                }).value();
  const std::string keys[kKeys] = {"a", "b", "c", "d", "e", "f", "g", "h"};
  for (std::uint64_t i = 0; i < kN; ++i) {
    const std::int64_t due = wall_ns() + 2'000'000;
    char payload[sizeof due + sizeof i];
    std::memcpy(payload, &due, sizeof due);
    std::memcpy(payload + sizeof due, &i, sizeof i);
    OutgoingMessage m{.key = keys[i % kKeys], .payload = std::string_view(payload, sizeof payload)};
    m.delay = 2ms;
    REQUIRE(topic.publish(m).ok());
    if (i % 1000 == 999) std::this_thread::sleep_for(200us);  // a stream, not one burst
  }
  REQUIRE(wait_until([&] { return got.load() == kN; }));
  MESSAGE("20,000 messages delayed 2 ms: max lateness " << max_late.load() / 1000 << " µs");
  CHECK(early.load() == 0);
  CHECK(out_of_order.load() == 0);
  CHECK(max_late.load() < 1'000'000'000);  // loose: a loaded 2-core machine
  CHECK(wait_until([&] { return slots_of(*bus, "delay.stream") == 0; }));
}

TEST_CASE("delayed messages hold their slots (slots_in_use, backpressure) and end with the bus") {
  auto bus = Bus::open({.workers = 1}).value();
  auto topic =
      bus->create_topic("delay.slots", {.lanes = 2, .backpressure = Backpressure::FailFast, .capacity = 64}).value();
  std::atomic<int> got{0};
  auto sub = bus->subscribe(topic, "g", [&](const MessageView&) {
                  got.fetch_add(1);
                  return Outcome::ack();
                }).value();
  OutgoingMessage m{.key = "k", .payload = "later"};
  m.delay = 1h;
  for (int i = 0; i < 64; ++i) REQUIRE(topic.publish(m).ok());
  CHECK(topic.publish(m).code() == Code::WouldBlock);
  CHECK(topic.publish({.key = "k", .payload = "now"}).code() == Code::WouldBlock);
  CHECK(slots_of(*bus, "delay.slots") == 64);
  CHECK(got.load() == 0);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(bus->shutdown(ShutdownMode::Drain).ok());  // drains at once: undue in-memory delays end with the bus
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  CHECK(got.load() == 0);
}

TEST_CASE("delayed large payloads and publish_batch with delays") {
  auto bus = Bus::open({.workers = 2}).value();
  auto topic = bus->create_topic("delay.large", {.lanes = 2, .slot_bytes = 64}).value();
  std::mutex mu;
  std::vector<std::string> seen;
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                  std::lock_guard l(mu);
                  seen.emplace_back(m.payload());
                  return Outcome::ack();
                }).value();
  const std::string big(5000, 'b');
  const std::string fits(30, 'f');  // fits the slot alone, not with the 24-byte extension block
  OutgoingMessage a{.key = "k", .payload = big};
  a.delay = 20ms;
  OutgoingMessage b{.key = "k", .payload = fits};
  b.delay = 10ms;
  OutgoingMessage c{.key = "k", .payload = "small"};
  c.ttl = 10s;
  OutgoingMessage batch[3] = {a, b, c};
  BatchPublishResult r = topic.publish_batch(batch);
  REQUIRE(r.status.ok());
  REQUIRE(r.published == 3);
  REQUIRE(wait_until([&] {
    std::lock_guard l(mu);
    return seen.size() == 3;
  }));
  std::lock_guard l(mu);
  CHECK(seen == std::vector<std::string>{"small", fits, big});
  // A slot goes back to its pool after the handler returns (per chunk of a
  // run), so the handler's last push can be seen before the last slot is free.
  CHECK(wait_until([&] { return slots_of(*bus, "delay.large") == 0; }));
}

TEST_CASE("TTL: an expired message is never delivered, is counted, and goes to the DLQ as `expired` when asked") {
  test::TempDir dir;
  BusOptions bo;
  bo.workers = 2;
  bo.store.directory = dir.path();
  auto bus = Bus::open(bo).value();
  auto topic = bus->create_topic("ttl.pings", {.lanes = 1}).value();
  std::atomic<bool> release{false};
  std::atomic<int> delivered_late{0}, delivered{0};
  auto handler = [&](const MessageView& m) {
    if (m.payload() == "block") {
      while (!release.load()) std::this_thread::sleep_for(1ms);
    } else if (m.payload() == "ping") {
      delivered_late.fetch_add(1);
    }
    delivered.fetch_add(1);
    return Outcome::ack();
  };
  GroupOptions dead;
  dead.dead_letter_expired = true;
  auto s1 = bus->subscribe(topic, "dlq", handler, dead).value();
  auto s2 = bus->subscribe(topic, "count", handler).value();
  REQUIRE(topic.publish({.key = "k", .payload = "block"}).ok());
  OutgoingMessage ping{.key = "k", .payload = "ping"};
  ping.ttl = 30ms;
  for (int i = 0; i < 10; ++i) REQUIRE(topic.publish(ping).ok());
  OutgoingMessage keep{.key = "k", .payload = "keep"};
  keep.ttl = 1h;
  REQUIRE(topic.publish(keep).ok());
  std::this_thread::sleep_for(60ms);  // past the pings' TTL while the lane is blocked
  release = true;
  REQUIRE(wait_until([&] { return delivered.load() == 4; }));  // block + keep, per group
  REQUIRE(wait_until([&] { return expired_of(*bus, "ttl.pings", "dlq") == 10 && expired_of(*bus, "ttl.pings", "count") == 10; }));
  CHECK(delivered_late.load() == 0);
  auto dlq = bus->dead_letters().value();
  REQUIRE(wait_until([&] { return dlq->list().value().size() == 10; }));
  auto entries = dlq->list();
  REQUIRE(entries.ok());
  for (const DlqEntry& e : *entries) {
    CHECK(e.error_class == ErrorClass::Expired);
    CHECK(e.group == "dlq");
    CHECK(e.payload == "ping");
  }
  CHECK(std::string(to_string(ErrorClass::Expired)) == "expired");
  CHECK(parse_error_class("expired") == ErrorClass::Expired);
  CHECK(wait_until([&] { return slots_of(*bus, "ttl.pings") == 0; }));  // slots return after the handler
}

TEST_CASE("TTL: a retry never outlives it; a message delayed into its TTL is delivered") {
  auto bus = Bus::open({.workers = 2}).value();
  auto topic = bus->create_topic("ttl.retry", {.lanes = 2}).value();
  std::atomic<int> calls{0};
  std::atomic<std::int64_t> last_call{0};
  GroupOptions g;
  g.max_attempts = 1000;
  g.backoff_initial = 30ms;
  g.backoff_max = 30ms;
  g.backoff_jitter = 0;
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                  if (m.payload() == "retry") {
                    calls.fetch_add(1);
                    last_call = wall_ns();
                    return Outcome::retry("dependency down");
                  }
                  return Outcome::ack();
                }, g).value();
  OutgoingMessage m{.key = "r", .payload = "retry"};
  m.ttl = 200ms;
  const std::int64_t published = wall_ns();
  REQUIRE(topic.publish(m).ok());
  REQUIRE(wait_until([&] { return expired_of(*bus, "ttl.retry", "g") == 1; }));
  const int n = calls.load();
  MESSAGE(n << " attempts within the 200 ms TTL");
  CHECK(n >= 1);
  CHECK(n < 20);
  CHECK(last_call.load() < published + 200'000'000 + 50'000'000);  // no attempt starts after the expiry
  std::this_thread::sleep_for(100ms);
  CHECK(calls.load() == n);
  // Delayed into its TTL: due at 30 ms, expires at 2 s: delivered.
  std::atomic<int> ok{0};
  auto sub2 = bus->subscribe(topic, "h", [&](const MessageView& v) {
                   if (v.payload() == "later") ok.fetch_add(1);
                   return Outcome::ack();
                 }).value();
  OutgoingMessage later{.key = "l", .payload = "later"};
  later.delay = 30ms;
  later.ttl = 2s;
  REQUIRE(topic.publish(later).ok());
  REQUIRE(wait_until([&] { return ok.load() == 1; }));
}

TEST_CASE("TopicOptions::default_ttl expires messages on the plain and batch paths") {
  auto bus = Bus::open({.workers = 2}).value();
  TopicOptions to;
  to.lanes = 1;
  to.default_ttl = 30ms;
  auto topic = bus->create_topic("ttl.default", to).value();
  std::atomic<bool> release{false};
  std::atomic<int> plain{0}, batched{0};
  auto s1 = bus->subscribe(topic, "plain", [&](const MessageView& m) {
                 if (m.payload() == "block")
                   while (!release.load()) std::this_thread::sleep_for(1ms);
                 plain.fetch_add(1);
                 return Outcome::ack();
               }).value();
  auto s2 = bus->subscribe_batch(topic, "batch", [&](std::span<const MessageView> ms) {
                 for (const MessageView& m : ms)
                   if (m.payload() == "block")
                     while (!release.load()) std::this_thread::sleep_for(1ms);
                 batched.fetch_add(static_cast<int>(ms.size()));
                 return BatchOutcome::all_acked();
               }).value();
  REQUIRE(topic.publish({.key = "k", .payload = "block"}).ok());
  std::this_thread::sleep_for(5ms);
  for (int i = 0; i < 20; ++i) REQUIRE(topic.publish({.key = "k", .payload = "stale"}).ok());
  OutgoingMessage fresh{.key = "k", .payload = "fresh"};
  fresh.ttl = 1h;  // a message's own ttl overrides the default
  REQUIRE(topic.publish(fresh).ok());
  std::this_thread::sleep_for(60ms);
  release = true;
  REQUIRE(wait_until([&] {
    return expired_of(*bus, "ttl.default", "plain") == 20 && expired_of(*bus, "ttl.default", "batch") == 20;
  }));
  REQUIRE(wait_until([&] { return plain.load() == 2 && batched.load() == 2; }));
}

// ---------------------------------------------------------------- durable topics and queues

namespace {

std::unique_ptr<Bus> open_store_bus(const std::string& dir) {
  BusOptions bo;
  bo.workers = 2;
  bo.store.directory = dir;
  bo.store.maintenance_interval = 20ms;  // retention passes often (the retention case)
  auto bus = Bus::open(bo);
  REQUIRE(bus.ok());
  return std::move(*bus);
}

struct Seen {
  std::mutex mu;
  std::vector<std::pair<std::string, std::int64_t>> got;  // payload, wall time of the handler call
  void add(std::string_view p) {
    std::lock_guard l(mu);
    got.emplace_back(std::string(p), wall_ns());
  }
  std::size_t size() {
    std::lock_guard l(mu);
    return got.size();
  }
  std::vector<std::string> order() {
    std::lock_guard l(mu);
    std::vector<std::string> o;
    for (auto& [p, t] : got) o.push_back(p);
    return o;
  }
  std::int64_t at(std::string_view p) {
    std::lock_guard l(mu);
    for (auto& [q, t] : got)
      if (q == p) return t;
    return 0;
  }
};

}  // namespace

TEST_CASE("durable topics and queues: delayed messages on time, in due-time order, not holding back others") {
  for (bool queue : {false, true}) {
    INFO((queue ? "durable queue" : "durable topic"));
    test::TempDir dir;
    auto bus = open_store_bus(dir.path());
    TopicOptions to;
    to.lanes = 1;
    to.durable = true;
    auto topic = (queue ? bus->create_queue("d.order", to) : bus->create_topic("d.order", to)).value();
    Seen seen;
    auto handler = [&](const MessageView& m) {
      seen.add(m.payload());
      return Outcome::ack();
    };
    auto sub = (queue ? bus->consume(topic, handler) : bus->subscribe(topic, "g", handler)).value();
    const std::int64_t now = wall_ns();
    auto at = [&](std::string_view payload, std::int64_t due) {
      OutgoingMessage m{.key = "order-1", .payload = payload};
      m.deliver_at = due;
      REQUIRE(topic.publish(m).ok());
    };
    // E's delay counts from its own publish (after 4 Sync publishes): 650 ms of margin for a loaded disk.
    at("A", now + 1'100'000'000);
    at("B", now + 800'000'000);
    REQUIRE(topic.publish({.key = "order-1", .payload = "C"}).ok());
    at("D", now + 800'000'000);
    bool async_done = false;
    std::mutex mu;
    OutgoingMessage e{.key = "order-1", .payload = "E"};
    e.delay = 150ms;
    REQUIRE(topic.publish_async(e, [&](const Status& st, std::uint64_t) {
                   std::lock_guard l(mu);
                   async_done = st.ok();
                 }).ok());
    REQUIRE(wait_until([&] { return seen.size() == 5; }));
    CHECK(seen.order() == std::vector<std::string>{"C", "E", "B", "D", "A"});
    CHECK(seen.at("B") >= now + 800'000'000 - 1'000'000);  // never early (store clock vs ours: 1 ms)
    CHECK(seen.at("A") >= now + 1'100'000'000 - 1'000'000);
    std::lock_guard l(mu);
    CHECK(async_done);
  }
}

TEST_CASE("durable delayed messages survive a restart and are delivered on time; retention never deletes them") {
  test::TempDir dir;
  std::int64_t due = 0;
  {
    auto bus = open_store_bus(dir.path());
    TopicOptions to;
    to.lanes = 1;
    to.durable = true;
    to.retention.max_age = 100ms;  // far shorter than the delay
    to.retention.max_count = 2;
    auto topic = bus->create_topic("d.restart", to).value();
    due = wall_ns() + 1'000'000'000;
    OutgoingMessage m{.key = "k", .payload = "reminder"};
    m.deliver_at = due;
    REQUIRE(topic.publish(m).ok());
    for (int i = 0; i < 10; ++i) REQUIRE(topic.publish({.key = "k", .payload = "filler"}).ok());
  }  // closed before the due time
  auto bus = open_store_bus(dir.path());
  TopicOptions to;
  to.lanes = 1;
  to.durable = true;
  to.retention.max_age = 100ms;
  to.retention.max_count = 2;
  auto topic = bus->create_topic("d.restart", to).value();
  std::this_thread::sleep_for(300ms);  // retention passes run (max_age, max_count) while it waits
  Seen seen;
  GroupOptions g;
  g.start = StartPosition::latest();  // only what enters the log from now on
  auto sub = bus->subscribe(topic, "late", [&](const MessageView& m) {
                  seen.add(m.payload());
                  CHECK(m.created_at_ns() == due);  // it entered its lane at its due time
                  return Outcome::ack();
                }, g).value();
  REQUIRE(wait_until([&] { return seen.size() == 1; }));
  CHECK(seen.order() == std::vector<std::string>{"reminder"});
  CHECK(seen.at("reminder") >= due - 1'000'000);
}

TEST_CASE("durable: messages delayed less than the writer's queue go straight to their lane, in order, never early") {
  // Most 1 us delays are over by the time the store's writer runs the publish
  // (store_delayed appends them at once); one due later waits in the index
  // and comes after them. Per key: publish order (= due-time order here).
  test::TempDir dir;
  auto bus = open_store_bus(dir.path());
  TopicOptions to;
  to.lanes = 2;
  to.durable = true;
  auto topic = bus->create_topic("d.short", to).value();
  Seen seen;
  std::mutex mu;
  std::map<std::string, std::int64_t> created;
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                  {
                    // Before seen.add: the test reads `created` once seen counts them all.
                    std::lock_guard l(mu);
                    created[std::string(m.payload())] = m.created_at_ns();
                  }
                  seen.add(m.payload());
                  return Outcome::ack();
                }).value();
  const std::int64_t later_due = wall_ns() + 400'000'000;
  OutgoingMessage late{.key = "k0", .payload = "late"};
  late.deliver_at = later_due;
  REQUIRE(topic.publish(late).ok());
  std::map<std::string, std::int64_t> published_at, stored_at;
  for (int i = 0; i < 60; ++i) {
    const std::string p = "s" + std::to_string(i);
    OutgoingMessage m{.key = i % 2 ? "k1" : "k0", .payload = p};
    m.delay = std::chrono::microseconds(1);
    published_at[p] = wall_ns();
    REQUIRE(topic.publish(m).ok());  // Sync: returns after its commit
    stored_at[p] = wall_ns();
  }
  REQUIRE(wait_until([&] { return seen.size() == 61; }));
  const auto order = seen.order();
  int last[2] = {-1, -1};
  bool late_seen = false;
  for (const std::string& p : order) {
    if (p == "late") {
      late_seen = true;
      continue;
    }
    const int i = std::stoi(p.substr(1));
    CHECK_MESSAGE(i > last[i % 2], p << " after s" << last[i % 2] << " of its key");
    last[i % 2] = i;
    std::lock_guard l(mu);
    // Its due time: never before the publish + 1 us. The due time is read
    // from WallClock and published_at from CLOCK_REALTIME: the two agree
    // within WallClock's bound, 50 us (lib/util/wall_clock.hpp).
    CHECK(created.at(p) >= published_at.at(p) - 50'000);
    CHECK(seen.at(p) >= created.at(p) - 1'000'000);  // never early (the store's clock against ours: 1 ms)
    // Key k0 holds "late" too: due-time order (a loaded machine may publish past
    // its due time). A message due after "late" comes after it; one stored (its
    // publish returned) before "late" fell due comes before it. One due before
    // but still being committed when "late" fell due may come either side: it
    // did not exist in the store yet (seen on a loaded CI machine: s46).
    if (i % 2 == 0) {
      if (created.at(p) > later_due)
        CHECK_MESSAGE(late_seen, p << " and \"late\" out of due-time order");
      else if (stored_at.at(p) + 1'000'000 < later_due)
        CHECK_MESSAGE(!late_seen, p << " and \"late\" out of due-time order");
    }
  }
  CHECK(seen.at("late") >= later_due - 1'000'000);
}

TEST_CASE("durable TTL: expired messages never delivered, counted, dead-lettered as `expired` when asked") {
  for (bool queue : {false, true}) {
    INFO((queue ? "durable queue" : "durable topic"));
    test::TempDir dir;
    auto bus = open_store_bus(dir.path());
    TopicOptions to;
    to.lanes = 1;
    to.durable = true;
    auto topic = (queue ? bus->create_queue("d.ttl", to) : bus->create_topic("d.ttl", to)).value();
    OutgoingMessage ping{.key = "k", .payload = "ping"};
    ping.ttl = 20ms;
    for (int i = 0; i < 5; ++i) REQUIRE(topic.publish(ping).ok());
    OutgoingMessage keep{.key = "k", .payload = "keep"};
    keep.ttl = 1h;
    REQUIRE(topic.publish(keep).ok());
    std::this_thread::sleep_for(50ms);  // the pings expire before anyone consumes
    std::atomic<int> pings{0}, keeps{0};
    auto handler = [&](const MessageView& m) {
      (m.payload() == "ping" ? pings : keeps).fetch_add(1);
      return Outcome::ack();
    };
    GroupOptions g;
    g.dead_letter_expired = true;
    auto sub = (queue ? bus->consume(topic, handler, g) : bus->subscribe(topic, "g", handler, g)).value();
    REQUIRE(wait_until([&] { return keeps.load() == 1; }));
    REQUIRE(wait_until([&] { return expired_of(*bus, "d.ttl", "g") == 5; }));
    CHECK(pings.load() == 0);
    auto dlq = bus->dead_letters().value();
    REQUIRE(wait_until([&] { return dlq->list().value().size() == 5; }));
    auto entries = dlq->list();
    REQUIRE(entries.ok());
    for (const DlqEntry& e : *entries) CHECK(e.error_class == ErrorClass::Expired);
    // Refused combinations on durable topics too.
    OutgoingMessage bad{.key = "k", .payload = "x"};
    bad.delay = 1s;
    bad.ttl = 10ms;
    CHECK(topic.publish(bad).code() == Code::InvalidArgument);
  }
}
