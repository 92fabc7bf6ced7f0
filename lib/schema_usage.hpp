// lanebus — MIT License.
// Field-usage counters (doc/schemas.md, "Field-usage audit"): one UsageTap per
// (consumer group, lane). The lane's running worker is its only writer (a
// lane runs on one worker at a time), so counting is two relaxed accesses and
// never allocates; the registry's flush reads them and writes the deltas to
// the store in day buckets. Internal.
#pragma once

#include <atomic>
#include <cstdint>

namespace lanebus::detail {

struct UsageTap {
  static constexpr std::uint32_t kSlots = 32;
  struct Slot {
    std::atomic<std::uint32_t> key{0};  // version << 16 | field id; 0 = free
    std::atomic<std::uint64_t> count{0};
  };
  Slot slots[kSlots];
  std::atomic<std::uint64_t> overflow{0};  // reads that found no free slot (shown, not attributed)

  void count(std::uint32_t field, std::uint16_t version) noexcept {
    const std::uint32_t key = (std::uint32_t(version) << 16) | (field & 0xffff);
    std::uint32_t h = (key * 2654435761u) >> 27;  // top 5 bits: 0..31
    for (std::uint32_t i = 0; i < kSlots; ++i) {
      Slot& s = slots[(h + i) % kSlots];
      std::uint32_t k = s.key.load(std::memory_order_relaxed);
      if (k == 0) {
        // relaxed: readers take a key without its count as 0 reads.
        s.key.store(key, std::memory_order_relaxed);
        k = key;
      }
      if (k == key) {
        s.count.store(s.count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        return;
      }
    }
    overflow.store(overflow.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
};

}  // namespace lanebus::detail
