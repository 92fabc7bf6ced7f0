// lanebus — MIT License.
// WallClock (wall_clock.hpp): calibration and re-anchoring.
#include "wall_clock.hpp"

#include <cstdio>
#include <cstring>

namespace lanebus::detail {

WallClock::Anchor WallClock::anchor_;

#if LANEBUS_HAVE_TSC
namespace {
/// The TSC is usable only where the kernel itself keeps time with it.
bool tsc_clocksource() noexcept {
  std::FILE* f = std::fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (f == nullptr) return false;
  char name[32] = {};
  const bool ok = std::fgets(name, sizeof name, f) != nullptr && std::strncmp(name, "tsc", 3) == 0 &&
                  (name[3] == '\n' || name[3] == '\0');
  std::fclose(f);
  return ok;
}

struct First {
  bool usable;
  std::uint64_t tsc;
  std::int64_t ns;
};

/// The process's first anchor, the far end of every mult measurement.
const First& first() noexcept {
  static const First f = [] {
    First x{tsc_clocksource(), 0, 0};
    x.tsc = __rdtsc();
    x.ns = WallClock::realtime_ns();
    return x;
  }();
  return f;
}

std::atomic<bool> g_refreshing{false};
}  // namespace

std::int64_t WallClock::refresh() noexcept {
  const First& f = first();
  // The pair (ns, tsc): the TSC read at the middle of the clock read.
  const std::uint64_t t1 = __rdtsc();
  const std::int64_t ns = realtime_ns();
  const std::uint64_t t2 = __rdtsc();
  if (!f.usable) return ns;
  const std::uint64_t tsc = t1 + (t2 - t1) / 2;
  const std::int64_t span_ns = ns - f.ns;
  if (span_ns < 10'000'000 || tsc <= f.tsc) return ns;  // too early for a good mult (or a clock step back)
  if (g_refreshing.exchange(true, std::memory_order_acquire)) return ns;  // another thread re-anchors
  const unsigned __int128 m = (static_cast<unsigned __int128>(span_ns) << 32) / (tsc - f.tsc);
  const std::uint32_t seq = anchor_.seq.load(std::memory_order_relaxed);
  anchor_.seq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  anchor_.tsc0.store(tsc, std::memory_order_relaxed);
  anchor_.ns0.store(ns, std::memory_order_relaxed);
  anchor_.mult.store(static_cast<std::uint64_t>(m), std::memory_order_relaxed);
  anchor_.seq.store(seq + 2, std::memory_order_release);
  g_refreshing.store(false, std::memory_order_release);
  return ns;
}
#else
std::int64_t WallClock::refresh() noexcept { return realtime_ns(); }
#endif

}  // namespace lanebus::detail
