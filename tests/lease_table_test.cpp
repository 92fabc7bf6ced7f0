// lanebus — MIT License.
// LeaseTable and LeaseGuard contracts in one process: every documented Code with its message,
// token monotonicity across restart, reboot and recreation, bad segment files, and threads
// sharing one segment through two mappings.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "access.hpp"
#include "lanebus/lease.hpp"
#include "lease_table.hpp"
#include "seed.hpp"
#include "temp_dir.hpp"
#include "unprivileged.hpp"
#include "wait.hpp"

using lanebus::Code;
using lanebus::LeaseGuard;
using lanebus::LeaseGuardOptions;
using lanebus::LeaseLoss;
using lanebus::LeaseOwner;
using lanebus::LeaseTable;
using lanebus::LeaseTableOptions;
using lanebus::test::TempDir;
using lanebus::test::wait_until;
using namespace std::chrono_literals;

namespace {

LeaseTableOptions test_options() {
  LeaseTableOptions o;
  o.allow_volatile_epoch = true;  // the temp dir may be tmpfs on other machines
  o.capacity = 64;
  return o;
}

std::unique_ptr<LeaseTable> open_table(const std::string& path, LeaseTableOptions o = test_options(),
                                       const lanebus::detail::LeaseTableHooks& hooks = {}) {
  auto t = lanebus::detail::open_lease_table_with_hooks(path, o, hooks);
  REQUIRE_MESSAGE(t.ok(), t.status().to_string());
  return std::move(*t);
}

LeaseOwner new_owner() {
  auto o = LeaseOwner::generate();
  REQUIRE(o.ok());
  return *o;
}

bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

#define CHECK_CODE(expr, expected, substring)                                               \
  do {                                                                                  \
    auto&& _st = (expr);                                                                \
    CHECK_MESSAGE(_st.code() == (expected), _st.status().to_string());                      \
    CHECK_MESSAGE(contains(_st.status().message(), substring), _st.status().to_string()); \
  } while (0)

// Status has no status(); adapt.
struct StatusView {
  lanebus::Status s;
  Code code() const { return s.code(); }
  const lanebus::Status& status() const { return s; }
};
StatusView sv(lanebus::Status s) { return StatusView{std::move(s)}; }

void poke(const std::string& path, off_t offset, const void* bytes, std::size_t n) {
  int fd = ::open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  REQUIRE(pwrite(fd, bytes, n, offset) == static_cast<ssize_t>(n));
  ::close(fd);
}

}  // namespace

TEST_CASE("owner ids carry pid, start time and a fresh random part") {
  LeaseOwner a = new_owner();
  LeaseOwner b = new_owner();
  CHECK(a.pid == static_cast<std::uint32_t>(getpid()));
  CHECK(a.start_time != 0);
  CHECK(a.start_time == b.start_time);
  CHECK_FALSE(a == b);  // same process, different random part
  CHECK(contains(a.to_string(), std::to_string(getpid()) + ":"));
}

TEST_CASE("acquire grants a token; a held lease is Busy for everyone") {
  TempDir dir;
  auto t = open_table(dir.file("leases"));
  LeaseOwner a = new_owner(), b = new_owner();
  auto la = t->acquire("jobs.index", a, 10s);
  REQUIRE(la.ok());
  CHECK(la->token != 0);
  CHECK(la->expires_at_ns > la->granted_at_ns);
  CHECK((la->token >> lanebus::detail::kSeqBits) == t->epoch());
  CHECK_CODE(t->acquire("jobs.index", b, 10s), Code::Busy, "is held by");
  CHECK_CODE(t->acquire("jobs.index", a, 10s), Code::Busy, "is held by");
  auto info = t->inspect("jobs.index");
  REQUIRE(info.ok());
  CHECK(info->held);
  CHECK(info->owner == a);
  CHECK(info->token == la->token);
  CHECK(info->time_left() > 0ns);
  CHECK(sv(lanebus::detail::Access::impl(*t).check_consistency()).code() == Code::Ok);
}

