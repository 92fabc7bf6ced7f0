// lanebus — MIT License.
// Helper for txconsume_test's kill -9 loop: consumes the durable queue
// "tickets.bookings" with a transactional handler that decrements a seat
// counter once per booking (idempotency scope "tickets"), and exits 0 once the
// queue is drained and `expected` bookings are recorded.
//   txconsume_child STORE_DIR EXPECTED
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const long expected = std::atol(argv[2]);
  BusOptions o;
  o.workers = 2;
  o.store.directory = argv[1];
  o.durable_poll = 5ms;
  // This test kills the consumer at random moments on purpose: a booking in
  // flight at three kills must not be taken for a poison message.
  o.dlq.poison_after_crashes = 0;
  auto bus_r = Bus::open(o);
  if (!bus_r.ok()) {
    std::fprintf(stderr, "child open: %s\n", bus_r.status().to_string().c_str());
    return 1;
  }
  auto& bus = *bus_r;
  auto queue = bus->create_queue("tickets.bookings", {.lanes = 4, .durable = true}).value();
  auto sub = bus->consume_tx(queue, [&](const MessageView& m, Transaction& tx) {
                    auto seats = tx.get("venue", "seats-left");
                    if (!seats.ok()) return Outcome::retry("no counter");
                    long left = std::stol(*seats);
                    if (Status s = tx.put("venue", "seats-left", std::to_string(left - 1)); !s.ok())
                      return Outcome::retry("put");
                    auto n = tx.get("venue", "bookings");
                    long count = n.ok() ? std::stol(*n) : 0;
                    (void)tx.put("venue", "bookings", std::to_string(count + 1));
                    (void)tx.put("booked", std::string(m.idempotency_key()), std::string(m.payload()));
                    return Outcome::ack();
                  },
                  {.idempotency_scope = "tickets", .visibility = 150ms})
                 .value();
  for (;;) {
    if (bus->stats().dlq.pending > 0) {
      std::fprintf(stderr, "child: a booking was dead-lettered\n");
      return 4;
    }
    auto n = bus->table_get("venue", "bookings");
    long count = n.ok() ? std::stol(*n) : 0;
    if (count > expected) {
      std::fprintf(stderr, "child: %ld bookings recorded, more than %ld\n", count, expected);
      return 3;
    }
    if (count == expected) {
      std::uint64_t lag = 0;
      for (const auto& t : bus->stats().topics)
        for (const auto& g : t.groups) lag += g.total.in_flight;
      if (lag == 0) break;
    }
    std::this_thread::sleep_for(5ms);
  }
  return 0;
}
