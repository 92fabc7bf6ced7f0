// lanebus — MIT License.
// The schema registry of a Bus (doc/schemas.md): registration, publish checks
// on durable and ephemeral topics, reader decoding, contracts, deprecation,
// removal and the usage audit (the reference story on an injected clock).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "access.hpp"
#include "asym_fence.hpp"
#include "bus_impl.hpp"
#include "lanebus/lanebus.hpp"
#include "scratch_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::wait_until;
using TempDir = lanebus::test::ScratchDir;

namespace {

constexpr std::int64_t kDay = 86'400'000'000'000;

BusOptions store_opts(const TempDir& dir) {
  BusOptions o;
  o.name = "schema-test";
  o.workers = 2;
  o.store.directory = (dir.path / "store").string();
  o.store.durability = Durability::Async;
  o.durable_poll = 10ms;
  return o;
}

SchemaVersion schema(const std::string& fields) {
  auto r = SchemaVersion::from_json("{\"fields\": [" + fields + "]}");
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  return *r;
}

const std::string kId = R"({"id": 1, "name": "order_id", "type": "string"})";
const std::string kAmount = R"({"id": 2, "name": "amount", "type": "int64"})";
const std::string kAmountD = R"({"id": 2, "name": "amount", "type": "int64", "default": 0})";
const std::string kCurrency = R"({"id": 3, "name": "currency", "type": "string", "default": "EUR"})";

std::string order(const char* id, std::int64_t amount) {
  char buf[128];
  RecordBuilder b(buf, sizeof(buf));
  b.add_string(1, id).add_int64(2, amount);
  return std::string(*b.finish());
}

}  // namespace

TEST_CASE("register: versions, identical is a no-op, incompatible refused, every change audited") {
  TempDir dir;
  auto bus = Bus::open(store_opts(dir)).value();
  Schemas s = bus->schemas();
  CHECK(s.latest("orders").code() == Code::NotFound);
  CHECK(*s.register_schema("orders", schema(kId + "," + kAmount), {"alice", "first cut"}) == 1);
  CHECK(*s.register_schema("orders", schema(kId + "," + kAmount), {"alice", "again"}) == 1);  // no-op
  auto bad = s.register_schema("orders", schema(kId + "," + kAmount + R"(,{"id": 3, "name": "x", "type": "bool"})"));
  CHECK(bad.code() == Code::Incompatible);
  CHECK(std::string(bad.status().message()).find("\"x\" (id 3) is added without a default") != std::string::npos);
  CHECK(s.check("orders", schema(kId + "," + kAmount + "," + kCurrency)).ok());
  CHECK(s.latest("orders")->version() == 1);  // check registers nothing
  CHECK(*s.register_schema("orders", schema(kId + "," + kAmount + "," + kCurrency), {"bob", "currency"}) == 2);
  CHECK(s.get("orders", 1)->fields().size() == 2);
  CHECK(s.get("orders", 3).code() == Code::NotFound);
  CHECK(s.versions("orders")->size() == 2);
  CHECK(*s.compatibility("orders") == Compatibility::Backward);
  CHECK(s.set_compatibility("orders", Compatibility::None, {"carol", "migration"}).ok());
  CHECK(*s.register_schema("orders", schema(kId + R"(,{"id": 2, "name": "amount", "type": "string"})")) == 3);
  CHECK(s.register_schema("bad name!", schema(kId)).code() == Code::InvalidName);
  auto log = s.audit_log().value();
  REQUIRE(log.size() == 4);  // register 1, register 2, compatibility, register 3 (the no-op is not logged)
  CHECK(log[0].action == "register");
  CHECK(log[0].who == "alice");
  CHECK(log[0].why == "first cut");
  CHECK(log[2].action == "compatibility");
  CHECK(log[2].detail == "none");
  CHECK(*s.topics() == std::vector<std::string>{"orders"});
}

