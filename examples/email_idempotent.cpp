// lanebus — MIT License.
// Exactly-once e-mail (doc/idempotency.md): at-least-once delivery + an idempotency table
// keyed by the business key ("welcome-e100"), never by a delivery id.
//
// Steps: two consumers race on welcome-e100 (exactly one claims and sends);
// a redelivery is skipped; after the hot tier's TTL expired and the process
// restarted, a redelivery is still skipped (durable tier); welcome-e101 sends.
// The fake mail provider's log must show exactly two sends.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// The fake mail provider: appends one line per e-mail "sent".
struct MailProvider {
  fs::path log;
  void send(std::string_view id) { std::ofstream(log, std::ios::app) << "sent " << id << "\n"; }
  int sends() const {
    std::ifstream in(log);
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line.rfind("sent ", 0) == 0;
    return n;
  }
};

BusOptions bus_options(const fs::path& dir) {
  BusOptions o;
  o.name = "mailer";
  o.workers = 2;
  o.store.directory = (dir / "store").string();
  o.durable_poll = 10ms;
  return o;
}

const IdempotencyOptions kMailScope{.hot_ttl = 200ms};  // short, so the demo can outlive it

template <typename Pred>
bool wait_for(Pred pred) {
  for (int i = 0; i < 10000 && !pred(); ++i) std::this_thread::sleep_for(1ms);
  return pred();
}

}  // namespace

int main() {
  char tmpl[] = "/tmp/lanebus-mail-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const fs::path dir = tmpl;
  MailProvider provider{dir / "provider.log"};
  int rc = 0;
  std::atomic<int> handled{0};
  auto mail_handler = [&](IdempotencyTable* table) {
    return [&, table](const MessageView& m) {
      ++handled;
      auto claim = table->claim(m.idempotency_key());
      if (!claim.ok()) return Outcome::retry(claim.status().to_string());
      if (claim->state == ClaimState::Done) {
        std::printf("   delivery %u of %.*s: already done -> skipped\n", m.attempt(), int(m.idempotency_key().size()),
                    m.idempotency_key().data());
        return Outcome::ack();
      }
      if (claim->state == ClaimState::InProgress) return Outcome::retry("another consumer is sending it");
      provider.send(m.idempotency_key());
      std::printf("   %.*s: claimed -> sent\n", int(m.idempotency_key().size()), m.idempotency_key().data());
      if (Status s = table->complete(m.idempotency_key(), "provider-accepted"); !s.ok())
        return Outcome::retry(s.to_string());
      return Outcome::ack();
    };
  };
  {
    auto bus = Bus::open(bus_options(dir)).value();
    IdempotencyTable* table = bus->idempotency("mail.welcome", kMailScope).value();

    std::printf("1. two consumers race on welcome-e100\n");
    std::atomic<int> winners{0};
    std::atomic<bool> go{false};
    auto racer = [&](const char* name) {
      while (!go) std::this_thread::yield();
      auto r = table->claim("welcome-e100");
      if (r.ok() && r->state == ClaimState::Claimed) {
        ++winners;
        provider.send("welcome-e100");
        (void)table->complete("welcome-e100", "provider-accepted");
        std::printf("   consumer %s claimed welcome-e100 -> sent\n", name);
      } else {
        std::printf("   consumer %s lost the race (%s)\n", name,
                    r.ok() ? (r->state == ClaimState::InProgress ? "in progress" : "done") : "error");
      }
    };
    std::thread a(racer, "A"), b(racer, "B");
    go = true;
    a.join();
    b.join();
    if (winners != 1) rc = 1;

    std::printf("2. the broker redelivers welcome-e100\n");
    auto outbox = bus->create_queue("mail.outbox", {.lanes = 2, .durable = true}).value();
    auto sub = bus->consume(outbox, mail_handler(table)).value();
    (void)outbox.publish({.key = "user-100", .payload = "Welcome!", .idempotency_key = "welcome-e100"});
    if (!wait_for([&] { return handled == 1; })) rc = 1;
    std::this_thread::sleep_for(300ms);  // the hot tier's TTL expires
  }
  {
    std::printf("3. the process restarts (hot tier empty, TTL long gone); welcome-e100 is redelivered again\n");
    auto bus = Bus::open(bus_options(dir)).value();
    IdempotencyTable* table = bus->idempotency("mail.welcome", kMailScope).value();
    auto outbox = bus->create_queue("mail.outbox", {.lanes = 2, .durable = true}).value();
    auto sub = bus->consume(outbox, mail_handler(table)).value();
    (void)outbox.publish({.key = "user-100", .payload = "Welcome!", .idempotency_key = "welcome-e100"});
    if (!wait_for([&] { return handled == 2; })) rc = 1;
    std::printf("4. a new user: welcome-e101\n");
    (void)outbox.publish({.key = "user-101", .payload = "Welcome!", .idempotency_key = "welcome-e101"});
    if (!wait_for([&] { return handled == 3; })) rc = 1;
    std::this_thread::sleep_for(50ms);
  }
  const int sends = provider.sends();
  std::printf("\nmail provider log: %d sends (expected exactly 2)\n", sends);
  if (sends != 2) rc = 1;
  fs::remove_all(dir);
  std::printf("%s\n", rc == 0 ? "OK" : "FAILED");
  return rc;
}
