// lanebus — MIT License.
// test_seed(): the seed of a random test — LANEBUS_SEED if set, else from the clock; always printed.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace lanebus::test {

inline std::uint64_t test_seed(const char* what) {
  std::uint64_t seed = 0;
  if (const char* env = std::getenv("LANEBUS_SEED"); env != nullptr && *env != '\0') {
    seed = std::strtoull(env, nullptr, 10);
  } else {
    seed = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  std::printf("%s: LANEBUS_SEED=%llu\n", what, static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  return seed;
}

}  // namespace lanebus::test
