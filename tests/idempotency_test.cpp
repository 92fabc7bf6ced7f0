// lanebus — MIT License.
// Idempotency tables (doc/idempotency.md): the contract of claim / complete / status /
// release, races between threads and between processes, the two tiers across
// a restart, claims of dead owners (real kill -9), the record format of older
// releases, retention, the hot tier's memory, and consumer groups that skip
// done keys.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <random>
#include <set>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "access.hpp"
#include "durable_store.hpp"
#include "hot_tier.hpp"
#include "idempotency.hpp"
#include "lanebus/lanebus.hpp"
#include "process.hpp"
#include "process_identity.hpp"
#include "scratch_dir.hpp"
#include "seed.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::wait_until;
using TempDir = lanebus::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

using lanebus::detail::DurableStore;
using lanebus::detail::HotTier;
using lanebus::detail::IdempotencyImpl;
using lanebus::detail::ProcessIdentity;
using lanebus::detail::StoreTable;
using lanebus::detail::StoreTxn;
using lanebus::test::Child;

std::string child_path() {
  const char* child = std::getenv("LANEBUS_IDEMPOTENCY_CHILD");
  REQUIRE_MESSAGE(child != nullptr, "LANEBUS_IDEMPOTENCY_CHILD is not set (run through meson test)");
  return child;
}

// The `idem` key of (scope, key): u16 BE scope length | scope | key.
std::string idem_key(std::string_view scope, std::string_view key) {
  std::string k;
  k.push_back(static_cast<char>((scope.size() >> 8) & 0xff));
  k.push_back(static_cast<char>(scope.size() & 0xff));
  k += scope;
  k += key;
  return k;
}

std::int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::unique_ptr<DurableStore> open_store(const fs::path& dir) {
  StoreOptions o;
  o.directory = (dir / "store").string();
  o.durability = Durability::Async;
  return DurableStore::open(o).value();
}

// Waits until `pid` (killed) is a zombie, without reaping it.
bool wait_zombie(pid_t pid) {
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) == 0;
}

}  // namespace

TEST_CASE("claim, complete, status and release follow the contract") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  IdempotencyTable* t = bus->idempotency("mail.welcome", {.max_key_bytes = 32}).value();
  CHECK(t->scope() == "mail.welcome");
  CHECK(bus->idempotency("mail.welcome").value() == t);  // same scope, same table

  auto first = t->claim("welcome-e100").value();
  CHECK(first.state == ClaimState::Claimed);
  CHECK(t->claim("welcome-e100").value().state == ClaimState::InProgress);
  auto st = t->status("welcome-e100").value();
  CHECK(st.state == ClaimState::InProgress);
  REQUIRE(t->complete("welcome-e100", "msg-id-1").ok());
  CHECK(t->complete("welcome-e100", "again").ok());  // completing a done key is OK
  auto done = t->claim("welcome-e100", true).value();
  CHECK(done.state == ClaimState::Done);
  CHECK(done.result == "msg-id-1");
  CHECK(t->status("welcome-e100").value().result == "msg-id-1");

  // A failed attempt releases its claim; the key can be claimed again.
  REQUIRE(t->claim("welcome-e101").value().state == ClaimState::Claimed);
  REQUIRE(t->release("welcome-e101").ok());
  CHECK(t->claim("welcome-e101").value().state == ClaimState::Claimed);

  SUBCASE("bad input is a clear error and changes nothing") {
    auto s = t->status("never-seen");
    CHECK(s.code() == Code::NotFound);
    CHECK(s.status().message().find("never-seen") != std::string_view::npos);
    CHECK(t->complete("never-claimed").code() == Code::NotFound);
    Status rel = t->release("welcome-e100");  // done keys are never released
    CHECK(rel.code() == Code::NotFound);
    CHECK(rel.message().find("done") != std::string_view::npos);
    CHECK(t->claim("welcome-e100").value().state == ClaimState::Done);
    CHECK(t->claim("").code() == Code::InvalidArgument);
    auto big = t->claim(std::string(33, 'k'));
    CHECK(big.code() == Code::PayloadTooLarge);
    CHECK(big.status().message().find("max_key_bytes") != std::string_view::npos);
    CHECK(bus->idempotency("Bad Scope").code() == Code::InvalidName);
    CHECK(bus->idempotency("x", {.hot_capacity = 0}).code() == Code::InvalidArgument);
    auto mem = Bus::open({.workers = 1}).value();
    auto r = mem->idempotency("x");
    CHECK(r.code() == Code::InvalidArgument);
    CHECK(r.status().message().find("store.directory") != std::string_view::npos);
  }
}

