// lanebus — MIT License.
// kill -9 inside lease-table operations: every crash point of acquire, renew and release, a
// seeded random kill loop, a stalled (stopped) holder giving Busy, and a negative control
// with the EOWNERDEAD repair switched off.
#include <doctest/doctest.h>
#include <signal.h>

#include <random>
#include <string>
#include <thread>

#include "access.hpp"
#include "lanebus/lease.hpp"
#include "lease_table.hpp"
#include "process.hpp"
#include "seed.hpp"
#include "sizes.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using lanebus::Code;
using lanebus::LeaseOwner;
using lanebus::LeaseTable;
using lanebus::test::Child;
using lanebus::test::TempDir;
using lanebus::test::wait_until;
using namespace std::chrono_literals;

namespace {

std::string helper() {
  std::string h = lanebus::test::helper_path("LANEBUS_LEASE_HELPER");
  REQUIRE_MESSAGE(!h.empty(), "LANEBUS_LEASE_HELPER is not set (run through meson test)");
  return h;
}

lanebus::LeaseTableOptions options() {
  lanebus::LeaseTableOptions o;
  o.allow_volatile_epoch = true;
  o.capacity = 256;
  o.lock_timeout = 5s;
  return o;
}

std::unique_ptr<LeaseTable> open_table(const std::string& path, const lanebus::detail::LeaseTableHooks& hooks = {},
                                       lanebus::LeaseTableOptions o = options()) {
  auto t = lanebus::detail::open_lease_table_with_hooks(path, o, hooks);
  REQUIRE_MESSAGE(t.ok(), t.status().to_string());
  return std::move(*t);
}

}  // namespace

TEST_CASE("kill -9 at every crash point of acquire, renew and release leaves the table consistent and usable") {
  TempDir dir;
  const std::string path = dir.file("leases");
  auto table = open_table(path);
  LeaseOwner me = *LeaseOwner::generate();
  int cycle = 0;
  for (std::string op : {"acquire", "renew", "release"}) {
    for (int point = lanebus::detail::kAfterLock; point <= lanebus::detail::kBeforeUnlock; ++point) {
      for (bool existing : {false, true}) {
        CAPTURE(op);
        CAPTURE(point);
        CAPTURE(existing);
        std::string name = "crash.n" + std::to_string(cycle++);
        if (existing) {  // the name already has an expired grant: covers reuse, not placement
          auto l = table->acquire(name, me, 1ms);
          REQUIRE(l.ok());
          REQUIRE(wait_until([&] { return !table->inspect(name)->held; }));
        }
        std::uint64_t counter_before = lanebus::detail::Access::impl(*table).next_token_for_test();
        std::uint64_t repairs_before = lanebus::detail::Access::impl(*table).repairs_for_test();
        Child c({helper(), "crash-point", path, op, std::to_string(point), name});
        std::string line = c.read_line();
        REQUIRE(line == "at " + std::to_string(point));
        c.signal(SIGKILL);
        CHECK(c.wait() == 128 + SIGKILL);
        // The next locker repairs (EOWNERDEAD) and the invariants hold.
        auto st = lanebus::detail::Access::impl(*table).check_consistency();
        CHECK_MESSAGE(st.ok(), st.to_string());
        CHECK(lanebus::detail::Access::impl(*table).repairs_for_test() == repairs_before + 1);
        CHECK(lanebus::detail::Access::impl(*table).next_token_for_test() >= counter_before);
        // No stuck slot: whatever the dead process held expires (ttl 200 ms).
        lanebus::Result<lanebus::Lease> mine(Code::Internal, "");
        REQUIRE(wait_until([&] {
          mine = table->acquire(name, me, 10s);
          return mine.ok();
        }));
        CHECK(mine->token >= counter_before);
        CHECK(table->confirm_grant(name, mine->token).ok());
        REQUIRE(table->release(name, me, mine->token).ok());
      }
    }
  }
}

