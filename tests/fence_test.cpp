// lanebus — MIT License.
// Fenced sinks (doc/leases.md) in one process, with a real LMDB store and a real LeaseTable:
// fenced durable lanes (barrier, stale, duplicates, forged barriers, batching, restart,
// reboot, per-lane slots, the test-only switch) and the store-level FencedResource check
// (every code; fence_api_test covers the public calls).
#include <doctest/doctest.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "access.hpp"
#include "durable_store.hpp"
#include "fence_lane.hpp"
#include "fence_resource.hpp"
#include "fence_support.hpp"
#include "lease_table.hpp"
#include "lanebus/bus.hpp"
#include "lanebus/fence.hpp"
#include "lanebus/lease.hpp"
#include "temp_dir.hpp"

using lanebus::Code;
using lanebus::FencedResource;
using lanebus::LeaseOwner;
using lanebus::LeaseTable;
using lanebus::Result;
using lanebus::Status;
using lanebus::detail::AppendRequest;
using lanebus::detail::AppendResult;
using lanebus::detail::DurableStore;
using lanebus::detail::fence_check;
using lanebus::detail::fence_write;
using lanebus::detail::resource_high_water;
using lanebus::detail::StoreTable;
using lanebus::detail::StoreTxn;
using lanebus::detail::TopicRef;
using lanebus::detail::TopicSpec;
using lanebus::test::TempDir;
using namespace std::chrono_literals;

namespace {

const Status& st_of(const Status& s) { return s; }
template <typename T>
Status st_of(const Result<T>& r) {
  return r.status();
}

#define CHECK_CODE(expr, expected, substring)                                                   \
  do {                                                                                          \
    Status _st = st_of(expr);                                                                   \
    CHECK_MESSAGE(_st.code() == (expected), _st.to_string());                                   \
    CHECK_MESSAGE(_st.message().find(substring) != std::string_view::npos, _st.to_string());   \
  } while (0)

struct Fixture {
  TempDir dir;
  std::unique_ptr<LeaseTable> table;
  std::unique_ptr<DurableStore> store;
  LeaseOwner a, b;

  explicit Fixture(bool check = true) {
    auto t = LeaseTable::open(dir.file("leases"), lanebus::test::fence_table_options());
    REQUIRE_MESSAGE(t.ok(), t.status().to_string());
    table = std::move(*t);
    reopen(check);
    a = *LeaseOwner::generate();
    b = *LeaseOwner::generate();
  }
  void reopen(bool check = true) {
    store.reset();
    auto s = lanebus::test::open_fenced_store(dir.file("store"), table.get(), check);
    REQUIRE_MESSAGE(s.ok(), s.status().to_string());
    store = std::move(*s);
  }
  TopicRef topic(const std::string& name, const std::string& fence, std::uint32_t lanes = 1, bool per_lane = false) {
    TopicSpec spec;
    spec.lanes = lanes;
    spec.fence = fence;
    spec.fence_per_lane = per_lane;
    auto t = store->open_topic(name, spec);
    REQUIRE_MESSAGE(t.ok(), t.status().to_string());
    return *t;
  }
  std::uint64_t grant(const std::string& lease, const LeaseOwner& who, std::chrono::milliseconds ttl = 60s) {
    auto l = table->acquire(lease, who, ttl);
    REQUIRE_MESSAGE(l.ok(), l.status().to_string());
    return l->token;
  }
  std::uint64_t hwm(const TopicRef& t, std::uint32_t lane = 0) {
    auto h = lanebus::detail::lane_fence_high_water(*store, t, lane);
    REQUIRE(h.ok());
    return *h;
  }
};

AppendRequest msg(const TopicRef& t, std::uint64_t token, std::string payload, std::string idem = "",
                  std::uint32_t lane = 0) {
  AppendRequest r;
  r.topic_id = t.id;
  r.lane = lane;
  r.header.fencing_token = token;
  r.idempotency_key = std::move(idem);
  r.payload = std::move(payload);
  return r;
}

std::vector<std::uint64_t> tokens(const std::vector<lanebus::detail::StoredMessage>& log) {
  std::vector<std::uint64_t> out;
  for (const auto& m : log) out.push_back(m.header.fencing_token);
  return out;
}

}  // namespace

