// lanebus — MIT License.
// Leases across real processes with real SIGSTOP/SIGCONT: the freeze/takeover
// scenario of doc/leases.md step for step, and 4 contending workers under a pausing nemesis, each with a
// negative control (fence check off) that shows the stale write getting through.
#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fenced_sink.hpp"
#include "lanebus/lease.hpp"
#include "process.hpp"
#include "seed.hpp"
#include "sizes.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using lanebus::LeaseTable;
using lanebus::test::Child;
using lanebus::test::FencedSink;
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
  return o;
}

std::uint64_t field_u64(const std::string& line, const std::string& key) {
  std::size_t p = line.find(key + "=");
  if (p == std::string::npos) return ~std::uint64_t{0};
  return std::strtoull(line.c_str() + p + key.size() + 1, nullptr, 10);
}

struct ScenarioResult {
  std::uint64_t token_a = 0, token_b = 0;
  std::string a_write, a_renew;
  std::vector<lanebus::test::SinkWrite> writes;
};

// The freeze/takeover scenario, with real processes: A acquires and renews
// twice, is frozen past the TTL, B takes over and writes, A resumes and writes.
ScenarioResult run_scenario(bool fence) {
  TempDir dir;
  const std::string table_path = dir.file("leases");
  const std::string sink_path = dir.file("sink");
  const std::string ttl = "300";
  auto table = LeaseTable::open(table_path, options());
  REQUIRE(table.ok());
  ScenarioResult res;

  Child a({helper(), "scenario-a", table_path, sink_path, ttl, fence ? "1" : "0"});
  REQUIRE(a.started());
  std::string line = a.read_line();
  MESSAGE("A: " << line);
  res.token_a = field_u64(line, "token");
  REQUIRE(line.rfind("acquired", 0) == 0);
  CHECK(a.read_line() == "renew ok=1");
  CHECK(a.read_line() == "renew ok=1");
  CHECK(a.read_line() == "freezing");
  REQUIRE(a.wait_stopped());  // A is frozen by a real SIGSTOP
  // Wait (by the table's clock) until A's lease has expired.
  REQUIRE(wait_until([&] { return !(*table)->inspect("batch-task-42")->held; }));

  Child b({helper(), "scenario-b", table_path, sink_path, ttl, fence ? "1" : "0"});
  line = b.read_line();
  MESSAGE("B: " << line);
  res.token_b = field_u64(line, "token");
  CHECK(b.read_line() == "write accepted=1");
  CHECK(b.wait() == 0);

  a.signal(SIGCONT);
  res.a_write = a.read_line();
  res.a_renew = a.read_line();
  MESSAGE("A after SIGCONT: " << res.a_write << " / " << res.a_renew);
  CHECK(a.wait() == 0);
  FencedSink sink(sink_path);
  res.writes = sink.writes();
  return res;
}

struct Grant {
  std::string name;
  std::uint64_t token = 0;
  std::int64_t granted = 0, last_expiry = 0, released_before = 0;
  int worker = 0;
};

struct ContentionResult {
  std::vector<Grant> grants;
  std::size_t stale_rejected = 0;
  std::size_t regressions = 0;
  std::size_t sink_writes = 0;
  int pauses = 0;
};

