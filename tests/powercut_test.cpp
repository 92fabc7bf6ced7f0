// lanebus — MIT License.
// Simulated power loss: several real processes publish,
// consume, dead-letter and complete idempotency keys through the public Bus
// while the faultfs shim (tests/support/faultfs.cpp) journals every write to
// data.mdb that is not durable yet. At a random moment every process is
// SIGKILLed, then the "power is cut": the file becomes its image as of the
// last successful fsync plus a random subset of the pages written since
// (faultfs::power_cut). The store is then reopened through the library and
// checked against what the processes reported as done. Model and limits:
// doc/power-loss.md. The Sync run also publishes delayed messages (topic
// pc.later, due 1..61 ms after publish): after every cut each one that was
// acknowledged is exactly once either waiting in the delayed index or in its
// lane's log (moved, with its due time), never lost, never moved twice; at
// the end a new group receives every one of them once, none before its due
// time (doc/delays.md).
//
// LANEBUS_POWER_CUTS sets the number of cuts of the Sync run (default 200, 100
// under a sanitizer; the Async run does a 40th, at least 5). LANEBUS_SEED replays a run.
#include <doctest/doctest.h>

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "delayed_index.hpp"
#include "durable_store.hpp"
#include "faultfs.hpp"
#include "lanebus/lanebus.hpp"
#include "powercut.hpp"
#include "process.hpp"
#include "seed.hpp"
#include "sizes.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::detail::DurableStore;
using lanebus::test::Child;
namespace pc = lanebus::test::powercut;
namespace faults = lanebus::test::faultfs;

