// lanebus — MIT License.
// Helper for liveness_test: consumes the durable queue "jobs" (4 lanes) with a
// plain handler, idempotency scope "liveness" (claim_timeout 5 min, the
// default, set explicitly) and visibility 1 s. Each completed message is
// appended to COMPLETIONS ("<idempotency key>\n", one write(2) with O_APPEND)
// before the handler returns ack.
//   liveness_child STORE_DIR COMPLETIONS BLOCK_KEY KEY...
// BLOCK_KEY: the handler prints "inside BLOCK_KEY" on stdout and then blocks
// for good on that message, holding its idempotency claim until the parent
// kills the process. "-" blocks on nothing. The child exits 0 (after printing
// "drained") once every KEY is done in the idempotency table.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  const std::string block = argv[3];
  const std::vector<std::string> keys(argv + 4, argv + argc);
  const int out = ::open(argv[2], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (out < 0) return 5;
  BusOptions o;
  o.workers = 2;
  o.store.directory = argv[1];
  o.durable_poll = 5ms;
  auto bus_r = Bus::open(o);
  if (!bus_r.ok()) {
    std::fprintf(stderr, "liveness_child: open: %s\n", bus_r.status().to_string().c_str());
    return 1;
  }
  auto& bus = *bus_r;
  // The scope's table, created before the group uses it, with the default
  // claim timeout spelled out: a dead consumer's claim must not need it.
  auto idem = bus->idempotency("liveness", {.claim_timeout = std::chrono::minutes(5)});
  if (!idem.ok()) return 1;
  auto queue = bus->create_queue("jobs", {.lanes = 4, .durable = true}).value();
  auto sub = bus->consume(queue,
                          [&](const MessageView& m) {
                            const std::string key(m.idempotency_key());
                            if (key == block) {
                              std::printf("inside %s\n", key.c_str());
                              std::fflush(stdout);
                              for (;;) ::pause();  // holds the claim until SIGKILL
                            }
                            const std::string line = key + "\n";
                            if (::write(out, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
                              return Outcome::retry("completion record");
                            return Outcome::ack();
                          },
                          {.idempotency_scope = "liveness", .visibility = 1000ms});
  if (!sub.ok()) {
    std::fprintf(stderr, "liveness_child: consume: %s\n", sub.status().to_string().c_str());
    return 1;
  }
  for (;;) {
    bool all_done = !keys.empty();
    for (const std::string& k : keys) {
      auto st = (*idem)->status(k);
      if (!st.ok() || st->state != ClaimState::Done) {
        all_done = false;
        break;
      }
    }
    if (all_done) break;
    std::this_thread::sleep_for(5ms);
  }
  (void)sub->close();
  (void)bus->shutdown(ShutdownMode::Drain);
  std::printf("drained\n");
  std::fflush(stdout);
  return 0;
}