TEST_CASE("a fenced topic keeps its fence across reopen; another fence is Conflict; bad names are InvalidName") {
  Fixture f;
  TopicRef t = f.topic("jobs", "batch-task-42");
  CHECK(t.fence == "batch-task-42");
  CHECK_FALSE(t.fence_per_lane);
  TopicSpec other;
  other.lanes = 1;
  other.fence = "other";
  CHECK_CODE(f.store->open_topic("jobs", other), Code::Conflict, "exists with fence \"batch-task-42\" per topic");
  TopicSpec none;
  none.lanes = 1;
  CHECK_CODE(f.store->open_topic("jobs", none), Code::Conflict, "not no fence");
  other.fence = "batch-task-42";
  other.fence_per_lane = true;
  CHECK_CODE(f.store->open_topic("jobs", other), Code::Conflict, "per lane");
  f.topic("plain", "");
  other.fence = "x";
  other.fence_per_lane = false;
  CHECK_CODE(f.store->open_topic("plain", other), Code::Conflict, "exists with no fence");
  other.fence = "Bad Name";
  CHECK_CODE(f.store->open_topic("new", other), Code::InvalidName, "fence");
  other.fence = std::string(195, 'a');
  CHECK_CODE(f.store->open_topic("new", other), Code::InvalidName, "at most 190");
  f.reopen();
  auto found = f.store->find_topic("jobs");
  REQUIRE(found.ok());
  CHECK(found->fence == "batch-task-42");
  CHECK(f.topic("jobs", "batch-task-42").id == t.id);
}

TEST_CASE("an append without a fencing token on a fenced lane is InvalidArgument") {
  Fixture f;
  TopicRef t = f.topic("jobs", "task");
  CHECK_CODE(f.store->append(msg(t, 0, "x")), Code::InvalidArgument, "has no fencing token");
  Status in_txn = f.store->write([&](StoreTxn& txn) { return txn.append(msg(t, 0, "x")).status(); });
  CHECK_CODE(in_txn, Code::InvalidArgument, "has no fencing token");
  CHECK(f.store->end_offset(t, 0).value() == 0);
}

TEST_CASE("barrier, same-generation and stale tokens on a fenced lane") {
  Fixture f;
  TopicRef t = f.topic("jobs", "task");
  std::uint64_t t1 = f.grant("task", f.a, 50ms);
  CHECK(f.hwm(t) == 0);
  REQUIRE(f.store->append(msg(t, t1, "a1")).ok());  // barrier of generation t1
  CHECK(f.hwm(t) == t1);
  REQUIRE(f.store->append(msg(t, t1, "a2")).ok());  // same generation
  std::this_thread::sleep_for(60ms);                 // let A's lease lapse so B can take over
  std::uint64_t t2 = f.grant("task", f.b);
  REQUIRE(t2 > t1);
  auto rb = f.store->append(msg(t, t2, "b1"));
  REQUIRE(rb.ok());
  CHECK_FALSE(rb->duplicate);
  CHECK(f.hwm(t) == t2);
  CHECK_CODE(f.store->append(msg(t, t1, "a3")), Code::StaleToken, "is below the high-water");
  CHECK(tokens(lanebus::test::read_lane_all(*f.store, t, 0)) == std::vector<std::uint64_t>{t1, t1, t2});
  CHECK(f.store->counters().append_failures == 1);
}

TEST_CASE("forged, foreign and huge barriers are FenceViolation and leave the fence unchanged") {
  Fixture f;
  TopicRef t = f.topic("jobs", "task");
  std::uint64_t t1 = f.grant("task", f.a);
  REQUIRE(f.store->append(msg(t, t1, "a1")).ok());
  std::uint64_t foreign = f.grant("elsewhere", f.b);  // granted, but for another name
  CHECK_CODE(f.store->append(msg(t, foreign, "x")), Code::FenceViolation, "was not confirmed as a grant of lease \"task\"");
  CHECK_CODE(f.store->append(msg(t, foreign + 7, "x")), Code::FenceViolation, "not confirmed");  // never granted
  CHECK_CODE(f.store->append(msg(t, ~std::uint64_t{0} - 1, "x")), Code::FenceViolation, "the fence is unchanged");
  CHECK(f.hwm(t) == t1);
  // Without a confirm hook no barrier passes; the current generation still does.
  f.store->set_fence_confirm(nullptr);
  std::uint64_t t2 = f.grant("task2", f.a);
  CHECK_CODE(f.store->append(msg(t, t2, "x")), Code::FenceViolation, "no lease confirmation hook");
  REQUIRE(f.store->append(msg(t, t1, "a2")).ok());
  CHECK(f.hwm(t) == t1);
  CHECK(tokens(lanebus::test::read_lane_all(*f.store, t, 0)) == std::vector<std::uint64_t>{t1, t1});
  // A hook that cannot answer now (Busy) refuses with Busy, fence unchanged.
  f.store->set_fence_confirm([](std::string_view, std::uint64_t) { return Status(Code::Busy, "stalled"); });
  CHECK_CODE(f.store->append(msg(t, t2, "x")), Code::Busy, "could not confirm it now");
  CHECK(f.hwm(t) == t1);
}

