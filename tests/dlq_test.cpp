// lanebus — MIT License.
// The dead-letter queue on a real LMDB store in a temp directory:
// arrivals (atomic with the ack), the review API, audit, retention, quota,
// automatic transient replay (injected clock), counters and classification.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dlq.hpp"
#include "durable_store.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using lanebus::detail::DlqStore;
using lanebus::detail::DurableStore;

namespace {

constexpr std::int64_t kT0 = 1'700'000'000'000'000'000;  // the injected clock's start (ns)
constexpr std::int64_t kMin = 60'000'000'000;

detail::TopicSpec spec(std::uint32_t lanes, bool is_queue) {
  detail::TopicSpec t;
  t.lanes = lanes;
  t.is_queue = is_queue;
  return t;
}

std::vector<std::uint64_t> ids_of(const Result<std::vector<DlqEntry>>& r) {
  std::vector<std::uint64_t> v;
  REQUIRE(r.ok());
  for (const DlqEntry& e : r.value()) v.push_back(e.id);
  return v;
}

bool contains(std::string_view hay, std::string_view needle) { return hay.find(needle) != std::string_view::npos; }

struct Fixture {
  lanebus::test::TempDir dir;
  std::unique_ptr<DurableStore> store;
  detail::TopicRef orders, payments;
  std::atomic<std::int64_t> clock{kT0};
  std::unique_ptr<DlqStore> dlq;

  explicit Fixture(DlqOptions opts = {}) {
    open();
    orders = store->open_topic("orders", spec(4, true)).value();
    payments = store->open_topic("payments", spec(2, false)).value();
    make_dlq(opts);
  }
  void open() {
    StoreOptions o;
    o.directory = dir.file("store");
    o.durability = Durability::Async;
    store = DurableStore::open(o).value();
  }
  void make_dlq(DlqOptions opts) {
    dlq = std::make_unique<DlqStore>(*store, opts, [this] { return clock.load(); });
  }
  void reopen(DlqOptions opts = {}) {
    dlq.reset();
    REQUIRE(store->close().ok());
    store.reset();
    open();
    orders = store->find_topic("orders").value();
    payments = store->find_topic("payments").value();
    make_dlq(opts);
  }
  DlqEntry entry(int i, ErrorClass c = ErrorClass::Permanent, const detail::TopicRef* t = nullptr) {
    if (t == nullptr) t = &orders;
    DlqEntry e;
    e.header.id = 1000 + i;
    e.header.created_at_ns = kT0 - 5 * kMin + i;
    e.header.correlation_id = 77 + i;
    e.header.fencing_token = 9 + i;
    e.header.attempt = 3;
    e.header.content_type = 12;
    e.header.schema_version = 4;
    e.key = "customer-" + std::to_string(i);
    e.idempotency_key = "pay-" + std::to_string(i);
    e.payload = std::string("{\"amount\":") + std::to_string(i) + "}\x01\x02";
    e.error_class = c;
    e.reason = "deserialize";
    e.error_text = "field 'amount_cents' missing";
    e.attempts = 3;
    e.first_failure_ns = kT0 - 2 * kMin;
    e.last_failure_ns = kT0 - kMin;
    e.topic = t->name;
    e.topic_id = t->id;
    e.lane = static_cast<std::uint32_t>(i) % t->lanes;
    e.offset = 40 + i;
    e.group = "billing";
    return e;
  }
  std::uint64_t add(const DlqEntry& e) {
    auto r = dlq->add(e);
    REQUIRE(r.ok());
    return *r;
  }
  std::uint64_t end(const detail::TopicRef& t, std::uint32_t lane) { return store->end_offset(t, lane).value(); }
  std::size_t audit_count() { return dlq->audit().value().size(); }
};

void check_same_message(const DlqEntry& a, const DlqEntry& b) {
  CHECK(a.header.id == b.header.id);
  CHECK(a.header.created_at_ns == b.header.created_at_ns);
  CHECK(a.header.correlation_id == b.header.correlation_id);
  CHECK(a.header.fencing_token == b.header.fencing_token);
  CHECK(a.header.attempt == b.header.attempt);
  CHECK(a.header.content_type == b.header.content_type);
  CHECK(a.header.schema_version == b.header.schema_version);
  CHECK(a.key == b.key);
  CHECK(a.idempotency_key == b.idempotency_key);
  CHECK(a.payload == b.payload);
  CHECK(a.error_class == b.error_class);
  CHECK(a.reason == b.reason);
  CHECK(a.error_text == b.error_text);
  CHECK(a.attempts == b.attempts);
  CHECK(a.first_failure_ns == b.first_failure_ns);
  CHECK(a.last_failure_ns == b.last_failure_ns);
  CHECK(a.topic == b.topic);
  CHECK(a.topic_id == b.topic_id);
  CHECK(a.lane == b.lane);
  CHECK(a.offset == b.offset);
  CHECK(a.group == b.group);
  CHECK(a.headers == b.headers);
}

}  // namespace

