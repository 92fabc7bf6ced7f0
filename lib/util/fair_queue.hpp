// lanebus — MIT License.
// FairRunQueue: the workers' queue of lanes that have work, shared among
// namespaces by their fair-share weight (manual: doc/tenancy.md, "Fair
// sharing"). Never allocates after construction, for any thread.
//
// Design notes
// - Classes: every namespace owns a SchedClass (NamespaceState::sched); lanes
//   of no namespace go to the queue's own default class. A class holds an
//   intrusive FIFO of its queued lanes (T::runq_next): a lane is queued at
//   most once (GroupLane::scheduled), so one link per lane is all the memory
//   the queue ever needs.
// - Choice (stride scheduling / start-time fair queueing): a class has a
//   virtual time `pass`. A worker takes the head lane of the active class
//   (one with queued lanes) of the smallest pass, and after running it
//   charges the class the lane's run time × kMaxWeight / weight. So while
//   classes stay backlogged their run times grow in proportion to their
//   weights: a class of weight w gets w/Σw of the time. A class that becomes
//   active starts at the queue's virtual time (the pass of the class last
//   picked), so idling banks no credit; a class alone in the queue takes
//   every worker (work-conserving) and, when it is alone, the queue's
//   virtual time follows its charges, so running on idle capacity costs it
//   nothing later.
// - Charges arrive after the run: two workers may both pick the class of the
//   smallest pass before either charges it. The accounting stays exact, so
//   the error is bounded by one lane run (a batch) per worker and does not
//   grow.
// - Cost: one short critical section (a few pointer moves; with several
//   active classes a scan of them for the smallest pass) per enqueue and per
//   dequeue, under a spin lock that yields when its holder was preempted.
//   Until two classes have been active at once the queue asks for no run
//   times (Pick::timed false): a bus with one namespace reads no clock.
// - Parking: moodycamel's LightweightSemaphore (no allocation) counts the
//   queued lanes; enqueue links, then signals; a dequeuer takes a count and
//   then a lane, which is there. (Why not moodycamel's
//   BlockingConcurrentQueue: it allocates an implicit producer for every new
//   producer thread.)
// - Stop: stop(n) sets the flag and signals n counts without lanes; a
//   dequeuer holding a count that finds no lane after stop returns false.
//   Lanes still queued then stay linked; nobody dequeues them again.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
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

/// NamespacePolicy::weight's upper bound: a charge of t ns moves a class of
/// weight w by t × kMaxWeight / w.
inline constexpr std::uint64_t kMaxWeight = 1000;

/// One namespace's part of the FairRunQueue. Plain fields are guarded by the
/// queue's lock; the atomics may be read at any time.
struct SchedClass {
  /// NamespacePolicy::weight (1..kMaxWeight); read at each charge, so a new
  /// weight takes effect with the next lane run.
  std::atomic<std::uint32_t> weight{1};
  /// Virtual time (wrapping; compared by signed difference).
  std::atomic<std::uint64_t> pass{0};
  /// Run time charged and lane runs picked (stats, tests).
  std::atomic<std::uint64_t> charged_ns{0};
  std::atomic<std::uint64_t> runs{0};

  // Guarded by the queue's lock.
  void* head = nullptr;  // FIFO of queued lanes (T*), linked by T::runq_next
  void* tail = nullptr;
  std::uint64_t queued = 0;
  SchedClass* next_active = nullptr;  // in the active list while queued > 0
  bool active = false;
};

/// Is virtual time a before b (wrap-safe)?
inline bool pass_before(std::uint64_t a, std::uint64_t b) noexcept {
  return static_cast<std::int64_t>(a - b) < 0;
}

/// T must have a `T* runq_next` member (owned by the queue while T is queued).
template <typename T>
class FairRunQueue {
 public:
  /// What a dequeue returns: the lane, the class it was queued in (charge
  /// that one), whether to time the run, and whether the class was alone.
  struct Pick {
    T* lane = nullptr;
    SchedClass* cls = nullptr;
    bool timed = false;
    bool alone = false;
  };

  FairRunQueue() : sema_(0, /*maxSpins=*/1) {}
  FairRunQueue(const FairRunQueue&) = delete;
  FairRunQueue& operator=(const FairRunQueue&) = delete;

