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
};

template <typename T>
using RunQueue = moodycamel::BlockingConcurrentQueue<T, RunQueueTraits>;

}  // namespace lanebus::detail
