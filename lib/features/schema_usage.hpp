// lanebus — MIT License.
// Field-usage counters (doc/schemas.md, "Field-usage audit"): one UsageTap per
// (consumer group, lane). The lane's running worker is its only writer (a
// lane runs on one worker at a time), so counting is a plain relaxed
// load + store and never allocates; the registry's flush reads the slots and
// writes the deltas to the store in day buckets. Internal.
#pragma once

#include <atomic>
#include <cstdint>

namespace lanebus::detail {

struct UsageTap {
  static constexpr std::uint32_t kSlots = 32;
  struct Slot {
    // key_of(version, path, field); 0 = free. Set once, never cleared.
    std::atomic<std::uint64_t> key{0};
    std::atomic<std::uint64_t> count{0};
  };
  Slot slots[kSlots];
  std::atomic<std::uint64_t> overflow{0};  // reads that found no free slot (not attributed)

  // The running lane's cache (only the lane's worker touches it): the slot of
  // each top-level field of one reader field list and writer version, by the
  // field's index in the list, so a read of a field seen before is one
  // increment. Slots are never freed, so a cached pointer stays valid.
  static constexpr std::uint32_t kCached = 32;
  const void* cached_fields = nullptr;
  std::uint16_t cached_version = 0;
  Slot* cached[kCached] = {};

  /// version << 48 | path << 16 | field: `path` holds up to two enclosing
  /// record field ids (RecordView::path_), so a key names "a", "a.b" or "a.b.c".
  static std::uint64_t key_of(std::uint16_t version, std::uint32_t path, std::uint32_t field) noexcept {
    return (std::uint64_t(version) << 48) | (std::uint64_t(path) << 16) | (field & 0xffff);
  }

  Slot* claim(std::uint64_t key) noexcept {
    const auto h = static_cast<std::uint32_t>((key * 0x9E3779B97F4A7C15ull) >> 59);  // 0..31
    for (std::uint32_t i = 0; i < kSlots; ++i) {
      Slot& s = slots[(h + i) % kSlots];
      const std::uint64_t k = s.key.load(std::memory_order_relaxed);
      if (k == key) return &s;
      if (k == 0) {
        // relaxed: the flush takes a key without its count as 0 reads.
        s.key.store(key, std::memory_order_relaxed);
        return &s;
      }
    }
    return nullptr;
  }
  static void bump(std::atomic<std::uint64_t>& c) noexcept {
    c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  void count(std::uint64_t key) noexcept {
    Slot* s = claim(key);
    bump(s != nullptr ? s->count : overflow);
  }
  /// A read of the top-level field at `index` of the reader's list `fields`.
  void count_top(const void* fields, std::uint32_t index, std::uint32_t id, std::uint16_t version) noexcept {
    if (fields != cached_fields || version != cached_version) {
      cached_fields = fields;
      cached_version = version;
      for (Slot*& c : cached) c = nullptr;
    }
    if (index < kCached) {
      Slot*& c = cached[index];
      if (c == nullptr) c = claim(key_of(version, 0, id));
      if (c != nullptr) {
        bump(c->count);
        return;
      }
    }
    count(key_of(version, 0, id));
  }
};

}  // namespace lanebus::detail