TEST_CASE("add then show round-trips every field; ids increase from 1") {
  Fixture f;
  DlqEntry in = f.entry(1);
  std::uint64_t id1 = f.add(in);
  f.clock += kMin;
  std::uint64_t id2 = f.add(f.entry(2, ErrorClass::Poison));
  CHECK(id1 == 1);
  CHECK(id2 == 2);
  DlqEntry out = f.dlq->show(id1).value();
  check_same_message(out, in);
  CHECK(out.id == id1);
  CHECK(out.state == DlqState::Pending);
  CHECK(out.dead_at_ns == kT0);
  CHECK(out.state_changed_at_ns == 0);
  CHECK(out.state_changed_by.empty());
  CHECK(f.dlq->show(id2).value().error_class == ErrorClass::Poison);
  CHECK(f.dlq->show(id2).value().dead_at_ns == kT0 + kMin);

  SUBCASE("the entry survives a reopen and ids keep increasing") {
    f.reopen();
    check_same_message(f.dlq->show(id1).value(), in);
    CHECK(f.add(f.entry(3)) == 3);
  }
  SUBCASE("show of an unknown id is NotFound naming the id") {
    auto r = f.dlq->show(42);
    CHECK(r.code() == Code::NotFound);
    CHECK(contains(r.status().message(), "42"));
  }
}

TEST_CASE("add validates the entry and stores nothing when it is refused") {
  Fixture f;
  DlqEntry e = f.entry(1);
  e.payload.clear();
  CHECK(f.dlq->add(e).code() == Code::InvalidArgument);
  e = f.entry(1);
  e.topic = "Bad Name";
  CHECK(f.dlq->add(e).code() == Code::InvalidName);
  e = f.entry(1);
  e.group.clear();
  CHECK(f.dlq->add(e).code() == Code::InvalidArgument);
  e = f.entry(1);
  e.key.assign(70000, 'k');
  auto r = f.dlq->add(e);
  CHECK(r.code() == Code::PayloadTooLarge);
  CHECK(contains(r.status().message(), "65535"));
  CHECK(f.dlq->list().value().empty());
  CHECK(f.dlq->counters().value().entries == 0);
}

TEST_CASE("add_in commits the DLQ entry in the same transaction as the ack of the failed message") {
  Fixture f;
  auto group = f.store->open_group(f.orders, "billing").value();
  detail::AppendRequest req;
  req.topic_id = f.orders.id;
  req.lane = 1;
  req.key = "k";
  req.payload = "bad";
  auto appended = f.store->append(std::move(req)).value();
  auto claimed = f.store->claim(group, 1).value();
  REQUIRE(claimed.has_value());
  DlqEntry e = f.entry(1);
  e.lane = 1;
  e.offset = appended.offset;

  SUBCASE("ack and entry together") {
    std::uint64_t id = 0;
    Status s = f.store->write([&](detail::StoreTxn& txn) -> Status {
      id = 0;
      auto r = f.dlq->add_in(txn, e, [&] { return txn.ack(group, 1, claimed->message.offset, claimed->attempt); });
      if (!r.ok()) return r.status();
      id = *r;
      return Status();
    });
    REQUIRE(s.ok());
    CHECK(id == 1);
    auto info = f.store->group_info(group).value();
    CHECK(info[1].in_flight == 0);
    CHECK(info[1].committed == appended.offset + 1);
    CHECK(f.dlq->counters().value().pending == 1);
  }
  SUBCASE("a failing ack (stale attempt) leaves neither the entry nor the ack") {
    Status s = f.store->write([&](detail::StoreTxn& txn) -> Status {
      auto r = f.dlq->add_in(txn, e, [&] { return txn.ack(group, 1, claimed->message.offset, claimed->attempt + 7); });
      return r.status();
    });
    CHECK(s.code() == Code::StaleToken);
    CHECK(f.dlq->list().value().empty());
    CHECK(f.dlq->counters().value().entries == 0);
    CHECK(f.store->group_info(group).value()[1].in_flight == 1);
  }
  SUBCASE("a refused entry (validation) does not ack the message") {
    e.payload.clear();
    bool acked = false;
    Status s = f.store->write([&](detail::StoreTxn& txn) -> Status {
      acked = false;
      auto r = f.dlq->add_in(txn, e, [&] {
        acked = true;
        return txn.ack(group, 1, claimed->message.offset, claimed->attempt);
      });
      return r.status();
    });
    CHECK(s.code() == Code::InvalidArgument);
    CHECK_FALSE(acked);
    CHECK(f.store->group_info(group).value()[1].in_flight == 1);
  }
  SUBCASE("add_in in a read transaction is refused") {
    Status s = f.store->read([&](detail::StoreTxn& txn) -> Status { return f.dlq->add_in(txn, e).status(); });
    CHECK(s.code() == Code::InvalidArgument);
  }
}

