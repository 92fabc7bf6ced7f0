// lanebus — MIT License.
// The dead-letter workflow (doc/dlq.md): a producer renames a field, three
// payments fail to deserialize, use up their retries and land in the DLQ as
// permanent; the consumer is fixed; an operator replays them with the CLI
// (`lanebus dlq replay`); each is processed once — one had already charged
// the card before failing, and the idempotency table stops a second charge;
// the audit log shows who replayed them.
//
//   payments_dlq [PATH_TO_lanebus_TOOL]   (default: ../tools/lanebus next to this binary)
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// "id=p1;amount=10" → the value of `field`, or "" if it is missing.
std::string field(std::string_view payload, std::string_view name) {
  std::string key = std::string(name) + "=";
  auto pos = payload.find(key);
  if (pos == std::string_view::npos) return {};
  auto end = payload.find(';', pos);
  return std::string(payload.substr(pos + key.size(), end == std::string_view::npos ? end : end - pos - key.size()));
}

int run(const std::vector<std::string>& args) {
  std::string cmd;
  for (const auto& a : args) cmd += "'" + a + "' ";
  std::printf("   $ lanebus");
  for (std::size_t i = 1; i < args.size(); ++i) std::printf(" %s", args[i].c_str());
  std::printf("\n");
  std::fflush(stdout);
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
}

template <typename Pred>
bool wait_for(Pred pred) {
  for (int i = 0; i < 15000 && !pred(); ++i) std::this_thread::sleep_for(1ms);
  return pred();
}

}  // namespace

int main(int argc, char** argv) {
  fs::path tool = argc > 1 ? fs::path(argv[1]) : fs::absolute(argv[0]).parent_path().parent_path() / "tools" / "lanebus";
  if (!fs::exists(tool)) {
    std::fprintf(stderr, "payments_dlq: the lanebus tool is not at %s (pass its path)\n", tool.c_str());
    return 1;
  }
  char tmpl[] = "/tmp/lanebus-payments-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const fs::path dir = tmpl;
  const std::string store = (dir / "store").string();
  int rc = 0;

  BusOptions o;
  o.name = "payments";
  o.workers = 2;
  o.store.directory = store;
  o.durable_poll = 10ms;
  auto bus = Bus::open(o).value();
  auto queue = bus->create_queue("payments.incoming", {.lanes = 2, .durable = true}).value();
  IdempotencyTable* charges = bus->idempotency("payments.charges").value();
  std::mutex mu;
  std::vector<std::string> charged;  // the card processor's log
  auto charge = [&](const std::string& id, const std::string& cents) {
    auto c = charges->claim("charge-" + id);
    if (!c.ok() || c->state != ClaimState::Claimed) {
      std::printf("   %s: card already charged -> not charged again\n", id.c_str());
      return;
    }
    {
      std::lock_guard l(mu);
      charged.push_back(id);
    }
    (void)charges->complete("charge-" + id, cents);
    std::printf("   %s: charged %s cents\n", id.c_str(), cents.c_str());
  };

  std::printf("1. consumer v1 reads `amount`; the producer now sends `amount_cents` (a field rename)\n");
  std::atomic<int> v1_calls{0};
  {
    auto v1 = bus->consume(queue, [&](const MessageView& m) {
                     ++v1_calls;
                     std::string id = field(m.payload(), "id");
                     // p2's old code path charged the card before parsing the rest.
                     if (id == "p2" && m.attempt() == 1) charge(id, field(m.payload(), "amount_cents"));
                     if (field(m.payload(), "amount").empty()) {
                       if (m.attempt() < 3) return Outcome::retry("deserialization failed: no field amount");
                       return Outcome::reject("deserialization failed: no field amount (schema changed?)");
                     }
                     return Outcome::ack();
                   },
                   {.max_attempts = 3, .backoff_initial = 5ms})
                  .value();
    for (const char* p : {"id=p1;amount_cents=1000", "id=p2;amount_cents=2500", "id=p3;amount_cents=400"})
      (void)queue.publish({.key = field(p, "id"), .payload = p, .idempotency_key = field(p, "id")});
    if (!wait_for([&] { return bus->stats().dlq.arrivals[static_cast<int>(ErrorClass::Permanent)] == 3; })) rc = 1;
  }
  auto st = bus->stats();
  std::printf("   v1 handler calls: %d; DLQ arrivals: permanent=%llu transient=%llu poison=%llu; depth=%llu\n",
              v1_calls.load(), static_cast<unsigned long long>(st.dlq.arrivals[1]),
              static_cast<unsigned long long>(st.dlq.arrivals[0]), static_cast<unsigned long long>(st.dlq.arrivals[2]),
              static_cast<unsigned long long>(st.dlq.pending));
  if (st.dlq.arrivals[static_cast<int>(ErrorClass::Permanent)] != 3) rc = 1;

  std::printf("\n2. the DLQ, as an operator sees it\n");
  if (run({tool.string(), "dlq", "list", store}) != 0) rc = 1;

  std::printf("\n3. consumer v2 reads `amount_cents`; alice replays the three entries from the CLI\n");
  std::atomic<int> processed{0};
  auto v2 = bus->consume(queue, [&](const MessageView& m) {
                   std::string id = field(m.payload(), "id");
                   charge(id, field(m.payload(), "amount_cents"));
                   ++processed;
                   return Outcome::ack();
                 },
                 {.max_attempts = 3})
                .value();
  auto entries = (*bus->dead_letters())->list().value();
  std::vector<std::string> replay = {tool.string(), "dlq", "replay", store, "--operator", "alice"};
  for (const auto& e : entries) replay.push_back(std::to_string(e.id));
  if (run(replay) != 0) rc = 1;
  if (!wait_for([&] { return processed == 3; })) rc = 1;
  std::this_thread::sleep_for(100ms);

  std::printf("\n4. the audit log\n");
  if (run({tool.string(), "dlq", "audit", store}) != 0) rc = 1;

  {
    std::lock_guard l(mu);
    std::printf("\ncard processor log: %zu charges (expected 3: p2 once, not twice)\n", charged.size());
    if (charged.size() != 3) rc = 1;
  }
  if (processed != 3) rc = 1;
  (void)bus->shutdown(ShutdownMode::Drain);
  fs::remove_all(dir);
  std::printf("%s\n", rc == 0 ? "OK" : "FAILED");
  return rc;
}