TEST_CASE("tokens rise strictly across all names and acquisitions") {
  TempDir dir;
  auto t = open_table(dir.file("leases"));
  LeaseOwner a = new_owner();
  std::uint64_t last = 0;
  for (int i = 0; i < 50; ++i) {
    std::string name = "n" + std::to_string(i % 7);
    auto l = t->acquire(name, a, 10s);
    REQUIRE_MESSAGE(l.ok(), l.status().to_string());
    CHECK(l->token > last);
    last = l->token;
    REQUIRE(t->release(name, a, l->token).ok());
  }
}

TEST_CASE("renew needs owner and token and an unexpired lease") {
  TempDir dir;
  auto t = open_table(dir.file("leases"));
  LeaseOwner a = new_owner(), b = new_owner();
  auto l = t->acquire("task", a, 10s);
  REQUIRE(l.ok());
  auto r = t->renew("task", a, l->token);
  REQUIRE(r.ok());
  CHECK(r->expires_at_ns >= l->expires_at_ns);
  CHECK(r->token == l->token);
  CHECK_CODE(t->renew("task", b, l->token), Code::StaleToken, "belongs to owner");
  CHECK_CODE(t->renew("task", a, l->token + 1000), Code::FenceViolation, "never granted");
  CHECK_CODE(t->renew("task", a, l->token - 1), Code::StaleToken, "superseded");
  CHECK_CODE(t->renew("nobody", a, l->token), Code::NotFound, "never granted");
  CHECK_CODE(t->renew("Bad Name", a, l->token), Code::InvalidName, "offset");
}

TEST_CASE("renew after expiry is refused even when nobody took the lease") {
  TempDir dir;
  auto t = open_table(dir.file("leases"));
  LeaseOwner a = new_owner(), b = new_owner();
  auto l = t->acquire("task", a, 30ms);
  REQUIRE(l.ok());
  REQUIRE(wait_until([&] { return LeaseTable::now() > l->expires_at_ns; }));
  auto info = t->inspect("task");
  REQUIRE(info.ok());
  CHECK_FALSE(info->held);
  CHECK(info->token == l->token);  // nobody took it
  CHECK_CODE(t->renew("task", a, l->token), Code::StaleToken, "expired");
  // Still refused on a second try: no resurrection.
  CHECK_CODE(t->renew("task", a, l->token), Code::StaleToken, "never renewed");
  auto lb = t->acquire("task", b, 10s);
  REQUIRE(lb.ok());
  CHECK(lb->token > l->token);
}

TEST_CASE("release is predicated on owner and token, and is idempotent for the holder") {
  TempDir dir;
  auto t = open_table(dir.file("leases"));
  LeaseOwner a = new_owner(), b = new_owner();
  auto l = t->acquire("task", a, 10s);
  REQUIRE(l.ok());
  CHECK_CODE(sv(t->release("task", b, l->token)), Code::StaleToken, "belongs to owner");
  CHECK_CODE(sv(t->release("task", a, l->token - 1)), Code::StaleToken, "superseded");
  CHECK_CODE(sv(t->release("task", a, l->token + 1)), Code::FenceViolation, "never granted");
  CHECK_CODE(sv(t->release("other", a, l->token)), Code::NotFound, "never granted");
  CHECK(t->inspect("task")->held);
  REQUIRE(t->release("task", a, l->token).ok());
  CHECK(t->release("task", a, l->token).ok());
  CHECK_FALSE(t->inspect("task")->held);
  CHECK_CODE(t->renew("task", a, l->token), Code::StaleToken, "released");
  auto lb = t->acquire("task", b, 10s);
  REQUIRE(lb.ok());
  CHECK(lb->token > l->token);
  // The old holder cannot release the new grant.
  CHECK_CODE(sv(t->release("task", a, l->token)), Code::StaleToken, "superseded");
}