// 4 workers contend for 3 names with short TTLs while the nemesis SIGSTOPs the
// current holder of a random name for 1.5 x TTL. With the fence off, runs
// until the sink shows a regression (or the time limit).
ContentionResult run_contention(bool fence, std::uint64_t seed, long seconds) {
  TempDir dir;
  const std::string table_path = dir.file("leases");
  const long ttl_ms = 100;
  const int workers = 4, names = 3;
  auto table = LeaseTable::open(table_path, options());
  REQUIRE(table.ok());
  std::vector<std::unique_ptr<Child>> kids;
  for (int w = 0; w < workers; ++w) {
    kids.push_back(std::make_unique<Child>(std::vector<std::string>{
        helper(), "contend", table_path, dir.path(), dir.file("log" + std::to_string(w)),
        std::to_string(names), std::to_string(ttl_ms), fence ? "1" : "0", std::to_string(seed + w),
        // Each worker runs 2 s past the pauses below, so none is stopped or
        // continued while it exits: under ASan, LeakSanitizer's exit-time
        // check ptrace-stops the process, and a SIGSTOP/SIGCONT arriving
        // then can leave it stopped for good (seen in fence_multiprocess_test).
        std::to_string(seconds * 1000 + 2000), std::to_string(w)}));
    const std::string line = kids.back()->read_line();
    if (line != "ready") {
      Child& k = *kids.back();
      FAIL("contention worker " << w << " did not start: it said \"" << line << "\", "
                                << (k.started() ? "exit status " + std::to_string(k.wait()) : std::string("spawn failed")));
    }
  }
  ContentionResult res;
  std::mt19937_64 rng(seed);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));
    auto info = (*table)->inspect("c" + std::to_string(rng() % names));
    if (!info.ok() || !info->held) continue;
    for (auto& k : kids) {
      if (static_cast<std::uint32_t>(k->pid()) != info->owner.pid) continue;
      k->signal(SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(ttl_ms * 3 / 2));
      k->signal(SIGCONT);
      ++res.pauses;
    }
  }
  for (auto& k : kids) CHECK(k->wait() == 0);

  for (int n = 0; n < names; ++n) {
    FencedSink sink(dir.file("c" + std::to_string(n) + ".sink"));
    auto writes = sink.writes();
    res.sink_writes += writes.size();
    res.regressions += FencedSink::regressions(writes);
  }
  std::map<std::uint64_t, Grant> by_token;
  for (int w = 0; w < workers; ++w) {
    std::ifstream in(dir.file("log" + std::to_string(w)));
    std::string kind, name;
    std::uint64_t token;
    while (in >> kind >> name >> token) {
      Grant& g = by_token[token];
      g.name = name;
      g.token = token;
      g.worker = w;
      if (kind == "G") {
        in >> g.granted >> g.last_expiry;
      } else if (kind == "R") {
        std::int64_t e;
        in >> e;
        g.last_expiry = std::max(g.last_expiry, e);
      } else if (kind == "X") {
        in >> g.released_before;
      } else if (kind == "W") {
        int accepted;
        in >> accepted;
        if (accepted == 0) ++res.stale_rejected;
      } else {
        std::string code;
        in >> code;
      }
    }
  }
  for (auto& [t, g] : by_token) res.grants.push_back(g);
  return res;
}

}  // namespace

TEST_CASE("reference scenario: frozen A's stale write is rejected, exactly one write from B") {
  ScenarioResult r = run_scenario(true);
  std::printf("step 0: worker-A acquires task, token=%llu\n", static_cast<unsigned long long>(r.token_a));
  std::printf("step 5: worker-B acquires expired task, token=%llu\n", static_cast<unsigned long long>(r.token_b));
  CHECK(r.token_b > r.token_a);
  CHECK(r.token_b == r.token_a + 1);  // nothing else was granted in between
  CHECK(r.a_write.rfind("write accepted=0", 0) == 0);
  CHECK(field_u64(r.a_write, "hwm") == r.token_b);
  CHECK(r.a_renew == "renew-after-resume code=StaleToken");
  REQUIRE(r.writes.size() == 1);
  CHECK(r.writes[0].token == r.token_b);
  CHECK(r.writes[0].writer == 2);
}

TEST_CASE("reference scenario, negative control: without the fence check the stale write gets through") {
  ScenarioResult r = run_scenario(false);
  CHECK(r.a_write.rfind("write accepted=1", 0) == 0);
  REQUIRE(r.writes.size() == 2);
  CHECK(r.writes[0].token == r.token_b);
  CHECK(r.writes[1].token == r.token_a);  // the stale generation wrote after the new one
  CHECK(FencedSink::regressions(r.writes) == 1);
}

