// lanebus — MIT License.
// Helper for idempotency_test. Opens the store at argv[1], scope "race", then:
//   race KEY BARRIER  waits until the file BARRIER exists (a start barrier),
//                     claims KEY and prints the outcome ("Claimed",
//                     "InProgress" or "Done"), then exits once BARRIER.end
//                     exists (its claim stays owned by a live process).
//   hold KEY          claims KEY, prints the outcome, then waits to be killed
//                     (it never completes or releases the claim).
//   loop PREFIX       for i = 0, 1, ...: claims PREFIX-i, prints
//                     "claimed PREFIX-i"; every other key it then completes and
//                     prints "done PREFIX-i". Runs until killed.
// Every claim uses claim_timeout = 5 min, so only owner liveness frees a key quickly.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "lanebus/lanebus.hpp"

namespace {
const char* name_of(lanebus::ClaimState s) {
  const char* names[] = {"Claimed", "InProgress", "Done"};
  return names[static_cast<int>(s)];
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: idempotency_child STORE race KEY BARRIER | hold KEY | loop PREFIX\n");
    return 2;
  }
  const std::string mode = argv[2];
  lanebus::BusOptions o;
  o.workers = 1;
  o.store.directory = argv[1];
  auto bus = lanebus::Bus::open(o);
  if (!bus.ok()) {
    std::fprintf(stderr, "open: %s\n", bus.status().to_string().c_str());
    return 1;
  }
  auto table = (*bus)->idempotency("race", {.claim_timeout = std::chrono::minutes(5)});
  if (!table.ok()) {
    std::fprintf(stderr, "idempotency: %s\n", table.status().to_string().c_str());
    return 1;
  }
  lanebus::IdempotencyTable* t = *table;
  if (mode == "race") {
    if (argc != 5) return 2;
    while (!std::filesystem::exists(argv[4])) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (mode == "race" || mode == "hold") {
    auto r = t->claim(argv[3]);
    if (!r.ok()) {
      std::fprintf(stderr, "claim: %s\n", r.status().to_string().c_str());
      return 1;
    }
    std::printf("%s\n", name_of(r->state));
    std::fflush(stdout);
    if (mode == "race") {
      // Stay alive (holding a claimed key) until every racer has claimed: a
      // claim of a process that exited is void at once (doc/idempotency.md).
      const std::string end = std::string(argv[4]) + ".end";
      while (!std::filesystem::exists(end)) std::this_thread::sleep_for(std::chrono::microseconds(100));
      return 0;
    }
    for (;;) ::pause();  // hold the claim until SIGKILL
  }
  if (mode == "loop") {
    for (int i = 0;; ++i) {
      const std::string key = std::string(argv[3]) + "-" + std::to_string(i);
      auto r = t->claim(key);
      if (!r.ok() || r->state != lanebus::ClaimState::Claimed) {
        std::fprintf(stderr, "claim %s: %s\n", key.c_str(),
                     r.ok() ? name_of(r->state) : r.status().to_string().c_str());
        return 1;
      }
      std::printf("claimed %s\n", key.c_str());
      std::fflush(stdout);
      if (i % 2 == 0) {
        lanebus::Status s = t->complete(key, "r");
        if (!s.ok()) return 1;
        std::printf("done %s\n", key.c_str());
        std::fflush(stdout);
      }
    }
  }
  std::fprintf(stderr, "unknown mode \"%s\"\n", mode.c_str());
  return 2;
}