TEST_CASE("confirm_grant confirms real grants and refuses forged ones") {
  TempDir dir;
  auto t = open_table(dir.file("leases"));
  LeaseOwner a = new_owner();
  auto l1 = t->acquire("lane.a", a, 10s);
  REQUIRE(l1.ok());
  auto other = t->acquire("lane.b", a, 10s);
  REQUIRE(other.ok());
  CHECK(t->confirm_grant("lane.a", l1->token).ok());
  CHECK_CODE(sv(t->confirm_grant("lane.a", l1->token + 1000000)), Code::FenceViolation, "never granted");
  CHECK_CODE(sv(t->confirm_grant("lane.a", ~std::uint64_t{0})), Code::FenceViolation, "never granted");
  CHECK_CODE(sv(t->confirm_grant("lane.b", l1->token)), Code::FenceViolation, "not granted");
  CHECK_CODE(sv(t->confirm_grant("lane.c", l1->token)), Code::NotFound, "never granted");
  // Superseded grants within the remembered history still confirm.
  REQUIRE(t->release("lane.a", a, l1->token).ok());
  std::uint64_t last = 0;
  for (int i = 0; i < 6; ++i) {
    auto l = t->acquire("lane.a", a, 10s);
    REQUIRE(l.ok());
    last = l->token;
    if (i == 4) CHECK(t->confirm_grant("lane.a", l->token).ok());
    REQUIRE(t->release("lane.a", a, l->token).ok());
  }
  CHECK(t->confirm_grant("lane.a", last).ok());
  CHECK_CODE(sv(t->confirm_grant("lane.a", l1->token)), Code::StaleToken, "older than");
}

TEST_CASE("acquire_any_slot leases one free slot of N") {
  TempDir dir;
  auto t = open_table(dir.file("leases"));
  std::set<std::string> names;
  std::vector<std::pair<LeaseOwner, lanebus::Lease>> held;
  for (int i = 0; i < 3; ++i) {
    LeaseOwner o = new_owner();
    auto l = t->acquire_any_slot("batch", 3, o, 10s);
    REQUIRE_MESSAGE(l.ok(), l.status().to_string());
    names.insert(l->name);
    held.emplace_back(o, *l);
  }
  CHECK(names == std::set<std::string>{"batch/slot-0", "batch/slot-1", "batch/slot-2"});
  LeaseOwner late = new_owner();
  CHECK_CODE(t->acquire_any_slot("batch", 3, late, 10s), Code::Busy, "all 3 slots");
  CHECK_CODE(t->acquire_any_slot("batch", 0, late, 10s), Code::InvalidArgument, "n must be");
  CHECK_CODE(t->acquire_any_slot("Batch", 2, late, 10s), Code::InvalidName, "offset");
  REQUIRE(t->release(held[1].second.name, held[1].first, held[1].second.token).ok());
  auto l = t->acquire_any_slot("batch", 3, late, 10s);
  REQUIRE(l.ok());
  CHECK(l->name == held[1].second.name);
  CHECK(l->token > held[2].second.token);
}

TEST_CASE("invalid names and ttls are clear errors") {
  TempDir dir;
  auto t = open_table(dir.file("leases"));
  LeaseOwner a = new_owner();
  for (std::string bad : {std::string(""), std::string("Upper"), std::string("a..b"), std::string("a/"),
                          std::string("/a"), std::string("a b"), std::string("a\nb"),
                          std::string(201, 'x')}) {
    auto r = t->acquire(bad, a, 1s);
    CHECK_MESSAGE(r.code() == Code::InvalidName, bad);
    CHECK(contains(r.status().message(), "lease name"));
  }
  CHECK(t->acquire(std::string(200, 'x'), a, 1s).ok());
  CHECK(t->acquire("tenant.mod/task-1_a", a, 1s).ok());
  CHECK_CODE(t->acquire("ok", a, 0ms), Code::InvalidArgument, "ttl must be positive");
  CHECK_CODE(t->acquire("ok", a, -5ms), Code::InvalidArgument, "ttl must be positive");
  CHECK_CODE(t->acquire("ok", a, std::chrono::hours(24 * 400)), Code::InvalidArgument, "longer than a year");
  CHECK_CODE(t->inspect("no.such"), Code::NotFound, "not in the table");
}