TEST_CASE("publish: a record that does not match the latest version is refused and nothing is stored") {
  TempDir dir;
  for (bool durable : {true, false}) {
    CAPTURE(durable);
    auto bus = Bus::open(store_opts(dir)).value();
    const std::string name = durable ? "d-orders" : "e-orders";
    TopicOptions to;
    to.durable = durable;
    to.lanes = 2;
    Topic t = bus->create_topic(name, to).value();
    // Untyped until a schema is registered.
    std::vector<std::string> seen;
    std::vector<std::uint16_t> versions;  // the schema version each message was stamped with
    std::mutex mu;
    auto sub = bus->subscribe(t, "g", [&](const MessageView& m) {
                     std::lock_guard l(mu);
                     seen.emplace_back(m.payload());
                     versions.push_back(m.schema_version());
                     return Outcome::ack();
                   }).value();
    CHECK(t.publish({.payload = "raw bytes"}).ok());
    REQUIRE(*bus->schemas().register_schema(name, schema(kId + "," + kAmount)) == 1);
    CHECK(t.publish({.payload = "raw bytes"}).code() == Code::SchemaViolation);
    const std::string good = order("o-1", 5);
    CHECK(t.publish({.payload = good}).ok());
    char buf[64];
    RecordBuilder b(buf, sizeof(buf));
    b.add_string(1, "o-2");  // amount missing (no default)
    Status miss = t.publish({.payload = *b.finish()});
    CHECK(miss.code() == Code::SchemaViolation);
    CHECK(std::string(miss.message()).find("\"amount\"") != std::string::npos);
    b.reset();
    b.add_string(1, "o-3").add_string(2, "five");
    CHECK(t.publish({.payload = *b.finish()}).code() == Code::SchemaViolation);
    CHECK(t.publish({.payload = good, .schema_version = 7}).code() == Code::SchemaViolation);  // unregistered version
    CHECK(t.publish({.payload = good, .schema_version = 1}).ok());
    REQUIRE(wait_until([&] {
      std::lock_guard l(mu);
      return seen.size() == 3;
    }));
    {
      std::lock_guard l(mu);
      CHECK(seen[0] == "raw bytes");
      CHECK(seen[1] == good);
      CHECK(seen[2] == good);
      CHECK(versions[0] == 0);  // before the schema
      CHECK(versions[1] == 1);  // the latest, stamped at publish
      CHECK(versions[2] == 1);
    }
    if (!durable) {
      // The checked publishes took this thread's publisher's own path: the
      // topic is still its solo publisher's (1 = made shared for good).
      if (detail::AsymmetricFence::available()) CHECK(detail::Access::core(*bus)->find(name)->owner.load() >= 2);
    }
    CHECK(bus->shutdown(ShutdownMode::Drain).ok());
  }
  // Reopened: the durable log holds exactly the three accepted messages.
  auto bus = Bus::open(store_opts(dir)).value();
  Topic t = bus->create_topic("d-orders", TopicOptions{.lanes = 2, .durable = true}).value();
  std::atomic<int> n{0};
  GroupOptions go;
  go.start = StartPosition::earliest();
  auto sub = bus->subscribe(t, "fresh", [&](const MessageView&) {
                   ++n;
                   return Outcome::ack();
                 }, go).value();
  CHECK(wait_until([&] { return n.load() == 3; }));
  CHECK(bus->shutdown(ShutdownMode::Drain).ok());
  CHECK(n.load() == 3);
}

TEST_CASE("readers decode every version through their schema: defaults fill added fields, removed are skipped") {
  auto bus = Bus::open(BusOptions{.workers = 2}).value();  // in-memory registry
  Schemas s = bus->schemas();
  REQUIRE(s.register_schema("pay", schema(kId + "," + kAmountD)).ok());
  Topic t = bus->create_topic("pay").value();
  struct Got {
    std::string id, currency;
    std::int64_t amount = -1;
    std::uint16_t version = 0;
  };
  std::mutex mu;
  std::vector<Got> got;
  auto sub = bus->subscribe(t, "reader", [&](const MessageView& m) {
                   auto v = s.view("pay", m);
                   REQUIRE(v.ok());
                   Got g;
                   g.id = std::string(*v->get_string("order_id"));
                   g.amount = v->get_int64("amount").ok() ? *v->get_int64("amount") : -1;
                   auto c = v->get_string("currency");
                   g.currency = c.ok() ? std::string(*c) : "<" + std::string(to_string(c.code())) + ">";
                   g.version = m.schema_version();
                   std::lock_guard l(mu);
                   got.push_back(g);
                   return Outcome::ack();
                 }).value();
  CHECK(t.publish({.payload = order("v1", 10)}).ok());
  REQUIRE(wait_until([&] {
    std::lock_guard l(mu);
    return got.size() == 1;
  }));
  // v2 adds currency (default EUR); v3 removes amount (it has a default).
  REQUIRE(*s.register_schema("pay", schema(kId + "," + kAmountD + "," + kCurrency)) == 2);
  CHECK(t.publish({.payload = order("v1-late", 11)}).ok());  // still valid for v2 (currency defaulted)
  REQUIRE(*s.register_schema("pay", schema(kId + "," + kCurrency)) == 3);
  char buf[64];
  RecordBuilder b(buf, sizeof(buf));
  b.add_string(1, "v3").add_string(3, "USD");
  CHECK(t.publish({.payload = *b.finish()}).ok());
  CHECK(t.publish({.payload = order("stale", 1)}).code() == Code::SchemaViolation);  // amount is gone in v3
  REQUIRE(wait_until([&] {
    std::lock_guard l(mu);
    return got.size() == 3;
  }));
  std::lock_guard l(mu);
  CHECK(got[0].id == "v1");
  CHECK(got[0].version == 1);
  CHECK(got[0].currency == "<NotFound>");  // read while v1 was the reader's schema
  CHECK(got[1].version == 2);
  CHECK(got[1].currency == "EUR");  // the reader's (v2 or v3) default fills the field the record lacks
  CHECK(got[2].id == "v3");
  CHECK(got[2].currency == "USD");
  CHECK(got[2].version == 3);
  CHECK(got[2].amount == -1);  // removed in the reader's schema: NotFound
}

