// lanebus — MIT License.
// RetryTimer: holds lanes whose head message waits out a retry backoff, and
// puts each back on the run queue when its time comes. Allocation-free: lanes
// are linked into a Boost.Intrusive multiset ordered by due time, through a
// hook inside the lane itself.
#pragma once

#include <boost/intrusive/set.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace lanebus::detail {

/// Embed in anything the timer holds. `due_ns` is steady_clock nanoseconds.
struct TimerEntry : boost::intrusive::set_base_hook<boost::intrusive::link_mode<boost::intrusive::safe_link>> {
  /// What firing means to the owner (the timer does not look at it).
  enum class Kind : std::uint8_t { Requeue, Wake, Delayed };
  std::int64_t due_ns = 0;
  Kind kind = Kind::Requeue;
  friend bool operator<(const TimerEntry& a, const TimerEntry& b) noexcept { return a.due_ns < b.due_ns; }
};

/// Thread safety: thread-safe. `fire` runs on the timer's thread with no lock held.
class RetryTimer {
 public:
  explicit RetryTimer(std::function<void(TimerEntry*)> fire) : fire_(std::move(fire)) {
    thread_ = std::thread([this] { run(); });
  }
  ~RetryTimer() { stop(); }

  static std::int64_t now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  /// Fire `e` at (or soon after) e->due_ns. REQUIRES: e is not already held.
  void add(TimerEntry* e) {
    bool earliest;
    {
      std::lock_guard l(mu_);
      auto it = set_.insert(*e);
      earliest = it == set_.begin();
    }
    if (earliest) cv_.notify_one();
  }

  /// Stop the thread and forget every held entry (they are not fired).
  void stop() {
    {
      std::lock_guard l(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    std::lock_guard l(mu_);
    set_.clear();
  }

  /// Fire `e` at `due_ns` or earlier: if `e` is already held for a later
  /// time it is moved up; if held for an earlier time nothing changes.
  void arm(TimerEntry* e, std::int64_t due_ns) {
    bool earliest;
    {
      std::lock_guard l(mu_);
      if (stopping_) return;
      if (e->is_linked()) {
        if (e->due_ns <= due_ns) return;
        set_.erase(set_.iterator_to(*e));
      }
      e->due_ns = due_ns;
      auto it = set_.insert(*e);
      earliest = it == set_.begin();
    }
    if (earliest) cv_.notify_one();
  }

  std::size_t size() const {
    std::lock_guard l(mu_);
    return set_.size();
  }

 private:
  void run() {
    std::unique_lock l(mu_);
    while (!stopping_) {
      if (set_.empty()) {
        cv_.wait(l);
        continue;
      }
      const std::int64_t now = now_ns();
      TimerEntry& first = *set_.begin();
      if (first.due_ns > now) {
        cv_.wait_for(l, std::chrono::nanoseconds(first.due_ns - now));
        continue;
      }
      set_.erase(set_.begin());
      l.unlock();
      fire_(&first);
      l.lock();
    }
  }

  std::function<void(TimerEntry*)> fire_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  boost::intrusive::multiset<TimerEntry> set_;  // guarded by mu_
  bool stopping_ = false;                      // guarded by mu_
  std::thread thread_;
};

}  // namespace lanebus::detail
