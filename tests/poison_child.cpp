// lanebus — MIT License.
// Helper for poison_test. Default mode: consumes the durable queue
// "work.jobs" (one lane); the handler abort()s on the payload "poison" and
// records every other job in the table "done" (transactionally). Exits 0 once
// the queue is drained.
//   poison_child STORE_DIR
// Topic mode: group "audit" of the durable topic "work.events" (2 lanes),
// default DlqOptions (poison_after_crashes 3), a transactional handler that
// abort()s on the payload "poison" and otherwise appends the payload to the
// per-key log "log" (key "<key>#<nnnn>", nnnn = the key's count in "seen") and
// bumps "stats"/"total". Exits 0 once "total" reaches EXPECTED and the group
// has no lag.
//   poison_child STORE_DIR topic EXPECTED
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;

namespace {

std::uint64_t lag(const Bus& bus) {
  std::uint64_t n = 0;
  for (const auto& t : bus.stats().topics)
    for (const auto& g : t.groups) n += g.total.in_flight;
  return n;
}

int topic_mode(const char* store, long expected) {
  BusOptions o;
  o.workers = 1;
  o.store.directory = store;
  o.durable_poll = 5ms;
  auto bus_r = Bus::open(o);  // DlqOptions left at their defaults
  if (!bus_r.ok()) return 1;
  auto& bus = *bus_r;
  auto topic = bus->create_topic("work.events", {.lanes = 2, .durable = true}).value();
  auto sub = bus->subscribe_tx(topic, "audit", [](const MessageView& m, Transaction& tx) {
                    if (m.payload() == "poison") std::abort();  // crashes the whole process
                    const std::string key(m.key());
                    auto seen = tx.get("seen", key);
                    const long n = seen.ok() ? std::stol(*seen) : 0;
                    char index[24];
                    std::snprintf(index, sizeof index, "%04ld", n);
                    (void)tx.put("log", key + "#" + index, std::string(m.payload()));
                    (void)tx.put("seen", key, std::to_string(n + 1));
                    auto total = tx.get("stats", "total");
                    (void)tx.put("stats", "total", std::to_string((total.ok() ? std::stol(*total) : 0) + 1));
                    return Outcome::ack();
                  }).value();
  for (;;) {
    auto total = bus->table_get("stats", "total");
    const long done = total.ok() ? std::stol(*total) : 0;
    if (done > expected) return 3;
    if (done == expected && lag(*bus) == 0) return 0;
    std::this_thread::sleep_for(5ms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[2]) == "topic") return topic_mode(argv[1], std::atol(argv[3]));
  if (argc != 2) return 2;
  BusOptions o;
  o.workers = 1;
  o.store.directory = argv[1];
  o.durable_poll = 5ms;
  o.dlq.poison_after_crashes = 3;
  auto bus_r = Bus::open(o);
  if (!bus_r.ok()) return 1;
  auto& bus = *bus_r;
  auto queue = bus->create_queue("work.jobs", {.lanes = 1, .durable = true}).value();
  auto sub = bus->consume_tx(queue, [](const MessageView& m, Transaction& tx) {
                    if (m.payload() == "poison") std::abort();  // crashes the whole process
                    (void)tx.put("done", std::string(m.payload()), "1");
                    return Outcome::ack();
                  },
                  {.visibility = 100ms})
                 .value();
  for (;;) {
    std::uint64_t lag = 0;
    for (const auto& t : bus->stats().topics)
      for (const auto& g : t.groups) lag += g.total.in_flight;
    if (lag == 0) return 0;
    std::this_thread::sleep_for(5ms);
  }
}
