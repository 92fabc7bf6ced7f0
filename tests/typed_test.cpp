// lanebus — MIT License.
// Typed topics (include/lanebus/typed.hpp) and payloads beyond a slot
// (lib/core/payload_pool.hpp): objects in memory, codecs on durable topics,
// size-classed blocks under backpressure, and every refusal.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "asym_fence.hpp"
#include "bus_impl.hpp"
#include "lanebus/lanebus.hpp"
#include "lanebus/record_codec.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using lanebus::test::wait_until;

namespace {

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

struct Tick {  // 48 bytes, trivially copyable
  std::uint64_t seq;
  double values[5];
};
static_assert(sizeof(Tick) == 48 && std::is_trivially_copyable_v<Tick>);

// Counts live objects: constructed in the slot, destroyed when the last group is done.
std::atomic<int> g_live{0};
struct Profile {
  std::string user;
  std::string theme;
  int version = 0;
  Profile() { g_live.fetch_add(1); }
  Profile(std::string u, std::string t, int v) : user(std::move(u)), theme(std::move(t)), version(v) {
    g_live.fetch_add(1);
  }
  Profile(const Profile& o) : user(o.user), theme(o.theme), version(o.version) { g_live.fetch_add(1); }
  Profile(Profile&& o) noexcept : user(std::move(o.user)), theme(std::move(o.theme)), version(o.version) {
    g_live.fetch_add(1);
  }
  ~Profile() { g_live.fetch_sub(1); }
};

struct Frame {  // 64 KiB: never fits a slot
  std::uint32_t seq = 0;
  unsigned char pixels[64 * 1024 - 4];
};

struct Throws {
  Throws() = default;
  Throws(const Throws&) { throw std::runtime_error("copy refused"); }
};

struct Other {
  int x = 0;
};

// A durable type with a codec that refuses negative amounts.
struct Payment {
  std::string account;
  std::int64_t cents = 0;
};

struct Packed {
  std::uint32_t a;
  std::uint32_t b;
};

}  // namespace

template <>
struct lanebus::Codec<Payment> {
  static constexpr std::string_view name = "PaymentCodec";
  static Status encode(const Payment& p, std::string& out) {
    if (p.cents < 0) return Status(Code::InvalidArgument, "negative amount");
    out.assign(std::to_string(p.cents) + ":" + p.account);
    return Status();
  }
  static Status decode(std::string_view bytes, Payment& p) {
    auto colon = bytes.find(':');
    if (colon == std::string_view::npos) return Status(Code::Corruption, "no colon in payment record");
    p.cents = std::stoll(std::string(bytes.substr(0, colon)));
    p.account.assign(bytes.substr(colon + 1));
    return Status();
  }
};
template <>
struct lanebus::StableLayout<Packed> : std::true_type {};

namespace {
struct Order {
  std::string customer;
  std::int64_t cents = 0;
  bool rush = false;
  double weight = 0;
  std::uint32_t qty = 0;
};
}  // namespace
template <>
struct lanebus::RecordSchema<Order> {
  static constexpr auto fields =
      std::make_tuple(record_field(1, &Order::customer), record_field(2, &Order::cents), record_field(3, &Order::rush),
                      record_field(4, &Order::weight), record_field(5, &Order::qty));
};
static_assert(lanebus::HasCodec<Order>);

TEST_CASE("a trivially copyable struct travels as an object, keyed by the extractor") {
  auto bus = Bus::open({.workers = 2}).value();
  TypedTopicOptions<Tick> o;
  o.topic.lanes = 4;
  o.key_of = [](const Tick& t) { return t.seq % 2 ? std::string_view("odd") : std::string_view("even"); };
  auto topic = bus->create_topic<Tick>("ticks", o).value();
  std::atomic<int> got{0};
  std::atomic<bool> ordered{true};
  std::uint64_t last_odd = 0, last_even = 0;
  auto sub = bus->subscribe<Tick>(topic, "g", [&](const Tick& t, const Delivery& d) {
                  bool odd = t.seq % 2;
                  if (d.key() != (odd ? "odd" : "even") || t.values[4] != double(t.seq) * 4) ordered = false;
                  if (d.lane() != lane_for_key(d.key(), 4) || d.attempt() != 1 || d.id() == 0) ordered = false;
                  std::uint64_t& last = odd ? last_odd : last_even;
                  if (t.seq <= last && last != 0) ordered = false;
                  last = t.seq;
                  got.fetch_add(1);
                  return Outcome::ack();
                }).value();
  for (std::uint64_t i = 1; i <= 1000; ++i) {
    Tick t{i, {0, double(i), double(i) * 2, double(i) * 3, double(i) * 4}};
    REQUIRE(topic.publish(t).ok());
  }
  REQUIRE(wait_until([&] { return got.load() == 1000; }));
  CHECK(ordered.load());
}