TEST_CASE("of concurrent claimers in threads exactly one wins") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  IdempotencyTable* t = bus->idempotency("race").value();
  for (int round = 0; round < 20; ++round) {
    std::string key = "payment-" + std::to_string(round);
    std::atomic<int> claimed{0}, other{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < 6; ++i)
      threads.emplace_back([&] {
        while (!go) std::this_thread::yield();
        auto r = t->claim(key);
        REQUIRE(r.ok());
        (r->state == ClaimState::Claimed ? claimed : other)++;
      });
    go = true;
    for (auto& th : threads) th.join();
    CHECK(claimed == 1);
    CHECK(other == 5);
  }
}

TEST_CASE("of concurrent claimers in separate processes exactly one wins") {
  const char* child = std::getenv("LANEBUS_IDEMPOTENCY_CHILD");
  REQUIRE_MESSAGE(child != nullptr, "LANEBUS_IDEMPOTENCY_CHILD is not set (run through meson test)");
  TempDir tmp;
  {
    auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();  // create the store first
    REQUIRE(bus->idempotency("race").ok());
  }
  const std::string store = (tmp.path / "store").string();
  for (int round = 0; round < 3; ++round) {
    const std::string key = "order-" + std::to_string(round);
    const std::string barrier = (tmp.path / ("go-" + std::to_string(round))).string();
    std::vector<std::pair<pid_t, int>> kids;
    for (int i = 0; i < 4; ++i) {
      int fds[2];
      REQUIRE(::pipe(fds) == 0);
      pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        ::dup2(fds[1], 1);
        ::close(fds[0]);
        ::execl(child, child, store.c_str(), "race", key.c_str(), barrier.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
      }
      ::close(fds[1]);
      kids.emplace_back(pid, fds[0]);
    }
    std::this_thread::sleep_for(50ms);  // let them open the store; the barrier starts them together
    std::ofstream(barrier) << "go";
    int claimed = 0, other = 0;
    std::vector<std::string> outs;
    for (auto [pid, fd] : kids) {
      // One line each while every racer is still alive (and owns what it claimed).
      std::string out;
      char ch;
      while (::read(fd, &ch, 1) == 1 && ch != '\n') out.push_back(ch);
      outs.push_back(out);
    }
    std::ofstream(barrier + ".end") << "end";
    std::size_t k = 0;
    for (auto [pid, fd] : kids) {
      const std::string out = outs[k++];
      ::close(fd);
      int status = 0;
      ::waitpid(pid, &status, 0);
      REQUIRE(WIFEXITED(status));
      REQUIRE(WEXITSTATUS(status) == 0);
      if (out.rfind("Claimed", 0) == 0) {
        ++claimed;
      } else {
        ++other;
      }
    }
    CHECK(claimed == 1);
    CHECK(other == 3);
  }
}

TEST_CASE("after the hot tier's TTL and a restart, the durable tier still knows a done key") {
  TempDir tmp;
  {
    auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
    IdempotencyTable* t = bus->idempotency("mail", {.hot_ttl = 1ms}).value();
    REQUIRE(t->claim("welcome-e100").value().state == ClaimState::Claimed);
    REQUIRE(t->complete("welcome-e100", "sent").ok());
  }
  std::this_thread::sleep_for(5ms);
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  IdempotencyTable* t = bus->idempotency("mail", {.hot_ttl = 1ms}).value();
  auto r = t->claim("welcome-e100", true).value();
  CHECK(r.state == ClaimState::Done);
  CHECK(r.result == "sent");
  CHECK(t->claim("welcome-e101").value().state == ClaimState::Claimed);
}