TEST_CASE("contracts: stored with the group; a version that removes or retypes a declared field is refused") {
  TempDir dir;
  auto bus = Bus::open(store_opts(dir)).value();
  Schemas s = bus->schemas();
  REQUIRE(s.register_schema("c-orders", schema(kId + "," + kAmountD + "," + kCurrency)).ok());
  Topic t = bus->create_topic("c-orders").value();
  GroupOptions go;
  go.reads = {"order_id", "currency"};
  auto sub = bus->subscribe(t, "billing", [](const MessageView&) { return Outcome::ack(); }, go).value();
  auto cs = s.contracts("c-orders").value();
  REQUIRE(cs.size() == 1);
  CHECK(cs[0].group == "billing");
  CHECK(cs[0].fields == go.reads);
  // Removing currency is fine for backward compatibility, but billing declares it.
  auto r = s.register_schema("c-orders", schema(kId + "," + kAmountD));
  CHECK(r.code() == Code::Incompatible);
  CHECK(std::string(r.status().message()).find("contract of group \"billing\"") != std::string::npos);
  CHECK(s.check("c-orders", schema(kId + "," + kAmountD)).code() == Code::Incompatible);
  // Removing amount (not declared) is accepted.
  CHECK(*s.register_schema("c-orders", schema(kId + "," + kCurrency)) == 2);
  // A second bus on the same store sees the contract at once.
  CHECK(s.drop_contract("c-orders", "nobody").code() == Code::NotFound);
  CHECK(s.drop_contract("c-orders", "billing", {"ops", "team gone"}).ok());
  CHECK(*s.register_schema("c-orders", schema(kId)) == 3);
}

TEST_CASE("deprecate and remove: refused until the window passed, no recent reads and no contract") {
  TempDir dir;
  auto bus = Bus::open(store_opts(dir)).value();
  std::atomic<std::int64_t> clock{100 * kDay};
  detail::Access::set_schema_clock_for_testing(*bus, [&] { return clock.load(); });
  Schemas s = bus->schemas();
  REQUIRE(s.register_schema("x", schema(kId + "," + kAmountD)).ok());
  CHECK(s.remove("x", "amount").code() == Code::Incompatible);  // not deprecated
  CHECK(std::string(s.remove("x", "amount").status().message()).find("not deprecated") != std::string::npos);
  CHECK(s.remove("x", "nope").code() == Code::NotFound);
  CHECK(s.deprecate("x", "nope", std::chrono::hours(24)).code() == Code::NotFound);
  CHECK(s.deprecate("x", "amount", std::chrono::hours(24 * 10), "missing").code() == Code::NotFound);
  CHECK(s.deprecate("x", "amount", std::chrono::hours(24 * 10), {}, {"dana", "unused"}).ok());
  auto deps = s.deprecations("x").value();
  REQUIRE(deps.size() == 1);
  CHECK(deps[0].window_ns == 10 * kDay);
  CHECK(deps[0].since_ns == 100 * kDay);
  clock = 109 * kDay;
  auto r = s.remove("x", "amount");
  CHECK(r.code() == Code::Incompatible);
  CHECK(std::string(r.status().message()).find("window is open") != std::string::npos);
  clock = 110 * kDay;
  CHECK(*s.remove("x", "amount", {"dana", "window over"}) == 2);
  CHECK(s.latest("x")->field("amount") == nullptr);
  auto log = s.audit_log().value();
  CHECK(log.back().action == "remove");
  CHECK(log.back().who == "dana");
  CHECK(log[log.size() - 2].action == "deprecate");
}

