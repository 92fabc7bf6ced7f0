// lanebus — MIT License.
// The latency histogram's bucket layout and quantiles.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <random>
#include <vector>

#include "histogram.hpp"

using lanebus::LatencyHistogram;
using lanebus::detail::latency_bucket;
using lanebus::detail::LatencyRecorder;

TEST_CASE("every value lands in the bucket whose bounds contain it") {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200000; ++i) {
    std::uint64_t v = rng() >> (rng() % 64);
    std::uint32_t b = latency_bucket(v);
    REQUIRE(b < LatencyHistogram::kBuckets);
    if (b + 1 < LatencyHistogram::kBuckets) CHECK(v < LatencyHistogram::upper_bound_ns(b));
    if (b > 0) CHECK(v >= LatencyHistogram::upper_bound_ns(b - 1));
  }
  CHECK(latency_bucket(0) == 0);
  CHECK(latency_bucket(1023) == 0);
  CHECK(latency_bucket(1024) == 1);
  CHECK(latency_bucket(~0ull) == LatencyHistogram::kBuckets - 1);
  for (std::uint32_t b = 1; b + 1 < LatencyHistogram::kBuckets; ++b) {
    std::uint64_t lo = LatencyHistogram::upper_bound_ns(b - 1), hi = LatencyHistogram::upper_bound_ns(b);
    CHECK(hi > lo);
    CHECK(double(hi - lo) <= 0.25 * double(lo) + 1);
  }
}

namespace {
// The layout's definition, as latency_bucket computed it before it went
// branch-free (histogram.hpp): the two must agree on every value.
std::uint32_t reference_bucket(std::uint64_t ns) {
  if (ns < 1024) return 0;
  const std::uint32_t e = 63u - static_cast<std::uint32_t>(std::countl_zero(ns));
  if (e > 41) return LatencyHistogram::kBuckets - 1;
  return 1 + (e - 10) * 4 + static_cast<std::uint32_t>((ns >> (e - 2)) & 3u);
}
}  // namespace

TEST_CASE("latency_bucket agrees with the layout's definition: every value below 2^20, each bound and power of two +-2, random values") {
  for (std::uint64_t v = 0; v < (1u << 20); ++v) REQUIRE(latency_bucket(v) == reference_bucket(v));
  for (std::uint32_t e = 0; e < 64; ++e)
    for (std::uint64_t d = 0; d <= 4; ++d) {
      const std::uint64_t v = (std::uint64_t{1} << e) + d - 2;
      REQUIRE(latency_bucket(v) == reference_bucket(v));
    }
  for (std::uint32_t b = 0; b + 1 < LatencyHistogram::kBuckets; ++b)
    for (std::uint64_t d = 0; d <= 2; ++d) {
      const std::uint64_t v = LatencyHistogram::upper_bound_ns(b) + d - 1;
      REQUIRE(latency_bucket(v) == reference_bucket(v));
    }
  std::mt19937_64 rng(11);
  for (int i = 0; i < 1'000'000; ++i) {
    const std::uint64_t v = rng() >> (rng() % 64);
    REQUIRE(latency_bucket(v) == reference_bucket(v));
  }
}

TEST_CASE("quantiles are within one bucket of the truth") {
  LatencyRecorder r;
  std::vector<std::uint64_t> values;
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(12.0, 1.5);  // ~160 µs median
  for (int i = 0; i < 100000; ++i) {
    auto v = static_cast<std::uint64_t>(dist(rng));
    values.push_back(v);
    r.record(v);
  }
  std::sort(values.begin(), values.end());
  LatencyHistogram h;
  r.add_to(h);
  CHECK(h.count == values.size());
  for (double q : {0.5, 0.99, 0.999}) {
    std::uint64_t truth = values[static_cast<std::size_t>(q * values.size())];
    std::uint64_t est = h.quantile_ns(q);
    std::uint32_t tb = latency_bucket(truth), eb = latency_bucket(est - 1);
    CHECK_MESSAGE((eb == tb || eb == tb + 1 || eb + 1 == tb), "q=" << q << " truth=" << truth << " est=" << est);
    CHECK(est >= truth);
  }
  LatencyHistogram empty;
  CHECK(empty.quantile_ns(0.5) == 0);
}