TEST_CASE("a full table is QuotaExceeded until an entry is released or expires") {
  TempDir dir;
  LeaseTableOptions o = test_options();
  o.capacity = 2;
  auto t = open_table(dir.file("leases"), o);
  LeaseOwner a = new_owner();
  auto la = t->acquire("a", a, 10s);
  auto lb = t->acquire("b", a, 10s);
  REQUIRE(la.ok());
  REQUIRE(lb.ok());
  CHECK_CODE(t->acquire("c", a, 10s), Code::QuotaExceeded, "is full: 2 names");
  REQUIRE(t->release("a", a, la->token).ok());
  auto lc = t->acquire("c", a, 10s);
  REQUIRE_MESSAGE(lc.ok(), lc.status().to_string());
  CHECK(lc->token > lb->token);
  CHECK(t->inspect("a").code() == Code::NotFound);  // its entry went to "c"
  CHECK(t->inspect("b")->held);
  CHECK(sv(lanebus::detail::Access::impl(*t).check_consistency()).code() == Code::Ok);
  auto all = t->list();
  REQUIRE(all.ok());
  CHECK(all->size() == 2);
}

TEST_CASE("restart keeps tokens rising") {
  TempDir dir;
  std::uint64_t first = 0;
  LeaseOwner a = new_owner();
  {
    auto t = open_table(dir.file("leases"));
    auto l = t->acquire("task", a, 10s);
    REQUIRE(l.ok());
    first = l->token;
  }
  auto t = open_table(dir.file("leases"));
  auto info = t->inspect("task");
  REQUIRE(info.ok());
  CHECK(info->held);  // the segment outlives its users
  CHECK(info->token == first);
  auto l = t->acquire("task2", a, 10s);
  REQUIRE(l.ok());
  CHECK(l->token > first);
}

TEST_CASE("a reboot (new boot id) expires every lease, advances the epoch and keeps tokens rising") {
  TempDir dir;
  lanebus::detail::LeaseTableHooks before;
  before.boot_id_override = "boot-one";
  LeaseOwner a = new_owner(), b = new_owner();
  std::uint64_t old_token = 0, old_epoch = 0;
  {
    auto t = open_table(dir.file("leases"), test_options(), before);
    auto l = t->acquire("task", a, 60s);
    REQUIRE(l.ok());
    old_token = l->token;
    old_epoch = t->epoch();
  }
  lanebus::detail::LeaseTableHooks after;
  after.boot_id_override = "boot-two";
  auto t = open_table(dir.file("leases"), test_options(), after);
  CHECK(t->epoch() > old_epoch);
  auto info = t->inspect("task");
  REQUIRE(info.ok());
  CHECK_FALSE(info->held);
  CHECK_CODE(t->renew("task", a, old_token), Code::StaleToken, "released");
  auto l = t->acquire("task", b, 10s);
  REQUIRE(l.ok());
  CHECK(l->token > old_token);
  CHECK((l->token >> lanebus::detail::kSeqBits) == t->epoch());
  // The same boot again changes nothing.
  auto again = open_table(dir.file("leases"), test_options(), after);
  CHECK(again->epoch() == t->epoch());
  CHECK(again->inspect("task")->held);
}