TEST_CASE("list filters by topic, group, class, state and age, and pages") {
  Fixture f;
  DlqEntry a = f.entry(1, ErrorClass::Transient);  // t0, orders, billing
  f.add(a);
  f.clock += 30 * kMin;
  DlqEntry b = f.entry(2, ErrorClass::Permanent, &f.payments);  // t0+30m
  b.group = "ledger";
  f.add(b);
  f.clock += 30 * kMin;
  f.add(f.entry(3, ErrorClass::Poison));  // t0+60m
  f.clock += 10 * kMin;                   // now = t0+70m
  std::uint64_t one = 1;
  REQUIRE(f.dlq->archive(std::span<const std::uint64_t>(&one, 1), "ann").ok());

  auto ids = [&](const DlqFilter& flt) {
    return ids_of(f.dlq->list(flt));
  };
  using V = std::vector<std::uint64_t>;
  CHECK(ids({}) == V{1, 2, 3});
  DlqFilter flt;
  flt.topic = "payments";
  CHECK(ids(flt) == V{2});
  flt = {};
  flt.group = "billing";
  CHECK(ids(flt) == V{1, 3});
  flt = {};
  flt.error_class = ErrorClass::Poison;
  CHECK(ids(flt) == V{3});
  flt = {};
  flt.state = DlqState::Archived;
  CHECK(ids(flt) == V{1});
  flt = {};
  flt.state = DlqState::Pending;
  CHECK(ids(flt) == V{2, 3});
  flt = {};
  flt.older_than = std::chrono::minutes(35);  // arrived at or before t0+35m
  CHECK(ids(flt) == V{1, 2});
  flt = {};
  flt.newer_than = std::chrono::minutes(45);  // arrived at or after t0+25m
  CHECK(ids(flt) == V{2, 3});
  flt = {};
  flt.older_than = std::chrono::minutes(20);  // at or before t0+50m: 1, 2
  flt.newer_than = std::chrono::minutes(50);  // at or after t0+20m: 2, 3
  CHECK(ids(flt) == V{2});
  flt = {};
  flt.limit = 2;
  CHECK(ids(flt) == V{1, 2});
  flt.after_id = 2;
  CHECK(ids(flt) == V{3});
  flt = {};
  flt.topic = "orders";
  flt.error_class = ErrorClass::Permanent;
  CHECK(ids(flt).empty());
}

TEST_CASE("replay appends the original message to its origin topic and marks the entry replayed") {
  Fixture f;
  DlqEntry in = f.entry(2);  // lane 2 of orders
  std::uint64_t id = f.add(in);
  const std::uint64_t end_before = f.end(f.orders, 2);
  f.clock += kMin;
  std::uint64_t ids[] = {id};
  auto r = f.dlq->replay(ids, "ann");
  REQUIRE(r.ok());
  REQUIRE(r->size() == 1);
  CHECK((*r)[0].id == id);
  CHECK((*r)[0].topic == "orders");
  CHECK((*r)[0].lane == 2);
  CHECK((*r)[0].offset == end_before);
  CHECK_FALSE((*r)[0].republished);

  auto batch = f.store->read(f.orders, 2, end_before).value();
  REQUIRE(batch.messages.size() == 1);
  const detail::StoredMessage& m = batch.messages[0];
  CHECK(m.key == in.key);
  CHECK(m.idempotency_key == in.idempotency_key);
  CHECK(m.payload == in.payload);
  CHECK(m.header.id == in.header.id);
  CHECK(m.header.correlation_id == in.header.correlation_id);
  CHECK(m.header.fencing_token == in.header.fencing_token);
  CHECK(m.header.content_type == in.header.content_type);
  CHECK(m.header.schema_version == in.header.schema_version);
  CHECK(m.header.created_at_ns > in.header.created_at_ns);  // the replay time: topic retention keeps it

  DlqEntry e = f.dlq->show(id).value();
  CHECK(e.state == DlqState::Replayed);
  CHECK(e.state_changed_by == "ann");
  CHECK(e.state_changed_at_ns == kT0 + kMin);
  CHECK(e.replay_offset == end_before);
  check_same_message(e, in);  // the record of the failure is kept

  auto c = f.dlq->counters().value();
  CHECK(c.pending == 0);
  CHECK(c.replayed == 1);
  CHECK(c.replays == 1);
  auto audit = f.dlq->audit().value();
  REQUIRE(audit.size() == 1);
  CHECK(audit[0].action == DlqAction::Replay);
  CHECK(audit[0].operator_name == "ann");
  CHECK(audit[0].ids == std::vector<std::uint64_t>{id});
  CHECK(audit[0].at_ns == kT0 + kMin);
}