TEST_CASE("a duplicate idempotency key in one generation is dropped and reported; a new generation accepts it") {
  Fixture f;
  TopicRef t = f.topic("jobs", "task");
  std::uint64_t t1 = f.grant("task", f.a, 30ms);
  auto first = f.store->append(msg(t, t1, "p1", "order-7"));
  REQUIRE(first.ok());
  auto again = f.store->append(msg(t, t1, "p1-again", "order-7"));
  REQUIRE(again.ok());
  CHECK(again->duplicate);
  CHECK(again->offset == first->offset);
  CHECK(again->id == first->id);
  // A long key (stored hashed) behaves the same.
  const std::string long_key(1000, 'k');
  auto l1 = f.store->append(msg(t, t1, "long", long_key));
  auto l2 = f.store->append(msg(t, t1, "long", long_key));
  REQUIRE(l1.ok());
  REQUIRE(l2.ok());
  CHECK_FALSE(l1->duplicate);
  CHECK(l2->duplicate);
  CHECK(l2->offset == l1->offset);
  auto other = f.store->append(msg(t, t1, "other", std::string(1000, 'j')));
  REQUIRE(other.ok());
  CHECK_FALSE(other->duplicate);
  CHECK(f.store->counters().appends == 3);
  std::this_thread::sleep_for(40ms);
  std::uint64_t t2 = f.grant("task", f.b);
  auto next_gen = f.store->append(msg(t, t2, "p1-b", "order-7"));
  REQUIRE(next_gen.ok());
  CHECK_FALSE(next_gen->duplicate);
  auto log = lanebus::test::read_lane_all(*f.store, t, 0);
  REQUIRE(log.size() == 4);
  CHECK(log[0].payload == "p1");
  CHECK(log[3].payload == "p1-b");
  // The barrier dropped the old generation's dedupe records: one record left.
  int records = 0;
  REQUIRE(f.store->read([&](StoreTxn& txn) {
                 return txn.scan(StoreTable::Fence, "D", "D", [&](std::string_view, std::string_view) {
                   ++records;
                   return true;
                 });
               }).ok());
  CHECK(records == 1);
}

