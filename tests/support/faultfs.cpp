// lanebus — MIT License.
// faultfs: an LD_PRELOAD shim that injects I/O faults into one file (the
// store's data.mdb) and records what a power cut could undo. Tests read it
// through faultfs.hpp; the model and its limits are in doc/power-loss.md.
//
// It interposes pwrite/pwrite64/pwritev/write/writev (LMDB 0.9 writes one
// dirty page with pwrite, a run of pages with lseek + writev, and the meta
// page with pwrite on a second, O_DSYNC descriptor) and fsync/fdatasync.
// Only descriptors that refer to the target file (same st_dev/st_ino as the
// path in LANEBUS_FAULTFS_FILE, or set by lanebus_faultfs_set_target) are
// touched; every other call goes straight to libc (dlsym(RTLD_NEXT)).
//
// Faults (each off by default):
// - fsync EIO: the N-th fsync/fdatasync of the target (counted from when it
//   was armed) fails with EIO. With the journal on, the shim first undoes
//   every unsynced write in the file, as Linux does when writeback fails (the
//   dirty pages are dropped and the next fsync reports success: fsyncgate).
//   Later fsyncs succeed again.
// - disk full: a budget of bytes by which writes may grow the file; a write
//   that would grow it further fails with ENOSPC and writes nothing.
//   Overwrites inside the file always succeed (ext4 and xfs allocate only on
//   growth; a copy-on-write file system is not modelled).
// - short writes: every write to the target writes half of what was asked.
//
// LANEBUS_FAULTFS_SYNCLOG=PATH: after each successful fsync/fdatasync of the
// target, the CLOCK_MONOTONIC ms at which it started is appended as a line.
//
// Power-cut recording (LANEBUS_FAULTFS_JOURNAL=PATH): before each write to
// the target the shim appends an undo record to the journal — offset, length,
// the file size before, the old bytes (pread) and the new bytes — then does
// the write. A successful fsync/fdatasync empties the journal (everything
// written before it is durable); a successful write through an O_DSYNC or
// O_SYNC descriptor removes its own record (durable on return). A record whose
// write failed is removed; a short write's record is rewritten with the length
// that was written. Writes, fsyncs and journal updates of all processes are
// serialised by flock on the journal (plus a mutex for the threads of one
// process), so the journal is exactly the list of writes not yet durable, in
// the order they reached the page cache. A process killed while appending
// leaves a torn last record, which readers ignore: its write had not started.
//
// Written without the C++ runtime (no exceptions, no allocation, no function
// statics): it is loaded before everything else.

// Meson builds with -D_FILE_OFFSET_BITS=64, which makes glibc's headers rename
// pwrite to pwrite64 (and pwritev to pwritev64); this file defines both
// names itself, so it needs the plain ones. off_t is 64-bit on LP64 anyway.
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

// Record layout (little-endian host order; the journal never leaves the machine):
//   u32 magic 'LBFJ', u32 done, u64 offset, u64 len, u64 old_len, u64 old_size,
//   old bytes [old_len], new bytes [len], u32 end magic 'JEND'.
// old_len = how much of [offset, offset+len) existed before (the rest was past EOF).
// done = 0 while the write is in flight, 1 once it returned: a process killed
// between appending the record and its write leaves done = 0, and the write
// may or may not have reached the page cache. A power cut undoes such a record
// (restoring the old bytes is right either way) but never redoes it: redoing
// bytes that were never written could resurrect, say, a meta page whose
// transaction another process has since overwritten (a TSan run found that
// corrupted store: LMDB asserted in mdb_page_touch and a completed
// idempotency key was gone).
constexpr std::uint32_t kMagic = 0x4c42464au;
constexpr std::uint32_t kEndMagic = 0x4a454e44u;
struct RecordHeader {
  std::uint32_t magic;
  std::uint32_t done;
  std::uint64_t offset;
  std::uint64_t len;
  std::uint64_t old_len;
  std::uint64_t old_size;
};