TEST_CASE("replaying an archived or already replayed entry is refused and changes nothing") {
  Fixture f;
  std::uint64_t a = f.add(f.entry(1));  // lane 1
  std::uint64_t b = f.add(f.entry(2));  // lane 2
  std::uint64_t c = f.add(f.entry(3));  // lane 3
  std::uint64_t only_a[] = {a}, only_b[] = {b};
  REQUIRE(f.dlq->replay(only_a, "ann").ok());
  REQUIRE(f.dlq->archive(only_b, "bob").ok());
  const std::size_t audits = f.audit_count();
  const std::uint64_t ends[] = {f.end(f.orders, 1), f.end(f.orders, 2), f.end(f.orders, 3)};

  SUBCASE("replayed twice") {
    auto r = f.dlq->replay(only_a, "ann");
    CHECK(r.code() == Code::Conflict);
    CHECK(contains(r.status().message(), "entry 1 is already replayed by \"ann\""));
  }
  SUBCASE("archived") {
    auto r = f.dlq->replay(only_b, "ann");
    CHECK(r.code() == Code::Conflict);
    CHECK(contains(r.status().message(), "already archived"));
  }
  SUBCASE("a batch with one archived entry replays none of them") {
    std::uint64_t mixed[] = {c, b};
    auto r = f.dlq->replay(mixed, "ann");
    CHECK(r.code() == Code::Conflict);
    CHECK(f.dlq->show(c).value().state == DlqState::Pending);
  }
  SUBCASE("archiving an archived entry") {
    Status s = f.dlq->archive(only_b, "bob");
    CHECK(s.code() == Code::Conflict);
  }
  CHECK(f.end(f.orders, 1) == ends[0]);
  CHECK(f.end(f.orders, 2) == ends[1]);
  CHECK(f.end(f.orders, 3) == ends[2]);
  CHECK(f.audit_count() == audits);
  CHECK(f.dlq->show(a).value().state == DlqState::Replayed);
  CHECK(f.dlq->show(b).value().state == DlqState::Archived);
  auto cnt = f.dlq->counters().value();
  CHECK(cnt.pending == 1);
  CHECK(cnt.replays == 1);
}

TEST_CASE("operations on unknown ids are refused atomically: NotFound naming the id, nothing changed") {
  Fixture f;
  std::uint64_t a = f.add(f.entry(1));
  std::uint64_t b = f.add(f.entry(2));
  const std::uint64_t end1 = f.end(f.orders, 1);
  std::uint64_t batch[] = {a, 999, b};
  auto r = f.dlq->replay(batch, "ann");
  CHECK(r.code() == Code::NotFound);
  CHECK(contains(r.status().message(), "entry 999 not found"));
  Status s = f.dlq->archive(batch, "ann");
  CHECK(s.code() == Code::NotFound);
  CHECK(contains(s.message(), "999"));
  auto p = f.dlq->purge(batch, "ann");
  CHECK(p.code() == Code::NotFound);
  CHECK(contains(p.status().message(), "999"));
  CHECK(f.end(f.orders, 1) == end1);
  CHECK(f.dlq->show(a).value().state == DlqState::Pending);
  CHECK(f.dlq->show(b).value().state == DlqState::Pending);
  CHECK(f.audit_count() == 0);
  CHECK(f.dlq->counters().value().pending == 2);

  SUBCASE("no ids, or no operator, is InvalidArgument") {
    CHECK(f.dlq->replay({}, "ann").code() == Code::InvalidArgument);
    std::uint64_t one[] = {a};
    auto no_op = f.dlq->replay(one, "");
    CHECK(no_op.code() == Code::InvalidArgument);
    CHECK(contains(no_op.status().message(), "operator"));
    CHECK(f.dlq->archive(one, "").code() == Code::InvalidArgument);
    CHECK(f.dlq->purge(one, "").code() == Code::InvalidArgument);
    CHECK(f.dlq->purge(DlqFilter{}, "").code() == Code::InvalidArgument);
  }
}

TEST_CASE("replay of an entry whose origin topic does not exist is NotFound naming the topic") {
  Fixture f;
  DlqEntry e = f.entry(1);
  e.topic = "gone";
  e.topic_id = 99;
  std::uint64_t id = f.add(e);
  std::uint64_t ids[] = {id};
  auto r = f.dlq->replay(ids, "ann");
  CHECK(r.code() == Code::NotFound);
  CHECK(contains(r.status().message(), "\"gone\""));
  CHECK(f.dlq->show(id).value().state == DlqState::Pending);
}

TEST_CASE("ephemeral origins replay through the republish callback only") {
  Fixture f;
  DlqEntry e = f.entry(1);
  e.topic = "clicks";
  e.topic_id = 0;
  std::uint64_t id = f.add(e);
  std::uint64_t ids[] = {id};
  auto r = f.dlq->replay(ids, "ann");
  CHECK(r.code() == Code::InvalidArgument);
  CHECK(contains(r.status().message(), "ephemeral"));
  CHECK(f.dlq->show(id).value().state == DlqState::Pending);
  std::vector<std::string> republished;
  r = f.dlq->replay(ids, "ann", [&](const DlqEntry& x) {
    republished.push_back(x.payload);
    return Status();
  });
  REQUIRE(r.ok());
  CHECK((*r)[0].republished);
  CHECK(republished == std::vector<std::string>{e.payload});
  CHECK(f.dlq->show(id).value().state == DlqState::Replayed);
}

