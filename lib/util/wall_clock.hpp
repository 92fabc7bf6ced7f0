// lanebus — MIT License.
// WallClock: nanoseconds since the Unix epoch for message timestamps and
// latency histograms, from the TSC instead of a clock_gettime per read.
//
// Design notes
// - A clock_gettime(CLOCK_REALTIME) costs 35-100 ns on the VMs we measure
//   (doc/performance.md); publish and the worker each read the clock once
//   per message. A TSC read costs about 16 ns; scaling it is a multiply.
// - One anchor for the process: (tsc0, ns0, mult), mult = ns per tick in
//   32.32 fixed point, under a sequence lock. A reader whose TSC is more than
//   kRefreshTicks (2^19, 175-260 µs at 2-3 GHz) past tsc0 re-anchors: it
//   reads a tight (TSC, CLOCK_REALTIME) pair (retried while a preemption
//   spreads it) and, if it wins a flag, publishes the new anchor. At 25 M
//   stamps a second that is one clock_gettime per ~5,000 stamps.
// - mult is measured from the first clock read of the process (Bus::open
//   makes one) over at least 5 ms, then over a base that slides every
//   ~10 s, and only over a span of at least 10^4 times the widths of its
//   two pairs (the TSC ticks around each clock read): a rate errs by at
//   most 10^-4 whatever the clock read costs (under valgrind it waits
//   longer). A measure more than 0.1 % off the last one is a step of the
//   system clock: the rate stays, the base moves; two such measures in a
//   row that agree replace the rate (the first one spanned a step).
// - Until that first rate, and where the TSC is not the kernel's
//   clocksource (it may then be unstable), now_ns() is clock_gettime
//   itself. (The first span was a fixed 100 ms: the first 100 ms of every
//   process ran the hot path at half its rate.)
//
// Error bound (tested in tests/fast_path_test.cpp and, from a fresh
// process, tests/wall_clock_test.cpp): within 50 µs of CLOCK_REALTIME read
// at the same moment. Each re-anchor starts from a fresh pair (±11 µs of
// anchor jitter at worst, the pair's half width: usually well under 1 µs);
// between re-anchors the error grows by the difference between the mult
// and the system clock's current rate times the time since the anchor.
// That difference is the mult's own error (under 10^-4) plus any change of
// the clock's rate since it was measured: NTP's or chrony's slew (chrony
// slews at up to 8.3 %, adjtimex's tick allows ±10 %), which the mult,
// averaged over up to 10 s, follows only slowly. Re-anchoring every 2^19
// ticks keeps that under 10 % × 260 µs = 26 µs. (It was 2^27 ticks, up to
// 70 ms: a clock whose rate changed by 0.5 % then drifted up to 350 µs from
// CLOCK_REALTIME before the next anchor, and a CI run caught created_at
// 240-430 µs behind it.) A step of the system clock shows until the next
// re-anchor. Every thread reads the same anchor, so an interval between two
// stamps (a latency) errs by at most the rate difference times the interval
// plus an anchor change between them.
#pragma once

#include <atomic>
#include <cstdint>
#include <ctime>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define LANEBUS_HAVE_TSC 1
#else
#define LANEBUS_HAVE_TSC 0
#endif

namespace lanebus::detail {

class WallClock {
 public:
  /// Nanoseconds since the Unix epoch (see the error bound above). Thread-safe, lock-free.
  static std::int64_t now_ns() noexcept {
#if LANEBUS_HAVE_TSC
    const std::uint32_t seq = anchor_.seq.load(std::memory_order_acquire);
    const std::uint64_t tsc0 = anchor_.tsc0.load(std::memory_order_relaxed);
    const std::int64_t ns0 = anchor_.ns0.load(std::memory_order_relaxed);
    const std::uint64_t mult = anchor_.mult.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    const std::uint64_t d = __rdtsc() - tsc0;
    if (mult != 0 && d < kRefreshTicks && (seq & 1) == 0 && anchor_.seq.load(std::memory_order_relaxed) == seq)
      return ns0 + static_cast<std::int64_t>((d * mult) >> 32);
    return refresh();
#else
    return realtime_ns();
#endif
  }

  /// CLOCK_REALTIME itself.
  /// A copy of the anchor for a loop that stamps many events (a worker's
  /// run): now_ns(reading) is a TSC read and a multiply, without the
  /// sequence lock's loads. It is exactly as accurate as now_ns(): the same
  /// anchor, used only while the TSC is within kRefreshTicks of it; past
  /// that, or before calibration, it falls back to now_ns().
  struct Reading {
    std::uint64_t tsc0 = 0;
    std::int64_t ns0 = 0;
    std::uint64_t mult = 0;  // 0: every read falls back to now_ns()
  };
  static Reading reading() noexcept {
    Reading r;
#if LANEBUS_HAVE_TSC
    const std::uint32_t seq = anchor_.seq.load(std::memory_order_acquire);
    r.tsc0 = anchor_.tsc0.load(std::memory_order_relaxed);
    r.ns0 = anchor_.ns0.load(std::memory_order_relaxed);
    r.mult = anchor_.mult.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if ((seq & 1) != 0 || anchor_.seq.load(std::memory_order_relaxed) != seq) r.mult = 0;
#endif
    return r;
  }
  static std::int64_t now_ns(const Reading& r) noexcept {
#if LANEBUS_HAVE_TSC
    const std::uint64_t d = __rdtsc() - r.tsc0;
    if (d < kRefreshTicks && r.mult != 0) [[likely]]
      return r.ns0 + static_cast<std::int64_t>((d * r.mult) >> 32);
#endif
    return now_ns();
  }

  static std::int64_t realtime_ns() noexcept {
    timespec ts;
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  }

  /// Tests only: the clock that calibration and re-anchoring read instead of
  /// CLOCK_REALTIME (nullptr: CLOCK_REALTIME again). For a test that makes
  /// the "system clock" change its rate (tests/wall_clock_test.cpp).
  static void set_source_for_testing(std::int64_t (*source)() noexcept) noexcept;

  /// True when now_ns() scales the TSC (after calibration, on a TSC clocksource).
  /// The TSC's use: it is the kernel's clocksource (else now_ns() is clock_gettime).
  static bool tsc_usable() noexcept;
  static bool scaled() noexcept { return anchor_.mult.load(std::memory_order_relaxed) != 0; }

 private:
  // 175-260 µs at 2-3 GHz: the error bound above. (d * mult stays within 64 bits up to 2^27.)
  static constexpr std::uint64_t kRefreshTicks = std::uint64_t{1} << 19;
  static std::int64_t refresh() noexcept;

  struct alignas(64) Anchor {
    std::atomic<std::uint32_t> seq{0};  // odd while a writer changes the anchor
    std::atomic<std::uint64_t> tsc0{0};
    std::atomic<std::int64_t> ns0{0};
    std::atomic<std::uint64_t> mult{0};  // 0: not calibrated (or no usable TSC)
  };
  static Anchor anchor_;
};

}  // namespace lanebus::detail