TEST_CASE("an abandoned in-progress claim can be taken over after claim_timeout") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  IdempotencyTable* t = bus->idempotency("jobs", {.claim_timeout = 30ms}).value();
  REQUIRE(t->claim("job-1").value().state == ClaimState::Claimed);
  CHECK(t->claim("job-1").value().state == ClaimState::InProgress);
  std::this_thread::sleep_for(60ms);  // the claim's owner "died"
  CHECK(t->claim("job-1").value().state == ClaimState::Claimed);
}

TEST_CASE("a consumer group with an idempotency scope skips done keys on a durable queue and a topic") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  auto queue = bus->create_queue("mail.outbox", {.lanes = 2, .durable = true}).value();
  auto topic = bus->create_topic("mail.events", {.lanes = 2}).value();  // ephemeral, same scope
  std::atomic<int> sent{0}, seen{0};
  auto q = bus->consume(queue, [&](const MessageView&) {
                 ++sent;
                 return Outcome::ack();
               },
               {.idempotency_scope = "mail.send"})
               .value();
  auto g = bus->subscribe(topic, "mailer", [&](const MessageView&) {
                 ++seen;
                 return Outcome::ack();
               },
               {.idempotency_scope = "mail.send"})
               .value();
  REQUIRE(queue.publish({.key = "u1", .payload = "welcome", .idempotency_key = "welcome-e100"}).ok());
  REQUIRE(wait_until([&] { return sent == 1; }));
  // A producer retry publishes the same business key again: skipped.
  REQUIRE(queue.publish({.key = "u1", .payload = "welcome", .idempotency_key = "welcome-e100"}).ok());
  // Another path (the ephemeral topic, same scope) also sees it as done.
  REQUIRE(topic.publish({.key = "u1", .payload = "welcome", .idempotency_key = "welcome-e100"}).ok());
  REQUIRE(queue.publish({.key = "u2", .payload = "welcome", .idempotency_key = "welcome-e101"}).ok());
  REQUIRE(wait_until([&] { return sent == 2; }));
  REQUIRE(wait_until([&] {
    auto st = bus->stats();
    std::uint64_t skipped = 0;
    for (auto& t : st.topics)
      for (auto& gr : t.groups) skipped += gr.total.duplicates_skipped;
    return skipped == 2;
  }));
  CHECK(sent == 2);
  CHECK(seen == 0);
  auto r = bus->subscribe(topic, "bad", [](const MessageView&) { return Outcome::ack(); },
                          {.idempotency_scope = "Bad Scope"});
  CHECK(r.code() == Code::InvalidName);
}

// ---------------------------------------------------------------- owners (doc/idempotency.md)

TEST_CASE("a claim whose owner was killed with kill -9 is taken over at once, not after claim_timeout") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  IdempotencyTable* t = bus->idempotency("race", {.claim_timeout = 5min}).value();
  Child c({child_path(), (tmp.path / "store").string(), "hold", "payment-7"});
  REQUIRE(c.started());
  REQUIRE(c.read_line() == "Claimed");

  // Negative control: while the owner lives, the key stays in progress.
  CHECK(t->claim("payment-7").value().state == ClaimState::InProgress);
  KeyStatus held = t->status("payment-7").value();
  CHECK(held.state == ClaimState::InProgress);
  CHECK(held.owner_pid == static_cast<std::uint32_t>(c.pid()));
  CHECK_FALSE(held.owner_dead);
  CHECK(held.result.empty());  // the owner is not reported as a result

  SUBCASE("after the killed owner is reaped") {
    c.signal(SIGKILL);
    CHECK(c.wait() == 128 + SIGKILL);
  }
  SUBCASE("while the killed owner is a zombie, not yet reaped") {
    c.signal(SIGKILL);
    REQUIRE(wait_zombie(c.pid()));
  }
  CHECK(t->status("payment-7").value().owner_dead);
  CHECK(t->claim("payment-7").value().state == ClaimState::Claimed);
  // The key is ours now: a second claim in this process stays in progress.
  CHECK(t->claim("payment-7").value().state == ClaimState::InProgress);
  KeyStatus mine = t->status("payment-7").value();
  CHECK(mine.owner_pid == static_cast<std::uint32_t>(::getpid()));
  CHECK_FALSE(mine.owner_dead);
  REQUIRE(t->complete("payment-7", "charged").ok());
  CHECK(t->claim("payment-7", true).value().result == "charged");
}