TEST_CASE("every replay, archive and purge writes an audit record with operator, time and ids") {
  Fixture f;
  for (int i = 1; i <= 6; ++i) f.add(f.entry(i, i == 6 ? ErrorClass::Poison : ErrorClass::Permanent));
  std::uint64_t r1[] = {2, 1}, a1[] = {3}, p1[] = {4, 4};
  REQUIRE(f.dlq->replay(r1, "ann").ok());
  f.clock += kMin;
  REQUIRE(f.dlq->archive(a1, "bob").ok());
  f.clock += kMin;
  CHECK(f.dlq->purge(p1, "cy").value() == 1);
  DlqFilter poison;
  poison.error_class = ErrorClass::Poison;
  CHECK(f.dlq->purge(poison, "dee").value() == 1);
  DlqFilter none;
  none.topic = "nothing";
  CHECK(f.dlq->purge(none, "eve").value() == 0);  // matched nothing: no audit record

  auto audit = f.dlq->audit().value();
  REQUIRE(audit.size() == 4);
  CHECK(audit[0].seq == 1);
  CHECK(audit[0].action == DlqAction::Replay);
  CHECK(audit[0].operator_name == "ann");
  CHECK(audit[0].ids == std::vector<std::uint64_t>{1, 2});
  CHECK(audit[0].at_ns == kT0);
  CHECK(audit[1].action == DlqAction::Archive);
  CHECK(audit[1].operator_name == "bob");
  CHECK(audit[1].ids == std::vector<std::uint64_t>{3});
  CHECK(audit[1].at_ns == kT0 + kMin);
  CHECK(audit[2].action == DlqAction::Purge);
  CHECK(audit[2].operator_name == "cy");
  CHECK(audit[2].ids == std::vector<std::uint64_t>{4});
  CHECK(audit[3].action == DlqAction::Purge);
  CHECK(audit[3].operator_name == "dee");
  CHECK(audit[3].ids == std::vector<std::uint64_t>{6});
  CHECK(f.dlq->audit(2, 1).value().size() == 1);
  CHECK(f.dlq->audit(2, 1).value()[0].seq == 3);
  CHECK(f.dlq->show(4).code() == Code::NotFound);
  auto c = f.dlq->counters().value();
  CHECK(c.entries == 4);  // 1, 2 (replayed), 3 (archived), 5 (pending)
  CHECK(c.purged == 2);
}

TEST_CASE("retention expires entries by age and by count, oldest first, audited as retention") {
  SUBCASE("age") {
    DlqOptions o;
    o.retention_max_age = std::chrono::hours(1);
    Fixture f(o);
    f.add(f.entry(1));
    f.clock += 40 * kMin;
    f.add(f.entry(2));
    f.clock += 30 * kMin;  // entry 1 is 70 min old, entry 2 30 min
    CHECK(f.dlq->expire().value() == 1);
    CHECK(f.dlq->show(1).code() == Code::NotFound);
    CHECK(f.dlq->show(2).ok());
    CHECK(f.dlq->expire().value() == 0);
    auto audit = f.dlq->audit().value();
    REQUIRE(audit.size() == 1);
    CHECK(audit[0].action == DlqAction::Expire);
    CHECK(audit[0].operator_name == "retention");
    CHECK(audit[0].ids == std::vector<std::uint64_t>{1});
    auto c = f.dlq->counters().value();
    CHECK(c.expired == 1);
    CHECK(c.entries == 1);
    CHECK(c.pending == 1);
  }
  SUBCASE("count, in bounded batches") {
    DlqOptions o;
    o.retention_max_age = std::chrono::milliseconds(0);
    o.retention_max_count = 2;
    o.expire_batch = 2;
    Fixture f(o);
    for (int i = 1; i <= 5; ++i) f.add(f.entry(i));
    CHECK(f.dlq->expire().value() == 2);
    CHECK(f.dlq->expire().value() == 1);
    CHECK(f.dlq->expire().value() == 0);
    CHECK(ids_of(f.dlq->list()) == std::vector<std::uint64_t>{4, 5});
    CHECK(f.dlq->counters().value().expired == 3);
  }
  SUBCASE("no limits: nothing expires") {
    DlqOptions o;
    o.retention_max_age = std::chrono::milliseconds(0);
    Fixture f(o);
    f.add(f.entry(1));
    f.clock += 100000 * kMin;
    CHECK(f.dlq->expire().value() == 0);
    CHECK(f.dlq->show(1).ok());
  }
}