TEST_CASE("outbox publishes from a transactional handler are checked like a normal publish") {
  TempDir dir;
  auto bus = Bus::open(store_opts(dir)).value();
  Schemas s = bus->schemas();
  REQUIRE(*s.register_schema("tx-orders", schema(kId + "," + kAmount)) == 1);
  Topic in = bus->create_queue("tx-in", {.lanes = 2, .durable = true}).value();
  Topic out = bus->create_topic("tx-orders", {.lanes = 2, .durable = true}).value();
  std::mutex mu;
  std::vector<std::string> seen;
  std::vector<std::uint16_t> versions;
  auto watcher = bus->subscribe(out, "audit", [&](const MessageView& m) {
                       std::lock_guard l(mu);
                       seen.emplace_back(m.payload());
                       versions.push_back(m.schema_version());
                       return Outcome::ack();
                     }).value();
  std::vector<Status> refusals;
  auto sub = bus->consume_tx(in, [&](const MessageView& m, Transaction& tx) {
                    char buf[64];
                    RecordBuilder b(buf, sizeof(buf));
                    b.add_string(1, "no-amount");  // amount has no default
                    Status bad1 = tx.publish(out, {.payload = *b.finish()});
                    Status bad2 = tx.publish(out, {.payload = "not a record"});
                    Status bad3 = tx.publish(out, {.payload = order("v9", 1), .schema_version = 9});
                    Status good = tx.publish(out, {.payload = order(std::string(m.payload()).c_str(), 7)});
                    REQUIRE(tx.put("done", std::string(m.payload()), "1").ok());
                    std::lock_guard l(mu);
                    refusals.push_back(bad1);
                    refusals.push_back(bad2);
                    refusals.push_back(bad3);
                    refusals.push_back(good);
                    return Outcome::ack();
                  }).value();
  REQUIRE(in.publish({.key = "k", .payload = "o-1"}).ok());
  REQUIRE(wait_until([&] {
    std::lock_guard l(mu);
    return seen.size() == 1;
  }));
  REQUIRE(wait_until([&] { return bus->table_get("done", "o-1").ok(); }));
  std::this_thread::sleep_for(50ms);
  std::lock_guard l(mu);
  REQUIRE(refusals.size() == 4);
  CHECK(refusals[0].code() == Code::SchemaViolation);
  CHECK(std::string(refusals[0].message()).find("\"amount\"") != std::string::npos);
  CHECK(refusals[1].code() == Code::SchemaViolation);
  CHECK(std::string(refusals[1].message()).find("magic") != std::string::npos);
  CHECK(refusals[2].code() == Code::SchemaViolation);
  CHECK(refusals[3].ok());
  REQUIRE(seen.size() == 1);  // only the good record reached the store
  CHECK(seen[0] == order("o-1", 7));
  CHECK(versions[0] == 1);
}

TEST_CASE("remove: reads in the audit window (the last 7 days, at most since the deprecation) block it") {
  auto bus = Bus::open(BusOptions{.workers = 1}).value();  // in-memory registry
  std::atomic<std::int64_t> clock{100 * kDay};
  detail::Access::set_schema_clock_for_testing(*bus, [&] { return clock.load(); });
  Schemas s = bus->schemas();
  REQUIRE(s.register_schema("w", schema(kId + "," + kAmountD)).ok());
  Topic t = bus->create_topic("w").value();
  std::atomic<int> n{0};
  auto sub = bus->subscribe(t, "late", [&](const MessageView& m) {
                   (void)s.view("w", m)->get_int64("amount");
                   ++n;
                   return Outcome::ack();
                 }).value();
  REQUIRE(s.deprecate("w", "amount", std::chrono::hours(24 * 10), {}, {"dana", "unused"}).ok());
  // One read at day 103.5, flushed then (the audit's "last read").
  clock = 103 * kDay + kDay / 2;
  REQUIRE(t.publish({.payload = order("o", 1)}).ok());
  REQUIRE(wait_until([&] { return n.load() == 1; }));
  REQUIRE(s.flush_usage().ok());
  CHECK(Schemas::kRemovalAuditWindow == std::chrono::hours(24 * 7));
  // Day 110: the window has passed, but day 103.5 is inside the last 7 days.
  clock = 110 * kDay;
  auto r = s.remove("w", "amount");
  REQUIRE(r.code() == Code::Incompatible);
  CHECK(std::string(r.status().message()).find("group \"late\"") != std::string::npos);
  CHECK(std::string(r.status().message()).find("window is open") == std::string::npos);
  clock = 110 * kDay + kDay / 2;  // exactly 7 days after the read: still inside
  CHECK(s.remove("w", "amount").code() == Code::Incompatible);
  clock = 110 * kDay + kDay / 2 + 1;  // the read has left the audit window
  auto ok = s.remove("w", "amount");
  CHECK_MESSAGE(ok.ok(), ok.status().to_string());
}

