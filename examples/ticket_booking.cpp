// lanebus — MIT License.
// Exactly-once effects inside the store (doc/idempotency.md, transactional consume): a
// seat counter decremented by booking events, with forced redeliveries (a
// flaky handler and a producer that sends some bookings twice), ends exactly
// at the number of distinct bookings.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

int main() {
  char tmpl[] = "/tmp/lanebus-tickets-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const fs::path dir = tmpl;
  BusOptions o;
  o.name = "box-office";
  o.workers = 2;
  o.store.directory = (dir / "store").string();
  auto bus = Bus::open(o).value();
  auto bookings = bus->create_queue("tickets.bookings", {.lanes = 4, .durable = true}).value();
  constexpr int kSeats = 500, kDistinct = 120, kDuplicates = 40;
  std::printf("venue has %d seats; %d distinct bookings arrive, %d of them twice, and the handler fails every\n"
              "first attempt of every third booking after writing (forced redelivery)\n\n",
              kSeats, kDistinct, kDuplicates);

  auto sub = bus->consume_tx(bookings, [&](const MessageView& m, Transaction& tx) {
                    auto left = tx.get("venue", "seats-left");
                    int seats = left.ok() ? std::stoi(*left) : kSeats;
                    (void)tx.put("venue", "seats-left", std::to_string(seats - 1));
                    (void)tx.put("seat-holders", std::string(m.idempotency_key()), std::string(m.key()));
                    int n = std::stoi(std::string(m.idempotency_key().substr(8)));
                    if (n % 3 == 0 && m.attempt() == 1) return Outcome::retry("payment gateway timeout");
                    return Outcome::ack();
                  },
                  {.max_attempts = 5, .idempotency_scope = "tickets"})
                 .value();
  for (int i = 0; i < kDistinct; ++i) {
    std::string id = "booking-" + std::to_string(i);
    (void)bookings.publish({.key = "customer-" + std::to_string(i % 9), .payload = "1 seat", .idempotency_key = id});
  }
  for (int i = 0; i < kDuplicates; ++i) {
    std::string id = "booking-" + std::to_string((i * 5) % kDistinct);
    (void)bookings.publish({.key = "customer-" + std::to_string(i % 9), .payload = "1 seat", .idempotency_key = id});
  }
  std::string expected = std::to_string(kSeats - kDistinct);
  // A generous deadline: every delivery is an fsynced transaction, which a loaded
  // machine's disk can make slow; the loop ends as soon as the seats are right.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto left = bus->table_get("venue", "seats-left");
    // Done when the seats are right, every duplicate was seen and skipped
    // (a duplicate may still wait in the queue when the seats already are),
    // and nothing is in flight.
    std::uint64_t lag = 0, skipped = 0;
    for (const auto& t : bus->stats().topics)
      for (const auto& g : t.groups) {
        lag += g.total.in_flight;
        skipped += g.total.duplicates_skipped;
      }
    if (left.ok() && *left == expected && skipped >= kDuplicates && lag == 0) break;
    std::this_thread::sleep_for(1ms);
  }
  auto left = bus->table_get("venue", "seats-left");
  auto g = bus->stats().topics[0].groups[0].total;
  std::printf("deliveries: %llu, retried: %llu, duplicates skipped: %llu\n",
              static_cast<unsigned long long>(g.delivered), static_cast<unsigned long long>(g.retried),
              static_cast<unsigned long long>(g.duplicates_skipped));
  std::printf("seats left: %s (expected %s = %d - %d distinct bookings)\n", left.ok() ? left->c_str() : "?",
              expected.c_str(), kSeats, kDistinct);
  const bool ok = left.ok() && *left == expected && g.duplicates_skipped == kDuplicates;
  (void)bus->shutdown(ShutdownMode::Drain);
  fs::remove_all(dir);
  std::printf("%s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
