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

inline std::uint32_t latency_bucket(std::uint64_t ns) noexcept {
  if (ns < 1024) return 0;
  const std::uint32_t e = 63u - static_cast<std::uint32_t>(std::countl_zero(ns));
  if (e > 41) return LatencyHistogram::kBuckets - 1;
  const std::uint32_t sub = static_cast<std::uint32_t>((ns >> (e - 2)) & 3u);
  return 1 + (e - 10) * 4 + sub;
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
