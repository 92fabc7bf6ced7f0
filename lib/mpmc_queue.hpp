// lanebus — MIT License.
// The only file that includes moodycamel. RunQueue: the workers' queue of
// lanes that have work (order between lanes does not matter, so moodycamel's
// lack of cross-producer FIFO is harmless here).
#pragma once

#if __has_include(<concurrentqueue/blockingconcurrentqueue.h>)
#include <concurrentqueue/blockingconcurrentqueue.h>
#else
#include <blockingconcurrentqueue.h>
#endif

namespace lanebus::detail {

struct RunQueueTraits : moodycamel::ConcurrentQueueDefaultTraits {
  // Workers spin themselves (BusOptions::spin) before parking; the semaphore
  // should then park at once rather than spin again.
  static const int MAX_SEMA_SPINS = 1;
  // A producer's block index doubles (a heap allocation) whenever it needs
  // more entries than ever before; moodycamel never shrinks it. With the
  // default 32 that can first happen long after warm-up (seen in the
  // zero-allocation test). The run queue holds at most one entry per lane,
  // so 4096 entries per producer (64 KiB) is never outgrown in practice.
  static const std::size_t IMPLICIT_INITIAL_INDEX_SIZE = 4096;
  static const std::size_t EXPLICIT_INITIAL_INDEX_SIZE = 4096;
};

template <typename T>
using RunQueue = moodycamel::BlockingConcurrentQueue<T, RunQueueTraits>;

}  // namespace lanebus::detail
