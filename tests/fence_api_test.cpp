// lanebus — MIT License.
// FencedResource through the public API only (what an installed program can
// use): FencedResource::write / high_water on a durable Bus, and
// Transaction::fence inside a transactional handler, with a real LMDB store and
// a real LeaseTable. Includes no lib/ header on purpose.
#include <doctest/doctest.h>

#include <map>
#include <mutex>
#include <string>

#include "lanebus/lanebus.hpp"
#include "scratch_dir.hpp"
#include "wait.hpp"

using lanebus::Bus;
using lanebus::Code;
using lanebus::FencedResource;
using lanebus::LeaseOwner;
using lanebus::LeaseTable;
using lanebus::MessageView;
using lanebus::Outcome;
using lanebus::Result;
using lanebus::Status;
using lanebus::Transaction;
using lanebus::test::ScratchDir;
using namespace std::chrono_literals;

namespace {

const Status& st_of(const Status& s) { return s; }
template <typename T>
Status st_of(const Result<T>& r) {
  return r.status();
}

#define CHECK_CODE(expr, expected, substring)                                                 \
  do {                                                                                        \
    Status _st = st_of(expr);                                                                 \
    CHECK_MESSAGE(_st.code() == (expected), _st.to_string());                                 \
    CHECK_MESSAGE(_st.message().find(substring) != std::string_view::npos, _st.to_string()); \
  } while (0)

constexpr const char* kLease = "ledger-owner";
constexpr const char* kResource = "ledger.balance";

struct World {
  ScratchDir dir;
  std::unique_ptr<LeaseTable> table;
  std::unique_ptr<Bus> bus;
  LeaseOwner a, b;

  World() {
    lanebus::LeaseTableOptions lo;
    lo.allow_volatile_epoch = true;  // the epoch file lives in the test's scratch dir
    lo.capacity = 64;
    auto t = LeaseTable::open((dir.path / "leases").string(), lo);
    REQUIRE_MESSAGE(t.ok(), t.status().to_string());
    table = std::move(*t);
    auto o = lanebus::test::store_bus(dir.path);
    o.lease_table = table.get();
    auto opened = Bus::open(o);
    REQUIRE_MESSAGE(opened.ok(), opened.status().to_string());
    bus = std::move(*opened);
    a = *LeaseOwner::generate();
    b = *LeaseOwner::generate();
  }
  std::uint64_t grant(const LeaseOwner& who, const char* lease = kLease) {
    auto l = table->acquire(lease, who, 60s);
    REQUIRE_MESSAGE(l.ok(), l.status().to_string());
    return l->token;
  }
  /// The holder gives the lease up and `next` takes it: a new generation.
  std::uint64_t hand_over(const LeaseOwner& from, std::uint64_t token, const LeaseOwner& next) {
    REQUIRE(table->release(kLease, from, token).ok());
    return grant(next);
  }
  std::string value(const char* key = "balance") {
    auto v = bus->table_get("ledger", key);
    return v.ok() ? *v : "<" + std::string(lanebus::to_string(v.code())) + ">";
  }
  std::uint64_t hwm() {
    auto h = FencedResource::high_water(*bus, kResource);
    REQUIRE_MESSAGE(h.ok(), h.status().to_string());
    return *h;
  }
};

}  // namespace

TEST_CASE("FencedResource::write on a Bus: a confirmed barrier, the current generation, a stale token refused "
          "with nothing written") {
  World w;
  FencedResource fence(*w.table);
  int runs = 0;
  auto put = [&](std::uint64_t token, const std::string& v, const char* lease = kLease) {
    return fence.write(*w.bus, kResource, lease, token, [&](Transaction& tx) {
      ++runs;
      return tx.put("ledger", "balance", v);
    });
  };
  CHECK(w.hwm() == 0);
  const std::uint64_t t1 = w.grant(w.a);
  REQUIRE(put(t1, "100").ok());  // the first generation's barrier, confirmed by the table
  CHECK(w.hwm() == t1);
  REQUIRE(put(t1, "110").ok());  // the current generation
  CHECK(w.value() == "110");

  const std::uint64_t t2 = w.hand_over(w.a, t1, w.b);
  REQUIRE(put(t2, "200").ok());
  CHECK(w.hwm() == t2);
  runs = 0;
  CHECK_CODE(put(t1, "lost-update"), Code::StaleToken, "is below the high-water");
  CHECK(runs == 0);  // refused before the write function ran
  CHECK(w.value() == "200");
  CHECK(w.hwm() == t2);

  // A token the table did not grant for this lease never moves the fence.
  const std::uint64_t foreign = w.grant(w.a, "other-owner");
  CHECK_CODE(put(foreign, "x"), Code::FenceViolation, "was not confirmed as a grant of lease \"ledger-owner\"");
  CHECK_CODE(put(foreign, "x", "other-owner"), Code::FenceViolation, "is bound to lease \"ledger-owner\"");
  CHECK_CODE(put(t2 + (1ull << 30), "x"), Code::FenceViolation, "the fence is unchanged");
  CHECK(runs == 0);
  CHECK(w.value() == "200");
  CHECK(w.hwm() == t2);

  // A failing write function: nothing written, and a barrier does not move the fence.
  const std::uint64_t t3 = w.hand_over(w.b, t2, w.a);
  Status s = fence.write(*w.bus, kResource, kLease, t3, [](Transaction& tx) {
    REQUIRE(tx.put("ledger", "balance", "half-done").ok());
    return Status(Code::NotFound, "no such account");
  });
  CHECK_CODE(s, Code::NotFound, "no such account");
  CHECK(w.value() == "200");
  CHECK(w.hwm() == t2);
  REQUIRE(put(t3, "300").ok());
  CHECK(w.hwm() == t3);
  CHECK(w.value() == "300");
}