namespace {

// 200 cuts in CI's plain stage, 100 under a sanitizer (ASan+UBSan and TSan
// stages), 2,000 with --setup soak.
int power_cuts() {
  return static_cast<int>(lanebus::test::env_size("LANEBUS_POWER_CUTS", lanebus::test::kSanitized ? 100 : 200));
}

std::string need_env(const char* name) {
  std::string p = lanebus::test::helper_path(name);
  REQUIRE_MESSAGE(!p.empty(), name << " is not set (run through meson test)");
  return p;
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

struct Published {
  std::uint32_t crc = 0;
  std::int64_t ok_ms = 0;  // when publish returned OK (CLOCK_MONOTONIC)
  int cut = 0;
};

// A delayed publish to pc.later that returned OK (Sync).
struct Delayed {
  std::uint32_t crc = 0;
  std::int64_t due_ns = 0;  // its deliver_at, wall clock
  int cut = 0;
};

// Everything the children reported as done, over all cuts.
struct Oracle {
  std::map<std::pair<std::string, std::uint64_t>, Published> events, jobs;
  std::map<std::pair<std::string, std::uint64_t>, Delayed> later;
  std::map<std::string, std::set<std::string>> idem;  // scope -> keys completed
  std::map<std::pair<std::string, std::uint64_t>, std::uint32_t> max_attempt;
  std::uint64_t committed[4] = {0, 0, 0, 0};  // audit group: reported committed past (offset + 1)
  std::uint64_t attempt_regressions = 0;
  std::uint64_t reports = 0;
};

struct Figures {
  int cuts = 0;
  int torn = 0;          // cuts that kept some unsynced pages and lost others
  int with_unsynced = 0; // cuts with any write not yet durable
  int in_flight = 0;     // writes whose process was killed inside them (undone, never redone)
  std::uint64_t unsynced_pages = 0;
  std::uint64_t verified = 0;  // publish checks (message found, CRC equal)
  std::uint64_t lost_in_bound = 0;  // Async: lost although a later flush succeeded
  std::uint64_t lost_beyond_interval = 0;  // Async: lost publishes older than interval + 1 s
  std::uint64_t flushes = 0;  // successful fsyncs of data.mdb, all cuts
  std::uint64_t lost_recent = 0;    // Async: newer publishes lost (allowed)
  std::int64_t max_loss_age_ms = -1;  // Async: oldest lost publish, ms before the kill
  std::uint64_t later_waiting = 0;  // delayed checks: found waiting in the delayed index
  std::uint64_t later_moved = 0;    // delayed checks: found in pc.later's log (moved when due)
  std::uint64_t later_lost = 0;     // acknowledged, in neither
  std::uint64_t later_twice = 0;    // in the log and the index, or twice in either
};

class PowerCutRun {
 public:
  PowerCutRun(Durability d, std::chrono::milliseconds flush)
      : durability_(d), flush_(flush), child_(need_env("LANEBUS_POWERCUT_CHILD")),
        shim_(need_env("LANEBUS_FAULTFS_SHIM")) {
    store_ = dir_.file("store");
    data_ = store_ + "/data.mdb";
    journal_ = dir_.file("journal");
    // Create the store and its tables once, durably, without the shim.
    auto bus = Bus::open(bus_options()).value();
    REQUIRE(bus->create_topic("pc.events", {.lanes = 4, .durable = true}).ok());
    REQUIRE(bus->create_queue("pc.jobs", {.lanes = 2, .durable = true}).ok());
    REQUIRE(bus->create_topic("pc.later", {.lanes = 2, .durable = true}).ok());
    REQUIRE(bus->idempotency("pc.idem").ok());
    REQUIRE(bus->shutdown(ShutdownMode::Drain, 10s).ok());
    bus.reset();
    // Only the children get the shim.
    ::setenv("LD_PRELOAD", shim_.c_str(), 1);
    ::setenv("LANEBUS_FAULTFS_FILE", data_.c_str(), 1);
    ::setenv("LANEBUS_FAULTFS_JOURNAL", journal_.c_str(), 1);
    synclog_ = dir_.file("synclog");
    ::setenv("LANEBUS_FAULTFS_SYNCLOG", synclog_.c_str(), 1);
  }
  ~PowerCutRun() {
    ::unsetenv("LD_PRELOAD");
    ::unsetenv("LANEBUS_FAULTFS_FILE");
    ::unsetenv("LANEBUS_FAULTFS_JOURNAL");
    ::unsetenv("LANEBUS_FAULTFS_SYNCLOG");
  }

  BusOptions bus_options() const {
    BusOptions o;
    o.workers = 2;
    o.store.directory = store_;
    o.store.durability = durability_;
    o.store.async_flush_interval = flush_;
    o.store.map_size_initial = 8ull << 20;
    o.durable_poll = 10ms;
    return o;
  }

  // One cycle: start the processes, let them run `run`, kill them all, cut
  // the power, verify. `full`: check every report so far, not only new ones.
  void cycle(int cut, std::chrono::milliseconds run, faults::Device device, std::mt19937_64& rng, bool full) {
    const char* mode = durability_ == Durability::Sync ? "sync" : "async";
    const std::string flush = std::to_string(flush_.count());
    std::vector<std::unique_ptr<Child>> kids;
    for (int p = 0; p < 2; ++p) {
      const std::string tag = "c" + std::to_string(cut) + "p" + std::to_string(p);
      kids.push_back(std::make_unique<Child>(std::vector<std::string>{child_, "publish", store_, tag, mode, flush, "2"}));
    }
    kids.push_back(std::make_unique<Child>(
        std::vector<std::string>{child_, "consume", store_, "c" + std::to_string(cut) + "q", mode, flush}));
    std::vector<std::vector<std::string>> lines(kids.size());
    for (std::size_t i = 0; i < kids.size(); ++i) {
      REQUIRE(kids[i]->started());
      // A consumer may report deliveries before it says ready.
      std::string l;
      while (!(l = kids[i]->read_line(60s)).empty() && l != "ready") lines[i].push_back(l);
      INFO("cut " << cut << " child " << i << (lines[i].empty() ? "" : ", last line: " + lines[i].back()));
      REQUIRE(l == "ready");
    }
    std::this_thread::sleep_for(run);
    for (auto& k : kids) k->signal(SIGKILL);
    const std::int64_t kill_ms = pc::now_ms();
    for (std::size_t i = 0; i < kids.size(); ++i) {
      for (std::string l; !(l = kids[i]->read_line(30s)).empty();) lines[i].push_back(l);
      const int rc = kids[i]->wait();
      INFO("cut " << cut << " child " << i << " exit " << rc << (lines[i].empty() ? "" : ", last line: " + lines[i].back()));
      REQUIRE_MESSAGE(rc == 128 + SIGKILL, "a child died on its own (crash or error) instead of by our SIGKILL");
    }
    // When the last successful fsync before the kill started, and how many there were.
    {
      std::ifstream in(synclog_);
      int n = 0;
      last_sync_ms_ = 0;
      for (std::string l; std::getline(in, l);) {
        if (l.empty()) continue;
        last_sync_ms_ = std::max<std::int64_t>(last_sync_ms_, std::stoll(l));
        ++n;
      }
      (void)!::truncate(synclog_.c_str(), 0);
      figures_.flushes += n;
      if (durability_ == Durability::Async) {
        CHECK_MESSAGE(n > 0, "cut " << cut << ": no flush (fsync) at all during a " << run.count()
                                    << " ms Async run with async_flush_interval " << flush_.count() << " ms");
      }
    }
    // The power cut.
    faults::CutReport rep = faults::power_cut(data_, journal_, rng, device);
    figures_.cuts += 1;
    if (rep.records > 0) figures_.with_unsynced += 1;
    figures_.in_flight += static_cast<int>(rep.in_flight);
    if (rep.torn()) figures_.torn += 1;
    figures_.unsynced_pages += rep.pages;
    if (std::getenv("LANEBUS_POWERCUT_TRACE") != nullptr) {
      MESSAGE("cut " << cut << ": unsynced writes " << rep.records << ", pages " << rep.pages << ", kept " << rep.kept << ", in flight " << rep.in_flight);
    }
    // Fold this cut's reports into the oracle.
    std::vector<std::pair<std::string, std::uint64_t>> new_events, new_jobs, new_later;
    std::vector<std::pair<std::string, std::string>> new_idem;
    std::uint64_t new_committed[4] = {0, 0, 0, 0};
    for (auto& ls : lines) {
      for (const std::string& l : ls) {
        auto w = words(l);
        REQUIRE_MESSAGE(!w.empty(), "empty report line");
        REQUIRE_MESSAGE(w[0] != "X", "cut " << cut << ": a child reported an error: " << l);
        oracle_.reports += 1;
        if ((w[0] == "E" || w[0] == "J") && w.size() == 5) {
          auto k = std::make_pair(w[1], std::stoull(w[2]));
          Published p{static_cast<std::uint32_t>(std::stoul(w[3])), std::stoll(w[4]), cut};
          (w[0] == "E" ? oracle_.events : oracle_.jobs)[k] = p;
          (w[0] == "E" ? new_events : new_jobs).push_back(k);
        } else if (w[0] == "L" && w.size() == 5) {
          auto k = std::make_pair(w[1], std::stoull(w[2]));
          oracle_.later[k] = Delayed{static_cast<std::uint32_t>(std::stoul(w[3])), std::stoll(w[4]), cut};
          new_later.push_back(k);
        } else if (w[0] == "I" && w.size() == 3) {
          oracle_.idem[w[1]].insert(w[2]);
          new_idem.emplace_back(w[1], w[2]);
        } else if (w[0] == "D" && w.size() == 4) {
          auto k = std::make_pair(w[1], std::stoull(w[2]));
          auto a = static_cast<std::uint32_t>(std::stoul(w[3]));
          auto it = oracle_.max_attempt.find(k);
          if (durability_ == Durability::Sync && it != oracle_.max_attempt.end() && a < it->second) {
            oracle_.attempt_regressions += 1;
            FAIL_CHECK("cut " << cut << ": " << k.first << "/" << k.second << " delivered with attempt " << a
                              << " after attempt " << it->second << " was committed");
          }
          if (it == oracle_.max_attempt.end() || a > it->second) oracle_.max_attempt[k] = a;
        } else if (w[0] == "O" && w.size() == 3) {
          auto lane = std::stoul(w[1]);
          REQUIRE(lane < 4);
          new_committed[lane] = std::max<std::uint64_t>(new_committed[lane], std::stoull(w[2]) + 1);
        } else {
          FAIL("cut " << cut << ": unexpected report line: " << l);
        }
      }
    }
    for (int lane = 0; lane < 4; ++lane) oracle_.committed[lane] = std::max(oracle_.committed[lane], new_committed[lane]);
    if (full) {
      new_events.clear();
      new_jobs.clear();
      for (auto& [k, v] : oracle_.events) new_events.push_back(k);
      for (auto& [k, v] : oracle_.jobs) new_jobs.push_back(k);
      new_later.clear();
      for (auto& [k, v] : oracle_.later) new_later.push_back(k);
    }
    verify(cut, kill_ms, new_events, new_jobs, full ? all_idem() : new_idem);
    if (durability_ == Durability::Sync) verify_later(cut, new_later);
  }

  std::vector<std::pair<std::string, std::string>> all_idem() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (auto& [scope, keys] : oracle_.idem)
      for (auto& k : keys) out.emplace_back(scope, k);
    return out;
  }

  // Reads lanes [from, end) of a topic into (tag, seq) -> crc.
  void read_topic(DurableStore& store, const char* name, std::map<std::pair<std::string, std::uint64_t>, std::uint32_t>* out,
                  int cut) {
    auto t = store.find_topic(name);
    REQUIRE_MESSAGE(t.ok(), "cut " << cut << ": " << t.status().to_string());
    for (std::uint32_t lane = 0; lane < t->lanes; ++lane) {
      for (std::uint64_t from = 0;;) {
        auto b = store.read(*t, lane, from);
        REQUIRE_MESSAGE(b.ok(), "cut " << cut << ": read " << std::string(name) << " lane " << lane << ": " << b.status().to_string());
        if (b->messages.empty()) break;
        for (const auto& m : b->messages) {
          std::string tag;
          std::uint64_t seq = 0;
          REQUIRE(pc::parse(m.payload, &tag, &seq));
          (*out)[{tag, seq}] = pc::crc32(m.payload);
        }
        from = b->next_offset;
      }
    }
  }

  void verify(int cut, std::int64_t kill_ms, const std::vector<std::pair<std::string, std::uint64_t>>& events,
              const std::vector<std::pair<std::string, std::uint64_t>>& jobs,
              const std::vector<std::pair<std::string, std::string>>& idem) {
    const bool sync = durability_ == Durability::Sync;
    {
      StoreOptions so = bus_options().store;
      auto store = DurableStore::open(so);
      // Sync promises an intact store after any cut; Async assumes a file
      // system that keeps write order (the Ordered device model).
      REQUIRE_MESSAGE(store.ok(), "cut " << cut << ": the store does not open after the power cut: "
                                         << store.status().to_string());
      std::map<std::pair<std::string, std::uint64_t>, std::uint32_t> stored_events, stored_jobs;
      read_topic(**store, "pc.events", &stored_events, cut);
      read_topic(**store, "pc.jobs", &stored_jobs, cut);
      auto check = [&](const char* what, const std::vector<std::pair<std::string, std::uint64_t>>& keys,
                       std::map<std::pair<std::string, std::uint64_t>, Published>& reported,
                       std::map<std::pair<std::string, std::uint64_t>, std::uint32_t>& stored) {
        for (const auto& k : keys) {
          const Published& p = reported[k];
          auto it = stored.find(k);
          const bool present = it != stored.end();
          if (present) {
            CHECK_MESSAGE(it->second == p.crc, "cut " << cut << ": " << what << " " << k.first << "/" << k.second
                                                      << " is present with other bytes (CRC)");
            figures_.verified += 1;
            continue;
          }
          if (sync) {
            FAIL_CHECK("cut " << cut << ": " << what << " " << k.first << "/" << k.second
                              << " returned OK (Sync) and is gone after the power cut");
            continue;
          }
          // Async: only this cut's publishes can be lost, and only the recent ones.
          if (p.cut != cut) {
            FAIL_CHECK("cut " << cut << ": Async " << what << " " << k.first << "/" << k.second << " of cut " << p.cut
                              << " was lost by a later power cut");
            continue;
          }
          // The promise: a flush (every async_flush_interval) makes everything
          // committed before it durable. A publish acknowledged before the
          // start of a flush that succeeded must survive; one acknowledged
          // later may be lost. How old the lost ones are is reported against
          // interval + 1 s (timing is a figure here, not a verdict).
          const std::int64_t age = kill_ms - p.ok_ms;
          figures_.max_loss_age_ms = std::max(figures_.max_loss_age_ms, age);
          if (age > async_bound_ms()) figures_.lost_beyond_interval += 1;
          if (p.ok_ms < last_sync_ms_) {
            figures_.lost_in_bound += 1;
            FAIL_CHECK("cut " << cut << ": Async " << what << " " << k.first << "/" << k.second << " acknowledged "
                              << age << " ms before the power cut, before a flush that succeeded "
                              << (kill_ms - last_sync_ms_) << " ms before the cut, is lost");
          } else {
            figures_.lost_recent += 1;
            reported.erase(k);  // lost within the promise: forget it
          }
        }
      };
      check("publish to pc.events", events, oracle_.events, stored_events);
      check("publish to pc.jobs", jobs, oracle_.jobs, stored_jobs);
      if (sync) {
        auto t = (*store)->find_topic("pc.events");
        REQUIRE(t.ok());
        auto g = (*store)->find_group(*t, "audit");
        if (g.ok()) {
          auto info = (*store)->group_info(*g);
          REQUIRE(info.ok());
          for (std::uint32_t lane = 0; lane < 4 && lane < info->size(); ++lane) {
            CHECK_MESSAGE((*info)[lane].committed >= oracle_.committed[lane],
                          "cut " << cut << ": group audit lane " << lane << " committed offset went back to "
                                 << (*info)[lane].committed << " below the reported " << oracle_.committed[lane]);
          }
        } else {
          for (auto c : oracle_.committed) CHECK(c == 0);
        }
      }
      REQUIRE((*store)->close().ok());
    }
    // Through the public API: idempotency records, and the store still works.
    auto bus = Bus::open(bus_options());
    REQUIRE_MESSAGE(bus.ok(), "cut " << cut << ": " << bus.status().to_string());
    if (sync) {
      for (auto& [scope, key] : idem) {
        auto table = (*bus)->idempotency(scope);
        REQUIRE(table.ok());
        auto st = (*table)->status(key);
        CHECK_MESSAGE((st.ok() && st->state == ClaimState::Done),
                      "cut " << cut << ": idempotency key " << scope << "/" << key << " was completed and is "
                             << (st.ok() ? "not done" : st.status().to_string()) << " after the power cut");
      }
    }
    auto t = (*bus)->create_topic("pc.events", {.lanes = 4, .durable = true});
    REQUIRE_MESSAGE(t.ok(), "cut " << cut << ": " << t.status().to_string());
    const std::string tag = "v" + std::to_string(cut);
    const std::string p = pc::payload(tag, 1);
    Status s = t->publish({.key = "verify", .payload = p});
    REQUIRE_MESSAGE(s.ok(), "cut " << cut << ": publish after reopening: " << s.to_string());
    oracle_.events[{tag, 1}] = Published{pc::crc32(p), pc::now_ms(), cut};
    REQUIRE((*bus)->shutdown(ShutdownMode::Drain, 10s).ok());
  }

  // Drain pc.jobs in this process: every message the consumers rejected is
  // in the DLQ exactly once (the entry and the ack commit together), and no
  // other message is there twice.
  void final_drain() {
    ::unsetenv("LD_PRELOAD");
    auto bus = Bus::open(bus_options()).value();
    auto jobs = bus->create_queue("pc.jobs", {.lanes = 2, .durable = true}).value();
    REQUIRE(bus->idempotency("pc.jobs.idem").ok());
    GroupOptions g;
    g.max_attempts = 1000;
    g.visibility = 300ms;
    g.idempotency_scope = "pc.jobs.idem";
    auto sub = bus->consume(
                      jobs,
                      [](const MessageView& m) {
                        std::string tag;
                        std::uint64_t seq = 0;
                        if (!pc::parse(m.payload(), &tag, &seq)) return Outcome::reject("not ours");
                        return seq % 2 == 0 ? Outcome::reject("even seq") : Outcome::ack();
                      },
                      g)
                   .value();
    auto lag = [&]() -> std::uint64_t {
      for (const auto& ts : bus->stats().topics)
        if (ts.name == "pc.jobs")
          for (const auto& gs : ts.groups) return gs.total.in_flight;
      return ~std::uint64_t{0};
    };
    REQUIRE_MESSAGE(lanebus::test::wait_until([&] { return lag() == 0; }, 60s), "pc.jobs did not drain: lag " << lag());
    REQUIRE(sub.close().ok());
    auto dlq = bus->dead_letters().value();
    auto entries = dlq->list({.topic = std::string("pc.jobs")}).value();
    std::map<std::pair<std::string, std::uint64_t>, int> count;
    for (const auto& e : entries) {
      std::string tag;
      std::uint64_t seq = 0;
      REQUIRE(pc::parse(e.payload, &tag, &seq));
      count[{tag, seq}] += 1;
    }
    for (auto& [k, n] : count) CHECK_MESSAGE(n == 1, k.first << "/" << k.second << " is in the DLQ " << n << " times");
    std::uint64_t rejected = 0;
    for (auto& [k, p] : oracle_.jobs) {
      if (k.second % 2 != 0) continue;
      rejected += 1;
      CHECK_MESSAGE(count[k] == 1, k.first << "/" << k.second << " was rejected but is in the DLQ " << count[k]
                                          << " times");
    }
    dlq_entries_ = entries.size();
    dlq_rejected_ = rejected;
    REQUIRE(bus->shutdown(ShutdownMode::Drain, 10s).ok());
  }

  // Sync: every acknowledged delayed publish is, after the cut, exactly once
  // in pc.later: waiting in the delayed index (with its due time) or moved to
  // its lane's log (created_at = due time, the record's due time kept).
  // `keys`: the ones to check (this cut's, or all); duplicates are looked
  // for among everything stored.
  void verify_later(int cut, const std::vector<std::pair<std::string, std::uint64_t>>& keys) {
    StoreOptions so = bus_options().store;
    auto store = DurableStore::open(so);
    REQUIRE_MESSAGE(store.ok(), "cut " << cut << ": " << store.status().to_string());
    auto t = (*store)->find_topic("pc.later");
    REQUIRE_MESSAGE(t.ok(), "cut " << cut << ": " << t.status().to_string());
    struct Found {
      int logged = 0, waiting = 0;
      std::uint32_t crc = 0;
      std::int64_t due_ns = 0;      // 0: appended undelayed (published at or after its due time)
      std::int64_t created_ns = 0;  // log records
    };
    std::map<std::pair<std::string, std::uint64_t>, Found> found;
    for (std::uint32_t lane = 0; lane < t->lanes; ++lane) {
      for (std::uint64_t from = 0;;) {
        auto b = (*store)->read(*t, lane, from);
        REQUIRE_MESSAGE(b.ok(), "cut " << cut << ": read pc.later lane " << lane << ": " << b.status().to_string());
        if (b->messages.empty()) break;
        for (const auto& m : b->messages) {
          std::string tag;
          std::uint64_t seq = 0;
          REQUIRE(pc::parse(m.payload, &tag, &seq));
          Found& f = found[{tag, seq}];
          f.logged += 1;
          f.crc = pc::crc32(m.payload);
          f.due_ns = m.due_ns;
          f.created_ns = m.header.created_at_ns;
          // A delayed record entered its lane at its due time; one published
          // when its deliver_at had passed already is an ordinary record (due 0).
          CHECK_MESSAGE((m.due_ns == 0 || m.header.created_at_ns == m.due_ns),
                        "cut " << cut << ": pc.later " << tag << "/" << seq << " entered its lane with created_at "
                               << m.header.created_at_ns << ", not its due time " << m.due_ns);
        }
        from = b->next_offset;
      }
    }
    Status scan = (*store)->read([&](lanebus::detail::StoreTxn& txn) -> Status {
      Status bad;
      Status s = txn.scan(lanebus::detail::StoreTable::Delayed, {}, {}, [&](std::string_view k, std::string_view v) {
        lanebus::detail::AppendRequest r;
        bad = lanebus::detail::decode_delayed(k, v, &r);
        if (!bad.ok()) return false;
        std::string tag;
        std::uint64_t seq = 0;
        if (r.topic_id != t->id || !pc::parse(r.payload, &tag, &seq)) {
          bad = Status(Code::Corruption, "an entry that is not a pc.later message");
          return false;
        }
        Found& f = found[{tag, seq}];
        f.waiting += 1;
        f.crc = pc::crc32(r.payload);
        f.due_ns = r.due_ns;
        return true;
      });
      return s.ok() ? bad : s;
    });
    REQUIRE_MESSAGE(scan.ok(), "cut " << cut << ": the delayed index after the power cut: " << scan.to_string());
    for (const auto& [k, f] : found) {
      if (f.logged + f.waiting > 1) {
        figures_.later_twice += 1;
        FAIL_CHECK("cut " << cut << ": pc.later " << k.first << "/" << k.second << " is stored " << f.logged
                          << " time(s) in its lane and " << f.waiting << " time(s) in the delayed index");
      }
    }
    for (const auto& k : keys) {
      const Delayed& d = oracle_.later.at(k);
      auto it = found.find(k);
      if (it == found.end()) {
        figures_.later_lost += 1;
        FAIL_CHECK("cut " << cut << ": delayed publish pc.later " << k.first << "/" << k.second
                          << " returned OK (Sync) and is gone after the power cut");
        continue;
      }
      CHECK_MESSAGE(it->second.crc == d.crc, "cut " << cut << ": pc.later " << k.first << "/" << k.second
                                                    << " is present with other bytes (CRC)");
      // Stored with its due time, or (published when that time had passed,
      // the child stalled between reading the clock and publishing) as an
      // ordinary record created at or after it (1 ms: the bus's clock against ours).
      if (it->second.due_ns != 0) {
        CHECK_MESSAGE(it->second.due_ns == d.due_ns, "cut " << cut << ": pc.later " << k.first << "/" << k.second
                                                            << " has due time " << it->second.due_ns
                                                            << ", published with " << d.due_ns);
      } else {
        CHECK_MESSAGE(it->second.created_ns >= d.due_ns - 1'000'000,
                      "cut " << cut << ": pc.later " << k.first << "/" << k.second << " is in its lane undelayed, created "
                             << it->second.created_ns << " before its due time " << d.due_ns);
      }
      (it->second.waiting > 0 ? figures_.later_waiting : figures_.later_moved) += 1;
    }
    REQUIRE((*store)->close().ok());
  }

  // After the last cut, without the shim: a new group of pc.later receives
  // every acknowledged delayed message exactly once, none before its due
  // time, and the delayed index ends empty.
  void final_later() {
    ::unsetenv("LD_PRELOAD");
    std::mutex mu;
    std::map<std::pair<std::string, std::uint64_t>, int> got;
    std::int64_t early = 0, worst_late_ns = 0;
    {
      auto bus = Bus::open(bus_options()).value();
      auto later = bus->create_topic("pc.later", {.lanes = 2, .durable = true}).value();
      auto sub = bus->subscribe(later, "final", [&](const MessageView& m) {
                      const std::int64_t now = wall_ns();
                      std::string tag;
                      std::uint64_t seq = 0;
                      if (!pc::parse(m.payload(), &tag, &seq)) return Outcome::reject("not ours");
                      std::lock_guard l(mu);
                      got[{tag, seq}] += 1;
                      auto it = oracle_.later.find({tag, seq});
                      // The store's clock against ours: 1 ms of slack.
                      if (it != oracle_.later.end() && now < it->second.due_ns - 1'000'000) ++early;
                      if (it != oracle_.later.end() && it->second.cut == figures_.cuts - 1)
                        worst_late_ns = std::max(worst_late_ns, now - it->second.due_ns);
                      return Outcome::ack();
                    }).value();
      auto all = [&] {
        std::lock_guard l(mu);
        for (const auto& [k, d] : oracle_.later)
          if (got.count(k) == 0) return false;
        return true;
      };
      REQUIRE_MESSAGE(lanebus::test::wait_until(all, 60s), "not every acknowledged delayed message was delivered");
      std::this_thread::sleep_for(100ms);  // a duplicate would arrive now
      REQUIRE(sub.close().ok());
      REQUIRE(bus->shutdown(ShutdownMode::Drain, 10s).ok());
    }
    std::lock_guard l(mu);
    for (const auto& [k, n] : got)
      CHECK_MESSAGE(n == 1, "pc.later " << k.first << "/" << k.second << " was delivered " << n << " times");
    // Every acknowledged one was delivered (waited for above); a publish the
    // child was killed after but before reporting may show up too (recovered).
    for (const auto& [k, n] : got)
      if (oracle_.later.count(k) == 0) later_recovered_ += 1;
    CHECK(early == 0);
    later_late_ms_ = static_cast<double>(worst_late_ns) / 1e6;
    auto store = DurableStore::open(bus_options().store);
    REQUIRE(store.ok());
    auto left = lanebus::detail::count_delayed(**store, 0);
    REQUIRE(left.ok());
    CHECK(*left == 0);
    REQUIRE((*store)->close().ok());
  }

  static std::int64_t wall_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  double later_late_ms_ = 0;
  std::uint64_t later_recovered_ = 0;  // final_later: delivered, never reported acknowledged (killed in between)  // final_later: the latest delivery past its due time, of the last cut's messages

  std::int64_t async_bound_ms() const { return flush_.count() + 1000; }
  const Figures& figures() const { return figures_; }
  const Oracle& oracle() const { return oracle_; }
  std::size_t dlq_entries_ = 0;
  std::uint64_t dlq_rejected_ = 0;

 private:
  Durability durability_;
  std::chrono::milliseconds flush_;
  std::string child_, shim_;
  lanebus::test::TempDir dir_;
  std::string store_, data_, journal_, synclog_;
  std::int64_t last_sync_ms_ = 0;  // start of the last successful fsync before the cut
  Oracle oracle_;
  Figures figures_;
};

}  // namespace

