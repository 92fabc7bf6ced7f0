// lanebus — MIT License.
// fsync_counter: an LD_PRELOAD shim that counts the durability syscalls a
// process really makes, so tests check real fsyncs instead of a counter the
// store bumps itself.
//
// Interposes fsync, fdatasync, msync and sync_file_range (libc wrappers; LMDB
// 0.9 on Linux calls fdatasync on the data file in mdb_env_sync, msync only
// with MDB_WRITEMAP, and writes the meta page through an O_DSYNC descriptor,
// which no wrapper sees: one commit = one fdatasync here). Each call is
// forwarded to the next definition (dlsym(RTLD_NEXT)) and counted, successful
// or not, in process-wide relaxed atomics: the counts are statistics read
// before and after a burst, ordered by the test's own joins and waits.
//
// Tests find it with dlsym(RTLD_DEFAULT, "lanebus_test_fsync_count") (see
// fsync_counter.hpp); it is registered with env LD_PRELOAD=<this module>
// (and, in ASan builds, ASAN_OPTIONS=verify_asan_link_order=0).
//
// Written in C-compatible C++ without the C++ runtime (no exceptions, no
// allocation): it must work when it is loaded before everything else.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>
#include <fcntl.h>

#include <atomic>
#include <cerrno>
#include <cstddef>

namespace {

enum Kind : int { kFsync = 0, kFdatasync = 1, kMsync = 2, kSyncFileRange = 3, kKinds = 4 };
std::atomic<unsigned long long> g_counts[kKinds];

std::atomic<void*> g_real[kKinds];

// The next definition of `name` (libc's), resolved on first use. No function-
// local statics: their guards would need the C++ runtime. A race resolves the
// same pointer twice, so relaxed loads and stores are enough.
template <typename Fn>
Fn next(Kind k, const char* name) {
  void* p = g_real[k].load(std::memory_order_relaxed);
  if (p == nullptr) {
    p = dlsym(RTLD_NEXT, name);
    g_real[k].store(p, std::memory_order_relaxed);
  }
  return reinterpret_cast<Fn>(p);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int fsync(int fd) {
  using Fn = int (*)(int);
  Fn real = next<Fn>(kFsync, "fsync");
  g_counts[kFsync].fetch_add(1, std::memory_order_relaxed);
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return real(fd);
}

__attribute__((visibility("default"))) int fdatasync(int fd) {
  using Fn = int (*)(int);
  Fn real = next<Fn>(kFdatasync, "fdatasync");
  g_counts[kFdatasync].fetch_add(1, std::memory_order_relaxed);
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return real(fd);
}

__attribute__((visibility("default"))) int msync(void* addr, size_t length, int flags) {
  using Fn = int (*)(void*, size_t, int);
  Fn real = next<Fn>(kMsync, "msync");
  // Only MS_SYNC waits for the disk; MS_ASYNC is a no-op on Linux.
  if ((flags & MS_SYNC) != 0) g_counts[kMsync].fetch_add(1, std::memory_order_relaxed);
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return real(addr, length, flags);
}

__attribute__((visibility("default"))) int sync_file_range(int fd, off64_t offset, off64_t nbytes,
                                                           unsigned int flags) {
  using Fn = int (*)(int, off64_t, off64_t, unsigned int);
  Fn real = next<Fn>(kSyncFileRange, "sync_file_range");
  g_counts[kSyncFileRange].fetch_add(1, std::memory_order_relaxed);
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return real(fd, offset, nbytes, flags);
}

/// Real fsync + fdatasync + msync(MS_SYNC) + sync_file_range calls so far.
__attribute__((visibility("default"))) unsigned long long lanebus_test_fsync_count(void) {
  unsigned long long n = 0;
  for (int k = 0; k < kKinds; ++k) n += g_counts[k].load(std::memory_order_relaxed);
  return n;
}

/// One kind: 0 fsync, 1 fdatasync, 2 msync(MS_SYNC), 3 sync_file_range; else 0.
__attribute__((visibility("default"))) unsigned long long lanebus_test_fsync_count_of(int kind) {
  if (kind < 0 || kind >= kKinds) return 0;
  return g_counts[kind].load(std::memory_order_relaxed);
}

}  // extern "C"
