// lanebus — MIT License.
// Helper for txconsume_test's kill -9 loop: consumes the durable queue
// "tickets.bookings" with a transactional handler that decrements a seat
// counter once per booking (idempotency scope "tickets"), and exits 0 once the
// queue is drained and `expected` bookings are recorded.
//   txconsume_child STORE_DIR EXPECTED [PROBE_FILE]
//
// PROBE_FILE (optional) is a file of sizeof(TxProbe) bytes the parent maps
// too (MAP_SHARED), so it can read, after the kill, what this process was
// doing when it died: handler entries, which booking each worker thread was
// inside, and which booking it last returned ack for (its commit may still
// have been pending). The parent may also set hold_at: the hold_at-th handler
// entry then blocks for good (after setting `held`), so the parent can kill
// the process with that transaction — and its idempotency claim — in flight.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "lanebus/lanebus.hpp"
#include "txconsume_probe.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::TxProbe;

namespace {

TxProbe* probe = nullptr;
std::atomic<std::uint32_t> next_slot{0};

std::uint32_t my_slot() {
  thread_local std::uint32_t slot = next_slot.fetch_add(1) % TxProbe::kSlots;
  return slot;
}

std::uint32_t load(std::uint32_t& v) { return std::atomic_ref<std::uint32_t>(v).load(); }
void store(std::uint32_t& v, std::uint32_t x) { std::atomic_ref<std::uint32_t>(v).store(x); }

// Booking number + 1 from the payload "booking-N" (0 if it does not parse).
std::uint32_t booking_tag(std::string_view payload) {
  constexpr std::string_view prefix = "booking-";
  if (payload.substr(0, prefix.size()) != prefix) return 0;
  return static_cast<std::uint32_t>(std::strtoul(std::string(payload.substr(prefix.size())).c_str(), nullptr, 10)) +
         1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) return 2;
  const long expected = std::atol(argv[2]);
  if (argc == 4) {
    int fd = ::open(argv[3], O_RDWR | O_CLOEXEC);
    if (fd < 0) return 5;
    void* p = ::mmap(nullptr, sizeof(TxProbe), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return 5;
    probe = static_cast<TxProbe*>(p);
  }
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
                    const std::uint32_t tag = booking_tag(m.payload());
                    std::uint32_t slot = 0;
                    if (probe != nullptr) {
                      slot = my_slot();
                      store(probe->returned_ack[slot], 0);
                      store(probe->inside[slot], tag);
                      const std::uint32_t n = std::atomic_ref<std::uint32_t>(probe->entered).fetch_add(1) + 1;
                      if (n == load(probe->hold_at)) {
                        store(probe->held, tag);
                        for (;;) ::pause();  // hold this transaction (and its claims) until SIGKILL
                      }
                    }
                    auto finish = [&](Outcome out) {
                      if (probe != nullptr) {
                        if (out.kind() == Outcome::Kind::Ack) store(probe->returned_ack[slot], tag);
                        store(probe->inside[slot], 0);
                      }
                      return out;
                    };
                    // A booking's own work (a payment call): without it the
                    // batched consumer drains all 300 bookings between two
                    // kills and the loop has nothing left to kill.
                    std::this_thread::sleep_for(4ms);
                    auto seats = tx.get("venue", "seats-left");
                    if (!seats.ok()) return finish(Outcome::retry("no counter"));
                    long left = std::stol(*seats);
                    if (Status s = tx.put("venue", "seats-left", std::to_string(left - 1)); !s.ok())
                      return finish(Outcome::retry("put"));
                    auto n = tx.get("venue", "bookings");
                    long count = n.ok() ? std::stol(*n) : 0;
                    (void)tx.put("venue", "bookings", std::to_string(count + 1));
                    (void)tx.put("booked", std::string(m.idempotency_key()), std::string(m.payload()));
                    return finish(Outcome::ack());
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
