// lanebus — MIT License.
// Liveness after a crash (doc/idempotency.md): a consumer killed while its
// handler holds a message's idempotency claim must not stall that key — and
// the rest of its lane — for claim_timeout (5 min). A fresh consumer drains
// the queue within about the visibility timeout, and every message's handler
// completes exactly once.
#include <doctest/doctest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "process.hpp"
#include "scratch_dir.hpp"
#include "seed.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::Child;
using lanebus::test::wait_until;

namespace {

constexpr std::uint32_t kLanes = 4;
constexpr auto kVisibility = 1000ms;  // liveness_child's GroupOptions::visibility

std::string state_name(const Result<KeyStatus>& st) {
  if (!st.ok()) return st.code() == Code::NotFound ? "unknown" : st.status().to_string();
  return st->state == ClaimState::Done ? "done" : st->state == ClaimState::InProgress ? "in progress" : "claimed";
}

}  // namespace

TEST_CASE("a consumer killed inside a handler does not stall its idempotency key: a fresh consumer drains at once") {
  const std::string child = lanebus::test::helper_path("LANEBUS_LIVENESS_CHILD");
  REQUIRE_MESSAGE(!child.empty(), "LANEBUS_LIVENESS_CHILD is not set (run through meson test)");
  const std::uint64_t seed = lanebus::test::test_seed("liveness_test");
  std::mt19937_64 rng(seed);
  lanebus::test::ScratchDir tmp;
  const std::string completions = (tmp.path / "completions").string();

  // Three ordering keys on three different lanes; A is the one whose handler
  // blocks on one message, with messages before and after it in its lane.
  std::vector<std::string> keys;
  std::vector<std::uint32_t> lanes;
  for (int i = 0; keys.size() < 3; ++i) {
    std::string k = "acct-" + std::to_string(i);
    std::uint32_t lane = lane_for_key(k, kLanes);
    if (std::find(lanes.begin(), lanes.end(), lane) != lanes.end()) continue;
    keys.push_back(k);
    lanes.push_back(lane);
  }
  std::vector<int> count(3);
  for (int& c : count) c = 4 + static_cast<int>(rng() % 3);  // 4..6 messages per key
  const int block_index = 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(count[0] - 2));
  auto idem_key = [&](int key, int i) { return keys[key] + "/" + std::to_string(i); };
  const std::string block = idem_key(0, block_index);
  std::vector<std::string> all;
  for (int key = 0; key < 3; ++key)
    for (int i = 0; i < count[key]; ++i) all.push_back(idem_key(key, i));
  MESSAGE("keys " << keys[0] << " (lane " << lanes[0] << ", " << count[0] << " messages, blocks on " << block << "), "
                  << keys[1] << " (lane " << lanes[1] << ", " << count[1] << "), " << keys[2] << " (lane " << lanes[2]
                  << ", " << count[2] << ")");

  // The parent's bus: publishes, then only reads the idempotency table (it
  // has no consumer). claim_timeout is the default, 5 min.
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path, 5ms)).value();
  auto idem = bus->idempotency("liveness", {.claim_timeout = std::chrono::minutes(5)}).value();
  auto queue = bus->create_queue("jobs", {.lanes = kLanes, .durable = true}).value();
  for (int i = 0; i < 6; ++i)
    for (int key = 0; key < 3; ++key)
      if (i < count[key])
        REQUIRE(queue.publish({.key = keys[key], .payload = "job " + idem_key(key, i), .idempotency_key = idem_key(key, i)})
                    .ok());
  auto done = [&](const std::string& k) {
    auto st = idem->status(k);
    return st.ok() && st->state == ClaimState::Done;
  };

  std::vector<std::string> argv1{child, (tmp.path / "store").string(), completions, block};
  argv1.insert(argv1.end(), all.begin(), all.end());
  Child first(argv1);
  REQUIRE(first.started());
  REQUIRE(first.read_line(30s) == "inside " + block);
  // Let everything else the first consumer can finish commit (B and C, and A
  // before the blocked message), so the kill leaves only the blocked call in
  // flight and "exactly once" is exact.
  REQUIRE(wait_until(
      [&] {
        for (int key = 0; key < 3; ++key)
          for (int i = 0; i < (key == 0 ? block_index : count[key]); ++i)
            if (!done(idem_key(key, i))) return false;
        return true;
      },
      30s));
  MESSAGE(block << " before the kill: " << state_name(idem->status(block)));
  first.signal(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  CHECK(first.wait() == 128 + SIGKILL);

  std::vector<std::string> argv2{child, (tmp.path / "store").string(), completions, "-"};
  argv2.insert(argv2.end(), all.begin(), all.end());
  Child second(argv2);
  REQUIRE(second.started());
  // The bound that matters is visibility + 2 s; the hard limit below only
  // turns a stall (today: claim_timeout, 5 min) into a failure on a loaded
  // machine without failing on timing.
  const auto bound = kVisibility + 2s;
  const auto hard_bound = kVisibility + 20s;
  const bool drained = wait_until(
      [&] {
        for (const std::string& k : all)
          if (!done(k)) return false;
        return true;
      },
      hard_bound);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  const double bound_s = std::chrono::duration<double>(bound).count();
  MESSAGE("drained " << std::string(drained ? "" : "NOT ") << "in " << took << " s after the kill (bound visibility + 2 s = "
                     << bound_s << " s: " << std::string(took <= bound_s ? "within" : "OVER") << ")");
  if (!drained) {
    std::string states;
    for (int i = block_index; i < count[0]; ++i)
      states += " " + idem_key(0, i) + "=" + state_name(idem->status(idem_key(0, i)));
    FAIL_CHECK("the fresh consumer did not drain " << keys[0] << " within " << hard_bound.count()
                                                    << " ms after the kill:" << states);
    second.signal(SIGKILL);
    (void)second.wait();
  } else {
    CHECK(second.read_line(30s) == "drained");
    CHECK(second.wait() == 0);
    CHECK(took < std::chrono::duration<double>(hard_bound).count());
  }
  MESSAGE("{\"test\":\"liveness\",\"seed\":" << seed << ",\"drained\":" << (drained ? 1 : 0)
                                             << ",\"drain_s\":" << took << ",\"bound_s\":" << bound_s << "}");

  // Exactly once per key whose handler completed (a completion is recorded
  // before the ack, and nothing but the blocked call was in flight at the kill).
  std::map<std::string, int> seen;
  std::ifstream in(completions);
  for (std::string line; std::getline(in, line);) ++seen[line];
  for (const std::string& k : all) {
    const int expected = done(k) ? 1 : 0;  // all of them once drained
    CHECK_MESSAGE(seen[k] == expected, k << " completed " << seen[k] << " times, expected " << expected);
    seen.erase(k);
  }
  CHECK_MESSAGE(seen.empty(), seen.size() << " unexpected completion records");
  (void)bus->shutdown(ShutdownMode::Abandon);
}