TEST_CASE("the quota refuses new entries or drops the oldest, explicitly and counted (R13)") {
  SUBCASE("RejectNew") {
    DlqOptions o;
    o.max_entries = 2;
    Fixture f(o);
    f.add(f.entry(1));
    f.add(f.entry(2));
    auto r = f.dlq->add(f.entry(3));
    CHECK(r.code() == Code::QuotaExceeded);
    CHECK(contains(r.status().message(), "max_entries 2"));
    auto c = f.dlq->counters().value();
    CHECK(c.entries == 2);
    CHECK(c.rejected == 1);
  }
  SUBCASE("DropOldest by count") {
    DlqOptions o;
    o.max_entries = 2;
    o.overflow = DlqOverflow::DropOldest;
    Fixture f(o);
    f.add(f.entry(1));
    f.add(f.entry(2));
    CHECK(f.add(f.entry(3)) == 3);
    CHECK(ids_of(f.dlq->list()) == std::vector<std::uint64_t>{2, 3});
    auto c = f.dlq->counters().value();
    CHECK(c.dropped == 1);
    CHECK(c.entries == 2);
    auto audit = f.dlq->audit().value();
    REQUIRE(audit.size() == 1);
    CHECK(audit[0].operator_name == "quota");
    CHECK(audit[0].ids == std::vector<std::uint64_t>{1});
  }
  SUBCASE("bytes stay under max_bytes") {
    DlqOptions o;
    o.max_entries = 0;
    o.overflow = DlqOverflow::DropOldest;
    o.max_bytes = 3 * detail::encode_dlq_entry(Fixture().entry(1)).size();
    Fixture f(o);
    for (int i = 1; i <= 9; ++i) f.add(f.entry(i));  // single-digit i: equal sizes
    auto c = f.dlq->counters().value();
    CHECK(c.bytes <= o.max_bytes);
    CHECK(c.entries == 3);
    CHECK(c.dropped == 6);
    DlqEntry huge = f.entry(9);
    huge.payload.assign(o.max_bytes, 'x');
    auto r = f.dlq->add(huge);
    CHECK(r.code() == Code::QuotaExceeded);
    CHECK(contains(r.status().message(), "alone"));
  }
}

TEST_CASE("transient entries are replayed automatically after the cool-down; permanent and poison wait") {
  Fixture f;
  std::uint64_t t = f.add(f.entry(1, ErrorClass::Transient));
  std::uint64_t p = f.add(f.entry(2, ErrorClass::Permanent));
  std::uint64_t x = f.add(f.entry(3, ErrorClass::Poison));
  const std::uint64_t end1 = f.end(f.orders, 1);
  f.clock += 4 * kMin;
  CHECK(f.dlq->replay_due_transient(std::chrono::minutes(5)).value() == 0);
  CHECK(f.dlq->show(t).value().state == DlqState::Pending);
  CHECK(f.audit_count() == 0);
  f.clock += 2 * kMin;
  CHECK(f.dlq->replay_due_transient(std::chrono::minutes(5)).value() == 1);
  DlqEntry e = f.dlq->show(t).value();
  CHECK(e.state == DlqState::Replayed);
  CHECK(e.state_changed_by == "auto");
  CHECK(f.end(f.orders, 1) == end1 + 1);
  CHECK(f.dlq->show(p).value().state == DlqState::Pending);
  CHECK(f.dlq->show(x).value().state == DlqState::Pending);
  CHECK(f.dlq->replay_due_transient(std::chrono::minutes(5)).value() == 0);  // already replayed
  auto c = f.dlq->counters().value();
  CHECK(c.auto_replays == 1);
  CHECK(c.replays == 0);
  auto audit = f.dlq->audit().value();
  REQUIRE(audit.size() == 1);
  CHECK(audit[0].action == DlqAction::AutoReplay);
  CHECK(audit[0].operator_name == "auto");
  CHECK(audit[0].ids == std::vector<std::uint64_t>{t});
}

TEST_CASE("automatic replay with the real clock picks an entry up once its short cool-down passed") {
  lanebus::test::TempDir dir;
  StoreOptions o;
  o.directory = dir.file("store");
  o.durability = Durability::Async;
  auto store = DurableStore::open(o).value();
  auto topic = store->open_topic("orders", spec(1, true)).value();
  DlqStore dlq(*store);  // the transaction's wall clock
  DlqEntry e;
  e.topic = "orders";
  e.topic_id = topic.id;
  e.group = "g";
  e.payload = "p";
  e.error_class = ErrorClass::Transient;
  std::uint64_t id = dlq.add(e).value();
  std::uint64_t replayed = 0;
  CHECK(lanebus::test::wait_until([&] {
    replayed += dlq.replay_due_transient(std::chrono::milliseconds(1), "sched").value();
    return replayed == 1;
  }));
  CHECK(dlq.show(id).value().state_changed_by == "sched");
  CHECK(store->end_offset(topic, 0).value() == 1);
}

