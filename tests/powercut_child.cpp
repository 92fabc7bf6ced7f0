// lanebus — MIT License.
// Helper process of powercut_test: runs a workload through the public Bus on a
// store whose data.mdb is recorded by the faultfs shim, until SIGKILLed.
// Reports every operation whose success means "durable" (Sync mode) as one
// line on stdout (one write(2) per line: a SIGKILL never tears a line; the
// pipe keeps what was written).
//
//   powercut_child publish DIR TAG sync|async FLUSH_MS THREADS
//       THREADS threads publish to durable topic pc.events (4 lanes); every
//       3rd message also to durable queue pc.jobs (2 lanes, idempotency key
//       "j-TAG.T-SEQ"); every 4th claims and completes "i-TAG.T-SEQ" in
//       idempotency scope pc.idem. Lines, after the call returned OK:
//         E TAG.T SEQ CRC MS     publish to pc.events (MS: CLOCK_MONOTONIC ms)
//         J TAG.T SEQ CRC MS     publish to pc.jobs
//         I SCOPE KEY            complete() of an idempotency key
//       In Sync mode every odd SEQ is also published delayed to durable
//       topic pc.later (2 lanes), due 1..61 ms later (deliver_at, wall
//       clock): the child's own bus moves the due ones to their lanes while
//       it runs, so cuts land before, during and after those moves. Line:
//         L TAG.T SEQ CRC DUE_NS publish to pc.later (DUE_NS: its deliver_at)
//   powercut_child consume DIR TAG sync|async FLUSH_MS
//       consumes pc.jobs (scope pc.jobs.idem; rejects an even SEQ: a DLQ
//       entry) and, transactionally, pc.events as group "audit" (each message
//       writes table pc.audit "L<lane>" = offset with its offset commit).
//       A reporter thread reads pc.audit, then commits an idempotency key of
//       scope pc.ticks (a later commit, so what it read is durable), then
//       reports. Lines:
//         D TAG SEQ ATTEMPT      a pc.jobs delivery (its claim was committed first)
//         O LANE OFFSET          group audit has committed past OFFSET in LANE
//         I SCOPE KEY
//   Both print "ready" once the bus is open and "X <status>" on an error.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "powercut.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
namespace pc = lanebus::test::powercut;

namespace {

void say(const std::string& line) {
  std::string l = line + "\n";
  ssize_t n = ::write(1, l.data(), l.size());
  (void)n;
}

[[noreturn]] void fail(const std::string& what, const Status& s) {
  say("X " + what + ": " + s.to_string());
  std::exit(4);
}

struct Args {
  std::string dir, tag;
  Durability durability = Durability::Sync;
  std::chrono::milliseconds flush{100};
};

std::unique_ptr<Bus> open_bus(const Args& a) {
  BusOptions o;
  o.name = "powercut";
  o.workers = 2;
  o.spin = std::chrono::nanoseconds(0);
  o.store.directory = a.dir;
  o.store.durability = a.durability;
  o.store.async_flush_interval = a.flush;
  o.store.map_size_initial = 8ull << 20;
  o.durable_poll = 10ms;
  auto bus = Bus::open(o);
  if (!bus.ok()) fail("open", bus.status());
  return std::move(*bus);
}

std::int64_t wall_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

Topic topic(Bus& bus, bool queue) {
  auto t = queue ? bus.create_queue("pc.jobs", {.lanes = 2, .durable = true})
                 : bus.create_topic("pc.events", {.lanes = 4, .durable = true});
  if (!t.ok()) fail("create", t.status());
  return *t;
}

int publish(const Args& a, int threads) {
  auto bus = open_bus(a);
  Topic events = topic(*bus, false), jobs = topic(*bus, true);
  auto later = bus->create_topic("pc.later", {.lanes = 2, .durable = true});
  if (!later.ok()) fail("create", later.status());
  const bool delayed = a.durability == Durability::Sync;
  auto idem = bus->idempotency("pc.idem");
  if (!idem.ok()) fail("idempotency", idem.status());
  say("ready");
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      const std::string tag = a.tag + "." + std::to_string(t);
      for (std::uint64_t seq = 1;; ++seq) {
        const std::string p = pc::payload(tag, seq);
        const std::string crc = std::to_string(pc::crc32(p));
        const std::string key = "k" + std::to_string(seq % 5);
        Status s = events.publish({.key = key, .payload = p});
        if (!s.ok()) fail("publish pc.events", s);
        say("E " + tag + " " + std::to_string(seq) + " " + crc + " " + std::to_string(pc::now_ms()));
        if (delayed && seq % 2 == 1) {
          OutgoingMessage m{.key = key, .payload = p};
          m.deliver_at = wall_ns() + static_cast<std::int64_t>((seq * 7) % 61 + 1) * 1'000'000;
          s = later->publish(m);
          if (!s.ok()) fail("publish pc.later", s);
          say("L " + tag + " " + std::to_string(seq) + " " + crc + " " + std::to_string(m.deliver_at));
        }
        if (seq % 3 == 0) {
          const std::string ik = "j-" + tag + "-" + std::to_string(seq);
          s = jobs.publish({.key = key, .payload = p, .idempotency_key = ik});
          if (!s.ok()) fail("publish pc.jobs", s);
          say("J " + tag + " " + std::to_string(seq) + " " + crc + " " + std::to_string(pc::now_ms()));
        }
        if (seq % 4 == 0) {
          const std::string ik = "i-" + tag + "-" + std::to_string(seq);
          auto c = (*idem)->claim(ik);
          if (!c.ok()) fail("claim", c.status());
          if (c->state == ClaimState::Claimed) {
            s = (*idem)->complete(ik, "done");
            if (!s.ok()) fail("complete", s);
            say("I pc.idem " + ik);
          }
        }
      }
    });
  }
  for (auto& t : ts) t.join();  // never: the parent kills us
  return 0;
}

