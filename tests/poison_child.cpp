// lanebus — MIT License.
// Helper for poison_test: consumes the durable queue "work.jobs" (one lane);
// the handler abort()s on the payload "poison" and records every other job in
// the table "done" (transactionally). Exits 0 once the queue is drained.
//   poison_child STORE_DIR
#include <chrono>
#include <cstdlib>
#include <thread>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
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