TEST_CASE("a deleted and recreated segment keeps tokens rising through the epoch file") {
  TempDir dir;
  LeaseOwner a = new_owner();
  std::uint64_t last = 0;
  for (int round = 0; round < 3; ++round) {
    auto t = open_table(dir.file("leases"));
    auto l = t->acquire("task", a, 60s);
    REQUIRE_MESSAGE(l.ok(), l.status().to_string());
    CHECK(l->token > last);
    last = l->token;
    REQUIRE(::unlink(dir.file("leases").c_str()) == 0);  // an operator's rm, or RemoveIPC
  }
  // The epoch file deleted while a segment lives is rewritten on attach.
  {
    auto t = open_table(dir.file("leases"));
    auto l = t->acquire("task", a, 60s);
    REQUIRE(l.ok());
    last = l->token;
  }
  REQUIRE(::unlink(dir.file("leases.epoch").c_str()) == 0);
  { auto t = open_table(dir.file("leases")); }  // attach restores the epoch file
  REQUIRE(::unlink(dir.file("leases").c_str()) == 0);
  auto t = open_table(dir.file("leases"));
  auto l = t->acquire("task", a, 60s);
  REQUIRE(l.ok());
  CHECK(l->token > last);
}

TEST_CASE("bad segment files are refused with a clear code") {
  TempDir dir;
  const std::string path = dir.file("leases");
  { auto t = open_table(path); }
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  SUBCASE("foreign file") {
    std::string junk = dir.file("junk");
    std::ofstream(junk) << std::string(8192, 'z');
    chmod(junk.c_str(), 0600);
    CHECK_CODE(LeaseTable::open(junk, test_options()), Code::Corruption, "bad magic");
  }
  SUBCASE("too small") {
    std::string tiny = dir.file("tiny");
    std::ofstream(tiny) << "0123456789";
    chmod(tiny.c_str(), 0600);
    CHECK_CODE(LeaseTable::open(tiny, test_options()), Code::Corruption, "too small");
  }
  SUBCASE("truncated or extended") {
    REQUIRE(truncate(path.c_str(), st.st_size + 4096) == 0);
    CHECK_CODE(LeaseTable::open(path, test_options()), Code::Corruption, "does not match");
  }
  SUBCASE("newer layout version") {
    std::uint32_t v = 99;
    poke(path, 8, &v, sizeof(v));
    CHECK_CODE(LeaseTable::open(path, test_options()), Code::VersionTooNew, "layout version 99");
  }
  SUBCASE("other ABI") {
    std::uint64_t tag = 42;
    poke(path, 16, &tag, sizeof(tag));
    CHECK_CODE(LeaseTable::open(path, test_options()), Code::Corruption, "ABI tag");
  }
  SUBCASE("symlink") {
    std::string link = dir.file("link");
    REQUIRE(symlink(path.c_str(), link.c_str()) == 0);
    CHECK_CODE(LeaseTable::open(link, test_options()), Code::PermissionDenied, "symlink");
  }
  SUBCASE("world writable") {
    REQUIRE(chmod(path.c_str(), 0666) == 0);
    CHECK_CODE(LeaseTable::open(path, test_options()), Code::PermissionDenied, "world writable");
  }
  SUBCASE("owned by another user") {
    if (geteuid() == 0) {
      REQUIRE(chown(path.c_str(), 4242, 4242) == 0);
      CHECK_CODE(LeaseTable::open(path, test_options()), Code::PermissionDenied, "owned by uid 4242");
    }
  }
  SUBCASE("another time namespace") {
    std::uint64_t ino = 12345;
    poke(path, offsetof(lanebus::detail::LeaseTableHeader, time_ns_inode), &ino, sizeof(ino));
    CHECK_CODE(LeaseTable::open(path, test_options()), Code::InvalidArgument, "time namespace");
  }
  SUBCASE("token counter reset by a buggy initialiser") {
    std::uint64_t zero = 1;
    poke(path, offsetof(lanebus::detail::LeaseTableHeader, next_token), &zero, sizeof(zero));
    CHECK_CODE(LeaseTable::open(path, test_options()), Code::Corruption, "token counter");
  }
  SUBCASE("damaged epoch file") {
    REQUIRE(::unlink(path.c_str()) == 0);
    std::ofstream(dir.file("leases.epoch"), std::ios::trunc) << std::string(64, 'q');
    CHECK_CODE(LeaseTable::open(path, test_options()), Code::Corruption, "no valid record");
  }
  SUBCASE("missing segment without create_if_missing") {
    LeaseTableOptions o = test_options();
    o.create_if_missing = false;
    CHECK_CODE(LeaseTable::open(dir.file("absent"), o), Code::NotFound, "does not exist");
  }
  SUBCASE("capacity out of range") {
    LeaseTableOptions o = test_options();
    o.capacity = 0;
    CHECK_CODE(LeaseTable::open(dir.file("zero"), o), Code::InvalidArgument, "capacity 0");
  }
  SUBCASE("epoch file on tmpfs") {
    LeaseTableOptions o;  // allow_volatile_epoch = false
    o.epoch_path = "/dev/shm/lanebus-test-epoch-" + std::to_string(getpid());
    auto r = LeaseTable::open(dir.file("durable"), o);
    ::unlink(o.epoch_path.c_str());
    CHECK_CODE(r, Code::InvalidArgument, "tmpfs");
  }
}