TEST_CASE("other types are constructed in the slot and destroyed after the last group") {
  g_live = 0;
  {
    auto bus = Bus::open({.workers = 2}).value();
    auto topic = bus->create_topic<Profile>("profiles", TopicOptions{.lanes = 2}).value();
    std::atomic<int> a{0}, b{0};
    std::atomic<bool> intact{true};
    auto check = [&](const Profile& p, std::atomic<int>& n) {
      if (p.user != "user-" + std::to_string(p.version) || p.theme.size() != 40) intact = false;
      n.fetch_add(1);
      return Outcome::ack();
    };
    auto sa = bus->subscribe<Profile>(topic, "a", [&](const Profile& p, const Delivery&) { return check(p, a); }).value();
    auto sb = bus->subscribe<Profile>(topic, "b", [&](const Profile& p, const Delivery&) { return check(p, b); }).value();
    for (int i = 0; i < 300; ++i) {
      Profile p("user-" + std::to_string(i), std::string(40, 't'), i);  // long strings: heap buffers
      if (i % 3 == 0) {
        REQUIRE(topic.publish(p).ok());
      } else if (i % 3 == 1) {
        REQUIRE(topic.publish(std::move(p)).ok());
      } else {
        REQUIRE(topic.emplace_keyed("k", "user-" + std::to_string(i), std::string(40, 't'), i).ok());
      }
    }
    REQUIRE(wait_until([&] { return a.load() == 300 && b.load() == 300; }));
    CHECK(intact.load());
    // Every object in a slot was destroyed once both groups were done.
    CHECK(wait_until([&] { return g_live.load() == 0; }));
    CHECK(topic.emplace("user-7", std::string(40, 't'), 7).ok());
    REQUIRE(wait_until([&] { return a.load() == 301 && b.load() == 301; }));
  }
  CHECK(g_live.load() == 0);
}

TEST_CASE("objects larger than the slot go to a block; queues take typed consumers") {
  auto bus = Bus::open({.workers = 2}).value();
  auto frames = bus->create_queue<Frame>("frames", {{.lanes = 2}, {}}).value();
  std::atomic<int> got{0};
  std::atomic<bool> intact{true};
  auto c = bus->consume<Frame>(frames, [&](const Frame& f, const Delivery&) {
                  if (f.pixels[0] != static_cast<unsigned char>(f.seq) || f.pixels[sizeof f.pixels - 1] != 0xAB)
                    intact = false;
                  got.fetch_add(1);
                  return Outcome::ack();
                }).value();
  auto frame = std::make_unique<Frame>();
  for (std::uint32_t i = 0; i < 100; ++i) {
    frame->seq = i;
    std::memset(frame->pixels, static_cast<int>(i & 0xff), sizeof frame->pixels);
    frame->pixels[sizeof frame->pixels - 1] = 0xAB;
    REQUIRE(frames.publish(*frame).ok());
  }
  REQUIRE(wait_until([&] { return got.load() == 100; }));
  CHECK(intact.load());
}