TEST_CASE("counters: depth, oldest pending age and arrivals per class are persisted and exact") {
  Fixture f;
  CHECK(f.dlq->counters().value().oldest_pending_at_ns == 0);
  f.add(f.entry(1, ErrorClass::Transient));
  f.clock += kMin;
  f.add(f.entry(2, ErrorClass::Permanent));
  f.add(f.entry(3, ErrorClass::Permanent));
  f.add(f.entry(4, ErrorClass::Poison));
  f.clock += kMin;
  std::uint64_t first[] = {1};
  REQUIRE(f.dlq->archive(first, "ann").ok());
  auto check = [&] {
    auto c = f.dlq->counters().value();
    CHECK(c.pending == 3);
    CHECK(c.archived == 1);
    CHECK(c.entries == 4);
    CHECK(c.arrivals[0] == 1);
    CHECK(c.arrivals[1] == 2);
    CHECK(c.arrivals[2] == 1);
    CHECK(c.oldest_pending_at_ns == kT0 + kMin);  // entry 1 (oldest) is archived
    CHECK(c.oldest_pending_age_ns == kMin);
    std::uint64_t bytes = 0;
    auto all = f.dlq->list();
    REQUIRE(all.ok());
    for (const DlqEntry& e : all.value()) bytes += detail::encode_dlq_entry(e).size();
    CHECK(c.bytes == bytes);
  };
  check();
  f.reopen();
  check();
}

TEST_CASE("classify_failure: crashes make poison, reject makes permanent, the rest is transient") {
  using K = Outcome::Kind;
  CHECK(classify_failure(K::Reject, 1, 1, false) == ErrorClass::Permanent);
  CHECK(classify_failure(K::Retry, 5, 5, false) == ErrorClass::Transient);
  CHECK(classify_failure(K::Retry, 5, 5, true) == ErrorClass::Transient);
  CHECK(classify_failure(K::Retry, 5, 2, false) == ErrorClass::Poison);  // 3 crashes
  CHECK(classify_failure(K::Reject, 4, 1, false) == ErrorClass::Poison);
  CHECK(classify_failure(K::Retry, 4, 2, false) == ErrorClass::Transient);  // 2 crashes < 3
  CHECK(classify_failure(K::Retry, 2, 1, false, 1) == ErrorClass::Poison);
  CHECK(classify_failure(K::Retry, 9, 0, false, 0) == ErrorClass::Transient);  // 0 = never poison
  CHECK(classify_failure(K::Retry, 1, 3, false) == ErrorClass::Transient);     // more outcomes than attempts
}

TEST_CASE("poison bookkeeping: persisted attempts minus noted outcomes counts crashed deliveries") {
  Fixture f;
  auto group = f.store->open_group(f.orders, "billing").value();
  detail::AppendRequest req;
  req.topic_id = f.orders.id;
  req.lane = 0;
  req.payload = "boom";
  auto at = f.store->append(std::move(req)).value();
  // Attempt 1 returns retry: the outcome is noted before the claim is released.
  auto c1 = f.store->claim(group, 0).value();
  REQUIRE(c1.has_value());
  std::uint32_t noted = 0;
  REQUIRE(f.store->write([&](detail::StoreTxn& txn) -> Status {
                  auto n = f.dlq->note_outcome_in(txn, group, 0, at.offset);
                  if (!n.ok()) return n.status();
                  noted = *n;
                  return Status();
                })
              .ok());
  CHECK(noted == 1);
  REQUIRE(f.store->release(group, 0, at.offset, c1->attempt, std::chrono::milliseconds(0)).ok());
  // Attempts 2 and 3 "crash": claimed, never answered; the claim expires.
  detail::ClaimOptions short_claim;
  short_claim.visibility = std::chrono::milliseconds(1);
  std::uint32_t attempt = 0;
  for (int crash = 0; crash < 2; ++crash) {
    REQUIRE(lanebus::test::wait_until([&] {
      auto c = f.store->claim(group, 0, short_claim).value();
      if (c) attempt = c->attempt;
      return c.has_value();
    }));
  }
  f.reopen();
  auto group2 = f.store->find_group(f.orders, "billing").value();
  std::optional<detail::ClaimedMessage> c4;
  REQUIRE(lanebus::test::wait_until([&] {
    c4 = f.store->claim(group2, 0).value();
    return c4.has_value();
  }));
  CHECK(c4->attempt == 4);
  std::uint32_t outcomes = 99;
  REQUIRE(f.store->read([&](detail::StoreTxn& txn) -> Status {
                  auto n = f.dlq->outcomes_in(txn, group2, 0, at.offset);
                  if (!n.ok()) return n.status();
                  outcomes = *n;
                  return Status();
                })
              .ok());
  CHECK(outcomes == 1);
  // Before delivering attempt 4: 3 attempts, 1 with an outcome = 2 crashes.
  CHECK(classify_failure(Outcome::Kind::Retry, c4->attempt - 1, outcomes, false, 2) == ErrorClass::Poison);
  // Dead-letter it as poison with the ack, and forget the bookkeeping, in one transaction.
  DlqEntry e = f.entry(0, ErrorClass::Poison);
  e.offset = at.offset;
  e.attempts = c4->attempt - 1;
  REQUIRE(f.store->write([&](detail::StoreTxn& txn) -> Status {
                  auto r = f.dlq->add_in(txn, e, [&]() -> Status {
                    Status s = txn.ack(group2, 0, at.offset, c4->attempt);
                    if (!s.ok()) return s;
                    return f.dlq->forget_outcomes_in(txn, group2, 0, at.offset);
                  });
                  return r.status();
                })
              .ok());
  REQUIRE(f.store->read([&](detail::StoreTxn& txn) -> Status {
                  outcomes = f.dlq->outcomes_in(txn, group2, 0, at.offset).value();
                  return Status();
                })
              .ok());
  CHECK(outcomes == 0);
  CHECK(f.store->group_info(group2).value()[0].in_flight == 0);
  CHECK(f.dlq->counters().value().arrivals[2] == 1);
  (void)attempt;
}

