// lanebus — MIT License.
// RunQueue: the workers' queue of lanes that have work. Never allocates after
// construction, for any thread.
//
// Design notes
// - Why not moodycamel's BlockingConcurrentQueue (used until 0.1): it makes an
//   implicit producer (a heap allocation) for every thread on its first
//   enqueue, so a publisher thread started after warm-up allocated on its
//   first publish, and its fallback `enqueue` grew blocks for good.
// - A lane is in the queue at most once (GroupLane::scheduled), so the number
//   of entries is bounded by the number of lanes. The queue is a bounded
//   Vyukov MPMC ring sized at Bus::open (kRunQueueCapacity entries); should
//   more lanes than that be scheduled at once, the surplus goes on an
//   intrusive FIFO overflow list (GroupLane::runq_next) under a mutex: still no
//   allocation, and counted (overflows()).
// - Order between lanes does not matter (per-key order lives in the lanes'
//   rings), so the overflow list may overtake the ring.
// - Parking: moodycamel's LightweightSemaphore (no allocation) counts the
//   entries. enqueue pushes, then signals; a dequeuer takes a count first and
//   then an entry, which is there (it may have to wait out an enqueuer of an
//   earlier ring cell that has claimed but not yet written it).
// - Stop: stop(n) sets the flag and signals n counts without entries; a
//   dequeuer holding a count that finds no entry after stop returns false.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

// lightweightsemaphore.h needs concurrentqueue.h's macros first (as
// blockingconcurrentqueue.h includes them).
#if __has_include(<concurrentqueue/lightweightsemaphore.h>)
#include <concurrentqueue/concurrentqueue.h>
#include <concurrentqueue/lightweightsemaphore.h>
#else
#include <concurrentqueue.h>
#include <lightweightsemaphore.h>
#endif

namespace lanebus::detail {

/// Entries the run queue's ring holds before it uses the overflow list.
inline constexpr std::uint32_t kRunQueueCapacity = 4096;

/// T must have a `T* runq_next` member (owned by the queue while T is queued).
template <typename T>
class RunQueue {
 public:
  explicit RunQueue(std::uint32_t capacity_pow2)
      : mask_(capacity_pow2 - 1), cells_(new Cell[capacity_pow2]), sema_(0, /*maxSpins=*/1) {
    for (std::uint64_t i = 0; i < capacity_pow2; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }

  RunQueue(const RunQueue&) = delete;
  RunQueue& operator=(const RunQueue&) = delete;

  /// Never fails, never allocates.
  void enqueue(T* v) noexcept {
    if (!try_push(v)) {
      std::lock_guard l(overflow_mu_);
      v->runq_next = nullptr;
      (overflow_tail_ ? overflow_tail_->runq_next : overflow_head_) = v;
      overflow_tail_ = v;
      overflow_count_.fetch_add(1, std::memory_order_release);
      overflows_.fetch_add(1, std::memory_order_relaxed);
    }
    sema_.signal();
  }

  /// An entry if one is queued now; false also after stop() when empty.
  bool try_dequeue(T*& v) noexcept {
    if (!sema_.tryWait()) return false;
    return take(v);
  }

  /// Wait for an entry; false only after stop().
  bool wait_dequeue(T*& v) noexcept {
    while (!sema_.wait()) {
    }
    return take(v);
  }

  /// Wake `waiters` dequeuers for good: once the queue is empty they return false.
  void stop(int waiters) noexcept {
    stop_.store(true, std::memory_order_release);
    sema_.signal(waiters);
  }
  bool stopped() const noexcept { return stop_.load(std::memory_order_acquire); }

  std::size_t size_approx() const noexcept {
    std::uint64_t t = tail_.load(std::memory_order_relaxed);
    std::uint64_t h = head_.load(std::memory_order_relaxed);
    return (t > h ? t - h : 0) + overflow_count_.load(std::memory_order_relaxed);
  }

  /// Entries that went to the overflow list (the ring was full).
  std::uint64_t overflows() const noexcept { return overflows_.load(std::memory_order_relaxed); }

 private:
  // Vyukov's bounded MPMC queue (the same algorithm as LaneRing).
  bool try_push(T* v) noexcept {
    std::uint64_t pos = tail_.load(std::memory_order_relaxed);
    Cell* cell;
    for (;;) {
      cell = &cells_[pos & mask_];
      std::uint64_t seq = cell->seq.load(std::memory_order_acquire);
      std::int64_t diff = static_cast<std::int64_t>(seq) - static_cast<std::int64_t>(pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (diff < 0) {
        return false;  // full
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
    cell->value = v;
    cell->seq.store(pos + 1, std::memory_order_release);
    return true;
  }

  bool try_pop(T*& v) noexcept {
    std::uint64_t pos = head_.load(std::memory_order_relaxed);
    Cell* cell;
    for (;;) {
      cell = &cells_[pos & mask_];
      std::uint64_t seq = cell->seq.load(std::memory_order_acquire);
      std::int64_t diff = static_cast<std::int64_t>(seq) - static_cast<std::int64_t>(pos + 1);
      if (diff == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (diff < 0) {
        return false;
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
    v = cell->value;
    cell->seq.store(pos + mask_ + 1, std::memory_order_release);
    return true;
  }

  /// We hold a semaphore count: an entry is queued (or stop() signalled).
  bool take(T*& v) noexcept {
    for (std::uint32_t spins = 0;;) {
      // The overflow list first: a busy ring must not starve it.
      if (overflow_count_.load(std::memory_order_acquire) > 0) {
        std::lock_guard l(overflow_mu_);
        if (overflow_head_ != nullptr) {
          v = overflow_head_;
          overflow_head_ = v->runq_next;
          if (overflow_head_ == nullptr) overflow_tail_ = nullptr;
          v->runq_next = nullptr;
          overflow_count_.fetch_sub(1, std::memory_order_relaxed);
          return true;
        }
      }
      if (try_pop(v)) return true;
      if (stopped()) return false;
      // An enqueuer has claimed the head cell and is writing it; if it was
      // preempted meanwhile, give it the core.
      if ((++spins & 1023) == 0) {
        std::this_thread::yield();
      } else {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
    }
  }

  struct Cell {
    std::atomic<std::uint64_t> seq{0};
    T* value = nullptr;
  };
  const std::uint64_t mask_;
  std::unique_ptr<Cell[]> cells_;
  alignas(64) std::atomic<std::uint64_t> tail_{0};
  alignas(64) std::atomic<std::uint64_t> head_{0};
  alignas(64) moodycamel::LightweightSemaphore sema_;
  alignas(64) std::atomic<std::uint64_t> overflow_count_{0};
  std::atomic<std::uint64_t> overflows_{0};
  std::atomic<bool> stop_{false};
  std::mutex overflow_mu_;
  T* overflow_head_ = nullptr;  // FIFO, guarded by overflow_mu_
  T* overflow_tail_ = nullptr;
};

}  // namespace lanebus::detail