TEST_CASE("a claim held by another thread of this process stays in progress until claim_timeout") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  IdempotencyTable* t = bus->idempotency("jobs", {.claim_timeout = 5min}).value();
  std::thread owner([&] { CHECK(t->claim("job-9").value().state == ClaimState::Claimed); });
  owner.join();
  CHECK(t->claim("job-9").value().state == ClaimState::InProgress);
  KeyStatus st = t->status("job-9").value();
  CHECK(st.owner_pid == static_cast<std::uint32_t>(::getpid()));
  CHECK_FALSE(st.owner_dead);
}

TEST_CASE("kill -9 of a claiming process at a seeded random moment never leaves a key in progress") {
  const std::uint64_t seed = lanebus::test::test_seed("idempotency kill -9 loop");
  std::mt19937_64 rng(seed);
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  IdempotencyTable* t = bus->idempotency("race", {.claim_timeout = 5min}).value();
  const std::string child = child_path();
  for (int cycle = 0; cycle < 4; ++cycle) {
    const std::string prefix = "c" + std::to_string(cycle);
    Child c({child, (tmp.path / "store").string(), "loop", prefix});
    REQUIRE(c.started());
    const int lines = std::uniform_int_distribution<int>(1, 40)(rng);
    std::set<int> claimed, done;
    for (int i = 0; i < lines; ++i) {
      const std::string line = c.read_line();
      REQUIRE_MESSAGE(!line.empty(), "the child stopped early; LANEBUS_SEED=" << seed);
      const int n = std::stoi(line.substr(line.rfind('-') + 1));
      (line.rfind("done ", 0) == 0 ? done : claimed).insert(n);
    }
    c.signal(SIGKILL);
    REQUIRE(c.wait() == 128 + SIGKILL);
    const int last = *claimed.rbegin() + 1;  // the child may have claimed one more unseen key
    for (int i = 0; i <= last; ++i) {
      INFO("cycle " << cycle << " key " << prefix << "-" << i << " LANEBUS_SEED=" << seed);
      auto r = t->claim(prefix + "-" + std::to_string(i)).value();
      CHECK(r.state != ClaimState::InProgress);
      if (done.count(i)) CHECK(r.state == ClaimState::Done);
      if (i % 2 == 1 && claimed.count(i)) CHECK(r.state == ClaimState::Claimed);  // never completed
    }
  }
}

