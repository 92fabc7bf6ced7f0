// lanebus — MIT License.
// Test sizes and soak figures. A loop's size comes from an environment variable
// with its CI default written here in the code, never pinned in tests/meson.build
// (a test's own env would override `meson test --setup soak`). print_figures()
// prints the one line per test that scripts/soak.sh sums per suite.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace lanebus::test {

/// True in an ASan or TSan build, where loops run 3-10x slower. Some CI
/// defaults are smaller there; the plain stage runs the full CI size.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

/// The value of environment variable `name` when it holds a positive integer,
/// else `ci_default`. The variables: LANEBUS_CRASH_CYCLES (kill loops),
/// LANEBUS_STRESS_SECONDS (stress and SIGSTOP contention loops),
/// LANEBUS_POWER_CUTS (power-cut loops), LANEBUS_CORRUPTION_TRIALS (page
/// damage trials).
inline std::uint64_t env_size(const char* name, std::uint64_t ci_default) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return ci_default;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  return (end != v && *end == '\0' && n > 0) ? n : ci_default;
}

/// One line for scripts/soak.sh: "figures: WHAT cycles=N messages=M seconds=S".
/// `cycles` counts kills, cuts or pauses; `messages` the messages (or grants)
/// the run checked; `seconds` the time since `start`.
inline void print_figures(const char* what, std::uint64_t cycles, std::uint64_t messages,
                          std::chrono::steady_clock::time_point start) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("figures: %s cycles=%llu messages=%llu seconds=%.1f\n", what, static_cast<unsigned long long>(cycles),
              static_cast<unsigned long long>(messages), seconds);
  std::fflush(stdout);
}

}  // namespace lanebus::test
