// lanebus — MIT License.
// WallClock's calibration from a fresh process (lib/util/wall_clock.hpp):
// this file's one test case is the process's first clock read, so it sees
// the whole calibration, which the other tests' processes have long passed.
#include <doctest/doctest.h>

#include <cstdint>

#include "clock_bound.hpp"
#include "wall_clock.hpp"

using lanebus::detail::WallClock;

TEST_CASE("a fresh process scales the TSC within a few ms of its first clock read, within the error bound") {
  if (!WallClock::tsc_usable()) {
    MESSAGE("the TSC is not the kernel's clocksource here: now_ns() is clock_gettime itself");
    CHECK(WallClock::now_ns() > 0);
    return;
  }
  REQUIRE_FALSE(WallClock::scaled());  // nothing read the clock before this test
  const std::int64_t first = WallClock::realtime_ns();
  (void)WallClock::now_ns();
  // The last read that fell back to clock_gettime, measured from the first
  // one: the calibration's span is 5 ms. A stall of this thread only moves
  // the first scaled read, not the last unscaled one, so the figure does
  // not depend on the machine's load; before the span was cut it was
  // 100 ms, which this fails.
  std::int64_t last_unscaled = first;
  while (!WallClock::scaled()) {
    const std::int64_t t = WallClock::realtime_ns();
    REQUIRE(t - first < 2'000'000'000);  // no tight (TSC, clock) pair in 2 s: broken, not slow
    (void)WallClock::now_ns();
    if (!WallClock::scaled()) last_unscaled = t;
  }
  MESSAGE("the last read before the TSC was scaled came " << (last_unscaled - first) / 1000 << " us after the first");
  CHECK(last_unscaled - first < 50'000'000);
  // Right after the calibration, the rate from its shortest span: the bound holds.
  lanebus::test::check_clock_bound();
}
