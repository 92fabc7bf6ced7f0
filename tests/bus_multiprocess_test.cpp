// lanebus — MIT License.
// Multi-process through the public Bus: two producer processes publish (Sync)
// to one durable topic while two consumer processes, each its own consumer
// group, consume it; the consumers are killed (kill -9) and restarted, one
// after the other. Checks per-key order in every consumer session, that a
// restarted consumer resumes between its group's committed offset and the
// first message no session had delivered (never backwards past a commit,
// never skipping a message), and
// that every message whose publish returned OK is consumed by both groups.
// The parent reads committed offsets with a read-only DurableStore; the
// workload itself uses only the public API (bus_mp_child).
#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "durable_store.hpp"
#include "lanebus/lanebus.hpp"
#include "process.hpp"
#include "seed.hpp"
#include "sizes.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using lanebus::test::Child;
using lanebus::test::TempDir;
using namespace std::chrono_literals;

namespace {

constexpr const char* kTopic = "mp.events";
constexpr std::uint32_t kLanes = 4;

std::string helper() {
  std::string h = lanebus::test::helper_path("LANEBUS_BUS_MP_CHILD");
  REQUIRE_MESSAGE(!h.empty(), "LANEBUS_BUS_MP_CHILD is not set (run through meson test)");
  return h;
}

// Committed offset of every lane of `group`, read from the store on disk
// (read-only, while the other processes keep writing). Empty if the group
// has not been created yet.
std::vector<std::uint64_t> committed_offsets(const std::string& dir, const std::string& group) {
  lanebus::StoreOptions o;
  o.directory = dir;
  o.read_only = true;
  auto store = lanebus::detail::DurableStore::open(o);
  REQUIRE_MESSAGE(store.ok(), store.status().to_string());
  std::vector<std::uint64_t> out;
  auto t = (*store)->find_topic(kTopic);
  REQUIRE_MESSAGE(t.ok(), t.status().to_string());
  if (auto g = (*store)->find_group(*t, group); g.ok()) {
    auto info = (*store)->group_info(*g);
    REQUIRE_MESSAGE(info.ok(), info.status().to_string());
    for (const auto& lane : *info) out.push_back(lane.committed);
  }
  REQUIRE((*store)->close().ok());
  return out;
}

std::vector<std::uint64_t> end_offsets(const std::string& dir) {
  lanebus::StoreOptions o;
  o.directory = dir;
  o.read_only = true;
  auto store = lanebus::detail::DurableStore::open(o);
  REQUIRE_MESSAGE(store.ok(), store.status().to_string());
  auto t = (*store)->find_topic(kTopic);
  REQUIRE(t.ok());
  std::vector<std::uint64_t> out;
  for (std::uint32_t lane = 0; lane < kLanes; ++lane) out.push_back((*store)->end_offset(*t, lane).value());
  REQUIRE((*store)->close().ok());
  return out;
}

// One consumer process and what the parent knows about its group and its
// current session (the life of one process).
struct Consumer {
  std::string group;
  std::unique_ptr<Child> child;
  std::set<std::string> delivered;  // payloads, over all sessions
  std::uint64_t redelivered = 0;     // deliveries of a payload a past session had already delivered
  std::map<std::uint32_t, std::uint64_t> next_new;  // per lane: 1 + the highest offset any session delivered
  std::uint64_t resumed_ahead = 0;   // lanes resumed past the committed offset the parent had read
  // Session state.
  std::uint64_t session_got = 0;
  std::vector<std::uint64_t> resume_at;  // the group's committed offsets when the session started
  std::map<std::uint32_t, std::uint64_t> resume_limit;  // next_new when the session started
  std::map<std::uint32_t, std::uint64_t> last_offset;
  std::map<std::string, std::uint64_t> last_seq;  // "PRODUCER:KEY" -> seq
  bool closed = false;
};

struct Violations {
  std::uint64_t count = 0;
  std::vector<std::string> first;
  void add(const std::string& what) {
    if (count++ < 10) first.push_back(what);
  }
};

}  // namespace