TEST_CASE("in-progress records of older releases and unknown owners wait for claim_timeout; dead owners do not") {
  TempDir tmp;
  auto store = open_store(tmp.path);
  IdempotencyOptions o;
  o.claim_timeout = std::chrono::hours(1);
  IdempotencyImpl idem(store.get(), "legacy", o);
  auto put_raw = [&](std::string_view key, std::int64_t written_at, std::string_view owner) {
    std::string v(9, '\0');
    v[0] = 1;  // in progress
    std::memcpy(v.data() + 1, &written_at, 8);
    v += owner;
    REQUIRE(store->write([&](StoreTxn& txn) { return txn.put(StoreTable::Idempotency, idem_key("legacy", key), v); })
                .ok());
  };
  const std::int64_t now = wall_ns();
  const ProcessIdentity self = lanebus::detail::self_identity();

  SUBCASE("a 9-byte record (no owner) is in progress, then taken over after claim_timeout") {
    put_raw("old-1", now, {});
    CHECK(idem.claim("old-1", false).value().state == ClaimState::InProgress);
    KeyStatus st = idem.status("old-1").value();
    CHECK(st.owner_pid == 0);
    CHECK_FALSE(st.owner_dead);
    put_raw("old-2", now - std::chrono::nanoseconds(std::chrono::hours(2)).count(), {});
    CHECK(idem.claim("old-2", false).value().state == ClaimState::Claimed);
  }
  SUBCASE("an owner in a format this release does not know is treated as alive") {
    put_raw("new-1", now, std::string(40, '\x07'));
    CHECK(idem.claim("new-1", false).value().state == ClaimState::InProgress);
  }
  SUBCASE("an owner from an earlier boot is dead") {
    ProcessIdentity earlier = self;
    earlier.boot_id[0] ^= 0xff;
    put_raw("boot-1", now, earlier.encode());
    CHECK(idem.status("boot-1").value().owner_dead);
    CHECK(idem.claim("boot-1", false).value().state == ClaimState::Claimed);
  }
  SUBCASE("an owner whose pid now belongs to another process (another start time) is dead") {
    ProcessIdentity reused = self;
    reused.start_time += 1;
    put_raw("pid-1", now, reused.encode());
    CHECK(idem.claim("pid-1", false).value().state == ClaimState::Claimed);
  }
  SUBCASE("an owner in another pid namespace cannot be checked and is treated as alive") {
    ProcessIdentity elsewhere = self;
    elsewhere.pid_ns += 1;
    elsewhere.pid = 1;
    put_raw("ns-1", now, elsewhere.encode());
    CHECK(idem.claim("ns-1", false).value().state == ClaimState::InProgress);
  }
  SUBCASE("a record of this process is ours: in progress") {
    put_raw("self-1", now, self.encode());
    CHECK(idem.claim("self-1", false).value().state == ClaimState::InProgress);
  }
  SUBCASE("a damaged record is a clear Corruption error") {
    REQUIRE(store->write([&](StoreTxn& txn) {
                   return txn.put(StoreTable::Idempotency, idem_key("legacy", "bad-1"), std::string("\x09xyz", 4));
                 }).ok());
    auto r = idem.claim("bad-1", false);
    CHECK(r.code() == Code::Corruption);
    CHECK(r.status().message().find("bad-1") != std::string_view::npos);
  }
}

TEST_CASE("a process identity encodes, decodes, survives fork and tells the dead from the living") {
  using lanebus::detail::process_is_dead;
  using lanebus::detail::read_start_time;
  const ProcessIdentity self = lanebus::detail::self_identity();
  CHECK(self.pid == static_cast<std::uint32_t>(::getpid()));
  CHECK(self.start_time != 0);
  CHECK(self.boot_known());
  CHECK(self.pid_ns != 0);
  CHECK(lanebus::detail::self_identity() == self);  // cached
  CHECK_FALSE(process_is_dead(self));

  ProcessIdentity back;
  REQUIRE(ProcessIdentity::decode(self.encode(), &back));
  CHECK(back == self);
  CHECK(self.encode().size() == ProcessIdentity::kEncodedBytes);
  CHECK_FALSE(ProcessIdentity::decode(self.encode().substr(1), &back));
  std::string other_format = self.encode();
  other_format[0] = 2;
  CHECK_FALSE(ProcessIdentity::decode(other_format, &back));

  // Unknown fields never make a process dead.
  ProcessIdentity unknown = self;
  unknown.start_time = 0;
  CHECK_FALSE(process_is_dead(unknown));
  unknown = self;
  unknown.boot_id = {};
  CHECK_FALSE(process_is_dead(unknown));
  unknown = self;
  unknown.pid_ns = 0;
  CHECK_FALSE(process_is_dead(unknown));
  CHECK_FALSE(process_is_dead(ProcessIdentity{}));

  // A forked child computes its own identity.
  pid_t kid = ::fork();
  REQUIRE(kid >= 0);
  if (kid == 0) {
    const ProcessIdentity mine = lanebus::detail::self_identity();
    ::_exit(mine.pid == static_cast<std::uint32_t>(::getpid()) && mine.start_time != 0 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(kid, &status, 0) == kid);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));

  // A live process, then the same process killed and reaped.
  kid = ::fork();
  REQUIRE(kid >= 0);
  if (kid == 0) {
    for (;;) ::pause();
  }
  ProcessIdentity other = self;
  other.pid = static_cast<std::uint32_t>(kid);
  REQUIRE(wait_until([&] { return read_start_time(kid) != 0; }));
  other.start_time = read_start_time(kid);
  CHECK_FALSE(process_is_dead(other));
  ProcessIdentity reused = other;
  reused.start_time += 1;
  CHECK(process_is_dead(reused));
  ::kill(kid, SIGKILL);
  REQUIRE(::waitpid(kid, &status, 0) == kid);
  CHECK(process_is_dead(other));
}