TEST_CASE("appends batched in one transaction are checked against the fence as left by earlier ones") {
  Fixture f;
  TopicRef t = f.topic("jobs", "task", 2);
  std::uint64_t t1 = f.grant("task", f.a, 20ms);
  REQUIRE(f.store->append(msg(t, t1, "a0")).ok());
  std::this_thread::sleep_for(30ms);
  std::uint64_t t2 = f.grant("task", f.b, 20ms);
  std::this_thread::sleep_for(30ms);
  std::uint64_t t3 = f.grant("task", f.a);
  SUBCASE("inside one write function (StoreTxn::append)") {
    std::vector<Status> got;
    Status s = f.store->write([&](StoreTxn& txn) -> Status {
      got.clear();
      for (std::uint64_t tok : {t2, t1, t2, t3, t2, t3}) got.push_back(txn.append(msg(t, tok, "m", "", 1)).status());
      return Status();  // rejected appends wrote nothing: the others commit
    });
    REQUIRE(s.ok());
    REQUIRE(got.size() == 6);
    CHECK(got[0].ok());
    CHECK(got[1].code() == Code::StaleToken);
    CHECK(got[2].ok());
    CHECK(got[3].ok());
    CHECK(got[4].code() == Code::StaleToken);
    CHECK(got[5].ok());
  }
  SUBCASE("queued appends taken as one batch by the writer") {
    // Hold the writer inside a transaction until every append is queued, so
    // the next batch takes them all.
    std::mutex m;
    std::condition_variable cv;
    bool go = false, holding = false;
    std::thread holder([&] {
      (void)f.store->write([&](StoreTxn&) {
        std::unique_lock<std::mutex> l(m);
        holding = true;
        cv.notify_all();
        cv.wait(l, [&] { return go; });
        return Status();
      });
    });
    {
      std::unique_lock<std::mutex> l(m);
      cv.wait(l, [&] { return holding; });
    }
    const std::uint64_t order[] = {t2, t1, t2, t3, t2, t3};
    std::vector<Status> got(6);
    std::mutex gm;
    int done = 0;
    for (int i = 0; i < 6; ++i) {
      REQUIRE(f.store
                  ->append_async(msg(t, order[i], "m", "", 1),
                                 [&, i](const Status& s, const AppendResult&) {
                                   std::lock_guard<std::mutex> l(gm);
                                   got[i] = s;
                                   ++done;
                                 })
                  .ok());
    }
    {
      std::lock_guard<std::mutex> l(m);
      go = true;
    }
    cv.notify_all();
    holder.join();
    REQUIRE(f.store->sync().ok());
    REQUIRE(f.store->write([](StoreTxn&) { return Status(); }).ok());  // after the batch
    std::lock_guard<std::mutex> l(gm);
    REQUIRE(done == 6);
    CHECK(f.store->counters().max_batch >= 6);
    CHECK(got[0].ok());
    CHECK(got[1].code() == Code::StaleToken);
    CHECK(got[2].ok());
    CHECK(got[3].ok());
    CHECK(got[4].code() == Code::StaleToken);
    CHECK(got[5].ok());
  }
  CHECK(tokens(lanebus::test::read_lane_all(*f.store, t, 1)) == std::vector<std::uint64_t>{t2, t2, t3, t3});
  CHECK(f.hwm(t, 1) == t3);
  CHECK(f.hwm(t, 0) == t3);  // per-topic fence: one high-water for every lane
  CHECK_CODE(f.store->append(msg(t, t1, "late", "", 0)), Code::StaleToken, "below the high-water");
}

TEST_CASE("per-lane fences: lane i is fenced by <fence>/slot-i on its own") {
  Fixture f;
  TopicRef t = f.topic("work", "work", 2, true);
  auto s0 = f.table->acquire("work/slot-0", f.a, 60s);
  auto s1 = f.table->acquire("work/slot-1", f.b, 60s);
  REQUIRE(s0.ok());
  REQUIRE(s1.ok());
  REQUIRE(f.store->append(msg(t, s1->token, "b", "", 1)).ok());
  // Slot 0's older token is fine on lane 0 (another fence), refused on lane 1.
  REQUIRE(f.store->append(msg(t, s0->token, "a", "", 0)).ok());
  CHECK_CODE(f.store->append(msg(t, s0->token, "a", "", 1)), Code::StaleToken, "work/slot-1");
  // A newer token of slot 0 is no barrier for lane 1 (granted for another lease).
  REQUIRE(f.table->release("work/slot-0", f.a, s0->token).ok());
  auto s0b = f.table->acquire("work/slot-0", f.a, 60s);
  REQUIRE(s0b.ok());
  CHECK_CODE(f.store->append(msg(t, s0b->token, "x", "", 1)), Code::FenceViolation, "lease \"work/slot-1\"");
  CHECK(f.hwm(t, 0) == s0->token);
  CHECK(f.hwm(t, 1) == s1->token);
}

TEST_CASE("the fence survives close and reopen, and tokens after a simulated lease-table reboot pass") {
  Fixture f;
  TopicRef t = f.topic("jobs", "task");
  std::uint64_t t1 = f.grant("task", f.a, 20ms);
  REQUIRE(f.store->append(msg(t, t1, "a")).ok());
  std::this_thread::sleep_for(30ms);
  std::uint64_t t2 = f.grant("task", f.b);
  REQUIRE(f.store->append(msg(t, t2, "b")).ok());
  f.reopen();
  t = f.topic("jobs", "task");
  CHECK(f.hwm(t) == t2);
  CHECK_CODE(f.store->append(msg(t, t1, "a-late")), Code::StaleToken, "below the high-water");
  // Reboot: a new boot id expires every lease and advances the epoch; new
  // tokens are higher than every old one, and the new segment confirms them.
  f.store.reset();
  f.table.reset();
  lanebus::detail::LeaseTableHooks reboot;
  reboot.boot_id_override = "boot-after-reboot";
  auto rebooted =
      lanebus::detail::open_lease_table_with_hooks(f.dir.file("leases"), lanebus::test::fence_table_options(), reboot);
  REQUIRE(rebooted.ok());
  f.table = std::move(*rebooted);
  f.reopen();
  t = f.topic("jobs", "task");
  std::uint64_t t3 = f.grant("task", f.a);
  CHECK(t3 > t2);
  REQUIRE(f.store->append(msg(t, t3, "after-reboot")).ok());
  CHECK_CODE(f.store->append(msg(t, t2, "b-late")), Code::StaleToken, "below the high-water");
  CHECK(tokens(lanebus::test::read_lane_all(*f.store, t, 0)) == std::vector<std::uint64_t>{t1, t2, t3});
}