TEST_CASE("two producer and two consumer processes share one store through Bus; consumers killed -9 and restarted") {
  const std::string exe = helper();
  const std::uint64_t seed = lanebus::test::test_seed("bus multiprocess");
  std::mt19937_64 rng(seed);
  const std::uint64_t restarts = lanebus::test::env_size("LANEBUS_MP_RESTARTS", 10);
  const auto start = std::chrono::steady_clock::now();
  TempDir dir;
  const std::string store_dir = dir.file("store");
  const std::string stop_producers = dir.file("stop-producers"), stop_consumers = dir.file("stop-consumers");

  std::map<std::string, std::unique_ptr<Child>> producers;  // name -> process
  std::set<std::string> producers_done;
  std::set<std::string> acked;  // payloads whose publish returned OK
  Violations bad;
  Consumer consumers[2];
  consumers[0].group = "audit";
  consumers[1].group = "billing";
  for (auto& c : consumers) c.resume_at.assign(kLanes, 0);  // a new group starts at the earliest offset

  auto start_consumer = [&](Consumer& c) {
    c.child = std::make_unique<Child>(std::vector<std::string>{exe, "consume", store_dir, kTopic, c.group, stop_consumers});
    REQUIRE(c.child->started());  // its "ready" may come after its first deliveries
    c.session_got = 0;
    c.resume_limit = c.next_new;
    c.last_offset.clear();
    c.last_seq.clear();
  };
  auto on_consumer_line = [&](Consumer& c, const std::string& line) {
    std::istringstream in(line);
    std::string what, payload, key;
    std::uint32_t lane = 0;
    std::uint64_t offset = 0;
    in >> what;
    if (what == "ready") return;
    if (what == "closed") {
      c.closed = true;
      return;
    }
    REQUIRE_MESSAGE(what == "got", c.group << ": " << line);
    in >> lane >> offset >> payload >> key;
    const std::size_t a = payload.find(':'), b = payload.rfind(':');
    REQUIRE_MESSAGE((a != std::string::npos && b > a), line);
    const std::string who_key = payload.substr(0, b);
    const std::uint64_t seq = std::stoull(payload.substr(b + 1));
    if (payload.substr(a + 1, b - a - 1) != key) bad.add(c.group + ": key " + key + " with payload " + payload);
    if (lane >= kLanes || lane != lanebus::lane_for_key(key, kLanes)) bad.add(c.group + ": " + key + " in lane " + std::to_string(lane));
    // Offsets of a lane arrive in order and without gaps within a session. A
    // restarted session resumes at or after the committed offset the parent
    // read after the kill, and at or before the first offset no session had
    // delivered yet (nothing skipped). The two differ when the kill landed
    // after the dead process's last commit reached the file but before LMDB
    // published it to readers (the lock file's txnid, set after the meta page
    // write): other processes see that commit only from the next write on.
    auto lo = c.last_offset.find(lane);
    if (lo != c.last_offset.end()) {
      if (offset != lo->second + 1)
        bad.add(c.group + " lane " + std::to_string(lane) + ": offset " + std::to_string(offset) + " after " +
                std::to_string(lo->second));
    } else {
      const std::uint64_t limit = c.resume_limit.count(lane) ? c.resume_limit[lane] : 0;
      if (offset < c.resume_at.at(lane) || offset > limit)
        bad.add(c.group + " lane " + std::to_string(lane) + ": resumed at offset " + std::to_string(offset) +
                ", committed was " + std::to_string(c.resume_at[lane]) + ", first never delivered " +
                std::to_string(limit));
      c.resumed_ahead += offset > c.resume_at[lane];
    }
    c.last_offset[lane] = offset;
    c.next_new[lane] = std::max(c.next_new[lane], offset + 1);
    // Per-key order: each producer's sequence numbers of a key rise within a session.
    auto ls = c.last_seq.find(who_key);
    if (ls != c.last_seq.end() && seq <= ls->second)
      bad.add(c.group + ": " + who_key + " seq " + std::to_string(seq) + " after " + std::to_string(ls->second));
    c.last_seq[who_key] = seq;
    if (!c.delivered.insert(payload).second) ++c.redelivered;
    ++c.session_got;
  };
  auto on_producer_line = [&](const std::string& name, const std::string& line) {
    std::istringstream in(line);
    std::string what, who, key, seq;
    in >> what >> who >> key >> seq;
    if (what == "ack") {
      REQUIRE(who == name);
      acked.insert(who + ":" + key + ":" + seq);
    } else if (what == "done") {
      producers_done.insert(name);
    } else {
      FAIL("producer " << name << ": " << line);
    }
  };
  // Read every line the children have written so far (read_line waits up to
  // 2 ms for more; 1 ms would round down to no read at all).
  auto pump = [&] {
    for (auto& [name, p] : producers)
      for (std::string l = p->read_line(2ms); !l.empty(); l = p->read_line(2ms)) on_producer_line(name, l);
    for (auto& c : consumers)
      for (std::string l = c.child->read_line(2ms); !l.empty(); l = c.child->read_line(2ms)) on_consumer_line(c, l);
  };
  auto pump_until = [&](auto pred, std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      pump();
    }
    return true;
  };

  // The topic exists before anyone starts (created through Bus, then closed).
  {
    lanebus::BusOptions o;
    o.workers = 1;
    o.store.directory = store_dir;
    auto bus = lanebus::Bus::open(o);
    REQUIRE_MESSAGE(bus.ok(), bus.status().to_string());
    REQUIRE((*bus)->create_topic(kTopic, {.lanes = kLanes, .durable = true}).ok());
    REQUIRE((*bus)->shutdown(lanebus::ShutdownMode::Drain).ok());
  }
  for (auto& c : consumers) start_consumer(c);
  for (const char* name : {"A", "B"}) {
    producers[name] = std::make_unique<Child>(std::vector<std::string>{exe, "produce", store_dir, kTopic, name, "4", stop_producers});
    REQUIRE(producers[name]->started());
    REQUIRE(producers[name]->read_line() == "ready");
  }

  // Kill the consumers in turn, each after a random number of deliveries
  // (0..1000) in its current session, and restart them.
  std::uint64_t kills = 0;
  for (std::uint64_t cycle = 0; cycle < restarts; ++cycle) {
    Consumer& victim = consumers[cycle % 2];
    const std::uint64_t after = rng() % 1001;
    REQUIRE_MESSAGE(pump_until([&] { return victim.session_got >= after; }, 60s),
                    victim.group << " delivered " << victim.session_got << " of " << after << " in 60 s; " << acked.size()
                                 << " publishes acknowledged so far");
    victim.child->signal(SIGKILL);
    for (std::string l = victim.child->read_line(10s); !l.empty(); l = victim.child->read_line(10s))
      on_consumer_line(victim, l);
    CHECK(victim.child->wait() == 128 + SIGKILL);
    ++kills;
    victim.resume_at = committed_offsets(store_dir, victim.group);
    if (victim.resume_at.empty()) victim.resume_at.assign(kLanes, 0);  // killed before it subscribed
    start_consumer(victim);
  }

  // Stop the producers; every acknowledged message must reach both groups.
  { std::ofstream(stop_producers) << "stop\n"; }
  REQUIRE_MESSAGE(pump_until([&] { return producers_done.size() == 2; }, 60s), "the producers did not finish");
  for (auto& [name, p] : producers) CHECK(p->wait() == 0);
  REQUIRE(acked.size() > 0);
  auto all_delivered = [&] {
    for (const auto& c : consumers)
      if (c.delivered.size() < acked.size()) return false;
    return true;
  };
  const bool caught_up = pump_until(all_delivered, 120s);
  { std::ofstream(stop_consumers) << "stop\n"; }
  REQUIRE(pump_until([&] { return consumers[0].closed && consumers[1].closed; }, 60s));
  for (auto& c : consumers) CHECK(c.child->wait() == 0);

  for (const std::string& v : bad.first) MESSAGE("violation: " << v);
  CHECK(bad.count == 0);
  CHECK(caught_up);
  // Nothing acknowledged is lost, and nothing was delivered that was not published.
  const std::vector<std::uint64_t> ends = end_offsets(store_dir);
  std::uint64_t stored = 0;
  for (std::uint64_t e : ends) stored += e;
  CHECK(stored == acked.size());  // the producers stopped cleanly: every stored message was acknowledged
  for (auto& c : consumers) {
    INFO("group " << c.group);
    std::uint64_t missing = 0;
    for (const std::string& p : acked) missing += c.delivered.count(p) == 0;
    CHECK(missing == 0);
    CHECK(c.delivered.size() == acked.size());
    CHECK(committed_offsets(store_dir, c.group) == ends);  // a drained shutdown commits everything
  }
  std::printf("bus multiprocess: kills=%llu acked=%zu delivered=%zu/%zu redelivered after a kill=%llu/%llu "
              "lanes resumed past the committed offset read=%llu/%llu violations=%llu\n",
              static_cast<unsigned long long>(kills), acked.size(), consumers[0].delivered.size(),
              consumers[1].delivered.size(), static_cast<unsigned long long>(consumers[0].redelivered),
              static_cast<unsigned long long>(consumers[1].redelivered),
              static_cast<unsigned long long>(consumers[0].resumed_ahead),
              static_cast<unsigned long long>(consumers[1].resumed_ahead), static_cast<unsigned long long>(bad.count));
  lanebus::test::print_figures("bus_multiprocess", kills, acked.size(), start);
}