// ---------------------------------------------------------------- retention

TEST_CASE("expire deletes done records older than durable_retention, oldest first, in bounded batches") {
  TempDir tmp;
  auto store = open_store(tmp.path);
  IdempotencyOptions o;
  o.durable_retention = 1ms;
  IdempotencyImpl s(store.get(), "s", o);
  IdempotencyImpl s2(store.get(), "s2", o);  // a scope whose name extends "s"
  o.durable_retention = std::chrono::hours(1);
  IdempotencyImpl keep(store.get(), "keep", o);
  o.durable_retention = 0ms;
  IdempotencyImpl forever(store.get(), "forever", o);

  constexpr int kKeys = 2500;
  auto complete_all = [&](IdempotencyImpl& idem, int n) {
    REQUIRE(store->write([&](StoreTxn& txn) -> Status {
                   for (int i = 0; i < n; ++i) {
                     Status st = idem.complete_in(txn, "k" + std::to_string(i), "r", false);
                     if (!st.ok()) return st;
                   }
                   return Status();
                 }).ok());
  };
  complete_all(s, kKeys);
  complete_all(s2, 10);
  complete_all(keep, 10);
  complete_all(forever, 10);
  // One key claimed (in progress) and one completed through complete(), so
  // the hot tier knows it as done.
  REQUIRE(s.claim("busy", false).value().state == ClaimState::Claimed);
  REQUIRE(s.claim("hot", false).value().state == ClaimState::Claimed);
  REQUIRE(s.complete("hot", "x").ok());
  REQUIRE(s.claim("hot", false).value().state == ClaimState::Done);  // answered by the hot tier

  // Wait until the wall clock is past the retention of every record.
  const std::int64_t written = wall_ns();
  REQUIRE(wait_until([&] { return wall_ns() - written > 5'000'000; }));

  CHECK(keep.expire(1024).value() == 0);     // not due yet
  CHECK(forever.expire(1024).value() == 0);  // retention 0: kept for ever
  CHECK(s.expire(0).value() == 0);
  std::vector<std::uint64_t> batches;
  for (;;) {
    std::uint64_t n = s.expire(1024).value();
    REQUIRE(n <= 1024);
    batches.push_back(n);
    if (n < 1024) break;
    REQUIRE(batches.size() < 10);
  }
  CHECK(batches == std::vector<std::uint64_t>{1024, 1024, kKeys + 1 - 2048});
  CHECK(s.expire(1024).value() == 0);

  for (int i : {0, 1, 1234, kKeys - 1}) CHECK(s.status("k" + std::to_string(i)).code() == Code::NotFound);
  CHECK(s.status("hot").code() == Code::NotFound);
  // The hot tier forgot it too: the key is new again, not "done".
  CHECK(s.claim("hot", false).value().state == ClaimState::Claimed);
  CHECK(s.status("busy").value().state == ClaimState::InProgress);  // in progress: never expired
  CHECK(s2.status("k3").value().state == ClaimState::Done);         // another scope
  CHECK(keep.status("k3").value().state == ClaimState::Done);
  CHECK(forever.status("k3").value().state == ClaimState::Done);
  CHECK(s2.expire(1024).value() == 10);
  CHECK(s2.status("k3").code() == Code::NotFound);
}

// The bus's maintenance (lib/core/delivery.cpp) calls IdempotencyImpl::expire for
// every scope about once a second.
TEST_CASE("the bus's maintenance deletes done records after durable_retention") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  IdempotencyTable* t = bus->idempotency("s", {.durable_retention = 300ms}).value();
  for (int i = 0; i < 20; ++i) {
    const std::string key = "k" + std::to_string(i);
    REQUIRE(t->claim(key).value().state == ClaimState::Claimed);
    REQUIRE(t->complete(key, "r").ok());
  }
  REQUIRE(t->claim("busy").value().state == ClaimState::Claimed);
  CHECK(wait_until([&] {
    for (int i = 0; i < 20; ++i)
      if (t->status("k" + std::to_string(i)).code() != Code::NotFound) return false;
    return true;
  }));
  CHECK(t->status("busy").value().state == ClaimState::InProgress);
}