TEST_CASE("bytes payloads beyond slot_bytes use blocks up to max_payload") {
  auto bus = Bus::open({.workers = 2}).value();
  auto topic = bus->create_topic("blobs", {.lanes = 2, .slot_bytes = 64}).value();
  std::atomic<std::uint64_t> bytes{0};
  std::atomic<bool> intact{true};
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& m) {
                  std::string_view p = m.payload();
                  if (p.front() != p.back() || p.size() != std::size_t(static_cast<unsigned char>(p[1])) * 1024)
                    intact = false;
                  bytes.fetch_add(p.size());
                  return Outcome::ack();
                }).value();
  std::uint64_t sent = 0;
  for (int kib : {1, 4, 16, 64, 200, 255}) {
    std::string p(std::size_t(kib) * 1024, static_cast<char>(kib));
    REQUIRE(topic.publish({.key = "k", .payload = p}).ok());
    sent += p.size();
  }
  REQUIRE(wait_until([&] { return bytes.load() == sent; }));
  CHECK(intact.load());
  // Blocks are placed on this thread's publisher's path: the topic is still
  // its solo publisher's (1 = made shared for good by the shared path).
  if (lanebus::detail::AsymmetricFence::available())
    CHECK(lanebus::detail::Access::core(*bus)->find("blobs")->owner.load() >= 2);
  // A batch with a large message goes one by one.
  std::string big(5 * 1024, 5);
  OutgoingMessage batch[2] = {{.key = "k", .payload = std::string_view(big).substr(0, 1024)},
                              {.key = "k", .payload = std::string_view(big)}};
  auto r = topic.publish_batch(batch);
  CHECK(r.ok());
  CHECK(r.published == 2);
  REQUIRE(wait_until([&] { return bytes.load() == sent + 6 * 1024; }));
  CHECK(!intact.load());  // the control: 1024 bytes of value 5 fail the size check

  SUBCASE("past max_payload: PayloadTooLarge naming the option") {
    std::string huge((1u << 20) + 1, 'x');
    Status st = topic.publish({.key = "k", .payload = huge});
    CHECK(st.code() == Code::PayloadTooLarge);
    CHECK(contains(st.message(), "TopicOptions::max_payload"));
    auto small = bus->create_topic("small", {.slot_bytes = 64, .max_payload = 100}).value();
    CHECK(small.publish({.payload = std::string(100, 'x')}).ok());
    CHECK(small.publish({.payload = std::string(101, 'x')}).code() == Code::PayloadTooLarge);
    auto rb = small.publish_batch(std::span<const OutgoingMessage>(batch, 2));
    CHECK(rb.status.code() == Code::PayloadTooLarge);
    CHECK(rb.published == 0);
  }
  SUBCASE("keys over 65535 bytes are refused, naming the limit") {
    auto wide = bus->create_topic("wide", {.slot_bytes = 1u << 20}).value();
    Status st = wide.publish({.key = std::string(70000, 'k'), .payload = "p"});
    CHECK(st.code() == Code::PayloadTooLarge);
    CHECK(contains(st.message(), "65535"));
    // A Publisher's fast path too (it once stored the length in 16 bits).
    Publisher pub = bus->publisher();
    CHECK(pub.publish(wide, {.key = "k", .payload = "p", .idempotency_key = std::string(70000, 'i')}).code() ==
          Code::PayloadTooLarge);
  }
  SUBCASE("keys that leave no room for the block reference name slot_bytes") {
    Status st = topic.publish({.key = std::string(60, 'k'), .payload = std::string(2000, 'x')});
    CHECK(st.code() == Code::PayloadTooLarge);
    CHECK(contains(st.message(), "slot_bytes"));
  }
  SUBCASE("bad options") {
    auto r1 = bus->create_topic("bad.max", {.max_payload = 0});
    CHECK(r1.code() == Code::InvalidArgument);
    CHECK(contains(r1.status().message(), "max_payload"));
    CHECK(bus->create_topic("bad.max2", {.max_payload = (16u << 20) + 1}).code() == Code::InvalidArgument);
    auto b2 = Bus::open({.memory_budget = (std::size_t{1} << 40) + 1});
    CHECK(b2.code() == Code::InvalidArgument);
    CHECK(contains(b2.status().message(), "memory_budget"));
  }
}

