// lanebus — MIT License.
// `lanebus namespace move` (lib/features/namespace_move.hpp, doc/tenancy.md "Moving a
// namespace") end to end with the built tool (LANEBUS_TOOL): a namespace with
// records in every table moves while the tool is killed with SIGKILL at
// seeded random points (named points inside and between its transactions,
// and random times); reruns finish it. Afterwards DST holds exactly what SRC
// held (per-table counts and checksums), a bus on DST consumes the same names
// from the same offsets and finds the DLQ entries, idempotency records and
// user tables, nothing of the namespace is left in SRC, and another namespace
// of SRC is untouched. Bad input: usage errors, a missing directory, an
// invalid name, an empty namespace, a DST holding the namespace, a live store.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "delayed_index.hpp"
#include "dlq.hpp"
#include "durable_store.hpp"
#include "idempotency.hpp"
#include "lanebus/lanebus.hpp"
#include "namespace_move.hpp"
#include "process.hpp"
#include "seed.hpp"
#include "shell.hpp"
#include "sizes.hpp"
#include "temp_dir.hpp"
#include "tenancy.hpp"
#include "wait.hpp"

using namespace lanebus;

namespace {

using lanebus::test::run_shell;
using lanebus::test::contains;

constexpr std::uint32_t kEventLanes = 4, kJobLanes = 2;
constexpr std::uint64_t kEvents = 600, kJobs = 200;  // noisy.events / noisy.jobs
constexpr std::uint64_t kQuietEvents = 100;

template <typename T>
T must(Result<T> r, const char* what) {
  INFO(what << ": " << r.status().to_string());
  REQUIRE(r.ok());
  return std::move(*r);
}
#define MUST(expr) must((expr), #expr)



std::string be32(std::uint32_t v) {
  std::string o;
  for (int i = 3; i >= 0; --i) o.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return o;
}

/// What populate() left that the checks need.
struct Expect {
  std::uint64_t events_committed[kEventLanes] = {};  // group g1 of noisy.events
  std::uint64_t jobs_acked = 0;                       // group of noisy.jobs
  std::uint64_t jobs_claimed = 0;                     // in flight (claims expire at once)
};

/// SRC with namespace "noisy" in every table and namespace "quiet" beside it.
Expect populate(const std::string& dir) {
  Expect x;
  StoreOptions o;
  o.directory = dir;
  o.durability = Durability::Async;
  auto store = MUST(detail::DurableStore::open(o));
  detail::TopicSpec ts;
  ts.lanes = kEventLanes;
  auto events = MUST(store->open_topic("noisy.events", ts));
  ts.lanes = kJobLanes;
  ts.is_queue = true;
  auto jobs = MUST(store->open_topic("noisy.jobs", ts));
  detail::TopicSpec qs;
  qs.lanes = 2;
  auto quiet = MUST(store->open_topic("quiet.events", qs));
  for (std::uint64_t i = 0; i < kEvents; ++i) {
    detail::AppendRequest r;
    r.topic_id = events.id;
    r.lane = static_cast<std::uint32_t>(i % kEventLanes);
    r.key = "k" + std::to_string(i % 17);
    r.payload = "event-" + std::to_string(i);
    REQUIRE(store->append_async(std::move(r), [](const Status& s, const detail::AppendResult&) { REQUIRE(s.ok()); }).ok());
  }
  for (std::uint64_t i = 0; i < kJobs; ++i) {
    detail::AppendRequest r;
    r.topic_id = jobs.id;
    r.lane = static_cast<std::uint32_t>(i % kJobLanes);
    r.idempotency_key = "job-" + std::to_string(i);
    r.payload = "job-" + std::to_string(i);
    REQUIRE(store->append_async(std::move(r), [](const Status& s, const detail::AppendResult&) { REQUIRE(s.ok()); }).ok());
  }
  for (std::uint64_t i = 0; i < kQuietEvents; ++i) {
    detail::AppendRequest r;
    r.topic_id = quiet.id;
    r.lane = static_cast<std::uint32_t>(i % 2);
    r.payload = "quiet-" + std::to_string(i);
    REQUIRE(store->append(std::move(r)).ok());
  }
  // Group offsets.
  auto g1 = MUST(store->open_group(events, "g1"));
  for (std::uint32_t l = 0; l < kEventLanes; ++l) {
    x.events_committed[l] = 10 * (l + 1);
    REQUIRE(store->commit_offset(g1, l, x.events_committed[l]).ok());
  }
  auto gq = MUST(store->open_group(quiet, "reader"));
  REQUIRE(store->commit_offset(gq, 0, 7).ok());
  // Queue claims: lane 0 acks 20; 5 more stay claimed with a visibility already over.
  auto workers = MUST(store->open_group(jobs, "queue"));  // the bus's queue group
  detail::ClaimOptions co;
  co.ordered = false;
  co.visibility = std::chrono::milliseconds(1);
  auto claimed = MUST(store->claim_batch(workers, 0, 25, co));
  REQUIRE(claimed.size() == 25);
  for (std::size_t i = 0; i < 20; ++i) {
    REQUIRE(store->ack(workers, 0, claimed[i].message.offset, claimed[i].attempt).ok());
  }
  x.jobs_acked = 20;
  x.jobs_claimed = 5;
  // DLQ: three entries of noisy.jobs (one archived), two of quiet.events.
  detail::DlqStore dlq(*store);
  std::vector<std::uint64_t> noisy_ids;
  for (int i = 0; i < 5; ++i) {
    const bool noisy = i < 3;
    DlqEntry e;
    e.topic = noisy ? "noisy.jobs" : "quiet.events";
    e.topic_id = noisy ? jobs.id : quiet.id;
    e.group = noisy ? "queue" : "reader";
    e.lane = 1;
    e.offset = static_cast<std::uint64_t>(i);
    e.key = "dead-" + std::to_string(i);
    e.payload = "dead-payload-" + std::to_string(i);
    e.error_class = ErrorClass::Permanent;
    e.reason = "boom";
    e.attempts = 3;
    auto id = MUST(dlq.add(e));
    if (noisy) noisy_ids.push_back(id);
  }
  REQUIRE(dlq.archive(std::span<const std::uint64_t>(noisy_ids.data(), 1), "ops").ok());
  // Idempotency scopes, done records.
  for (const char* scope : {"noisy.pay", "quiet.pay"}) {
    IdempotencyOptions io;
    io.durable_retention = std::chrono::hours(1);  // done records also in idem_age
    detail::IdempotencyImpl idem(store.get(), scope, io);
    for (int i = 0; i < 4; ++i) {
      const std::string key = "order-" + std::to_string(i);
      REQUIRE(idem.claim(key, false).ok());
      REQUIRE(idem.complete(key, "receipt-" + std::to_string(i)).ok());
    }
  }
  // User tables, tenancy (policy, usage), schema, fence and poison bookkeeping.
  REQUIRE(store->write([&](detail::StoreTxn& t) -> Status {
    for (int i = 0; i < 5; ++i) {
      for (const char* table : {"noisy.kv", "quiet.kv"}) {
        std::string k = std::string(table) + '\0' + "key-" + std::to_string(i);
        if (Status s = t.put(detail::StoreTable::User, k, "value-" + std::to_string(i)); !s.ok()) return s;
      }
    }
    NamespacePolicy p;
    p.publish.msgs_per_s = 500;
    p.weight = 3;
    if (Status s = t.put(detail::StoreTable::Tenancy, "n/noisy", detail::encode_policy(p)); !s.ok()) return s;
    if (Status s = t.put(detail::StoreTable::Tenancy, "n/quiet", detail::encode_policy(NamespacePolicy{})); !s.ok())
      return s;
    for (std::uint64_t m = 100; m < 103; ++m) {
      NamespaceUsage u;
      u.msgs_in = m;
      u.bytes_in = 10 * m;
      for (const char* ns : {"noisy", "quiet"}) {
        if (Status s = t.put(detail::StoreTable::Tenancy, detail::usage_key(ns, m), detail::encode_usage(u)); !s.ok())
          return s;
      }
    }
    if (Status s = t.put(detail::StoreTable::Schema, "mnoisy.events", std::string(1, '\0')); !s.ok()) return s;
    if (Status s = t.put(detail::StoreTable::Schema, std::string("vnoisy.events\0\0\1", 16), "{}"); !s.ok()) return s;
    if (Status s = t.put(detail::StoreTable::Schema, "mquiet.events", std::string(1, '\0')); !s.ok()) return s;
    if (Status s = t.put(detail::StoreTable::Fence, "L" + be32(events.id) + be32(0xffffffffu), std::string(8, '\7'));
        !s.ok())
      return s;
    return Status();
  }).ok());
  // Delayed messages waiting for their due time (an hour away): three of noisy.events, two of quiet.events.
  REQUIRE(store->write([&](detail::StoreTxn& t) -> Status {
    const std::int64_t due = static_cast<std::int64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count()) + 3'600'000'000'000LL;
    for (std::uint32_t i = 0; i < 5; ++i) {
      detail::AppendRequest r;
      r.topic_id = i < 3 ? events.id : quiet.id;
      r.lane = i % 2;
      r.key = "later-" + std::to_string(i);
      r.payload = "delayed-" + std::to_string(i);
      r.header.id = 900 + i;
      r.header.created_at_ns = due + i;
      r.due_ns = due + i;
      if (Status s = detail::put_delayed(t, r, i); !s.ok()) return s;
    }
    return Status();
  }).ok());
  REQUIRE(store->write([&](detail::StoreTxn& t) -> Status {
    detail::DlqStore::TopicMark m;
    m.from = 3;
    m.to = 9;
    m.careful_to = 9;
    return dlq.set_topic_mark_in(t, g1, 2, m);
  }).ok());
  REQUIRE(store->close().ok());
  return x;
}

