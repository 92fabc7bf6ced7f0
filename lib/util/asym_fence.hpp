// lanebus — MIT License.
// Asymmetric fences: a Dekker hand-off whose one side runs per message and
// whose other side runs rarely pays its fence on the rare side only.
//
// Design notes
// - A Dekker hand-off (each side stores, then loads the other's flag) needs
//   a full fence on both sides. On x86 that is a locked instruction, which
//   waits for every earlier store to reach the cache; on a publisher that just
//   wrote a message into lines the consumer's core holds, that wait is a
//   cross-core round trip per message (doc/performance.md).
// - membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) makes every running thread
//   of the process execute a full fence before it returns. The frequent side
//   then needs only a compiler fence (light_fence) and the rare side calls
//   heavy_fence (folly's asymmetric_thread_fence_light/heavy, Linux ≥ 4.14).
// - The process registers once (MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED).
//   Where the kernel or a seccomp filter refuses membarrier, available() is
//   false and callers keep their symmetric seq_cst fences.
//
// Invariant: a light_fence is only relied on when available() was true
// before the frequent side started using it.
#pragma once

#include <atomic>

namespace lanebus::detail {

class AsymmetricFence {
 public:
  /// True when heavy() is a process-wide barrier (membarrier registered).
  /// Thread-safe; the first call registers.
  static bool available() noexcept;
  /// The frequent side: orders this thread's earlier stores before its later
  /// loads against a concurrent heavy() (a compiler fence only).
  static void light() noexcept { std::atomic_signal_fence(std::memory_order_seq_cst); }
  /// The rare side: a full fence here and on every running thread of the
  /// process. Falls back to a plain seq_cst fence when !available().
  static void heavy() noexcept;
};

}  // namespace lanebus::detail