int consume(const Args& a) {
  auto bus = open_bus(a);
  Topic events = topic(*bus, false), jobs = topic(*bus, true);
  auto scope = bus->idempotency("pc.jobs.idem");
  if (!scope.ok()) fail("idempotency", scope.status());
  auto ticks = bus->idempotency("pc.ticks");
  if (!ticks.ok()) fail("idempotency", ticks.status());
  GroupOptions g;
  g.max_attempts = 1000;
  g.visibility = 300ms;
  g.idempotency_scope = "pc.jobs.idem";
  auto q = bus->consume(
      jobs,
      [](const MessageView& m) {
        std::string tag;
        std::uint64_t seq = 0;
        if (!pc::parse(m.payload(), &tag, &seq)) return Outcome::reject("not ours");
        say("D " + tag + " " + std::to_string(seq) + " " + std::to_string(m.attempt()));
        return seq % 2 == 0 ? Outcome::reject("even seq") : Outcome::ack();
      },
      g);
  if (!q.ok()) fail("consume", q.status());
  auto sub = bus->subscribe_tx(
      events, "audit",
      [](const MessageView& m, Transaction& tx) {
        Status s = tx.put("pc.audit", "L" + std::to_string(m.lane()), std::to_string(m.offset()));
        if (!s.ok()) return Outcome::retry("put failed");
        return Outcome::ack();
      },
      {});
  if (!sub.ok()) fail("subscribe_tx", sub.status());
  say("ready");
  for (std::uint64_t n = 1;; ++n) {
    std::string seen[4];
    for (int lane = 0; lane < 4; ++lane) {
      auto v = bus->table_get("pc.audit", "L" + std::to_string(lane));
      if (v.ok()) {
        seen[lane] = *v;
      } else if (v.code() != Code::NotFound) {
        fail("table_get", v.status());
      }
    }
    // A commit that starts after the read: once it is durable, so is what was read.
    const std::string key = "t-" + a.tag + "-" + std::to_string(n);
    auto c = (*ticks)->claim(key);
    if (!c.ok()) fail("claim", c.status());
    Status s = (*ticks)->complete(key, "tick");
    if (!s.ok()) fail("complete", s);
    say("I pc.ticks " + key);
    for (int lane = 0; lane < 4; ++lane) {
      if (!seen[lane].empty()) say("O " + std::to_string(lane) + " " + seen[lane]);
    }
    std::this_thread::sleep_for(2ms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: powercut_child publish|consume DIR TAG sync|async FLUSH_MS [THREADS]\n");
    return 2;
  }
  Args a;
  a.dir = argv[2];
  a.tag = argv[3];
  a.durability = std::strcmp(argv[4], "async") == 0 ? Durability::Async : Durability::Sync;
  a.flush = std::chrono::milliseconds(std::atoi(argv[5]));
  if (std::strcmp(argv[1], "publish") == 0) return publish(a, argc > 6 ? std::atoi(argv[6]) : 2);
  if (std::strcmp(argv[1], "consume") == 0) return consume(a);
  return 2;
}