TEST_CASE("power cut: every Sync publish, committed offset, attempt, DLQ entry and idempotency record that was "
          "reported done survives") {
  const std::uint64_t seed = lanebus::test::test_seed("power cut sync");
  std::mt19937_64 rng(seed);
  const int cuts = power_cuts();
  const auto t0 = std::chrono::steady_clock::now();
  PowerCutRun run(Durability::Sync, 100ms);
  for (int cut = 0; cut < cuts; ++cut) {
    const auto ms = std::chrono::milliseconds(std::uniform_int_distribution<int>(10, 80)(rng));
    run.cycle(cut, ms, faults::Device::Torn, rng, cut % 25 == 24 || cut == cuts - 1);
  }
  run.final_drain();
  run.final_later();
  const auto& f = run.figures();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("sync: cuts=" << f.cuts << " with_unsynced_writes=" << f.with_unsynced << " in_flight_writes=" << f.in_flight << " torn=" << f.torn
                        << " unsynced_pages=" << f.unsynced_pages << " publish_checks=" << f.verified
                        << " publishes=" << run.oracle().events.size() + run.oracle().jobs.size()
                        << " idempotency_keys=" << run.all_idem().size()
                        << " deliveries_tracked=" << run.oracle().max_attempt.size() << " dlq_entries="
                        << run.dlq_entries_ << " rejected=" << run.dlq_rejected_
                        << " attempt_regressions=" << run.oracle().attempt_regressions
                        << " delayed_publishes=" << run.oracle().later.size() << " delayed_checks_waiting="
                        << f.later_waiting << " delayed_checks_moved=" << f.later_moved
                        << " delayed_lost=" << f.later_lost << " delayed_stored_twice=" << f.later_twice
                        << " delayed_final_worst_late_ms=" << run.later_late_ms_
                        << " delayed_recovered=" << run.later_recovered_ << " seconds=" << secs);
  lanebus::test::print_figures("power_cut_sync", f.cuts, f.verified, t0);
  CHECK(f.verified > 0);
  CHECK(f.torn > 0);  // the test bites: some cuts really tore a commit
  // Cuts found delayed messages both waiting and moved (the index and the move are both exercised).
  CHECK(f.later_waiting > 0);
  CHECK(f.later_moved > 0);
}