TEST_CASE("a malformed entry record decodes to Corruption") {
  Fixture f;
  std::string enc = detail::encode_dlq_entry(f.entry(1));
  CHECK(detail::decode_dlq_entry(enc).ok());
  CHECK(detail::decode_dlq_entry(std::string_view(enc).substr(0, enc.size() - 1)).code() == Code::Corruption);
  CHECK(detail::decode_dlq_entry(enc + "x").code() == Code::Corruption);
  CHECK(detail::decode_dlq_entry("").code() == Code::Corruption);
  enc[0] = 9;  // a newer layout
  CHECK(detail::decode_dlq_entry(enc).code() == Code::Corruption);
}

TEST_CASE("an entry with headers is format 2; one without stays format 1; bad header blocks are refused") {
  Fixture f;
  DlqEntry plain = f.entry(1);
  CHECK(detail::encode_dlq_entry(plain)[0] == 1);  // as before, byte for byte
  DlqEntry with = f.entry(2);
  with.headers = std::string("\x02\x00\x0d\x00", 4) + std::string("\x01\x01\x00" "ab", 5) +
                 std::string("\x02\x03\x00" "xyabc", 8);
  std::string enc = detail::encode_dlq_entry(with);
  CHECK(enc[0] == 2);
  DlqEntry back = detail::decode_dlq_entry(enc).value();
  check_same_message(back, with);
  CHECK(HeadersView(back.headers).find("xy") == std::optional<std::string_view>("abc"));
  // Through the store, across a reopen.
  const std::uint64_t id = f.add(with);
  f.reopen();
  check_same_message(f.dlq->show(id).value(), with);
  // A damaged block in a stored entry: Corruption, not a view past the bytes.
  std::string bad = enc;
  bad[bad.size() - with.headers.size()] = 5;  // the count lies
  CHECK(detail::decode_dlq_entry(bad).code() == Code::Corruption);
  // Format 2 with an empty block is not written by anyone: Corruption.
  std::string empty_block = detail::encode_dlq_entry(plain);
  empty_block[0] = 2;
  empty_block += std::string(4, '\0');
  CHECK(detail::decode_dlq_entry(empty_block).code() == Code::Corruption);
  // add refuses a block that is not one, and stores nothing.
  const std::uint64_t before = f.dlq->counters().value().entries;
  DlqEntry e = f.entry(3);
  e.headers = "not a header block";
  auto r = f.dlq->add(e);
  CHECK(r.code() == Code::InvalidArgument);
  CHECK(contains(r.status().message(), "headers"));
  CHECK(f.dlq->counters().value().entries == before);
}

TEST_CASE("to_string and parse of classes and states are inverse") {
  for (ErrorClass c : {ErrorClass::Transient, ErrorClass::Permanent, ErrorClass::Poison}) {
    CHECK(parse_error_class(to_string(c)) == c);
  }
  for (DlqState s : {DlqState::Pending, DlqState::Replayed, DlqState::Archived}) {
    CHECK(parse_dlq_state(to_string(s)) == s);
  }
  CHECK_FALSE(parse_error_class("Poison").has_value());
  CHECK_FALSE(parse_dlq_state("").has_value());
  CHECK(std::string(to_string(DlqAction::AutoReplay)) == "auto-replay");
}

TEST_CASE("replay into a fenced origin topic is refused: only the lease holder may append there") {
  Fixture f;
  detail::TopicSpec fenced = spec(1, true);
  fenced.fence = "orders-writer";
  auto t = f.store->open_topic("fenced", fenced);
  REQUIRE(t.ok());
  std::uint64_t id = f.add(f.entry(1, ErrorClass::Transient, &*t));
  std::uint64_t ids[] = {id};
  auto r = f.dlq->replay(ids, "ann");
  CHECK(r.code() == Code::InvalidArgument);
  CHECK(contains(r.status().message(), "fenced"));
  f.clock += 60 * kMin;
  CHECK(f.dlq->replay_due_transient(std::chrono::minutes(5)).value() == 0);  // skipped, left pending
  CHECK(f.dlq->show(id).value().state == DlqState::Pending);
  CHECK(f.end(*t, 0) == 0);
  CHECK(f.audit_count() == 0);
}
