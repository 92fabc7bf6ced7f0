// lanebus — MIT License.
// CommitWake: the futex words of wake.shm (design notes and invariants in
// commit_wake.hpp).
#include "commit_wake.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>
#include <ctime>

#include "errno_status.hpp"
#include "process_identity.hpp"
#include "quote.hpp"

namespace lanebus::detail {

namespace {

// "LBWAKE" | layout version 1.
constexpr std::uint64_t kMagic = 0x4c4257414b450000ull;
constexpr std::uint64_t kVersion = 1;
constexpr std::uint64_t kMagicMask = 0xffffffffffff0000ull;

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared words must be address-free");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "shared words must be address-free");
static_assert(sizeof(CommitWake::Slot) == 64, "one slot per cache line");
static_assert(offsetof(CommitWake::Slot, owner) == 0 && offsetof(CommitWake::Slot, seq) == 8 &&
                  offsetof(CommitWake::Slot, sleeping) == 12,
              "wake.shm layout version 1");
static_assert(sizeof(std::atomic<std::uint32_t>) == 4, "the futex word is 32 bits");

// A non-private futex: the word lives in a shared file mapping and the
// waiters are other processes (the kernel keys it by inode and offset).
long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t val, const timespec* timeout) noexcept {
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, val, timeout, nullptr, 0);
}

std::uint64_t owner_word_of_self() noexcept {
  const ProcessIdentity self = self_identity();
  return static_cast<std::uint64_t>(self.pid) | (static_cast<std::uint64_t>(self.start_time & 0xffffffffu) << 32);
}

// Certain death only (see process_is_dead): the pid is gone, reused by a
// process with another start time, or a zombie.
bool owner_dead(std::uint64_t word) noexcept {
  const auto pid = static_cast<pid_t>(word & 0xffffffffu);
  const std::uint64_t start_low = word >> 32;
  if (pid <= 0) return false;
  if (pid == ::getpid()) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  char state = '?';
  const std::uint64_t start = read_start_time(pid, &state);
  if (start == 0) return ::kill(pid, 0) != 0 && errno == ESRCH;
  if (start_low != 0 && (start & 0xffffffffu) != start_low) return true;
  return state == 'Z' || state == 'X';
}

}  // namespace

CommitWake::CommitWake(int fd, void* map) noexcept : fd_(fd), map_(map), owner_word_(owner_word_of_self()) {}

CommitWake::Slot* CommitWake::slot(std::size_t i) const noexcept {
  return reinterpret_cast<Slot*>(static_cast<char*>(map_) + 64 * (i + 1));
}

Result<std::unique_ptr<CommitWake>> CommitWake::open(const std::string& directory) {
  const std::string path = directory + "/" + kFileName;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return errno_status("open", path, errno);
  auto fail = [&](Status s) {
    ::close(fd);
    return s;
  };
  struct stat st {};
  if (fstat(fd, &st) != 0) return fail(errno_status("fstat", path, errno));
  if (!S_ISREG(st.st_mode)) return fail(Status(Code::PermissionDenied, quoted(path) + " is not a regular file"));
  if (st.st_uid != geteuid()) {
    return fail(Status(Code::PermissionDenied, quoted(path) + " is owned by uid " + std::to_string(st.st_uid) +
                                                   ", not this process's euid " + std::to_string(geteuid())));
  }
  if ((st.st_mode & 0022) != 0) {
    return fail(Status(Code::PermissionDenied, quoted(path) + " is group or world writable"));
  }
  // A new file is all zero once extended: a valid empty table. Two openers
  // extending it at once both leave it at kBytes; it never shrinks.
  if (st.st_size < static_cast<off_t>(kBytes) && ftruncate(fd, static_cast<off_t>(kBytes)) != 0) {
    return fail(errno_status("ftruncate", path, errno));
  }
  void* map = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return fail(errno_status("mmap", path, errno));
  std::unique_ptr<CommitWake> w(new CommitWake(fd, map));
  auto* header = static_cast<std::atomic<std::uint64_t>*>(map);
  std::uint64_t h = 0;
  if (!header->compare_exchange_strong(h, kMagic | kVersion, std::memory_order_acq_rel) && h != (kMagic | kVersion)) {
    if ((h & kMagicMask) == kMagic) {
      return Status(Code::VersionTooNew, quoted(path) + " has layout version " + std::to_string(h & 0xffff) +
                                             ", this build knows 1");
    }
    return Status(Code::Corruption, quoted(path) + " is not a lanebus wake table");
  }
  if (!w->claim_slot()) {
    w->reclaim_dead();
    (void)w->claim_slot();
  }
  return w;
}

