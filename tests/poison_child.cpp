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
// Topic-batch mode: the same with a batch handler (topic_batch_mode).
//   poison_child STORE_DIR topic-batch EXPECTED
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <span>
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

// The topic modes' bus: one worker, a 5 ms poll, DlqOptions left at their defaults.
Result<std::unique_ptr<Bus>> open_topic_bus(const char* store) {
  BusOptions o;
  o.workers = 1;
  o.store.directory = store;
  o.durable_poll = 5ms;
  return Bus::open(o);
}

int topic_mode(const char* store, long expected) {
  auto bus_r = open_topic_bus(store);
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

// Topic mode with a batch handler (subscribe_batch, spans of up to 4): a
// span holding "poison" abort()s before anything of it is recorded; else
// each payload is appended to STORE/handled.log (O_APPEND write(2), so what
// was written survives the abort). Exits 0 once EXPECTED distinct payloads
// are in the file (this run's and earlier runs') and the group has no lag.
int topic_batch_mode(const char* store, long expected) {
  auto bus_r = open_topic_bus(store);
  if (!bus_r.ok()) return 1;
  auto& bus = *bus_r;
  const int fd = ::open((std::string(store) + "/handled.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return 4;
  std::mutex mu;
  std::set<std::string> distinct;  // every payload handled, by this run or an earlier one
  {
    std::ifstream earlier(std::string(store) + "/handled.log");
    for (std::string line; std::getline(earlier, line);) distinct.insert(line);
  }
  auto topic = bus->create_topic("work.events", {.lanes = 2, .durable = true}).value();
  auto sub = bus->subscribe_batch(
                    topic, "audit",
                    [&](std::span<const MessageView> ms) {
                      for (const MessageView& m : ms)
                        if (m.payload() == "poison") std::abort();  // crashes the whole process
                      std::string lines;
                      for (const MessageView& m : ms) lines.append(m.payload()).append("\n");
                      if (::write(fd, lines.data(), lines.size()) != static_cast<ssize_t>(lines.size())) std::abort();
                      std::lock_guard l(mu);
                      for (const MessageView& m : ms) distinct.insert(std::string(m.payload()));
                      return BatchOutcome::all_acked();
                    },
                    {.batch_max = 4})
                 .value();
  for (;;) {
    std::size_t done;
    {
      std::lock_guard l(mu);
      done = distinct.size();
    }
    if (done == static_cast<std::size_t>(expected) && lag(*bus) == 0) return 0;
    std::this_thread::sleep_for(5ms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[2]) == "topic") return topic_mode(argv[1], std::atol(argv[3]));
  if (argc == 4 && std::string(argv[2]) == "topic-batch") return topic_batch_mode(argv[1], std::atol(argv[3]));
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