TEST_CASE("contention: 4 processes, random pauses: tokens in takeover order, no double holders, no stale write accepted") {
  const std::uint64_t seed = lanebus::test::test_seed("lease contention");
  const auto seconds = static_cast<long>(lanebus::test::env_size("LANEBUS_STRESS_SECONDS", 2));
  const auto start = std::chrono::steady_clock::now();
  ContentionResult r = run_contention(true, seed, seconds);
  MESSAGE("grants=" << r.grants.size() << " pauses=" << r.pauses << " sink_writes=" << r.sink_writes
                    << " stale_rejected=" << r.stale_rejected);
  std::printf("contention: grants=%zu pauses=%d sink_writes=%zu stale_rejected=%zu regressions=%zu\n",
              r.grants.size(), r.pauses, r.sink_writes, r.stale_rejected, r.regressions);
  lanebus::test::print_figures("lease_contention", static_cast<std::uint64_t>(r.pauses), r.sink_writes, start);
  REQUIRE(r.grants.size() > 10);
  CHECK(r.regressions == 0);
  // Tokens are unique (map keys) and, across all names, rise with grant time.
  int order_violations = 0, overlaps = 0;
  std::map<std::string, const Grant*> prev;
  for (std::size_t i = 0; i < r.grants.size(); ++i) {
    const Grant& g = r.grants[i];
    if (i > 0 && g.granted < r.grants[i - 1].granted) ++order_violations;
    auto it = prev.find(g.name);
    if (it != prev.end()) {
      const Grant& p = *it->second;
      // p's validity ended no later than its last confirmed expiry or the
      // moment before it called release; g must start after that.
      std::int64_t p_end = p.released_before != 0 ? std::min(p.last_expiry, p.released_before) : p.last_expiry;
      if (g.granted < p_end) {
        ++overlaps;
        MESSAGE("overlap on " << g.name << ": token " << p.token << " valid until " << p_end << ", token "
                              << g.token << " granted at " << g.granted);
      }
    }
    prev[g.name] = &g;
  }
  CHECK(order_violations == 0);
  CHECK(overlaps == 0);
}

TEST_CASE("contention, negative control: without the fence check a paused holder's stale write gets through") {
  const std::uint64_t seed = lanebus::test::test_seed("lease contention control");
  std::size_t regressions = 0;
  for (int attempt = 0; attempt < 3 && regressions == 0; ++attempt) {
    ContentionResult r = run_contention(false, seed + static_cast<std::uint64_t>(attempt) * 1000, 2);
    std::printf("control: grants=%zu pauses=%d sink_writes=%zu regressions=%zu\n", r.grants.size(), r.pauses,
                r.sink_writes, r.regressions);
    regressions += r.regressions;
  }
  CHECK(regressions > 0);
}

TEST_CASE("lanebus leases PATH lists name, owner, token and time left; bad commands exit 2") {
  std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");
  if (tool.empty()) {
    MESSAGE("LANEBUS_TOOL not set (tools disabled): skipping");
    return;
  }
  TempDir dir;
  const std::string path = dir.file("leases");
  auto table = LeaseTable::open(path, options());
  REQUIRE(table.ok());
  auto owner = *lanebus::LeaseOwner::generate();
  auto held = (*table)->acquire("orders.shard-1", owner, 60s);
  REQUIRE(held.ok());
  auto gone = (*table)->acquire("orders.shard-2", owner, 60s);
  REQUIRE(gone.ok());
  REQUIRE((*table)->release("orders.shard-2", owner, gone->token).ok());

  Child ls({tool, "leases", path});
  std::string header = ls.read_line();
  CHECK(header.find("NAME") == 0);
  CHECK(header.find("TIME_LEFT") != std::string::npos);
  std::string all;
  for (std::string line = ls.read_line(); !line.empty(); line = ls.read_line()) all += line + "\n";
  CHECK(ls.wait() == 0);
  MESSAGE(all);
  CHECK(all.find("orders.shard-1") != std::string::npos);
  CHECK(all.find(owner.to_string()) != std::string::npos);
  CHECK(all.find(std::to_string(held->token)) != std::string::npos);
  CHECK(all.find("held") != std::string::npos);
  CHECK(all.find("released") != std::string::npos);
  CHECK(all.find("# 2 names") != std::string::npos);

  Child unknown({tool, "no-such-command"});
  CHECK(unknown.wait() == 2);
  Child missing({tool, "leases", dir.file("absent")});
  CHECK(missing.wait() == 1);
  Child help({tool, "--help"});
  CHECK(help.read_line().find("usage: lanebus") == 0);
  CHECK(help.wait() == 0);
}
