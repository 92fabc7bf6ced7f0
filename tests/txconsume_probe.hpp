// lanebus — MIT License.
// TxProbe: what txconsume_child was doing when it died, in a small file that
// txconsume_test and the child both map MAP_SHARED. Plain 32-bit words, read
// and written through std::atomic_ref (always lock-free, so address-free).
#pragma once

#include <atomic>
#include <cstdint>

namespace lanebus::test {

struct TxProbe {
  static constexpr std::uint32_t kSlots = 8;  ///< one per worker thread of the child (it runs 2)
  std::uint32_t entered = 0;  ///< handler entries in this child
  std::uint32_t hold_at = 0;  ///< set by the parent: the hold_at-th entry blocks for good (0 = never)
  std::uint32_t held = 0;     ///< booking number + 1 of the held call, once it blocks
  std::uint32_t pad = 0;
  /// Per worker thread: booking number + 1 of the handler call running now (0 = none).
  std::uint32_t inside[kSlots] = {};
  /// Per worker thread: booking number + 1 of its last call that returned ack
  /// (the commit follows the return), cleared when it enters the next call.
  std::uint32_t returned_ack[kSlots] = {};
};
static_assert(std::atomic_ref<std::uint32_t>::is_always_lock_free);

}  // namespace lanebus::test
