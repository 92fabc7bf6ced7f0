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

// A 128-bit product for the 32.32 rate (GCC and Clang; __extension__ keeps -Wpedantic quiet).
__extension__ typedef unsigned __int128 u128;

std::atomic<bool> g_refreshing{false};
// Writer state (guarded by g_refreshing): the base the mult is measured from.
std::uint64_t g_base_tsc = 0;
std::int64_t g_base_ns = 0;
// The last measure that disagreed with the rate (0: none since the last agreement).
std::uint64_t g_rejected = 0;
// Before the first calibration: no re-anchor attempt (and its flag) until then.
std::atomic<std::int64_t> g_calibrate_at_ns{0};

// Calibrate over at least 5 ms (the process's first Bus::open starts it):
// with both ends of the span read in under kCalibrationTicks, the rate is
// off by at most 2 × 512 ticks over 5 ms, 1.4·10^-4 at 1.5 GHz and less
// on faster TSCs, and it improves as the span grows. It was 100 ms with
// loose pairs; a process's first 100 ms then read CLOCK_REALTIME per
// message, half the hot path's rate (doc/performance.md, tenth round).
constexpr std::int64_t kFirstSpanNs = 5'000'000;
constexpr std::int64_t kSlideSpanNs = 10'000'000'000;  // then measure over up to the last ~10 s
constexpr std::uint64_t kAnchorTicks = std::uint64_t{1} << 16;  // ~22 µs at 3 GHz
constexpr std::uint64_t kCalibrationTicks = std::uint64_t{1} << 10;  // ~340 ns at 3 GHz

/// A (TSC, CLOCK_REALTIME) pair read close together: the TSC at the middle
/// of the clock read, retried while a preemption spreads the reads over
/// `max_ticks` or more. False when no pair that tight came.
bool sample(std::uint64_t* tsc, std::int64_t* ns, std::uint64_t max_ticks, int tries) noexcept {
  for (; tries > 0; --tries) {
    const std::uint64_t t1 = __rdtsc();
    const std::int64_t n = WallClock::realtime_ns();
    const std::uint64_t t2 = __rdtsc();
    if (t2 >= t1 && t2 - t1 < max_ticks) {
      *tsc = t1 + (t2 - t1) / 2;
      *ns = n;
      return true;
    }
  }
  return false;
}

bool usable() noexcept {
  static const bool ok = tsc_clocksource();
  return ok;
}
}  // namespace

std::int64_t WallClock::refresh() noexcept {
  std::uint64_t tsc;
  std::int64_t ns;
  if (!usable() || !sample(&tsc, &ns, kAnchorTicks, 4)) return realtime_ns();
  if (ns < g_calibrate_at_ns.load(std::memory_order_relaxed)) return ns;  // too early for a rate
  if (g_refreshing.exchange(true, std::memory_order_acquire)) return ns;  // another thread re-anchors
  // The ends of a rate's span are tight pairs; a loose one only anchors.
  std::uint64_t tight_tsc;
  std::int64_t tight_ns;
  const bool tight = sample(&tight_tsc, &tight_ns, kCalibrationTicks, 8);
  if (tight) {
    tsc = tight_tsc;
    ns = tight_ns;
  }
  std::uint64_t mult = anchor_.mult.load(std::memory_order_relaxed);
  if (!tight) {
    // Anchor with the loose pair, measure nothing.
  } else if (g_base_tsc == 0 || tsc <= g_base_tsc || ns <= g_base_ns) {
    g_base_tsc = tsc;  // the first sample, or the clock stepped back: measure from here
    g_base_ns = ns;
    if (mult == 0) g_calibrate_at_ns.store(ns + kFirstSpanNs, std::memory_order_relaxed);
  } else if (const std::int64_t span = ns - g_base_ns; span >= kFirstSpanNs) {
    const auto m = static_cast<std::uint64_t>((static_cast<u128>(span) << 32) / (tsc - g_base_tsc));
    if (mult == 0 || (m > mult ? m - mult : mult - m) <= mult / 1000) {
      mult = m;  // within 0.1 % of the last rate: NTP's slew, or a better measure
      g_rejected = 0;
      if (span >= kSlideSpanNs) {
        g_base_tsc = tsc;
        g_base_ns = ns;
      }
    } else if (g_rejected != 0 && (m > g_rejected ? m - g_rejected : g_rejected - m) <= g_rejected / 1000) {
      mult = m;  // two spans in a row agree against it: the rate was measured across a step
      g_rejected = 0;
      g_base_tsc = tsc;
      g_base_ns = ns;
    } else {
      g_rejected = m;  // a step of the system clock: keep the rate, measure again from here
      g_base_tsc = tsc;
      g_base_ns = ns;
    }
  }
  if (mult != 0) {
    const std::uint32_t seq = anchor_.seq.load(std::memory_order_relaxed);
    anchor_.seq.store(seq + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    anchor_.tsc0.store(tsc, std::memory_order_relaxed);
    anchor_.ns0.store(ns, std::memory_order_relaxed);
    anchor_.mult.store(mult, std::memory_order_relaxed);
    anchor_.seq.store(seq + 2, std::memory_order_release);
  }
  g_refreshing.store(false, std::memory_order_release);
  return ns;
}

bool WallClock::tsc_usable() noexcept { return usable(); }
#else
std::int64_t WallClock::refresh() noexcept { return realtime_ns(); }
bool WallClock::tsc_usable() noexcept { return false; }
#endif

}  // namespace lanebus::detail
