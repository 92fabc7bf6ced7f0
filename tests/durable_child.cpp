// lanebus — MIT License.
// Helper process for the durable crash, fault and multi-process tests. Reports
// every acknowledged operation as one line on stdout (one write(2) per line,
// so a SIGKILL never leaves a torn line).
//
//   durable_child produce DIR TOPIC LANES PRODUCER FIRST_SEQ COUNT   (COUNT 0 = until killed)
//       appends payload "PRODUCER:SEQ" with key "kSEQ%7", keeping up to 64
//       appends in flight (sync mode); prints "ack PRODUCER SEQ ID" after each
//       completion, "done" at the end.
//   durable_child consume DIR QUEUE GROUP VISIBILITY_MS
//       claims from lane 0 of a queue, prints "claim OFFSET ATTEMPT", then
//       "ack OFFSET" after the ack commits; prints "idle" and exits when the
//       queue is drained.
//   durable_child follow DIR TOPIC GROUP COUNT
//       polls end offsets of every lane, reads, prints "got PAYLOAD KEY", commits
//       offsets; exits after COUNT messages.
//   durable_child fsize DIR LIMIT_BYTES
//       sets RLIMIT_FSIZE (SIGXFSZ ignored) and appends 4 KiB payloads until
//       refused; prints "ack SEQ", then "error CODE MESSAGE", then the result of
//       one more append and of a read ("after CODE", "read CODE").
//   durable_child bus_queue DIR QUEUE PREFIX COUNT VISIBILITY_MS
//       through a Bus: consumes durable queue QUEUE (2 lanes), printing
//       "handled PAYLOAD ATTEMPT" before each ack, while one thread publishes
//       COUNT messages "PREFIX-I" one by one, printing "published PAYLOAD"
//       when each publish returned (committed). With COUNT 0 it publishes
//       nothing, waits until nothing is left to handle, prints
//       "dead PAYLOAD CLASS ATTEMPTS" for each dead letter,
//       "stats CLAIMS CLAIMS_AHEAD" (the store's counters), "idle", and exits.
//   durable_child readers DIR
//       until killed: opens the LMDB environment (which reserves 2 reader
//       slots under the slot lock and LMDB's reader mutex), reads key "k" 20
//       times on each of 3 threads (one waits for a slot), runs
//       mdb_reader_check, closes it; prints "ok CYCLE" after each cycle.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "bus_impl.hpp"
#include "durable_store.hpp"
#include "lanebus/lanebus.hpp"
#include "lmdb_store.hpp"

using lanebus::Code;
using lanebus::detail::AppendRequest;
using lanebus::detail::DurableStore;
using lanebus::detail::TopicSpec;