TEST_CASE("negative control: with the fence check off (test-only) a stale append is committed") {
  Fixture f(false);
  TopicRef t = f.topic("jobs", "task");
  std::uint64_t t1 = f.grant("task", f.a, 20ms);
  std::this_thread::sleep_for(30ms);
  std::uint64_t t2 = f.grant("task", f.b);
  REQUIRE(f.store->append(msg(t, t2, "b")).ok());
  REQUIRE(f.store->append(msg(t, t1, "a-stale")).ok());
  auto log = lanebus::test::read_lane_all(*f.store, t, 0);
  CHECK(lanebus::test::token_regressions(log) == 1);
}

// ---------------------------------------------------------------- FencedResource

TEST_CASE("FencedResource: barrier, current generation, stale, forged, foreign lease and bad arguments") {
  Fixture f;
  FencedResource fence(*f.table);
  std::uint64_t t1 = f.grant("ledger-owner", f.a, 20ms);
  auto put = [&](std::uint64_t token, const std::string& value, const std::string& lease = "ledger-owner") {
    return fence_write(fence, *f.store, "ledger.balance", lease, token,
                       [&](StoreTxn& txn) { return txn.put(StoreTable::User, "balance", value); });
  };
  auto value = [&] {
    std::string v;
    REQUIRE(f.store->read([&](StoreTxn& txn) {
                     auto g = txn.get(StoreTable::User, "balance");
                     if (g.ok()) v = std::string(*g);
                     return Status();
                   }).ok());
    return v;
  };
  REQUIRE(put(t1, "100").ok());
  CHECK(resource_high_water(*f.store, "ledger.balance").value() == t1);
  REQUIRE(put(t1, "110").ok());
  std::this_thread::sleep_for(30ms);
  std::uint64_t t2 = f.grant("ledger-owner", f.b);
  REQUIRE(put(t2, "200").ok());
  CHECK_CODE(put(t1, "lost-update"), Code::StaleToken, "is below the high-water");
  CHECK(value() == "200");
  std::uint64_t other = f.grant("other-owner", f.a);
  CHECK_CODE(put(other, "x"), Code::FenceViolation, "was not confirmed as a grant of lease \"ledger-owner\"");
  CHECK_CODE(put(other, "x", "other-owner"), Code::FenceViolation, "is bound to lease \"ledger-owner\"");
  CHECK_CODE(put(~std::uint64_t{0}, "x"), Code::FenceViolation, "the fence is unchanged");
  CHECK_CODE(put(0, "x"), Code::InvalidArgument, "fencing token 0");
  CHECK_CODE(fence_write(fence, *f.store, "Bad Name", "ledger-owner", t2, [](StoreTxn&) { return Status(); }),
             Code::InvalidName, "fenced resource");
  CHECK_CODE(put(t2, "x", "bad lease!"), Code::InvalidName, "lease name");
  CHECK(resource_high_water(*f.store, "ledger.balance").value() == t2);
  CHECK(value() == "200");
  // check() inside the user's own write function.
  std::uint64_t t3 = 0;
  {
    REQUIRE(f.table->release("ledger-owner", f.b, t2).ok());
    t3 = f.grant("ledger-owner", f.a);
  }
  Status s = f.store->write([&](StoreTxn& txn) -> Status {
    Status c = fence_check(fence, txn, "ledger.balance", "ledger-owner", t3);
    if (!c.ok()) return c;
    return txn.put(StoreTable::User, "balance", "300");
  });
  REQUIRE(s.ok());
  s = f.store->write([&](StoreTxn& txn) -> Status {
    Status c = fence_check(fence, txn, "ledger.balance", "ledger-owner", t2);
    if (!c.ok()) return c;
    return txn.put(StoreTable::User, "balance", "stale");
  });
  CHECK_CODE(s, Code::StaleToken, "below the high-water");
  CHECK(value() == "300");
  Status in_read = f.store->read([&](StoreTxn& txn) { return fence_check(fence, txn, "ledger.balance", "ledger-owner", t3); });
  CHECK_CODE(in_read, Code::InvalidArgument, "write transaction");
}