TEST_CASE("power cut: Async loses at most the publishes of the last flush interval (write-order-preserving disk)") {
  const std::uint64_t seed = lanebus::test::test_seed("power cut async");
  std::mt19937_64 rng(seed);
  const int cuts = std::max(5, power_cuts() / 40);
  const auto t0 = std::chrono::steady_clock::now();
  PowerCutRun run(Durability::Async, 20ms);
  for (int cut = 0; cut < cuts; ++cut) {
    // Long enough that early publishes are older than the bound at the cut.
    const auto ms = std::chrono::milliseconds(std::uniform_int_distribution<int>(1100, 1500)(rng));
    // LANEBUS_POWERCUT_ASYNC_TORN=1: the reordering device instead (an
    // experiment: Async does not promise to survive it, see doc/power-loss.md).
    const bool torn = std::getenv("LANEBUS_POWERCUT_ASYNC_TORN") != nullptr;
    run.cycle(cut, ms, torn ? faults::Device::Torn : faults::Device::Ordered, rng, cut == cuts - 1);
  }
  const auto& f = run.figures();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("async: cuts=" << f.cuts << " with_unsynced_writes=" << f.with_unsynced << " in_flight_writes=" << f.in_flight << " publish_checks=" << f.verified
                         << " flushes=" << f.flushes << " lost_recent=" << f.lost_recent
                         << " lost_despite_later_flush=" << f.lost_in_bound << " lost_older_than_bound=" << f.lost_beyond_interval
                         << " oldest_loss_ms=" << f.max_loss_age_ms << " bound_ms=" << run.async_bound_ms()
                         << " seconds=" << secs);
  CHECK(f.verified > 0);
}