enum Fn : int { kPwrite, kPwrite64, kPwritev, kPwritev64, kWrite, kWritev, kFsync, kFdatasync, kFns };
const char* const kNames[kFns] = {"pwrite", "pwrite64", "pwritev", "pwritev64", "write", "writev", "fsync", "fdatasync"};
std::atomic<void*> g_real[kFns];

template <typename F>
F real(Fn k) {
  void* p = g_real[k].load(std::memory_order_relaxed);
  if (p == nullptr) {
    p = dlsym(RTLD_NEXT, kNames[k]);
    g_real[k].store(p, std::memory_order_relaxed);
  }
  return reinterpret_cast<F>(p);
}
using PwriteFn = ssize_t (*)(int, const void*, size_t, off_t);
using PwritevFn = ssize_t (*)(int, const struct iovec*, int, off_t);
using WriteFn = ssize_t (*)(int, const void*, size_t);
using WritevFn = ssize_t (*)(int, const struct iovec*, int);
using SyncFn = int (*)(int);

// Configuration. g_target is written only while no store is open (tests set
// it before opening one); everything else is atomic or guarded by g_mu.
char g_target[PATH_MAX];
std::atomic<bool> g_have_target{false};
pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
int g_journal = -1;  // GUARDED_BY(g_mu)
int g_journal_rw = -1;  // GUARDED_BY(g_mu): the journal without O_APPEND, to set a record's done flag
int g_synclog = -1;  // LANEBUS_FAULTFS_SYNCLOG: one line per successful fsync (set at load)
char* g_scratch = nullptr;  // GUARDED_BY(g_mu): buffer for old bytes
std::size_t g_scratch_size = 0;

std::atomic<unsigned long long> g_fsyncs{0};
std::atomic<unsigned long long> g_fsync_fail_at{0};  // 0 = off
std::atomic<long long> g_space{-1};                  // bytes of growth left; -1 = unlimited
std::atomic<int> g_short{0};
// Statistics: relaxed counters read by tests between phases.
enum Stat : int { kWrites, kBytes, kSyncs, kEioInjected, kEnospcInjected, kShortInjected, kRecords, kStats };
std::atomic<unsigned long long> g_stats[kStats];

void bump(Stat s, unsigned long long n = 1) { g_stats[s].fetch_add(n, std::memory_order_relaxed); }

void die(const char* what) {
  const char* prefix = "faultfs: fatal: ";
  WriteFn w = real<WriteFn>(kWrite);
  if (w != nullptr) {
    (void)w(2, prefix, std::strlen(prefix));
    (void)w(2, what, std::strlen(what));
    (void)w(2, "\n", 1);
  }
  std::abort();
}