detail::MoveSums sums(const std::string& dir, const char* ns) {
  if (!std::filesystem::exists(dir + "/data.mdb")) return detail::MoveSums{};
  StoreOptions o;
  o.directory = dir;
  o.read_only = true;
  auto opened = detail::DurableStore::open(o);
  // A move killed while it created DST leaves an empty environment (a rerun initialises it).
  if (opened.code() == Code::NotFound) return detail::MoveSums{};
  auto store = MUST(std::move(opened));
  return MUST(detail::namespace_sums(*store, ns));
}

std::uint64_t total(const detail::MoveSums& s, bool with_policy) {
  std::uint64_t n = 0;
  for (int i = 0; i < detail::kMoveTables; ++i) {
    if (!with_policy && i == static_cast<int>(detail::MoveTable::Policy)) continue;
    n += s[static_cast<std::size_t>(i)].count;
  }
  return n;
}

/// After the move, the same names as before: consume, look up. mapped: a bus
/// on SRC with BusOptions::namespace_stores {noisy -> DST}; else a bus on DST.
void check_on_bus(const std::string& src, const std::string& dst, const Expect& x, bool mapped) {
  BusOptions o;
  o.workers = 2;
  o.store.directory = mapped ? src : dst;
  o.store.durability = Durability::Async;
  if (mapped) o.namespace_stores.push_back(NamespaceStore{"noisy", dst});
  auto bus = MUST(Bus::open(o));
  TopicOptions to;
  to.durable = true;
  to.lanes = kEventLanes;
  Topic events = MUST(bus->create_topic("noisy.events", to));
  to.lanes = kJobLanes;
  Topic jobs = MUST(bus->create_queue("noisy.jobs", to));
  std::uint64_t expect_events = 0;
  for (std::uint32_t l = 0; l < kEventLanes; ++l) expect_events += kEvents / kEventLanes - x.events_committed[l];
  const std::uint64_t expect_jobs = kJobs - x.jobs_acked;
  std::atomic<std::uint64_t> got_events{0}, got_jobs{0}, bad{0};
  auto se = bus->subscribe(events, "g1", [&](const MessageView& m) {
                  if (m.payload().substr(0, 6) != "event-") bad.fetch_add(1);
                  got_events.fetch_add(1);
                  return Outcome::ack();
                }).value();
  std::mutex mu;
  std::set<std::string> jobs_seen;
  auto sj = bus->consume(jobs, [&](const MessageView& m) {
                  std::lock_guard<std::mutex> l(mu);
                  if (!jobs_seen.insert(std::string(m.payload())).second) bad.fetch_add(1);
                  got_jobs.fetch_add(1);
                  return Outcome::ack();
                }).value();
  CHECK(lanebus::test::wait_until([&] { return got_events.load() >= expect_events && got_jobs.load() >= expect_jobs; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(got_events.load() == expect_events);
  CHECK(got_jobs.load() == expect_jobs);
  CHECK(bad.load() == 0);
  CHECK(MUST(bus->table_get("noisy.kv", "key-3")) == "value-3");
  auto idem = MUST(bus->idempotency("noisy.pay"));
  auto ks = MUST(idem->status("order-2"));
  CHECK(ks.state == ClaimState::Done);
  CHECK(ks.result == "receipt-2");
  auto info = MUST(bus->namespaces()->describe("noisy"));
  CHECK(info.declared);
  CHECK(info.policy.weight == 3);
  if (mapped) {
    // Other namespaces stay in SRC, through the same bus.
    CHECK(MUST(bus->table_get("quiet.kv", "key-1")) == "value-1");
    to.lanes = 2;
    CHECK(MUST(bus->create_topic("quiet.events", to)).is_durable());
    CHECK(MUST(bus->find("noisy.events")).name() == "noisy.events");
    for (const DlqEntry& e : MUST(MUST(bus->dead_letters())->list())) CHECK(e.topic == "quiet.events");
  } else {
    CHECK(bus->table_get("quiet.kv", "key-3").code() == Code::NotFound);
    auto dl = MUST(MUST(bus->dead_letters())->list());
    REQUIRE(dl.size() == 3);
    int archived = 0;
    for (const DlqEntry& e : dl) {
      CHECK(e.topic == "noisy.jobs");
      CHECK(e.topic_id != 0);
      if (e.state == DlqState::Archived) ++archived;
    }
    CHECK(archived == 1);
    CHECK(info.usage.msgs_in == 100 + 101 + 102);  // the usage moved with the namespace
  }
  (void)se.close();
  (void)sj.close();
  (void)bus->shutdown(ShutdownMode::Drain);
}

struct Dirs {
  lanebus::test::TempDir tmp;
  std::string src = tmp.file("src"), dst = tmp.file("dst");
  std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");
  std::string move_cmd(const std::string& ns = "noisy") const { return tool + " namespace move " + src + " " + dst + " " + ns; }
};

}  // namespace

TEST_CASE("namespace move: every table moves, verified, and a bus on DST uses the same names") {
  Dirs d;
  REQUIRE_FALSE(d.tool.empty());
  const Expect x = populate(d.src);
  const detail::MoveSums before = sums(d.src, "noisy");
  const detail::MoveSums quiet_before = sums(d.src, "quiet");
  for (int i = 0; i < detail::kMoveTables; ++i) {
    INFO("table " << std::string(detail::move_table_name(static_cast<detail::MoveTable>(i))));
    CHECK(before[static_cast<std::size_t>(i)].count > 0);  // data in every table
  }
  std::string out;
  REQUIRE(run_shell(d.move_cmd(), &out) == 0);
  INFO(out);
  CHECK(contains(out, "verified"));
  CHECK(contains(out, "moved namespace \"noisy\""));
  CHECK(sums(d.dst, "noisy") == before);
  const detail::MoveSums left = sums(d.src, "noisy");
  CHECK(total(left, false) == 0);
  CHECK(left[static_cast<std::size_t>(detail::MoveTable::Policy)].count == 1);  // the policy stays in SRC
  CHECK(sums(d.src, "quiet") == quiet_before);
  // Rerunning a finished move is OK and changes nothing.
  REQUIRE(run_shell(d.move_cmd(), &out) == 0);
  CHECK(contains(out, "already moved"));
  CHECK(sums(d.dst, "noisy") == before);
  check_on_bus(d.src, d.dst, x, false);
  // A bus on SRC refuses to grow the namespace there again, naming DST; other namespaces work.
  {
    BusOptions o;
    o.store.directory = d.src;
    auto bus = MUST(Bus::open(o));
    TopicOptions to;
    to.durable = true;
    to.lanes = kEventLanes;
    auto again = bus->create_topic("noisy.events", to);
    CHECK(again.code() == Code::Conflict);
    CHECK(contains(again.status().to_string(), "was moved to the store"));
    CHECK(contains(again.status().to_string(), std::filesystem::canonical(d.dst).string()));
    CHECK(bus->idempotency("noisy.pay").code() == Code::Conflict);
    to.lanes = 2;
    CHECK(bus->create_topic("quiet.events", to).ok());
    CHECK(bus->idempotency("quiet.pay").ok());
    (void)bus->shutdown(ShutdownMode::Drain);
  }
}

TEST_CASE("namespace move: delayed messages move with their namespace and are delivered from DST on time") {
  Dirs d;
  REQUIRE_FALSE(d.tool.empty());
  auto wall_ns = [] {
    return static_cast<std::int64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
  };
  constexpr int kNoisy = 20, kQuiet = 5;
  TopicOptions to;
  to.durable = true;
  to.lanes = 2;
  std::map<std::string, std::int64_t> due;  // payload -> due time
  {
    BusOptions o;
    o.workers = 2;
    o.store.directory = d.src;
    auto bus = MUST(Bus::open(o));
    Topic noisy = MUST(bus->create_topic("noisy.reminders", to));
    Topic quiet = MUST(bus->create_topic("quiet.reminders", to));
    const std::int64_t first = wall_ns() + 1'500'000'000;  // after the move
    for (int i = 0; i < kNoisy + kQuiet; ++i) {
      const std::string p = (i < kNoisy ? "noisy-" : "quiet-") + std::to_string(i);
      const std::string key = "user-" + std::to_string(i % 3);
      OutgoingMessage m{.key = key, .payload = p};
      m.deliver_at = first + std::int64_t{i} * 10'000'000;
      REQUIRE((i < kNoisy ? noisy : quiet).publish(m).ok());
      due[p] = m.deliver_at;
    }
    REQUIRE(bus->shutdown(ShutdownMode::Drain).ok());
  }
  auto waiting = [](const std::string& dir) {
    StoreOptions o;
    o.directory = dir;
    o.read_only = true;
    auto store = MUST(detail::DurableStore::open(o));
    return MUST(detail::count_delayed(*store, 0));
  };
  const detail::MoveSums before = sums(d.src, "noisy");
  CHECK(before[static_cast<std::size_t>(detail::MoveTable::Delayed)].count == kNoisy);
  std::string out;
  REQUIRE(run_shell(d.move_cmd(), &out) == 0);
  INFO(out);
  CHECK(contains(out, std::to_string(kNoisy) + " delayed"));
  CHECK(sums(d.dst, "noisy") == before);  // verified: the same entries, remapped to DST's topic id
  CHECK(waiting(d.src) == kQuiet);        // quiet's stay in SRC
  CHECK(waiting(d.dst) == kNoisy);
  // A bus on DST delivers them: each once, never before its due time, entering its lane at its due time.
  BusOptions o;
  o.workers = 2;
  o.store.directory = d.dst;
  auto bus = MUST(Bus::open(o));
  Topic noisy = MUST(bus->create_topic("noisy.reminders", to));
  std::mutex mu;
  std::map<std::string, int> got;
  std::uint64_t early = 0, wrong_created = 0;
  auto sub = MUST(bus->subscribe(noisy, "g", [&](const MessageView& m) {
    const std::int64_t now = wall_ns();
    std::lock_guard<std::mutex> l(mu);
    const std::string p(m.payload());
    got[p] += 1;
    auto it = due.find(p);
    if (it == due.end() || now < it->second - 1'000'000) ++early;  // 1 ms: the bus's clock against ours
    if (it == due.end() || m.created_at_ns() != it->second) ++wrong_created;
    return Outcome::ack();
  }));
  CHECK(lanebus::test::wait_until([&] {
    std::lock_guard<std::mutex> l(mu);
    return got.size() == kNoisy;
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  {
    std::lock_guard<std::mutex> l(mu);
    CHECK(got.size() == kNoisy);
    for (const auto& [p, n] : got) {
      CHECK_MESSAGE(n == 1, p << " delivered " << n << " times");
      CHECK(p.rfind("noisy-", 0) == 0);
    }
    CHECK(early == 0);
    CHECK(wrong_created == 0);
  }
  REQUIRE(sub.close().ok());
  REQUIRE(bus->shutdown(ShutdownMode::Drain).ok());
  bus.reset();
  CHECK(waiting(d.dst) == 0);
}

TEST_CASE("namespace move: killed with SIGKILL at random points, reruns finish it") {
  Dirs d;
  REQUIRE_FALSE(d.tool.empty());
  const std::uint64_t seed = lanebus::test::test_seed("namespace_move kill");
  std::mt19937_64 rng(seed);
  const std::uint64_t cycles = lanebus::test::env_size("LANEBUS_CRASH_CYCLES", lanebus::test::kSanitized ? 6 : 20);
  const char* points[] = {"start", "src-marked", "copying", "copied", "verified", "deleting", "src-deleted", "done"};
  const auto t0 = std::chrono::steady_clock::now();
  std::uint64_t kills = 0;
  for (std::uint64_t c = 0; c < cycles; ++c) {
    std::filesystem::remove_all(d.src);
    std::filesystem::remove_all(d.dst);
    const Expect x = populate(d.src);
    const detail::MoveSums before = sums(d.src, "noisy");
    const detail::MoveSums quiet_before = sums(d.src, "quiet");
    // Up to three killed runs, then one that must finish.
    const int killed_runs = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < killed_runs; ++k) {
      lanebus::test::Child* child = nullptr;
      const bool by_point = rng() % 3 != 0;
      std::string at;
      if (by_point) {
        at = points[rng() % std::size(points)];
        if (at == "copying") at += ":" + std::to_string(1 + rng() % 2);
        ::setenv("LANEBUS_TEST_MOVE_KILL_AT", at.c_str(), 1);
      }
      child = new lanebus::test::Child({d.tool, "namespace", "move", d.src, d.dst, "noisy"});
      ::unsetenv("LANEBUS_TEST_MOVE_KILL_AT");
      REQUIRE(child->started());
      if (!by_point) {
        const auto delay = std::chrono::microseconds(rng() % 150000);
        std::this_thread::sleep_for(delay);
        child->signal(SIGKILL);  // kill -9 (may come after it finished)
        at = "after " + std::to_string(delay.count()) + " us";
      }
      const int rc = child->wait();
      delete child;
      INFO("cycle " << c << " kill " << k << " at " << at << " rc " << rc);
      CHECK((rc == 128 + SIGKILL || rc == 0));
      if (rc == 128 + SIGKILL) ++kills;
      // Never in neither store, never half: whatever is in DST equals SRC's, or DST is empty.
      const detail::MoveSums in_dst = sums(d.dst, "noisy");
      const detail::MoveSums in_src = sums(d.src, "noisy");
      CHECK((in_dst == before || total(in_dst, true) == 0));
      CHECK((in_src == before || total(in_src, false) == 0));
      CHECK((total(in_dst, true) != 0 || in_src == before));
    }
    std::string out;
    const int rc = run_shell(d.move_cmd(), &out);
    INFO("cycle " << c << ": " << out);
    REQUIRE(rc == 0);
    CHECK(sums(d.dst, "noisy") == before);
    CHECK(total(sums(d.src, "noisy"), false) == 0);
    CHECK(sums(d.src, "quiet") == quiet_before);
    if (c == 0 || c + 1 == cycles) check_on_bus(d.src, d.dst, x, c == 0);
  }
  lanebus::test::print_figures("namespace_move kill", kills, cycles * (kEvents + kJobs), t0);
}

TEST_CASE("namespace move: bad input gets a clear error and exit code") {
  Dirs d;
  REQUIRE_FALSE(d.tool.empty());
  std::string out;
  CHECK(run_shell(d.tool + " namespace", &out) == 2);
  CHECK(run_shell(d.tool + " namespace move " + d.src, &out) == 2);
  CHECK(contains(out, "needs SRC_DIR DST_DIR NAMESPACE"));
  CHECK(run_shell(d.tool + " namespace rename a b c", &out) == 2);
  // A missing source directory.
  CHECK(run_shell(d.move_cmd(), &out) == 1);
  CHECK(contains(out, "is not a directory"));
  std::filesystem::create_directories(d.src);
  CHECK(run_shell(d.move_cmd(), &out) == 1);
  CHECK(contains(out, "holds no lanebus store"));
  populate(d.src);
  const detail::MoveSums before = sums(d.src, "noisy");
  // An invalid name, an empty namespace, the same store twice.
  CHECK(run_shell(d.move_cmd("Not_Valid!"), &out) == 1);
  CHECK(contains(out, "InvalidName"));
  CHECK(run_shell(d.move_cmd("ghost"), &out) == 1);
  CHECK(contains(out, "has nothing"));
  CHECK(run_shell(d.tool + " namespace move " + d.src + " " + d.src + " noisy", &out) == 1);
  CHECK(contains(out, "same store"));
  CHECK_FALSE(std::filesystem::exists(d.dst));  // refused before creating anything
  // A store open in another process (here: this one) is refused.
  {
    StoreOptions o;
    o.directory = d.src;
    auto live = MUST(detail::DurableStore::open(o));
    CHECK(run_shell(d.move_cmd(), &out) == 1);
    CHECK(contains(out, "is open by process " + std::to_string(::getpid())));
    REQUIRE(live->close().ok());
  }
  // DST already holding a topic of the namespace.
  {
    StoreOptions o;
    o.directory = d.dst;
    auto other = MUST(detail::DurableStore::open(o));
    REQUIRE(other->open_topic("noisy.events", detail::TopicSpec{}).ok());
    REQUIRE(other->close().ok());
  }
  CHECK(run_shell(d.move_cmd(), &out) == 1);
  CHECK(contains(out, "already holds data of namespace \"noisy\""));
  CHECK(sums(d.src, "noisy") == before);  // nothing was touched
  // A second DST while a move to the first is under way (killed after marking SRC).
  std::filesystem::remove_all(d.dst);
  ::setenv("LANEBUS_TEST_MOVE_KILL_AT", "copied", 1);
  CHECK(run_shell(d.move_cmd(), &out) == 128 + SIGKILL);
  ::unsetenv("LANEBUS_TEST_MOVE_KILL_AT");
  CHECK(run_shell(d.tool + " namespace move " + d.src + " " + d.tmp.file("other") + " noisy", &out) == 1);
  CHECK(contains(out, "being moved to"));
  CHECK(run_shell(d.move_cmd(), &out) == 0);
  CHECK(contains(out, "resuming"));
  CHECK(sums(d.dst, "noisy") == before);
}
