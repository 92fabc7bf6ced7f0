// lanebus — MIT License.
// Helper for idempotency_test: opens the store at argv[1], waits until the file
// argv[3] exists (a start barrier), claims key argv[2] in scope "race", and
// prints the outcome ("Claimed", "InProgress" or "Done") on stdout.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "lanebus/lanebus.hpp"

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  lanebus::BusOptions o;
  o.workers = 1;
  o.store.directory = argv[1];
  auto bus = lanebus::Bus::open(o);
  if (!bus.ok()) {
    std::fprintf(stderr, "open: %s\n", bus.status().to_string().c_str());
    return 1;
  }
  auto table = (*bus)->idempotency("race");
  if (!table.ok()) return 1;
  while (!std::filesystem::exists(argv[3])) std::this_thread::sleep_for(std::chrono::microseconds(100));
  auto r = (*table)->claim(argv[2]);
  if (!r.ok()) {
    std::fprintf(stderr, "claim: %s\n", r.status().to_string().c_str());
    return 1;
  }
  const char* names[] = {"Claimed", "InProgress", "Done"};
  std::printf("%s\n", names[static_cast<int>(r->state)]);
  return 0;
}