  /// Queue `v` in class `c` (nullptr: the default class). Never fails, never
  /// allocates.
  void enqueue(T* v, SchedClass* c) noexcept {
    if (c == nullptr) c = &default_;
    v->runq_next = nullptr;
    lock();
    if (c->tail != nullptr) {
      static_cast<T*>(c->tail)->runq_next = v;
    } else {
      c->head = v;
    }
    c->tail = v;
    if (c->queued++ == 0) activate(c);
    size_.store(size_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    unlock();
    sema_.signal();
  }

  /// A lane if one is queued now; false also after stop() when empty.
  bool try_dequeue(Pick& p) noexcept {
    if (!sema_.tryWait()) return false;
    return take(p);
  }

  /// Wait for a lane; false only after stop().
  bool wait_dequeue(Pick& p) noexcept {
    while (!sema_.wait()) {
    }
    return take(p);
  }

  /// wait_dequeue for at most `usecs` microseconds: false on a timeout
  /// (p untouched) and after stop().
  bool wait_dequeue_for(Pick& p, std::int64_t usecs) noexcept {
    if (!sema_.wait(usecs)) return false;
    return take(p);
  }

  /// After running p.lane for `ns` (p.timed): charge its class.
  void charge(const Pick& p, std::int64_t ns) noexcept {
    if (ns <= 0) ns = 1;
    SchedClass* c = p.cls;
    const std::uint32_t w = c->weight.load(std::memory_order_relaxed);
    const std::uint64_t step = static_cast<std::uint64_t>(ns) * kMaxWeight / (w == 0 ? 1 : w);
    const std::uint64_t now = c->pass.fetch_add(step, std::memory_order_relaxed) + step;
    c->charged_ns.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
    // It ran on capacity nobody else wanted: move the queue's clock along,
    // so a class arriving later does not take that time back from it.
    if (p.alone) advance_vtime(now);
  }

  /// Wake `waiters` dequeuers for good: once the queue is empty they return false.
  void stop(int waiters) noexcept {
    stop_.store(true, std::memory_order_release);
    sema_.signal(waiters);
  }
  bool stopped() const noexcept { return stop_.load(std::memory_order_acquire); }

  /// Lanes queued (approximate).
  std::size_t size_approx() const noexcept { return size_.load(std::memory_order_relaxed); }

  /// Have two classes been active at once (runs are timed from then on)?
  bool contended() const noexcept { return contended_.load(std::memory_order_relaxed); }

 private:
  void lock() noexcept {
    for (std::uint32_t spins = 0;;) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      while (locked_.load(std::memory_order_relaxed)) {
        // The holder moves a few pointers; if it still holds the lock after
        // this, it was preempted: give it the core.
        if ((++spins & 63) == 0) {
          std::this_thread::yield();
        } else {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#elif defined(__aarch64__)
          asm volatile("yield");
#endif
        }
      }
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

  void advance_vtime(std::uint64_t to) noexcept {
    std::uint64_t v = vtime_.load(std::memory_order_relaxed);
    while (pass_before(v, to) && !vtime_.compare_exchange_weak(v, to, std::memory_order_relaxed)) {
    }
  }

  // Lock held.
  void activate(SchedClass* c) noexcept {
    // Idle time banks no credit: start at the queue's virtual time.
    const std::uint64_t v = vtime_.load(std::memory_order_relaxed);
    std::uint64_t p = c->pass.load(std::memory_order_relaxed);
    while (pass_before(p, v) && !c->pass.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
    }
    c->active = true;
    c->next_active = nullptr;
    if (active_tail_ != nullptr) {
      active_tail_->next_active = c;
    } else {
      active_head_ = c;
    }
    active_tail_ = c;
    if (++active_count_ == 2 && !contended_.load(std::memory_order_relaxed))
      contended_.store(true, std::memory_order_relaxed);
  }

  /// We hold a semaphore count: a lane is queued (or stop() signalled).
  bool take(Pick& p) noexcept {
    for (std::uint32_t spins = 0;;) {
      lock();
      if (active_head_ != nullptr) {
        pop_locked(p);
        unlock();
        return true;
      }
      unlock();
      if (stopped()) return false;
      // Not reached: enqueue links before it signals. Kept as a guard.
      if ((++spins & 63) == 0) std::this_thread::yield();
    }
  }

  void pop_locked(Pick& p) noexcept {
    // The active class of the smallest pass; ties go to the one active longest.
    SchedClass* best = active_head_;
    SchedClass* best_prev = nullptr;
    p.alone = active_count_ == 1;
    if (!p.alone) {
      std::uint64_t best_pass = best->pass.load(std::memory_order_relaxed);
      for (SchedClass *prev = active_head_, *c = active_head_->next_active; c != nullptr;
           prev = c, c = c->next_active) {
        const std::uint64_t cp = c->pass.load(std::memory_order_relaxed);
        if (pass_before(cp, best_pass)) {
          best = c;
          best_prev = prev;
          best_pass = cp;
        }
      }
    }
    T* v = static_cast<T*>(best->head);
    best->head = v->runq_next;
    if (best->head == nullptr) best->tail = nullptr;
    v->runq_next = nullptr;
    if (--best->queued == 0) {
      // Unlink the class from the active list.
      (best_prev != nullptr ? best_prev->next_active : active_head_) = best->next_active;
      if (active_tail_ == best) active_tail_ = best_prev;
      best->next_active = nullptr;
      best->active = false;
      --active_count_;
    }
    advance_vtime(best->pass.load(std::memory_order_relaxed));
    size_.store(size_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
    best->runs.fetch_add(1, std::memory_order_relaxed);
    p.lane = v;
    p.cls = best;
    p.timed = contended_.load(std::memory_order_relaxed);
  }

  alignas(64) std::atomic<bool> locked_{false};
  // Guarded by locked_.
  SchedClass* active_head_ = nullptr;
  SchedClass* active_tail_ = nullptr;
  std::uint32_t active_count_ = 0;
  SchedClass default_;
  // Written under the lock (vtime_ also by charge's CAS), read anywhere.
  std::atomic<std::uint64_t> vtime_{0};
  std::atomic<std::size_t> size_{0};
  std::atomic<bool> contended_{false};
  alignas(64) moodycamel::LightweightSemaphore sema_;
  std::atomic<bool> stop_{false};
};

}  // namespace lanebus::detail