bool is_target(int fd) {
  if (!g_have_target.load(std::memory_order_acquire)) return false;
  struct stat a {};
  if (::fstat(fd, &a) != 0 || !S_ISREG(a.st_mode)) return false;
  struct stat b {};
  if (::stat(g_target, &b) != 0) return false;
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Locks out every other writer and fsync of the target, in all processes.
struct Lock {
  Lock() {
    pthread_mutex_lock(&g_mu);
    if (g_journal >= 0) {
      while (::flock(g_journal, LOCK_EX) != 0 && errno == EINTR) {
      }
    }
  }
  ~Lock() {
    if (g_journal >= 0) ::flock(g_journal, LOCK_UN);
    pthread_mutex_unlock(&g_mu);
  }
};

char* scratch(std::size_t n) {  // REQUIRES g_mu
  if (n <= g_scratch_size) return g_scratch;
  std::size_t size = 1 << 20;
  while (size < n) size *= 2;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap of the scratch buffer failed");
  if (g_scratch != nullptr) ::munmap(g_scratch, g_scratch_size);
  g_scratch = static_cast<char*>(p);
  g_scratch_size = size;
  return g_scratch;
}

off_t journal_size() {  // REQUIRES g_mu
  struct stat st {};
  if (::fstat(g_journal, &st) != 0) die("fstat of the journal failed");
  return st.st_size;
}

void journal_truncate(off_t size) {  // REQUIRES g_mu
  while (::ftruncate(g_journal, size) != 0) {
    if (errno != EINTR) die("ftruncate of the journal failed");
  }
}

// Mark the record that starts at `at` as written (its write returned).
void journal_mark_done(off_t at) {  // REQUIRES g_mu
  const std::uint32_t one = 1;
  if (real<PwriteFn>(kPwrite)(g_journal_rw, &one, sizeof one, at + static_cast<off_t>(offsetof(RecordHeader, done))) !=
      static_cast<ssize_t>(sizeof one)) {
    die("marking a journal record done failed");
  }
}

// Append the undo record of writing `iov` (total `len` bytes) at `off`.
void journal_append(int fd, std::uint64_t off, const struct iovec* iov, int iovcnt, std::uint64_t len,
                    std::uint64_t old_size) {  // REQUIRES g_mu
  RecordHeader h{kMagic, 0, off, len, 0, old_size};
  h.old_len = off >= old_size ? 0 : (old_size - off < len ? old_size - off : len);
  char* old = scratch(h.old_len + 1);
  std::size_t got = 0;
  // `fd` may be write-only (LMDB's O_DSYNC meta descriptor): read through our own.
  int rfd = h.old_len > 0 ? ::open(g_target, O_RDONLY | O_CLOEXEC) : -1;
  if (h.old_len > 0 && rfd < 0) die("cannot open the target to read the old bytes");
  (void)fd;
  while (got < h.old_len) {
    ssize_t n = ::pread(rfd, old + got, h.old_len - got, static_cast<off_t>(off + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) die("pread of the old bytes failed");
    got += static_cast<std::size_t>(n);
  }
  if (rfd >= 0) ::close(rfd);
  struct iovec out[IOV_MAX];
  if (iovcnt + 3 > IOV_MAX) die("too many iovecs");
  int k = 0;
  out[k++] = {&h, sizeof h};
  out[k++] = {old, static_cast<std::size_t>(h.old_len)};
  std::uint64_t left = len;
  for (int i = 0; i < iovcnt && left > 0; ++i) {
    std::size_t n = iov[i].iov_len < left ? iov[i].iov_len : static_cast<std::size_t>(left);
    out[k++] = {iov[i].iov_base, n};
    left -= n;
  }
  std::uint32_t end = kEndMagic;
  out[k++] = {&end, sizeof end};
  const std::size_t want = sizeof h + h.old_len + len + sizeof end;
  ssize_t n = real<WritevFn>(kWritev)(g_journal, out, k);
  if (n < 0 || static_cast<std::size_t>(n) != want) die("append to the journal failed (short or error)");
  bump(kRecords);
}

// Undo every journaled write, newest first (the dirty pages are lost).
void journal_revert_all(int fd) {  // REQUIRES g_mu
  off_t size = journal_size();
  if (size == 0) return;
  void* map = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ, MAP_PRIVATE, g_journal, 0);
  if (map == MAP_FAILED) die("mmap of the journal failed");
  const char* base = static_cast<const char*>(map);
  // Collect record starts (at most one per page-size step is plenty for a stack array? no: walk twice).
  std::size_t count = 0;
  for (std::size_t pos = 0; pos + sizeof(RecordHeader) <= static_cast<std::size_t>(size);) {
    RecordHeader h;
    std::memcpy(&h, base + pos, sizeof h);
    std::size_t total = sizeof h + h.old_len + h.len + 4;
    if (h.magic != kMagic || pos + total > static_cast<std::size_t>(size)) break;
    pos += total;
    ++count;
  }
  for (std::size_t i = count; i-- > 0;) {
    std::size_t pos = 0;
    for (std::size_t j = 0; j < i; ++j) {
      RecordHeader h;
      std::memcpy(&h, base + pos, sizeof h);
      pos += sizeof h + h.old_len + h.len + 4;
    }
    RecordHeader h;
    std::memcpy(&h, base + pos, sizeof h);
    if (h.old_len > 0 &&
        real<PwriteFn>(kPwrite)(fd, base + pos + sizeof h, h.old_len, static_cast<off_t>(h.offset)) !=
            static_cast<ssize_t>(h.old_len)) {
      die("reverting a write failed");
    }
    if (::ftruncate(fd, static_cast<off_t>(h.old_size)) != 0) die("reverting the file size failed");
  }
  ::munmap(map, static_cast<std::size_t>(size));
}

std::uint64_t iov_total(const struct iovec* iov, int iovcnt) {
  std::uint64_t t = 0;
  for (int i = 0; i < iovcnt; ++i) t += iov[i].iov_len;
  return t;
}

// The common path of every write to the target. `off` < 0: at the current
// position (write/writev). `issue` does the real call with (iov, iovcnt, len).
template <typename Issue>
ssize_t faulted_write(int fd, const struct iovec* iov, int iovcnt, off_t off, Issue issue) {
  Lock lock;
  std::uint64_t len = iov_total(iov, iovcnt);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return -1;
  const auto size = static_cast<std::uint64_t>(st.st_size);
  std::uint64_t at = 0;
  if (off >= 0) {
    at = static_cast<std::uint64_t>(off);
  } else {
    int fl = ::fcntl(fd, F_GETFL);
    off_t cur = (fl >= 0 && (fl & O_APPEND) != 0) ? st.st_size : ::lseek(fd, 0, SEEK_CUR);
    if (cur < 0) return -1;
    at = static_cast<std::uint64_t>(cur);
  }
  bump(kWrites);
  const std::uint64_t growth = at + len > size ? at + len - size : 0;
  long long space = g_space.load(std::memory_order_relaxed);
  if (space >= 0 && growth > static_cast<std::uint64_t>(space)) {
    bump(kEnospcInjected);
    errno = ENOSPC;
    return -1;
  }
  // A short write: keep the first half of the request.
  struct iovec cut[IOV_MAX];
  if (g_short.load(std::memory_order_relaxed) != 0 && len > 1 && iovcnt <= IOV_MAX) {
    std::uint64_t want = len / 2, left = want;
    int n = 0;
    for (int i = 0; i < iovcnt && left > 0; ++i) {
      std::size_t take = iov[i].iov_len < left ? iov[i].iov_len : static_cast<std::size_t>(left);
      cut[n++] = {iov[i].iov_base, take};
      left -= take;
    }
    iov = cut;
    iovcnt = n;
    len = want;
    bump(kShortInjected);
  }
  off_t before = -1;
  if (g_journal >= 0) {
    before = journal_size();
    journal_append(fd, at, iov, iovcnt, len, size);
  }
  ssize_t n = issue(iov, iovcnt, len);
  int saved = errno;
  if (n > 0) {
    bump(kBytes, static_cast<unsigned long long>(n));
    const std::uint64_t grown = at + static_cast<std::uint64_t>(n) > size ? at + static_cast<std::uint64_t>(n) - size : 0;
    if (space >= 0) g_space.fetch_sub(static_cast<long long>(grown), std::memory_order_relaxed);
  }
  if (g_journal >= 0) {
    int fl = ::fcntl(fd, F_GETFL);
    const bool dsync = fl >= 0 && (fl & O_DSYNC) == O_DSYNC;
    if (n <= 0 || (dsync && static_cast<std::uint64_t>(n) == len)) {
      journal_truncate(before);  // nothing was written, or it is durable already
    } else if (static_cast<std::uint64_t>(n) < len) {
      journal_truncate(before);  // describe what was really written
      journal_append(fd, at, iov, iovcnt, static_cast<std::uint64_t>(n), size);
      if (dsync) {
        journal_truncate(before);
      } else {
        journal_mark_done(before);
      }
    } else {
      journal_mark_done(before);
    }
  }
  // A short write through a short-write fault: report what was written.
  errno = saved;
  return n;
}

int faulted_sync(int fd, Fn which) {
  SyncFn f = real<SyncFn>(which);
  if (f == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  if (!is_target(fd)) return f(fd);
  Lock lock;
  bump(kSyncs);
  unsigned long long n = g_fsyncs.fetch_add(1, std::memory_order_relaxed) + 1;
  unsigned long long at = g_fsync_fail_at.load(std::memory_order_relaxed);
  if (at != 0 && n == at) {
    bump(kEioInjected);
    if (g_journal >= 0) {
      journal_revert_all(fd);  // writeback failed: the dirty pages are gone
      journal_truncate(0);
    }
    errno = EIO;
    return -1;
  }
  struct timespec started {};
  ::clock_gettime(CLOCK_MONOTONIC, &started);
  int rc = f(fd);
  if (rc == 0 && g_journal >= 0) journal_truncate(0);
  if (rc == 0 && g_synclog >= 0) {
    // When the fsync that just succeeded started (CLOCK_MONOTONIC ms): every
    // write that completed before then is durable.
    char line[32];
    unsigned long long ms = static_cast<unsigned long long>(started.tv_sec) * 1000ull +
                            static_cast<unsigned long long>(started.tv_nsec) / 1000000ull;
    int n = 0;
    char digits[24];
    do {
      digits[n++] = static_cast<char>('0' + ms % 10);
      ms /= 10;
    } while (ms != 0);
    int k = 0;
    while (n > 0) line[k++] = digits[--n];
    line[k++] = '\n';
    (void)real<WriteFn>(kWrite)(g_synclog, line, static_cast<std::size_t>(k));
  }
  return rc;
}

void open_journal(const char* path) {  // REQUIRES g_mu
  if (g_journal >= 0) {
    ::close(g_journal);
    g_journal = -1;
  }
  if (g_journal_rw >= 0) {
    ::close(g_journal_rw);
    g_journal_rw = -1;
  }
  if (path == nullptr || *path == '\0') return;
  g_journal = ::open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (g_journal < 0) die("cannot open LANEBUS_FAULTFS_JOURNAL");
  g_journal_rw = ::open(path, O_RDWR | O_CLOEXEC);
  if (g_journal_rw < 0) die("cannot open LANEBUS_FAULTFS_JOURNAL for the done flags");
}

void set_target(const char* path) {
  g_have_target.store(false, std::memory_order_release);
  if (path == nullptr || *path == '\0' || std::strlen(path) >= sizeof g_target) return;
  std::memcpy(g_target, path, std::strlen(path) + 1);
  g_have_target.store(true, std::memory_order_release);
}

__attribute__((constructor)) void faultfs_init() {
  set_target(std::getenv("LANEBUS_FAULTFS_FILE"));
  pthread_mutex_lock(&g_mu);
  open_journal(std::getenv("LANEBUS_FAULTFS_JOURNAL"));
  pthread_mutex_unlock(&g_mu);
  if (const char* e = std::getenv("LANEBUS_FAULTFS_SYNCLOG"); e != nullptr && *e != '\0') {
    g_synclog = ::open(e, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  }
  if (const char* e = std::getenv("LANEBUS_FAULTFS_FSYNC_EIO"); e != nullptr && *e != '\0') {
    g_fsync_fail_at.store(std::strtoull(e, nullptr, 10), std::memory_order_relaxed);
  }
  if (const char* e = std::getenv("LANEBUS_FAULTFS_SPACE"); e != nullptr && *e != '\0') {
    g_space.store(std::strtoll(e, nullptr, 10), std::memory_order_relaxed);
  }
}

}  // namespace

extern "C" {

#define FAULTFS_API __attribute__((visibility("default")))

FAULTFS_API ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  PwriteFn f = real<PwriteFn>(kPwrite);
  if (!is_target(fd)) return f(fd, buf, n, off);
  struct iovec v {const_cast<void*>(buf), n};
  return faulted_write(fd, &v, 1, off, [&](const struct iovec* iov, int, std::uint64_t len) {
    return f(fd, iov[0].iov_base, static_cast<size_t>(len), off);
  });
}

FAULTFS_API ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  PwriteFn f = real<PwriteFn>(kPwrite64);
  if (!is_target(fd)) return f(fd, buf, n, off);
  struct iovec v {const_cast<void*>(buf), n};
  return faulted_write(fd, &v, 1, off, [&](const struct iovec* iov, int, std::uint64_t len) {
    return f(fd, iov[0].iov_base, static_cast<size_t>(len), off);
  });
}

FAULTFS_API ssize_t pwritev(int fd, const struct iovec* iov, int iovcnt, off_t off) {
  PwritevFn f = real<PwritevFn>(kPwritev);
  if (!is_target(fd)) return f(fd, iov, iovcnt, off);
  return faulted_write(fd, iov, iovcnt, off,
                       [&](const struct iovec* v, int c, std::uint64_t) { return f(fd, v, c, off); });
}

FAULTFS_API ssize_t pwritev64(int fd, const struct iovec* iov, int iovcnt, off_t off) {
  PwritevFn f = real<PwritevFn>(kPwritev64);
  if (!is_target(fd)) return f(fd, iov, iovcnt, off);
  return faulted_write(fd, iov, iovcnt, off,
                       [&](const struct iovec* v, int c, std::uint64_t) { return f(fd, v, c, off); });
}

FAULTFS_API ssize_t write(int fd, const void* buf, size_t n) {
  WriteFn f = real<WriteFn>(kWrite);
  if (!is_target(fd)) return f(fd, buf, n);
  struct iovec v {const_cast<void*>(buf), n};
  return faulted_write(fd, &v, 1, -1, [&](const struct iovec* iov, int, std::uint64_t len) {
    return f(fd, iov[0].iov_base, static_cast<size_t>(len));
  });
}

FAULTFS_API ssize_t writev(int fd, const struct iovec* iov, int iovcnt) {
  WritevFn f = real<WritevFn>(kWritev);
  if (!is_target(fd)) return f(fd, iov, iovcnt);
  return faulted_write(fd, iov, iovcnt, -1,
                       [&](const struct iovec* v, int c, std::uint64_t) { return f(fd, v, c); });
}

FAULTFS_API int fsync(int fd) { return faulted_sync(fd, kFsync); }
FAULTFS_API int fdatasync(int fd) { return faulted_sync(fd, kFdatasync); }

// ---- control, for tests in the process that has the shim (faultfs.hpp) ----

/// Fault the file at `path` ("" or null: none). Call with no store open.
FAULTFS_API void lanebus_faultfs_set_target(const char* path) { set_target(path); }
/// Record undo records in `path` ("" or null: stop recording).
FAULTFS_API void lanebus_faultfs_set_journal(const char* path) {
  pthread_mutex_lock(&g_mu);
  open_journal(path);
  pthread_mutex_unlock(&g_mu);
}
/// The n-th fsync/fdatasync of the target from now fails with EIO (0: off).
FAULTFS_API void lanebus_faultfs_fail_fsync(unsigned long long n) {
  pthread_mutex_lock(&g_mu);
  g_fsync_fail_at.store(n == 0 ? 0 : g_fsyncs.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  pthread_mutex_unlock(&g_mu);
}
/// Bytes by which writes may still grow the target; -1: unlimited (space is back).
FAULTFS_API void lanebus_faultfs_set_space(long long bytes) { g_space.store(bytes, std::memory_order_relaxed); }
/// 1: every write to the target writes half of what was asked; 0: off.
FAULTFS_API void lanebus_faultfs_set_short_writes(int on) { g_short.store(on, std::memory_order_relaxed); }
/// Statistics: writes, bytes, syncs, eio, enospc, short, journal records.
FAULTFS_API unsigned long long lanebus_faultfs_stat(int which) {
  if (which < 0 || which >= kStats) return 0;
  return g_stats[which].load(std::memory_order_relaxed);
}

}  // extern "C"
