// lanebus — MIT License.
// Mutex and MutexLock annotated for clang's -Wthread-safety (after leveldb's port/).
#pragma once

#include <mutex>

#if defined(__clang__)
#define LANEBUS_TSA(x) __attribute__((x))
#else
#define LANEBUS_TSA(x)
#endif

#define GUARDED_BY(x) LANEBUS_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) LANEBUS_TSA(pt_guarded_by(x))
#define REQUIRES(...) LANEBUS_TSA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) LANEBUS_TSA(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) LANEBUS_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) LANEBUS_TSA(release_capability(__VA_ARGS__))
#define CAPABILITY(x) LANEBUS_TSA(capability(x))
#define SCOPED_CAPABILITY LANEBUS_TSA(scoped_lockable)
#define NO_THREAD_SAFETY_ANALYSIS LANEBUS_TSA(no_thread_safety_analysis)

namespace lanebus::detail {

/// std::mutex with a capability annotation. Thread safety: thread-safe.
class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

/// Scoped lock for Mutex. Thread safety: one thread at a time.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->lock(); }
  ~MutexLock() RELEASE() { mu_->unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

}  // namespace lanebus::detail