TEST_CASE("negative control: with the EOWNERDEAD repair off, a kill mid-update leaves a torn entry") {
  TempDir dir;
  const std::string path = dir.file("leases");
  lanebus::detail::LeaseTableHooks no_repair;
  no_repair.skip_repair = true;
  auto table = open_table(path, no_repair);
  Child c({helper(), "crash-point", path, "acquire", std::to_string(lanebus::detail::kMidUpdate), "torn"});
  REQUIRE(c.read_line() == "at " + std::to_string(lanebus::detail::kMidUpdate));
  c.signal(SIGKILL);
  CHECK(c.wait() == 128 + SIGKILL);
  auto st = lanebus::detail::Access::impl(*table).check_consistency();
  CHECK(st.code() == Code::Corruption);
  CHECK(st.message().find("torn grant") != std::string_view::npos);
  MESSAGE(st.to_string());
}

TEST_CASE("a participant stopped inside an operation makes others Busy, not hung; killing it frees the table") {
  TempDir dir;
  const std::string path = dir.file("leases");
  lanebus::LeaseTableOptions quick = options();
  quick.lock_timeout = 200ms;
  auto table = open_table(path, {}, quick);
  Child c({helper(), "crash-point", path, "acquire", std::to_string(lanebus::detail::kMidUpdate), "stall"});
  REQUIRE(c.read_line() == "at " + std::to_string(lanebus::detail::kMidUpdate));
  c.signal(SIGSTOP);
  LeaseOwner me = *LeaseOwner::generate();
  auto r = table->acquire("other", me, 1s);
  CHECK(r.code() == Code::Busy);
  CHECK(r.status().message().find("stalled") != std::string_view::npos);
  c.signal(SIGKILL);
  CHECK(c.wait() == 128 + SIGKILL);
  auto ok = table->acquire("other", me, 1s);
  CHECK_MESSAGE(ok.ok(), ok.status().to_string());
  CHECK(lanebus::detail::Access::impl(*table).check_consistency().ok());
  CHECK(table->inspect("stall").code() == Code::NotFound);  // the half-done placement was rolled back
}

TEST_CASE("kill -9 at random moments, many cycles: the table stays consistent and tokens never go back") {
  TempDir dir;
  const std::string path = dir.file("leases");
  auto table = open_table(path);
  const std::uint64_t seed = lanebus::test::test_seed("lease kill loop");
  std::mt19937_64 rng(seed);
  // At least LANEBUS_STRESS_SECONDS (default 2) and LANEBUS_CRASH_CYCLES kills (default 20).
  const auto seconds = static_cast<long>(lanebus::test::env_size("LANEBUS_STRESS_SECONDS", 2));
  const auto min_cycles = static_cast<int>(lanebus::test::env_size("LANEBUS_CRASH_CYCLES", 20));
  LeaseOwner me = *LeaseOwner::generate();
  std::uint64_t last_counter = 0;
  int cycles = 0;
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end || cycles < min_cycles) {
    Child c({helper(), "hammer", path, std::to_string(rng())});
    REQUIRE(c.read_line() == "ready");
    // A random kill moment (not a synchronisation): the helper runs table operations in a loop.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    c.signal(SIGKILL);
    REQUIRE(c.wait() == 128 + SIGKILL);
    auto st = lanebus::detail::Access::impl(*table).check_consistency();
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    std::uint64_t counter = lanebus::detail::Access::impl(*table).next_token_for_test();
    CHECK(counter >= last_counter);
    last_counter = counter;
    auto l = table->acquire("parent", me, 10s);
    REQUIRE_MESSAGE(l.ok(), l.status().to_string());
    REQUIRE(table->release("parent", me, l->token).ok());
    ++cycles;
  }
  std::printf("kill loop: cycles=%d repairs=%llu\n", cycles,
              static_cast<unsigned long long>(lanebus::detail::Access::impl(*table).repairs_for_test()));
  lanebus::test::print_figures("lease_kill_loop", static_cast<std::uint64_t>(cycles), 0, start);
  // Every leftover lease of the dead helpers becomes acquirable (no stuck slots).
  for (int i = 0; i < 4; ++i) {
    std::string name = "h" + std::to_string(i);
    REQUIRE(wait_until([&] { return table->acquire(name, me, 10s).ok(); }));
  }
}