TEST_CASE("reads of nested fields are counted as \"parent.child\", down to 3 levels") {
  auto bus = Bus::open(BusOptions{.workers = 1}).value();  // in-memory registry
  Schemas s = bus->schemas();
  REQUIRE(s.register_schema("n", schema(kId + R"(,
    {"id": 2, "name": "zone", "type": "record", "default": {}, "fields": [
      {"id": 1, "name": "region", "type": "string", "default": ""},
      {"id": 2, "name": "inner", "type": "record", "default": {}, "fields": [
        {"id": 1, "name": "code", "type": "int64", "default": 0},
        {"id": 2, "name": "deep", "type": "record", "default": {}, "fields": [
          {"id": 1, "name": "x", "type": "bool", "default": false}]}]}]},
    {"id": 3, "name": "items", "type": "list", "items": "record", "default": [], "fields": [
      {"id": 1, "name": "sku", "type": "string", "default": ""}]})"))
              .ok());
  Topic t = bus->create_topic("n").value();
  std::atomic<int> n{0};
  GroupOptions go;
  go.reads = {"order_id", "zone"};  // declaring "zone" covers "zone.region" and below
  // Reads through FieldKeys are counted exactly like reads by name.
  const FieldKey order_id("order_id"), region_key("region");
  auto sub = bus->subscribe(t, "nested", [&](const MessageView& m) {
                   auto v = s.view("n", m).value();
                   CHECK(*v.get_string(order_id) == "o-1");
                   auto zone = v.get_record("zone").value();
                   CHECK(*zone.get_string(region_key) == "EU");
                   auto inner = zone.get_record("inner").value();
                   CHECK(*inner.get_int64("code") == 7);
                   CHECK(*inner.get_record("deep")->get_bool("x"));  // level 4: not counted
                   auto items = v.get_list("items").value();
                   REQUIRE(items.size() == 2);
                   CHECK(*items.get_record(0)->get_string("sku") == "A");
                   CHECK(*items.get_record(1)->get_string("sku") == "B");
                   ++n;
                   return Outcome::ack();
                 }, go).value();
  char buf[256];
  RecordBuilder b(buf, sizeof(buf));
  b.add_string(1, "o-1");
  b.begin_record(2).add_string(1, "EU").begin_record(2).add_int64(1, 7).begin_record(2).add_bool(1, true);
  b.end_record().end_record().end_record();
  b.begin_list(3, FieldType::Record);
  b.begin_record(0).add_string(1, "A").end_record().begin_record(0).add_string(1, "B").end_record();
  b.end_list();
  REQUIRE(t.publish({.payload = *b.finish()}).ok());
  REQUIRE(t.publish({.payload = *b.finish()}).ok());
  REQUIRE(wait_until([&] { return n.load() == 2; }));
  auto reads = [&](const char* field) -> std::uint64_t {
    auto u = s.usage("n", field, 0).value();
    return u.empty() ? 0 : u[0].reads;
  };
  CHECK(reads("order_id") == 2);
  CHECK(reads("zone") == 2);
  CHECK(reads("zone.region") == 2);
  CHECK(reads("zone.inner") == 2);
  CHECK(reads("zone.inner.code") == 2);
  CHECK(reads("zone.inner.deep") == 2);
  CHECK(reads("zone.inner.deep.x") == 0);  // deeper than 3 levels: not counted
  CHECK(reads("items") == 2);
  CHECK(reads("items.sku") == 4);  // two elements per record
  auto region = s.usage("n", "zone.region", 0).value();
  REQUIRE(region.size() == 1);
  CHECK_FALSE(region[0].outside_contract);  // covered by the contract's "zone"
  CHECK(region[0].in_contract);
  auto sku = s.usage("n", "items.sku", 0).value();
  REQUIRE(sku.size() == 1);
  CHECK(sku[0].outside_contract);  // "items" is not declared
}
