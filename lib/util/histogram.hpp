// lanebus — MIT License.
// LatencyRecorder: a fixed-bucket, allocation-free latency histogram recorded
// by one thread at a time (a lane's owner) and read by anyone.
//
// Buckets (LatencyHistogram in stats.hpp documents the same layout): bucket 0
// holds [0, 1024) ns; above that, each power of two [2^e, 2^(e+1)) for
// e = 10..41 is split into 4 equal sub-buckets, so a bucket's width is at
// most 25 % of its lower bound; the last bucket also takes everything larger.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>

#include "lanebus/stats.hpp"

namespace lanebus::detail {

/// Branch-free (it runs once per delivery, doc/performance.md "Sixth round"):
/// clamped to [1023, 2^42 - 1], ns has its top bit e in [9, 41]; its top
/// three bits t = ns >> (e - 2) are 4 + sub, so 1 + (e - 10) * 4 + sub is
/// 4e + t - 43. The clamp sends [0, 1024) to bucket 0 (e = 9, t = 7) and
/// everything from 2^42 on to the last (e = 41, t = 7: 128).
/// tests/histogram_test.cpp checks it against the definition above.
inline std::uint32_t latency_bucket(std::uint64_t ns) noexcept {
  constexpr std::uint64_t kLow = 1023, kHigh = (std::uint64_t{1} << 42) - 1;
  const std::uint64_t x = ns < kLow ? kLow : ns > kHigh ? kHigh : ns;
  const std::uint32_t e = 63u - static_cast<std::uint32_t>(std::countl_zero(x));
  return 4 * e + static_cast<std::uint32_t>(x >> (e - 2)) - 43;
}

class LatencyRecorder {
 public:
  /// Single writer at a time (hand-offs ordered by the run queue): plain
  /// load+store, no read-modify-write. relaxed: independent tallies.
  void record(std::uint64_t ns) noexcept {
    auto& b = buckets_[latency_bucket(ns)];
    b.store(b.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    sum_.store(sum_.load(std::memory_order_relaxed) + ns, std::memory_order_relaxed);
  }
  /// record() in two steps, for a loop over many values: count(ns) for
  /// each (its bucket only; `times` values of ns at once), then add_sum(the
  /// values' sum) once.
  void count(std::uint64_t ns, std::uint64_t times = 1) noexcept {
    auto& b = buckets_[latency_bucket(ns)];
    b.store(b.load(std::memory_order_relaxed) + times, std::memory_order_relaxed);
  }
  void add_sum(std::uint64_t total_ns) noexcept {
    sum_.store(sum_.load(std::memory_order_relaxed) + total_ns, std::memory_order_relaxed);
  }
  /// Add this recorder's counts into `out` (sized kBuckets).
  void add_to(LatencyHistogram& out) const {
    out.counts.resize(LatencyHistogram::kBuckets);
    for (std::uint32_t i = 0; i < LatencyHistogram::kBuckets; ++i) {
      std::uint64_t c = buckets_[i].load(std::memory_order_relaxed);
      out.counts[i] += c;
      out.count += c;
    }
    out.sum_ns += sum_.load(std::memory_order_relaxed);
  }

 private:
  std::atomic<std::uint64_t> buckets_[LatencyHistogram::kBuckets] = {};
  std::atomic<std::uint64_t> sum_{0};
};

}  // namespace lanebus::detail