CommitWake::~CommitWake() {
  if (own_ != nullptr) {
    own_->sleeping.store(0, std::memory_order_relaxed);
    // Release: nothing is published through it; acq_rel keeps the CAS simple.
    std::uint64_t mine = owner_word_;
    own_->owner.compare_exchange_strong(mine, 0, std::memory_order_acq_rel);
  }
  if (map_ != nullptr) munmap(map_, kBytes);
  if (fd_ >= 0) ::close(fd_);
}

bool CommitWake::claim_slot() noexcept {
  for (std::size_t i = 0; i < kSlots; ++i) {
    Slot* s = slot(i);
    std::uint64_t expected = 0;
    if (s->owner.load(std::memory_order_relaxed) == 0 &&
        s->owner.compare_exchange_strong(expected, owner_word_, std::memory_order_acq_rel)) {
      // A previous owner may have died asleep; `seq` keeps counting (any value works).
      s->sleeping.store(0, std::memory_order_seq_cst);
      own_ = s;
      return true;
    }
  }
  return false;
}

std::size_t CommitWake::reclaim_dead() noexcept {
  std::size_t freed = 0;
  for (std::size_t i = 0; i < kSlots; ++i) {
    Slot* s = slot(i);
    if (s == own_) continue;
    std::uint64_t o = s->owner.load(std::memory_order_acquire);
    if (o == 0 || o == owner_word_ || !owner_dead(o)) continue;
    if (s->owner.compare_exchange_strong(o, 0, std::memory_order_acq_rel)) ++freed;
  }
  return freed;
}

void CommitWake::notify_others() noexcept {
  // 1. Bump every owned slot but ours (invariant 2: before looking at `sleeping`).
  std::uint64_t bumped = 0;
  for (std::size_t i = 0; i < kSlots; ++i) {
    Slot* s = slot(i);
    // Relaxed: a slot claimed after this load belongs to a process that reads
    // the store after claiming it, so it sees this commit anyway.
    if (s == own_ || s->owner.load(std::memory_order_relaxed) == 0) continue;
    s->seq.fetch_add(1, std::memory_order_seq_cst);
    ++bumped;
  }
  if (bumped == 0) return;
  bumps_.fetch_add(bumped, std::memory_order_relaxed);  // relaxed: a statistic
  if (hook_) hook_();
  // 2. Wake the sleepers (a FUTEX_WAKE only where someone sleeps).
  std::uint64_t woke = 0;
  for (std::size_t i = 0; i < kSlots; ++i) {
    Slot* s = slot(i);
    if (s == own_ || s->owner.load(std::memory_order_relaxed) == 0) continue;
    if (s->sleeping.load(std::memory_order_seq_cst) == 0) continue;
    (void)futex(&s->seq, FUTEX_WAKE, INT_MAX, nullptr);
    ++woke;
  }
  wakes_sent_.fetch_add(woke, std::memory_order_relaxed);  // relaxed: a statistic
}

std::uint32_t CommitWake::seq() const noexcept {
  return own_ != nullptr ? own_->seq.load(std::memory_order_seq_cst) : 0;
}

bool CommitWake::wait(std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept {
  if (own_ == nullptr) return false;
  if (timeout.count() < 0) timeout = std::chrono::nanoseconds(0);
  const timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000),
                    static_cast<long>(timeout.count() % 1'000'000'000)};
  // Invariant 2: announce the sleep, then look at the word (seq_cst both).
  own_->sleeping.store(1, std::memory_order_seq_cst);
  if (own_->seq.load(std::memory_order_seq_cst) == seen) {
    // EAGAIN (the word changed first), EINTR, ETIMEDOUT: the caller looks again either way.
    (void)futex(&own_->seq, FUTEX_WAIT, seen, &ts);
  }
  own_->sleeping.store(0, std::memory_order_seq_cst);
  const bool changed = own_->seq.load(std::memory_order_seq_cst) != seen;
  if (changed) woken_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
  return changed;
}

void CommitWake::interrupt() noexcept {
  if (own_ == nullptr) return;
  own_->seq.fetch_add(1, std::memory_order_seq_cst);
  (void)futex(&own_->seq, FUTEX_WAKE, INT_MAX, nullptr);
}

int CommitWake::slot_index() const noexcept {
  for (std::size_t i = 0; i < kSlots; ++i) {
    if (slot(i) == own_) return static_cast<int>(i);
  }
  return -1;
}

std::size_t CommitWake::owned_slots() const noexcept {
  std::size_t n = 0;
  for (std::size_t i = 0; i < kSlots; ++i) n += slot(i)->owner.load(std::memory_order_relaxed) != 0;
  return n;
}

}  // namespace lanebus::detail