TEST_CASE("FencedResource::write: the commit re-validates the fence, so a barrier that lands meanwhile refuses "
          "the older writer") {
  World w;
  FencedResource fence(*w.table);
  const std::uint64_t t1 = w.grant(w.a);
  REQUIRE(fence.write(*w.bus, kResource, kLease, t1, [](Transaction& tx) { return tx.put("ledger", "balance", "1"); })
              .ok());
  const std::uint64_t t2 = w.hand_over(w.a, t1, w.b);
  int runs = 0;
  // Writer A (token t1) checks the fence; while its write function runs,
  // writer B's barrier (token t2) commits. A's commit finds the fence moved:
  // A runs again, and this time the fence refuses it.
  Status s = fence.write(*w.bus, kResource, kLease, t1, [&](Transaction& tx) {
    if (++runs == 1) {
      Status b = fence.write(*w.bus, kResource, kLease, t2,
                             [](Transaction& inner) { return inner.put("ledger", "balance", "from-b"); });
      REQUIRE_MESSAGE(b.ok(), b.to_string());
    }
    return tx.put("ledger", "balance", "from-a");
  });
  CHECK_CODE(s, Code::StaleToken, "is below the high-water");
  CHECK(runs == 1);
  CHECK(w.value() == "from-b");
  CHECK(w.hwm() == t2);
}

TEST_CASE("FencedResource::write and high_water: every argument error names its cause") {
  World w;
  FencedResource fence(*w.table);
  const std::uint64_t t1 = w.grant(w.a);
  auto noop = [](Transaction&) { return Status(); };
  CHECK_CODE(fence.write(*w.bus, kResource, kLease, 0, noop), Code::InvalidArgument, "fencing token 0");
  CHECK_CODE(fence.write(*w.bus, "Bad Name", kLease, t1, noop), Code::InvalidName, "fenced resource");
  CHECK_CODE(fence.write(*w.bus, kResource, "bad lease!", t1, noop), Code::InvalidName, "lease name");
  CHECK_CODE(fence.write(*w.bus, kResource, kLease, t1, {}), Code::InvalidArgument, "write function is empty");
  CHECK_CODE(FencedResource::high_water(*w.bus, "Bad Name"), Code::InvalidName, "fenced resource");
  FencedResource none(lanebus::FenceConfirm{});
  CHECK_CODE(none.write(*w.bus, kResource, kLease, t1, noop), Code::FenceViolation, "no lease confirmation hook");
  FencedResource busy([](std::string_view, std::uint64_t) { return Status(Code::Busy, "stalled"); });
  CHECK_CODE(busy.write(*w.bus, kResource, kLease, t1, noop), Code::Busy, "could not confirm it now");
  CHECK(w.hwm() == 0);

  auto memory_bus = Bus::open({});
  REQUIRE(memory_bus.ok());
  CHECK_CODE(fence.write(**memory_bus, kResource, kLease, t1, noop), Code::InvalidArgument, "has no store");
  CHECK_CODE(FencedResource::high_water(**memory_bus, kResource), Code::InvalidArgument, "has no store");
}

TEST_CASE("Transaction::fence in a transactional handler: a stale or forged token voids the transaction, a "
          "confirmed barrier commits with the handler's writes") {
  World w;
  FencedResource fence(*w.table);
  auto jobs = w.bus->create_topic("ledger.jobs", {.lanes = 1, .durable = true});
  REQUIRE_MESSAGE(jobs.ok(), jobs.status().to_string());

  std::mutex mu;
  std::map<std::string, Code> fence_code;  // payload -> what fence() said (last run)
  std::map<std::string, Code> put_code;    // payload -> what put() said after it
  auto sub = w.bus->subscribe_tx(*jobs, "bookkeeper", [&](const MessageView& m, Transaction& tx) {
    const std::string value(m.payload());
    Status f = tx.fence(fence, kResource, kLease, m.fencing_token());
    // This handler ignores a refusal on purpose and acks: the refused
    // transaction must still write nothing.
    Status p = tx.put("ledger", value == "done" ? "done" : "balance", value);
    std::lock_guard<std::mutex> l(mu);
    fence_code[value] = f.code();
    put_code[value] = p.code();
    return Outcome::ack();
  });
  REQUIRE_MESSAGE(sub.ok(), sub.status().to_string());

  auto publish = [&](std::uint64_t token, const char* payload) {
    lanebus::OutgoingMessage m;
    m.key = "acct-1";
    m.payload = payload;
    m.fencing_token = token;
    Status s = jobs->publish(m);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
  };
  const std::uint64_t t1 = w.grant(w.a);
  publish(t1, "100");
  const std::uint64_t t2 = w.hand_over(w.a, t1, w.b);
  const std::uint64_t foreign = w.grant(w.a, "other-owner");
  publish(t2, "200");       // barrier of the new generation: confirmed by the table
  publish(t1, "stale");     // the old holder, late
  publish(foreign, "forged");  // another lease's token
  publish(t2, "done");      // one lane: committed after everything above
  REQUIRE(lanebus::test::wait_until([&] { return w.value("done") == "done"; }));

  std::lock_guard<std::mutex> l(mu);
  CHECK(fence_code["100"] == Code::Ok);
  CHECK(fence_code["200"] == Code::Ok);
  CHECK(fence_code["stale"] == Code::StaleToken);
  CHECK(put_code["stale"] == Code::StaleToken);  // the transaction is void after a refusal
  CHECK(fence_code["forged"] == Code::FenceViolation);
  CHECK(put_code["forged"] == Code::FenceViolation);
  CHECK(fence_code["done"] == Code::Ok);
  CHECK(w.value() == "200");  // nothing of the refused transactions was written
  CHECK(w.hwm() == t2);
}