TEST_CASE("a payload beyond the memory budget meets the topic's backpressure") {
  // 1 MiB budget: 128 KiB per class, so the 64 KiB class has 2 blocks and no
  // larger class has any.
  auto bus = Bus::open({.workers = 1, .memory_budget = 1u << 20}).value();
  std::atomic<bool> gate{false};
  std::atomic<int> got{0}, entered{0};
  auto hold = [&](const MessageView&) {
    entered.fetch_add(1);
    while (!gate.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    got.fetch_add(1);
    return Outcome::ack();
  };
  std::string p(40 * 1024, 'x');
  // The first message is in its handler, the second queued: both blocks in use.
  auto publish_two = [&](const Topic& t) {
    REQUIRE(t.publish({.key = "k", .payload = p}).ok());
    REQUIRE(wait_until([&] { return entered.load() == 1; }));
    REQUIRE(t.publish({.key = "k", .payload = p}).ok());
  };
  SUBCASE("FailFast: WouldBlock naming memory_budget") {
    auto t = bus->create_topic("ff", {.lanes = 1, .backpressure = Backpressure::FailFast}).value();
    auto s = bus->subscribe(t, "g", hold).value();
    publish_two(t);
    Status st = t.publish({.key = "k", .payload = p});
    CHECK(st.code() == Code::WouldBlock);
    CHECK(contains(st.message(), "memory_budget"));
    gate = true;
    REQUIRE(wait_until([&] { return got.load() == 2; }));
    CHECK(t.publish({.key = "k", .payload = p}).ok());  // blocks came back
    REQUIRE(wait_until([&] { return got.load() == 3; }));
  }
  SUBCASE("Block: TimedOut after block_timeout") {
    auto t = bus->create_topic("bl", {.lanes = 1, .block_timeout = std::chrono::milliseconds(30)}).value();
    auto s = bus->subscribe(t, "g", hold).value();
    publish_two(t);
    Status st = t.publish({.key = "k", .payload = p});
    CHECK(st.code() == Code::TimedOut);
    CHECK(contains(st.message(), "memory_budget"));
    CHECK(t.try_publish({.key = "k", .payload = p}).code() == Code::WouldBlock);
    gate = true;
    REQUIRE(wait_until([&] { return got.load() == 2; }));
  }
  SUBCASE("DropOldest: the oldest queued message makes room") {
    auto t = bus->create_topic("dr", {.lanes = 1, .backpressure = Backpressure::DropOldest}).value();
    auto s = bus->subscribe(t, "g", hold).value();
    publish_two(t);
    CHECK(t.publish({.key = "k", .payload = p}).ok());  // drops the second
    gate = true;
    REQUIRE(wait_until([&] { return got.load() == 2; }));
    std::uint64_t dropped = 0;
    for (const auto& ts : bus->stats().topics)
      for (const auto& g : ts.groups)
        for (const auto& l : g.lanes) dropped += l.dropped;
    CHECK(dropped == 1);
  }
  SUBCASE("a budget without a block that large: PayloadTooLarge naming memory_budget") {
    auto t = bus->create_topic("nb", {.max_payload = 1u << 20}).value();
    Status st = t.publish({.key = "k", .payload = std::string(100 * 1024, 'x')});
    CHECK(st.code() == Code::PayloadTooLarge);
    CHECK(contains(st.message(), "BusOptions::memory_budget"));
  }
}

TEST_CASE("typed refusals: other types, bytes, throwing constructors") {
  auto bus = Bus::open({.workers = 1}).value();
  auto ticks = bus->create_topic<Tick>("t.ticks").value();
  auto again = bus->create_topic<Other>("t.ticks");
  CHECK(again.code() == Code::Conflict);
  CHECK(contains(again.status().message(), "Tick"));
  CHECK(contains(again.status().message(), "Other"));
  CHECK(bus->create_topic<Tick>("t.ticks").ok());  // same type: the same topic

  auto sub = bus->subscribe<Other>(ticks, "g", [](const Other&, const Delivery&) { return Outcome::ack(); });
  CHECK(sub.code() == Code::Conflict);
  CHECK(contains(sub.status().message(), "Tick"));
  CHECK(contains(sub.status().message(), "Other"));

  auto bytes = bus->create_topic("t.bytes").value();
  auto sb = bus->subscribe<Tick>(bytes, "g", [](const Tick&, const Delivery&) { return Outcome::ack(); });
  CHECK(sb.code() == Code::Conflict);
  CHECK(contains(sb.status().message(), "carries bytes"));
  REQUIRE(bytes.publish({.payload = "x"}).ok());
  auto late = bus->create_topic<Tick>("t.bytes");
  CHECK(late.code() == Code::Conflict);
  CHECK(contains(late.status().message(), "bytes"));

  Status raw = ticks.topic().publish({.payload = "not a tick"});
  CHECK(raw.code() == Code::InvalidArgument);
  CHECK(contains(raw.message(), "TypedTopic"));
  OutgoingMessage one[1] = {{.payload = "not a tick"}};
  CHECK(ticks.topic().publish_batch(one).status.code() == Code::InvalidArgument);

  auto throwing = bus->create_topic<Throws>("t.throws").value();
  std::atomic<int> got{0};
  auto st = bus->subscribe<Throws>(throwing, "g", [&](const Throws&, const Delivery&) {
                  got.fetch_add(1);
                  return Outcome::ack();
                }).value();
  Throws t;
  Status th = throwing.publish(t);
  CHECK(th.code() == Code::InvalidArgument);
  CHECK(contains(th.message(), "threw"));
  // Again, now that this thread's publisher has the topic as its last one:
  // the publisher's own path (publish_via) constructs in the slot too, and
  // gives the slot back when the constructor throws.
  for (int i = 0; i < 100; ++i) {
    Status again = throwing.publish(t);
    CHECK(again.code() == Code::InvalidArgument);
    CHECK(contains(again.message(), "threw"));
  }
  for (const TopicStats& ts : bus->stats().topics)
    if (ts.name == "t.throws") CHECK(ts.slots_in_use == 0);
  CHECK(TypedTopic<Tick>().publish(Tick{}).code() == Code::InvalidArgument);
  CHECK(ticks.publish(Tick{}, OutgoingMessage{.payload = "x"}).code() == Code::InvalidArgument);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(got.load() == 0);  // nothing was published
}

namespace {
// A bus with two workers and a store in `dir`.
std::unique_ptr<Bus> open_with_store(lanebus::test::TempDir& dir) {
  BusOptions o;
  o.workers = 2;
  o.store.directory = dir.file("store");
  return Bus::open(o).value();
}
}  // namespace

TEST_CASE("durable typed topics encode with the codec") {
  lanebus::test::TempDir dir;
  auto bus = open_with_store(dir);

  SUBCASE("std::string, StableLayout and a user codec round-trip") {
    auto names = bus->create_durable_topic<std::string>("d.names").value();
    auto packed = bus->create_durable_topic<Packed>("d.packed").value();
    TypedTopicOptions<Payment> po;
    po.key_of = [](const Payment& p) { return std::string_view(p.account); };
    auto pays = bus->create_durable_topic<Payment>("d.pay", po).value();
    std::atomic<int> n{0}, k{0}, m{0};
    std::atomic<bool> ok{true};
    std::vector<std::string> seen;  // one key, one lane: one worker at a time
    auto s1 = bus->subscribe<std::string>(names, "g", [&](const std::string& s, const Delivery& d) {
                    if (d.key() != "same") ok = false;
                    seen.push_back(s);
                    n.fetch_add(1);
                    return Outcome::ack();
                  }).value();
    auto s2 = bus->subscribe<Packed>(packed, "g", [&](const Packed& p, const Delivery&) {
                    if (p.b != p.a * 2) ok = false;
                    k.fetch_add(1);
                    return Outcome::ack();
                  }).value();
    auto s3 = bus->subscribe<Payment>(pays, "g", [&](const Payment& p, const Delivery& d) {
                    if (d.key() != p.account || p.cents != 1234) ok = false;
                    m.fetch_add(1);
                    return Outcome::ack();
                  }).value();
    for (int i = 0; i < 5; ++i) {
      REQUIRE(names.publish("name-" + std::to_string(i + 1), OutgoingMessage{.key = "same"}).ok());
      REQUIRE(packed.publish(Packed{std::uint32_t(i), std::uint32_t(i * 2)}).ok());
      REQUIRE(pays.publish(Payment{"acct-" + std::to_string(i), 1234}).ok());
    }
    REQUIRE(wait_until([&] { return n.load() == 5 && k.load() == 5 && m.load() == 5; }));
    CHECK(ok.load());
    CHECK(seen == std::vector<std::string>{"name-1", "name-2", "name-3", "name-4", "name-5"});
  }
  SUBCASE("a failing encoder: InvalidArgument naming type and codec, nothing published") {
    auto pays = bus->create_durable_topic<Payment>("d.pay2").value();
    Status st = pays.publish(Payment{"a", -5});
    CHECK(st.code() == Code::InvalidArgument);
    CHECK(contains(st.message(), "Payment"));
    CHECK(contains(st.message(), "PaymentCodec"));
    CHECK(contains(st.message(), "negative amount"));
    for (const auto& ts : bus->stats().topics)
      if (ts.name == "d.pay2") CHECK(ts.published == 0);
  }
  SUBCASE("a decode failure is a permanent failure with the codec's message") {
    auto pays = bus->create_durable_topic<Payment>("d.pay3").value();
    std::atomic<int> calls{0};
    auto s = bus->subscribe<Payment>(pays, "g", [&](const Payment&, const Delivery&) {
                   calls.fetch_add(1);
                   return Outcome::ack();
                 }).value();
    REQUIRE(pays.topic().publish({.key = "x", .payload = "garbage"}).ok());  // bytes: allowed on durable
    DeadLetters* dlq = bus->dead_letters().value();
    REQUIRE(wait_until([&] { return !dlq->list().value().empty(); }));
    auto entries = dlq->list().value();
    REQUIRE(entries.size() == 1);
    CHECK(entries[0].error_class == ErrorClass::Permanent);
    CHECK(entries[0].reason == "no colon in payment record");
    CHECK(calls.load() == 0);
  }
  SUBCASE("a type without a codec on a durable topic is refused at run time") {
    auto r = bus->create_topic<Other>("d.other", TopicOptions{.durable = true});
    CHECK(r.code() == Code::InvalidArgument);
    CHECK(contains(r.status().message(), "Other"));
    CHECK(contains(r.status().message(), "Codec"));
    auto bytes = bus->create_topic("d.bytes", {.durable = true}).value();
    auto s = bus->subscribe<Other>(bytes, "g", [](const Other&, const Delivery&) { return Outcome::ack(); });
    CHECK(s.code() == Code::InvalidArgument);
    CHECK(contains(s.status().message(), "Codec"));
  }
  SUBCASE("durable payloads up to max_payload, past it PayloadTooLarge") {
    auto big = bus->create_topic("d.big", {.max_payload = 8u << 20, .durable = true}).value();
    std::atomic<std::size_t> got{0};
    auto s = bus->subscribe(big, "g", [&](const MessageView& m) {
                   got = m.payload().size();
                   return Outcome::ack();
                 }).value();
    REQUIRE(big.publish({.key = "k", .payload = std::string(8u << 20, 'z')}).ok());
    REQUIRE(wait_until([&] { return got.load() == (8u << 20); }));
    Status st = big.publish({.key = "k", .payload = std::string((8u << 20) + 1, 'z')});
    CHECK(st.code() == Code::PayloadTooLarge);
    CHECK(contains(st.message(), "max_payload"));
    CHECK(bus->create_topic("d.huge", {.max_payload = (64u << 20) + 1, .durable = true}).code() ==
          Code::InvalidArgument);
  }
}

TEST_CASE("structs with a RecordSchema travel as records") {
  Order o{std::string(300, 'c'), -1999, true, 2.5, 3};  // a long string: the encoder's buffer grows
  std::string buf;
  REQUIRE(Codec<Order>::encode(o, buf).ok());
  auto v = RecordView::parse(buf);
  REQUIRE(v.ok());
  CHECK(v->get_string(1).value() == o.customer);
  CHECK(v->get_int64(2).value() == -1999);
  CHECK(v->get_uint64(5).value() == 3);
  Order back;
  REQUIRE(Codec<Order>::decode(buf, back).ok());
  CHECK(back.customer == o.customer);
  CHECK(back.cents == -1999);
  CHECK(back.rush);
  CHECK(back.weight == 2.5);
  CHECK(back.qty == 3);

  // An older writer without fields 2..5: the members keep their values.
  char b2[64];
  RecordBuilder old(b2, sizeof b2);
  old.add_string(1, "old");
  Order o2;
  o2.qty = 9;
  REQUIRE(Codec<Order>::decode(old.finish().value(), o2).ok());
  CHECK(o2.customer == "old");
  CHECK(o2.qty == 9);
  // Field 2 written as a string: Corruption naming the field.
  char b3[64];
  RecordBuilder wrong(b3, sizeof b3);
  wrong.add_string(2, "x");
  Status bad = Codec<Order>::decode(wrong.finish().value(), o2);
  CHECK(bad.code() == Code::Corruption);
  CHECK(contains(bad.message(), "record field 2"));
  CHECK(Codec<Order>::decode("not a record", o2).code() == Code::Corruption);

  lanebus::test::TempDir dir;
  BusOptions bo;
  bo.workers = 1;
  bo.store.directory = dir.file("store");
  auto bus = Bus::open(bo).value();
  auto orders = bus->create_durable_topic<Order>("d.orders").value();
  std::atomic<int> got{0};
  std::atomic<bool> ok{true};
  auto sub = bus->subscribe<Order>(orders, "g", [&](const Order& r, const Delivery&) {
                  if (r.customer != "c-" + std::to_string(r.qty) || r.cents != 100 * r.qty) ok = false;
                  got.fetch_add(1);
                  return Outcome::ack();
                }).value();
  for (std::uint32_t i = 1; i <= 5; ++i)
    REQUIRE(orders.publish(Order{"c-" + std::to_string(i), 100 * i, false, 0, i}).ok());
  REQUIRE(wait_until([&] { return got.load() == 5; }));
  CHECK(ok.load());
}

TEST_CASE("typed handlers see the message's headers (Delivery::headers), in memory and durable") {
  lanebus::test::TempDir dir;
  auto bus = open_with_store(dir);
  const Header hs[] = {{"tenant", "acme"}, {"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}};
  TraceContext parent;
  REQUIRE(TraceContext::parse(hs[1].value, &parent));
  auto ticks = bus->create_topic<Tick>("h.ticks").value();        // an object in the slot
  auto frames = bus->create_topic<Frame>("h.frames").value();     // an object in a block
  auto names = bus->create_durable_topic<std::string>("h.names").value();  // encoded by the codec
  std::atomic<int> seen{0};
  std::atomic<bool> ok{true};
  auto check = [&](const Delivery& d) {
    if (d.headers().size() != 2 || d.headers().find("tenant") != std::optional<std::string_view>("acme") ||
        d.headers().find("traceparent") != std::optional<std::string_view>(hs[1].value) ||
        current_trace_context().span_id != parent.span_id)
      ok = false;
    seen.fetch_add(1);
  };
  auto s1 = bus->subscribe<Tick>(ticks, "g", [&](const Tick&, const Delivery& d) {
                  check(d);
                  return Outcome::ack();
                }).value();
  auto s2 = bus->subscribe<Frame>(frames, "g", [&](const Frame&, const Delivery& d) {
                  check(d);
                  return Outcome::ack();
                }).value();
  auto s3 = bus->subscribe<std::string>(names, "g", [&](const std::string& s, const Delivery& d) {
                  if (s != "n") ok = false;
                  check(d);
                  return Outcome::ack();
                }).value();
  OutgoingMessage env{.key = "k", .headers = hs};
  REQUIRE(ticks.publish(Tick{1, {}}, env).ok());
  auto frame = std::make_unique<Frame>();
  REQUIRE(frames.publish(*frame, env).ok());
  REQUIRE(names.publish(std::string("n"), env).ok());
  // And without headers: an empty view.
  std::atomic<int> bare{0};
  auto plain = bus->create_topic<Tick>("h.bare").value();
  auto s4 = bus->subscribe<Tick>(plain, "g", [&](const Tick&, const Delivery& d) {
                  if (d.headers().empty() && d.headers().encoded().empty()) bare.fetch_add(1);
                  return Outcome::ack();
                }).value();
  REQUIRE(plain.publish(Tick{2, {}}).ok());
  REQUIRE(wait_until([&] { return seen.load() == 3 && bare.load() == 1; }));
  CHECK(ok.load());
}