TEST_CASE("a segment the user may not open or create is PermissionDenied (as root: checked as nobody in a child)") {
  TempDir dir;
  REQUIRE(chmod(dir.path().c_str(), 0711) == 0);  // searchable, not writable, by others
  const std::string path = dir.file("leases");
  { REQUIRE(LeaseTable::open(path, test_options()).ok()); }
  // Root's file is 0600: nobody may not open it. Not root, the owner takes its own permission away.
  if (geteuid() != 0) REQUIRE(chmod(path.c_str(), 0000) == 0);
  auto open_line = [](const std::string& p) {
    return [p] {
      auto t = LeaseTable::open(p, test_options());
      return t.ok() ? std::string("OK") : lanebus::test::status_line(t.status());
    };
  };
  const std::string existing = lanebus::test::as_unprivileged(open_line(path));
  CHECK_MESSAGE(existing.rfind("PermissionDenied ", 0) == 0, existing);
  CHECK_MESSAGE(contains(existing, "leases"), existing);
  // Creating a segment in a directory the user may not write.
  if (geteuid() != 0) REQUIRE(chmod(dir.path().c_str(), 0500) == 0);
  const std::string created = lanebus::test::as_unprivileged(open_line(dir.file("new-leases")));
  if (geteuid() != 0) REQUIRE(chmod(dir.path().c_str(), 0700) == 0);
  CHECK_MESSAGE(created.rfind("PermissionDenied ", 0) == 0, created);
  CHECK(access(dir.file("new-leases").c_str(), F_OK) != 0);
}

TEST_CASE("LeaseGuard fails closed a safety margin before expiry and renew then refuses") {
  TempDir dir;
  auto t = open_table(dir.file("leases"));
  LeaseOwner a = new_owner();
  std::atomic<int> lost{0};
  LeaseGuardOptions o;
  o.ttl = 20s;
  o.safety_margin = 19900ms;  // valid() ends after ~100 ms, the table holds for 20 s
  o.background_renewal = false;
  o.on_lost = [&](const lanebus::Lease&, LeaseLoss why) {
    CHECK(why == LeaseLoss::DeadlineReached);
    lost.fetch_add(1);
  };
  auto g = LeaseGuard::acquire(*t, "task", a, o);
  REQUIRE(g.ok());
  CHECK((*g)->valid());
  CHECK((*g)->deadline() == (*g)->lease().expires_at_ns);
  REQUIRE(wait_until([&] { return !(*g)->valid(); }));
  // Closed while the table still considers the lease held: fail closed, before expiry.
  CHECK(t->inspect("task")->held);
  CHECK_CODE(sv((*g)->renew()), Code::StaleToken, "safety margin");
  CHECK_FALSE((*g)->valid());
  CHECK(lost.load() == 1);
  CHECK_CODE(sv((*g)->renew()), Code::StaleToken, "safety margin");
  CHECK(lost.load() == 1);  // at most once
}