TEST_CASE("FencedResource: a failed write function leaves the fence; Busy, no hook and corruption are reported") {
  Fixture f;
  std::uint64_t t1 = f.grant("owner", f.a);
  FencedResource fence(*f.table);
  Status s = fence_write(fence, *f.store, "res", "owner", t1, [](StoreTxn&) { return Status(Code::NotFound, "no row"); });
  CHECK_CODE(s, Code::NotFound, "no row");
  CHECK(resource_high_water(*f.store, "res").value() == 0);
  FencedResource busy([](std::string_view, std::uint64_t) { return Status(Code::Busy, "stalled"); });
  CHECK_CODE(fence_write(busy, *f.store, "res", "owner", t1, [](StoreTxn&) { return Status(); }), Code::Busy,
             "could not confirm it now");
  FencedResource none(lanebus::FenceConfirm{});
  CHECK_CODE(fence_write(none, *f.store, "res", "owner", t1, [](StoreTxn&) { return Status(); }), Code::FenceViolation,
             "no lease confirmation hook");
  CHECK(resource_high_water(*f.store, "res").value() == 0);
  REQUIRE(f.store->write([](StoreTxn& txn) { return txn.put(StoreTable::Fence, "Rbroken", "xy"); }).ok());
  CHECK_CODE(resource_high_water(*f.store, "broken"), Code::Corruption, "malformed");
  CHECK_CODE(fence_write(fence, *f.store, "broken", "owner", t1, [](StoreTxn&) { return Status(); }), Code::Corruption,
             "malformed");
}

TEST_CASE("FencedResource negative control: with the check off (test hook) a stale write lands") {
  Fixture f;
  std::uint64_t t1 = f.grant("owner", f.a, 20ms);
  std::this_thread::sleep_for(30ms);
  std::uint64_t t2 = f.grant("owner", f.b);
  FencedResource on(*f.table);
  FencedResource off(*f.table);
  lanebus::detail::Access::set_check_enabled_for_testing(off, false);
  auto put = [&](const FencedResource& r, std::uint64_t tok, const char* v) {
    return fence_write(r, *f.store, "res", "owner", tok, [&](StoreTxn& txn) { return txn.put(StoreTable::User, "k", v); });
  };
  REQUIRE(put(on, t2, "new").ok());
  CHECK(put(on, t1, "stale").code() == Code::StaleToken);
  CHECK(put(off, t1, "stale").ok());
  std::string v;
  REQUIRE(f.store->read([&](StoreTxn& txn) {
                   v = std::string(*txn.get(StoreTable::User, "k"));
                   return Status();
                 }).ok());
  CHECK(v == "stale");  // the lost update the fence prevents
}

TEST_CASE("FencedResource negative control through a Bus: with the check off (test hook) write lets a stale "
          "token's update land") {
  Fixture f;
  std::uint64_t t1 = f.grant("owner", f.a);
  REQUIRE(f.table->release("owner", f.a, t1).ok());
  std::uint64_t t2 = f.grant("owner", f.b);
  lanebus::BusOptions o;
  o.workers = 1;
  o.store.directory = f.dir.file("bus-store");
  o.lease_table = f.table.get();
  auto bus = lanebus::Bus::open(o);
  REQUIRE_MESSAGE(bus.ok(), bus.status().to_string());
  FencedResource on(*f.table);
  FencedResource off(*f.table);
  lanebus::detail::Access::set_check_enabled_for_testing(off, false);
  auto put = [&](const FencedResource& r, std::uint64_t tok, const char* v) {
    return r.write(**bus, "res", "owner", tok, [&](lanebus::Transaction& tx) { return tx.put("t", "k", v); });
  };
  REQUIRE(put(on, t2, "new").ok());
  CHECK(put(on, t1, "stale").code() == Code::StaleToken);
  CHECK((*bus)->table_get("t", "k").value() == "new");
  CHECK(put(off, t1, "stale").ok());
  CHECK((*bus)->table_get("t", "k").value() == "stale");  // the lost update the fence prevents
  CHECK(FencedResource::high_water(**bus, "res").value() == t2);
}
