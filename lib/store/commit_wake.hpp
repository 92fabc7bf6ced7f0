// lanebus — MIT License.
// CommitWake: wakes the durable consumers of other processes after a commit
// that appended, through one futex word per process in `wake.shm` beside the
// store's files. The poll (BusOptions::durable_poll) stays as the safety net.
//
// Why not something ready-made: an eventfd or a pipe cannot be shared by
// unrelated processes without a broker to pass it; a process-shared condition
// variable needs a mutex, and a mutex that `kill -9` or SIGSTOP can leave held
// wedges everyone (doc/reliability.md); LMDB has no commit notification. A
// futex word in a shared file mapping needs no lock at all: a writer bumps it
// and calls FUTEX_WAKE, a sleeper waits while it still holds the value seen.
//
// Layout (4096 bytes, all zero = a valid empty table):
//   [0, 64)      header: u64 magic|version (0 until the first opener sets it)
//   [64, 4096)   63 slots of 64 bytes: u64 owner (pid | start time << 32, 0 =
//                free), u32 seq (the futex word), u32 sleeping (1 while the
//                owner is inside FUTEX_WAIT)
//
// Invariants:
// 1. Nothing here is a lock. Every shared word is a lock-free 32/64-bit
//    atomic (static_asserted); a process killed or frozen between any two
//    instructions leaves a table every other process can go on using.
// 2. A writer bumps `seq` of every owned slot but its own *before* it looks at
//    `sleeping` (seq_cst on both sides, Dekker): a sleeper that set `sleeping`
//    and then saw the old `seq` is either woken by that writer's FUTEX_WAKE or
//    sees the new `seq` itself (FUTEX_WAIT compares it in the kernel). A
//    wake-up is never lost while the writer runs to the end of notify_others.
// 3. A writer frozen or killed after its bump and before its FUTEX_WAKE delays
//    a sleeper only until the next commit of any other process (which bumps
//    and wakes again) or the sleeper's timeout, whichever comes first:
//    callers always wait with a timeout (the poll interval).
// 4. A slot belongs to the process that moved its owner from 0 by CAS. The
//    slot of a dead owner (process_is_dead: certain only) is freed by CAS
//    back to 0 by any process; until then writers keep bumping it, which
//    costs one atomic add per commit and a FUTEX_WAKE syscall if it died
//    asleep. Processes of another pid namespace are never declared dead.
// 5. No allocation after open(); notify_others() and wait() make no library
//    call but the futex system call.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "lanebus/status.hpp"

namespace lanebus::detail {

/// The commit wake table of one store directory (see the file comment).
///
/// Thread safety: notify_others() from one thread at a time (the store's
/// writer); wait() from one thread at a time (the bus's poller); the other
/// methods are thread-safe.
class CommitWake {
 public:
  static constexpr std::size_t kBytes = 4096;
  static constexpr std::size_t kSlots = kBytes / 64 - 1;
  static constexpr const char* kFileName = "wake.shm";

  /// Open (creating it 0600 if missing) `<directory>/wake.shm`, map it and
  /// claim a slot for this process (freeing the slots of dead processes if
  /// none is free). Errors (the caller then relies on its poll alone):
  /// PermissionDenied (a symlink, not a regular file, another owner, group
  /// or world writable), VersionTooNew or Corruption (another header),
  /// IOError (open, ftruncate, mmap). A full table is not an error: the
  /// object then only notifies (has_slot() is false).
  static Result<std::unique_ptr<CommitWake>> open(const std::string& directory);
  ~CommitWake();  // frees the slot, unmaps
  CommitWake(const CommitWake&) = delete;
  CommitWake& operator=(const CommitWake&) = delete;

  /// After a commit that appended: bump every other owned slot and wake those
  /// whose owner sleeps. Never blocks (one FUTEX_WAKE per sleeping process).
  void notify_others() noexcept;
  /// The value of this process's word; pass it to wait() after reading the
  /// store, so a commit between the two is not missed. 0 without a slot.
  std::uint32_t seq() const noexcept;
  /// Sleep until this process's word differs from `seen` (a commit of another
  /// process, or interrupt()) or `timeout` passes. True when it differs.
  /// Without a slot: returns false at once (the caller sleeps otherwise).
  bool wait(std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept;
  /// Bump this process's own word and wake its sleeper (shutting down).
  void interrupt() noexcept;
  /// Free the slots whose owner is certainly dead; the number freed.
  std::size_t reclaim_dead() noexcept;

  bool has_slot() const noexcept { return own_ != nullptr; }
  /// Index of this process's slot, or -1 (tests).
  int slot_index() const noexcept;
  /// Slots owned at the moment (tests, stats).
  std::size_t owned_slots() const noexcept;
  /// Wake-ups sent (FUTEX_WAKE calls) and words bumped by this object; wait()
  /// calls that returned true. Relaxed statistics.
  std::uint64_t wakes_sent() const noexcept { return wakes_sent_.load(std::memory_order_relaxed); }
  std::uint64_t bumps() const noexcept { return bumps_.load(std::memory_order_relaxed); }
  std::uint64_t woken() const noexcept { return woken_.load(std::memory_order_relaxed); }

  /// TEST ONLY: called by notify_others() after the bumps and before the
  /// FUTEX_WAKE calls (a test freezes or kills the process there). Set before
  /// the first commit; never in production code.
  void set_between_bump_and_wake_for_testing(std::function<void()> hook) { hook_ = std::move(hook); }

  struct Slot {
    std::atomic<std::uint64_t> owner;
    std::atomic<std::uint32_t> seq;
    std::atomic<std::uint32_t> sleeping;
    char pad[48];
  };

 private:
  CommitWake(int fd, void* map) noexcept;
  bool claim_slot() noexcept;
  Slot* slot(std::size_t i) const noexcept;

  int fd_ = -1;
  void* map_ = nullptr;
  Slot* own_ = nullptr;
  std::uint64_t owner_word_ = 0;
  std::function<void()> hook_;
  std::atomic<std::uint64_t> wakes_sent_{0}, bumps_{0}, woken_{0};
};

}  // namespace lanebus::detail
