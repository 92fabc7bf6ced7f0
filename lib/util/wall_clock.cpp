// lanebus — MIT License.
// WallClock (wall_clock.hpp): calibration and re-anchoring.
#include "wall_clock.hpp"

#include <cstdio>
#include <cstring>

namespace lanebus::detail {

WallClock::Anchor WallClock::anchor_;

namespace {
// set_source_for_testing: the clock sample() and refresh() read (nullptr: CLOCK_REALTIME).
std::atomic<std::int64_t (*)() noexcept> g_source{nullptr};
std::int64_t source_ns() noexcept {
  std::int64_t (*const f)() noexcept = g_source.load(std::memory_order_acquire);
  return f != nullptr ? f() : WallClock::realtime_ns();
}
}  // namespace

void WallClock::set_source_for_testing(std::int64_t (*source)() noexcept) noexcept {
  g_source.store(source, std::memory_order_release);
}

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
// Writer state (guarded by g_refreshing): the base the mult is measured
// from, and how wide its pair was (TSC ticks around the clock read).
std::uint64_t g_base_tsc = 0;
std::int64_t g_base_ns = 0;
std::uint64_t g_base_width = 0;
// The last measure that disagreed with the rate (0: none since the last agreement).
std::uint64_t g_rejected = 0;
// Until the first rate: no re-anchor attempt (and its flag) before then.
std::atomic<std::int64_t> g_calibrate_at_ns{0};

// A rate is measured over at least 5 ms from the process's first clock
// read (Bus::open makes one), and only over a span long enough for the
// widths of its two pairs: each end is known to within half its pair's
// width, so a span of kErrorInverse × (the widths) ticks errs by at most
// 10^-4. With pairs of ~100 ticks (a vDSO clock_gettime) that takes under
// 1 ms, so 5 ms decides; with slow clock reads (valgrind) it waits longer.
// It was a fixed 100 ms: a process's first 100 ms then read
// CLOCK_REALTIME per message, half the hot path's rate (doc/performance.md,
// tenth round).
constexpr std::int64_t kFirstSpanNs = 5'000'000;
constexpr std::int64_t kSlideSpanNs = 10'000'000'000;  // then measure over up to the last ~10 s
constexpr std::uint64_t kAnchorTicks = std::uint64_t{1} << 16;  // a pair wider is refused (~22 µs at 3 GHz)
constexpr std::uint64_t kTightTicks = std::uint64_t{1} << 10;   // a pair this tight ends the search
constexpr std::uint64_t kErrorInverse = 10'000;

/// A (TSC, CLOCK_REALTIME) pair read close together: the TSC at the middle
/// of the clock read. The tightest of up to four tries (the first under
/// kTightTicks ends the search); false when none was under kAnchorTicks.
bool sample(std::uint64_t* tsc, std::int64_t* ns, std::uint64_t* width) noexcept {
  std::uint64_t best = kAnchorTicks;
  for (int tries = 0; tries < 4 && best >= kTightTicks; ++tries) {
    const std::uint64_t t1 = __rdtsc();
    const std::int64_t n = source_ns();
    const std::uint64_t t2 = __rdtsc();
    if (t2 < t1 || t2 - t1 >= best) continue;
    best = t2 - t1;
    *tsc = t1 + best / 2;
    *ns = n;
  }
  *width = best;
  return best < kAnchorTicks;
}

bool usable() noexcept {
  static const bool ok = tsc_clocksource();
  return ok;
}
}  // namespace

std::int64_t WallClock::refresh() noexcept {
  std::uint64_t tsc = 0, width = 0;
  std::int64_t ns = 0;
  if (!usable() || !sample(&tsc, &ns, &width)) return source_ns();
  if (ns < g_calibrate_at_ns.load(std::memory_order_relaxed)) return ns;  // too early for a rate
  if (g_refreshing.exchange(true, std::memory_order_acquire)) return ns;  // another thread re-anchors
  std::uint64_t mult = anchor_.mult.load(std::memory_order_relaxed);
  if (g_base_tsc == 0 || tsc <= g_base_tsc || ns <= g_base_ns) {
    g_base_tsc = tsc;  // the first sample, or the clock stepped back: measure from here
    g_base_ns = ns;
    g_base_width = width;
    if (mult == 0) g_calibrate_at_ns.store(ns + kFirstSpanNs, std::memory_order_relaxed);
  } else if (const std::int64_t span = ns - g_base_ns; span < kFirstSpanNs) {
    // Too short to measure: anchor only.
  } else if ((g_base_width + width) * kErrorInverse > tsc - g_base_tsc) {
    // Too short for these pairs' widths: anchor only, and before the first
    // rate look again only once as long again has passed.
    if (mult == 0) g_calibrate_at_ns.store(ns + span, std::memory_order_relaxed);
  } else {
    const auto m = static_cast<std::uint64_t>((static_cast<u128>(span) << 32) / (tsc - g_base_tsc));
    const auto near = [](std::uint64_t x, std::uint64_t y) { return (x > y ? x - y : y - x) <= y / 1000; };
    if (mult == 0 || near(m, mult)) {
      mult = m;  // within 0.1 % of the last rate: NTP's slew, or a better measure
      g_rejected = 0;
      if (span >= kSlideSpanNs) {
        g_base_tsc = tsc;
        g_base_ns = ns;
        g_base_width = width;
      }
    } else {
      // A step of the system clock: keep the rate and measure again from
      // here; the next measure agreeing with this one instead replaces the
      // rate (the rate was measured across a step).
      if (g_rejected != 0 && near(m, g_rejected)) {
        mult = m;
        g_rejected = 0;
      } else {
        g_rejected = m;
      }
      g_base_tsc = tsc;
      g_base_ns = ns;
      g_base_width = width;
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
std::int64_t WallClock::refresh() noexcept { return source_ns(); }
bool WallClock::tsc_usable() noexcept { return false; }
#endif

}  // namespace lanebus::detail