TEST_CASE("LeaseGuard renews in the background and releases on destruction") {
  TempDir dir;
  auto t = open_table(dir.file("leases"));
  LeaseOwner a = new_owner();
  LeaseGuardOptions o;
  o.ttl = 300ms;
  o.renew_interval = 30ms;
  std::uint64_t token = 0;
  {
    auto g = LeaseGuard::acquire(*t, "task", a, o);
    REQUIRE(g.ok());
    token = (*g)->token();
    std::int64_t first_deadline = (*g)->deadline();
    REQUIRE(wait_until([&] { return (*g)->deadline() > first_deadline + 200000000; }));
    CHECK((*g)->valid());
    auto info = t->inspect("task");
    CHECK(info->held);
    CHECK(info->token == token);
    CHECK_CODE(LeaseGuard::acquire(*t, "task", new_owner(), o), Code::Busy, "is held by");
  }
  auto info = t->inspect("task");
  REQUIRE(info.ok());
  CHECK_FALSE(info->held);
  CHECK(info->expires_at_ns == 0);
  LeaseGuardOptions badm;
  badm.ttl = 100ms;
  badm.safety_margin = 100ms;
  CHECK_CODE(LeaseGuard::acquire(*t, "task", a, badm), Code::InvalidArgument, "safety_margin");
}

TEST_CASE("LeaseGuard's revocation callback runs once when a renewal fails") {
  TempDir dir;
  auto t = open_table(dir.file("leases"));
  LeaseOwner a = new_owner();
  std::atomic<int> lost{0};
  std::atomic<int> why{-1};
  LeaseGuardOptions o;
  o.ttl = 2s;
  o.renew_interval = 10ms;
  o.on_lost = [&](const lanebus::Lease&, LeaseLoss w) {
    why.store(static_cast<int>(w));
    lost.fetch_add(1);
  };
  auto g = LeaseGuard::acquire(*t, "task", a, o);
  REQUIRE(g.ok());
  // Someone with the owner's credentials releases it behind the guard's back.
  REQUIRE(t->release("task", a, (*g)->token()).ok());
  REQUIRE(wait_until([&] { return lost.load() == 1; }));
  CHECK(why.load() == static_cast<int>(LeaseLoss::RenewFailed));
  CHECK_FALSE((*g)->valid());
}

TEST_CASE("threads on two mappings of one segment never hold a lease together") {
  TempDir dir;
  const std::string path = dir.file("leases");
  auto t1 = open_table(path);
  auto t2 = open_table(path);
  REQUIRE(static_cast<void*>(lanebus::detail::Access::impl(*t1).header()) != static_cast<void*>(lanebus::detail::Access::impl(*t2).header()));
  const std::uint64_t seed = lanebus::test::test_seed("two mappings");
  std::mutex sink_mu;
  std::uint64_t sink_hwm = 0;
  std::vector<std::uint64_t> sink_tokens;
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> grants{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      LeaseTable& t = (i % 2 == 0) ? *t1 : *t2;
      std::mt19937_64 rng(seed + static_cast<std::uint64_t>(i));
      LeaseOwner me = *LeaseOwner::generate();
      for (int k = 0; k < 300; ++k) {
        auto l = t.acquire("shared", me, 10s);
        if (!l.ok()) {
          std::this_thread::yield();
          continue;
        }
        grants.fetch_add(1);
        if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
        {
          std::lock_guard<std::mutex> lk(sink_mu);
          if (l->token >= sink_hwm) {
            sink_hwm = l->token;
            sink_tokens.push_back(l->token);
          }
        }
        if (rng() % 2 == 0) (void)t.renew("shared", me, l->token);
        inside.fetch_sub(1);
        CHECK(t.release("shared", me, l->token).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(overlaps.load() == 0);
  CHECK(grants.load() > 0);
  CHECK(sink_tokens.size() == static_cast<std::size_t>(grants.load()));
  for (std::size_t i = 1; i < sink_tokens.size(); ++i) CHECK(sink_tokens[i] > sink_tokens[i - 1]);
  CHECK(sv(lanebus::detail::Access::impl(*t1).check_consistency()).code() == Code::Ok);
}