// ---------------------------------------------------------------- hot tier memory

TEST_CASE("the hot tier starts small, grows under load and stops at hot_capacity") {
  constexpr std::int64_t kTtl = 1'000'000;
  // The footprint documented next to IdempotencyOptions::hot_capacity (LP64).
  if (sizeof(void*) == 8) {
    CHECK(HotTier::footprint_at(1024, 512) == 581'632);
    CHECK(HotTier::footprint_at(65'536, 512) == 37'224'448);
  }
  HotTier hot(65'536, 512, kTtl);
  CHECK(hot.entries() == 1024);
  CHECK(hot.footprint_bytes() == HotTier::footprint_at(1024, 512));

  // 100,000 distinct keys, all within the TTL: it doubles up to the bound,
  // then evicts the least recently written.
  std::vector<std::uint32_t> sizes;
  for (int i = 0; i < 100'000; ++i) {
    hot.put("key-" + std::to_string(i), HotTier::State::Done, 10, 10);
    if (sizes.empty() || sizes.back() != hot.entries()) sizes.push_back(hot.entries());
  }
  CHECK(sizes == std::vector<std::uint32_t>{1024, 2048, 4096, 8192, 16384, 32768, 65536});
  CHECK(hot.size() == 65'536);
  CHECK(hot.footprint_bytes() == HotTier::footprint_at(65'536, 512));
  CHECK(hot.get("key-99999", 10) == HotTier::State::Done);
  CHECK(hot.get("key-34464", 10) == HotTier::State::Done);  // the oldest one kept
  CHECK(hot.get("key-34463", 10) == HotTier::State::Unknown);
  CHECK(hot.get("key-0", 10) == HotTier::State::Unknown);
  CHECK(hot.get("key-99999", 10 + kTtl + 1) == HotTier::State::Unknown);  // expired

  SUBCASE("a stable working set within one TTL does not grow it") {
    HotTier steady(65'536, 512, kTtl);
    // 800 keys per TTL window, written in time order: expired entries are recycled.
    for (int i = 0; i < 50'000; ++i) {
      const std::int64_t now = std::int64_t{i} * (kTtl / 800);
      steady.put("key-" + std::to_string(i), HotTier::State::Done, now, now);
      CHECK(steady.get("key-" + std::to_string(i), now) == HotTier::State::Done);
    }
    CHECK(steady.entries() == 1024);
  }
  SUBCASE("a capacity below the initial size is the bound from the start") {
    HotTier tiny(10, 16, kTtl);
    CHECK(tiny.entries() == 10);
    for (int i = 0; i < 100; ++i) tiny.put("k" + std::to_string(i), HotTier::State::Done, 5, 5);
    CHECK(tiny.entries() == 10);
    CHECK(tiny.size() == 10);
    CHECK(tiny.get("k99", 5) == HotTier::State::Done);
    CHECK(tiny.get("k89", 5) == HotTier::State::Unknown);
  }
  SUBCASE("forget and over-long keys") {
    hot.forget("key-99999");
    CHECK(hot.get("key-99999", 10) == HotTier::State::Unknown);
    hot.put(std::string(513, 'x'), HotTier::State::Done, 10, 10);  // longer than max_key: not cached
    CHECK(hot.get(std::string(513, 'x'), 10) == HotTier::State::Unknown);
  }
}

TEST_CASE("a fresh idempotency scope's hot tier is small") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  IdempotencyTable* t = bus->idempotency("fresh").value();
  MESSAGE("hot tier of a fresh default scope: " << lanebus::detail::Access::impl(*t)->hot_footprint_bytes()
                                                << " bytes; at the default bound: "
                                                << HotTier::footprint_at(65'536, 512) << " bytes");
  CHECK(lanebus::detail::Access::impl(*t)->hot_footprint_bytes() <= 600 * 1024);
  IdempotencyTable* small = bus->idempotency("small", {.hot_capacity = 100, .max_key_bytes = 64}).value();
  CHECK(lanebus::detail::Access::impl(*small)->hot_footprint_bytes() == HotTier::footprint_at(100, 64));
}