namespace {

void say(const std::string& line) {
  std::string l = line + "\n";
  ssize_t n = ::write(1, l.data(), l.size());
  (void)n;
}

std::unique_ptr<DurableStore> open_or_die(const char* dir) {
  lanebus::StoreOptions o;
  o.directory = dir;
  o.map_size_initial = 8ull << 20;
  o.map_size_max = 1ull << 30;
  auto s = DurableStore::open(o);
  if (!s.ok()) {
    say("open-error " + s.status().to_string());
    std::exit(3);
  }
  return std::move(*s);
}

int produce(int argc, char** argv) {
  if (argc < 8) return 2;
  auto store = open_or_die(argv[2]);
  std::uint32_t lanes = static_cast<std::uint32_t>(std::atoi(argv[4]));
  std::string producer = argv[5];
  std::uint64_t first = std::strtoull(argv[6], nullptr, 10);
  std::uint64_t count = std::strtoull(argv[7], nullptr, 10);
  auto t = store->open_topic(argv[3], TopicSpec{lanes, false, {}});
  if (!t.ok()) {
    say("topic-error " + t.status().to_string());
    return 3;
  }
  say("ready");
  std::atomic<int> in_flight{0};
  std::atomic<std::uint64_t> completed{0};
  std::atomic<bool> failed{false};
  for (std::uint64_t seq = first; count == 0 || seq < first + count; ++seq) {
    while (in_flight.load() >= 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    AppendRequest r;
    r.topic_id = t->id;
    r.key = "k" + std::to_string(seq % 7);
    r.lane = lanebus::lane_for_key(r.key, lanes);
    r.payload = producer + ":" + std::to_string(seq);
    in_flight.fetch_add(1);
    auto s = store->append_async(std::move(r), [&, seq](const lanebus::Status& st,
                                                        const lanebus::detail::AppendResult& res) {
      if (st.ok()) {
        say("ack " + producer + " " + std::to_string(seq) + " " + std::to_string(res.id));
      } else {
        say("fail " + st.to_string());
        failed.store(true);
      }
      completed.fetch_add(1);
      in_flight.fetch_sub(1);
    });
    if (!s.ok()) {
      say("fail " + s.to_string());
      return 4;
    }
    if (failed.load()) return 4;
  }
  while (in_flight.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  if (!store->close().ok()) return 5;
  say("done");
  return failed.load() ? 4 : 0;
}

int consume(int argc, char** argv) {
  if (argc < 6) return 2;
  auto store = open_or_die(argv[2]);
  auto q = store->find_topic(argv[3]);
  if (!q.ok()) return 3;
  auto g = store->open_group(*q, argv[4]);
  if (!g.ok()) return 3;
  lanebus::detail::ClaimOptions co;
  co.visibility = std::chrono::milliseconds(std::atoi(argv[5]));
  say("ready");
  for (;;) {
    auto c = store->claim(*g, 0, co);
    if (!c.ok()) {
      say("fail " + c.status().to_string());
      return 4;
    }
    if (!c->has_value()) {
      auto info = store->group_info(*g);
      auto end = store->end_offset(*q, 0);
      if (info.ok() && end.ok() && (*info)[0].committed == *end) {
        say("idle");
        return store->close().ok() ? 0 : 5;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    const auto& m = **c;
    say("claim " + std::to_string(m.message.offset) + " " + std::to_string(m.attempt));
    // "Handler" work: the parent's SIGKILL may land here, before the ack.
    std::this_thread::sleep_for(std::chrono::microseconds(500));
    lanebus::Status s = store->ack(*g, 0, m.message.offset, m.attempt);
    if (!s.ok()) {
      say("fail " + s.to_string());
      return 4;
    }
    say("ack " + std::to_string(m.message.offset));
  }
}

int bus_queue(int argc, char** argv) {
  if (argc < 7) return 2;
  lanebus::BusOptions o;
  o.workers = 2;
  o.store.directory = argv[2];
  o.store.map_size_initial = 8ull << 20;
  o.durable_poll = std::chrono::milliseconds(10);
  auto bus = lanebus::Bus::open(o);
  if (!bus.ok()) {
    say("open-error " + bus.status().to_string());
    return 3;
  }
  auto q = (*bus)->create_queue(argv[3], {.lanes = 2, .durable = true});
  if (!q.ok()) return 3;
  const std::string prefix = argv[4];
  const long count = std::atol(argv[5]);
  lanebus::GroupOptions go;
  go.visibility = std::chrono::milliseconds(std::atoi(argv[6]));
  go.max_attempts = 1000;
  auto sub = (*bus)->consume(
      *q,
      [](const lanebus::MessageView& m) {
        say("handled " + std::string(m.payload()) + " " + std::to_string(m.attempt()));
        // "Handler" work: the parent's SIGKILL may land here, before the ack.
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        return lanebus::Outcome::ack();
      },
      go);
  if (!sub.ok()) return 3;
  say("ready");
  for (long i = 0; i < count; ++i) {
    const std::string payload = prefix + "-" + std::to_string(i);
    lanebus::Status s = q->publish({.key = "k" + std::to_string(i % 5), .payload = payload});
    if (!s.ok()) {
      say("fail " + s.to_string());
      return 4;
    }
    say("published " + payload);
    if (i % 4 == 3) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (count == 0) {
    // Drained when the queue keeps no message and no claim for a while.
    auto drained = [&] {
      for (const lanebus::TopicStats& t : (*bus)->stats().topics)
        if (t.name == argv[3]) return t.groups.at(0).total.in_flight == 0 && t.groups.at(0).total.claimed == 0;
      return false;
    };
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int quiet = 0; quiet < 20 && std::chrono::steady_clock::now() < deadline;) {
      quiet = drained() ? quiet + 1 : 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // Dead letters: a message whose claims were lost to kills poison_after_crashes
    // times (DlqOptions, 3 by default) is dead-lettered as poison without a call.
    auto dlq = (*bus)->dead_letters();
    if (!dlq.ok()) return 6;
    auto dead = (*dlq)->list();
    if (!dead.ok()) return 6;
    for (const lanebus::DlqEntry& e : *dead)
      say("dead " + e.payload + " " + lanebus::to_string(e.error_class) + " " + std::to_string(e.attempts));
    const auto c = lanebus::detail::Access::core(**bus)->store()->counters();
    say("stats " + std::to_string(c.claims) + " " + std::to_string(c.claims_ahead));
    say("idle");
  }
  (void)sub->close();
  return (*bus)->shutdown(lanebus::ShutdownMode::Drain).ok() ? 0 : 5;
}

int follow(int argc, char** argv) {
  if (argc < 6) return 2;
  auto store = open_or_die(argv[2]);
  std::uint64_t want = std::strtoull(argv[5], nullptr, 10);
  lanebus::Result<lanebus::detail::TopicRef> t = lanebus::Status(Code::NotFound);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!(t = store->find_topic(argv[3])).ok()) {  // the producers may not have created it yet
    if (std::chrono::steady_clock::now() > deadline) return 3;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto g = store->open_group(*t, argv[4]);
  if (!g.ok()) return 3;
  auto info = store->group_info(*g);
  if (!info.ok()) return 3;
  std::vector<std::uint64_t> pos;
  for (auto& l : *info) pos.push_back(l.committed);
  say("ready");
  std::uint64_t got = 0;
  while (got < want) {
    if (std::chrono::steady_clock::now() > deadline) return 6;
    bool any = false;
    for (std::uint32_t lane = 0; lane < t->lanes; ++lane) {
      auto end = store->end_offset(*t, lane);  // cheap poll for data from other processes
      if (!end.ok()) return 4;
      if (*end <= pos[lane]) continue;
      auto b = store->read(*t, lane, pos[lane]);
      if (!b.ok()) {
        say("fail " + b.status().to_string());
        return 4;
      }
      for (auto& m : b->messages) say("got " + m.payload + " " + m.key);
      got += b->messages.size();
      pos[lane] = b->next_offset;
      if (!store->commit_offset_async(*g, lane, pos[lane], nullptr).ok()) return 4;
      any = true;
    }
    if (!any) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  say("done");
  return store->close().ok() ? 0 : 5;
}

int fsize(int argc, char** argv) {
  if (argc < 4) return 2;
  ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG
  struct rlimit rl {};
  rl.rlim_cur = rl.rlim_max = std::strtoull(argv[3], nullptr, 10);
  if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) return 2;
  auto store = open_or_die(argv[2]);
  auto t = store->open_topic("big", TopicSpec{1, false, {}});
  if (!t.ok()) {
    say("error " + std::string(lanebus::to_string(t.code())) + " " + std::string(t.status().message()));
    return 0;
  }
  say("ready");
  for (int seq = 0;; ++seq) {
    AppendRequest r;
    r.topic_id = t->id;
    r.payload = std::to_string(seq) + ":" + std::string(4096, 'f');
    auto a = store->append(std::move(r));
    if (!a.ok()) {
      say("error " + std::string(lanebus::to_string(a.code())) + " " + std::string(a.status().message()));
      break;
    }
    say("ack " + std::to_string(seq));
  }
  AppendRequest r;
  r.topic_id = t->id;
  r.payload = std::string(4096, 'g');
  say("after " + std::string(lanebus::to_string(store->append(std::move(r)).code())));
  say("read " + std::string(lanebus::to_string(store->read(*t, 0, 0).code())));
  return 0;
}

int readers(int argc, char** argv) {
  if (argc < 3) return 2;
  lanebus::detail::LmdbEnv::Config cfg;
  cfg.path = argv[2];
  cfg.read_slots = 2;  // 3 reading threads: one of them waits for a slot
  for (std::uint64_t cycle = 0;; ++cycle) {
    auto env = lanebus::detail::LmdbEnv::open(cfg);
    if (!env.ok()) {
      say("open-error " + env.status().to_string());
      return 3;
    }
    std::atomic<int> bad{0};
    std::thread threads[3];
    for (auto& th : threads) {
      th = std::thread([&] {
        for (int i = 0; i < 20; ++i) {
          auto r = (*env)->begin_read();
          if (!r.ok()) {
            bad.fetch_add(1);
            continue;
          }
          auto dbi = (*env)->open_dbi(*r, nullptr, false);
          if (!dbi.ok() || !r->get(*dbi, "k").ok()) bad.fetch_add(1);
        }
      });
    }
    for (auto& th : threads) th.join();
    if (bad.load() != 0) {
      say("read-error");
      return 4;
    }
    if (!(*env)->reader_check().ok()) return 5;
    say("ok " + std::to_string(cycle));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string mode = argv[1];
  if (mode == "produce") return produce(argc, argv);
  if (mode == "consume") return consume(argc, argv);
  if (mode == "follow") return follow(argc, argv);
  if (mode == "bus_queue") return bus_queue(argc, argv);
  if (mode == "fsize") return fsize(argc, argv);
  if (mode == "readers") return readers(argc, argv);
  return 2;
}
