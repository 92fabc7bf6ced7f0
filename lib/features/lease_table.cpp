// lanebus — MIT License.
// LeaseTableImpl: creating, attaching and operating on a lease table segment.
//
// Design notes
// - One robust, process-shared pthread mutex guards the segment. Operations
//   are a few hundred nanoseconds of plain stores; the lock is always taken
//   with a bound (lock_timeout), so a participant SIGSTOPped inside an
//   operation makes others fail with Busy instead of hanging.
// - Crash safety: every mutation of an entry first copies the entry into the
//   header's undo record and sets undo_valid (a full fence orders the flag
//   between the copy and the mutation). A process killed anywhere inside the
//   operation leaves the robust mutex "owner died": the next locker gets
//   EOWNERDEAD, copies the pre-image back, clears the flag and only then calls
//   pthread_mutex_consistent. The token counter is
//   never rolled back: a token taken by a dead operation is simply skipped.
// - Creation: the segment is built in a temporary file (O_CREAT|O_EXCL, 0600,
//   fchmod), published with a release store of `ready`, and only then
//   link(2)ed to its final name. A racing creator's link fails with EEXIST and
//   it attaches to the winner instead, so nobody sees a half-built segment.
#include "lease_table.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "epoch_file.hpp"
#include "errno_status.hpp"
#include "hash.hpp"
#include "process_identity.hpp"
#include "quote.hpp"

namespace lanebus::detail {
namespace {


std::uint64_t inode_of(const char* path) {
  struct stat st {};
  if (stat(path, &st) != 0) return 0;
  return st.st_ino;
}

std::string read_boot_id(const LeaseTableHooks& hooks) {
  if (!hooks.boot_id_override.empty()) return hooks.boot_id_override.substr(0, 39);
  return current_boot_id_text().substr(0, 39);
}

std::size_t segment_bytes(std::uint32_t capacity) {
  std::size_t bytes = kHeaderBytes + std::size_t{capacity} * sizeof(Entry);
  std::size_t page = 4096;
  return (bytes + page - 1) / page * page;
}

std::string epoch_path_for(const std::string& path, const LeaseTableOptions& options) {
  return options.epoch_path.empty() ? path + ".epoch" : options.epoch_path;
}

LeaseOwner owner_of(const OwnerRecord& r) { return LeaseOwner{r.pid, r.start_time, r.nonce}; }
bool same_owner(const OwnerRecord& r, const LeaseOwner& o) {
  return r.pid == o.pid && r.start_time == o.start_time && r.nonce == o.nonce;
}

bool held_at(const Entry& e, std::int64_t now) { return e.expires_at != 0 && now < e.expires_at; }

std::string ms_text(std::int64_t ns) { return std::to_string(ns / 1000000) + " ms"; }

}  // namespace

// ---------------------------------------------------------------------------
// Names, hashes, ABI tag

std::uint64_t lease_name_hash(std::string_view name) noexcept {
  const std::uint64_t h = fnv1a64(name, kFnv1a64ShortOffset);  // the segments' basis (hash.hpp)
  return h == 0 ? 1 : h;
}

Status validate_lease_name(std::string_view name) {
  if (name.empty()) return Status(Code::InvalidName, "lease name is empty");
  if (name.size() > kMaxLeaseNameBytes) {
    return Status(Code::InvalidName, "lease name is " + std::to_string(name.size()) +
                                         " bytes; the limit is " + std::to_string(kMaxLeaseNameBytes));
  }
  bool segment_start = true;
  for (std::size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool word = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (word) {
      segment_start = false;
      continue;
    }
    if ((c == '.' || c == '/') && !segment_start && i + 1 < name.size()) {
      segment_start = true;
      continue;
    }
    std::string shown = static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e
                            ? "byte " + std::to_string(static_cast<unsigned char>(c))
                            : "'" + std::string(1, c) + "'";
    return Status(Code::InvalidName, "lease name " + quoted(name) + ": " + shown + " at offset " +
                                         std::to_string(i) +
                                         " (segments of [a-z0-9_-] separated by '.' or '/')");
  }
  return Status::OK();
}

std::uint64_t lease_abi_tag() noexcept {
  std::string tag;
#if defined(__x86_64__)
  tag += "x86_64";
#elif defined(__aarch64__)
  tag += "aarch64";
#else
  tag += "other-arch";
#endif
#if defined(__GLIBC__)
  tag += "/glibc";
#else
  tag += "/libc";
#endif
  tag += "/mutex" + std::to_string(sizeof(pthread_mutex_t)) + "/hdr" + std::to_string(sizeof(LeaseTableHeader)) +
         "/entry" + std::to_string(sizeof(Entry)) + "/le" +
         std::to_string(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);
  return lease_name_hash(tag);
}

// ---------------------------------------------------------------------------
// Locking

/// RAII: the segment mutex, held for one operation.
class LockedTable {
 public:
  explicit LockedTable(LeaseTableImpl& t) : t_(t), status_(t.lock()) {}
  ~LockedTable() {
    if (status_.ok()) {
      t_.crash_point(kBeforeUnlock);
      t_.unlock();
    }
  }
  LockedTable(const LockedTable&) = delete;
  LockedTable& operator=(const LockedTable&) = delete;
  const Status& status() const { return status_; }

 private:
  LeaseTableImpl& t_;
  Status status_;
};

Status LeaseTableImpl::lock() {
  int rc;
  const long long timeout_ns = static_cast<long long>(options_.lock_timeout.count()) * 1000000LL;
#if defined(__SANITIZE_THREAD__)
  // TSan's timedlock interceptor does not record a lock that returns
  // EOWNERDEAD (its trylock interceptor does), so TSan builds poll trylock up
  // to the same bound instead.
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const long long deadline = static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec + timeout_ns;
  for (;;) {
    rc = pthread_mutex_trylock(&header_->mutex);
    if (rc != EBUSY) break;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec >= deadline) {
      rc = ETIMEDOUT;
      break;
    }
    struct timespec nap {0, 50000};
    nanosleep(&nap, nullptr);
  }
#else
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += timeout_ns / 1000000000LL;
  ts.tv_nsec += timeout_ns % 1000000000LL;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec += 1;
    ts.tv_nsec -= 1000000000L;
  }
  rc = pthread_mutex_clocklock(&header_->mutex, CLOCK_MONOTONIC, &ts);
#endif
  if (rc == 0) {
    crash_point(kAfterLock);
    return Status::OK();
  }
  if (rc == EOWNERDEAD) {
    // The previous holder died inside an operation: roll its entry back, then
    // (and only then) mark the mutex consistent. Unlocking without
    // pthread_mutex_consistent would make it ENOTRECOVERABLE forever.
    if (!hooks_.skip_repair) repair();
    pthread_mutex_consistent(&header_->mutex);
    crash_point(kAfterLock);
    return Status::OK();
  }
  if (rc == ETIMEDOUT) {
    return Status(Code::Busy, "lease table " + quoted(path_) + ": mutex held for more than " +
                                  std::to_string(options_.lock_timeout.count()) +
                                  " ms (a participant stalled inside an operation, e.g. SIGSTOPped)");
  }
  if (rc == ENOTRECOVERABLE) {
    return Status(Code::Corruption, "lease table " + quoted(path_) +
                                        ": mutex is not recoverable; remove the segment file");
  }
  return Status(Code::Internal, "lease table " + quoted(path_) + ": pthread_mutex lock: " +
                                    std::strerror(rc));
}

void LeaseTableImpl::unlock() { pthread_mutex_unlock(&header_->mutex); }

void LeaseTableImpl::repair() {
  LeaseTableHeader& h = *header_;
  if (h.undo_valid == 1 && h.undo_index < capacity_) {
    std::memcpy(static_cast<void*>(entry(h.undo_index)), &h.undo_entry, sizeof(Entry));
  }
  std::uint32_t used = 0;
  std::uint64_t max_token = 0;
  for (std::uint32_t i = 0; i < capacity_; ++i) {
    if (entries_[i].name_hash != 0) ++used;
    if (entries_[i].token > max_token) max_token = entries_[i].token;
  }
  h.used = used;
  // The counter only moves forwards; this only matters for a damaged header.
  if (h.next_token <= max_token) h.next_token = max_token + 1;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  h.undo_valid = 0;
  h.repairs += 1;
}

void LeaseTableImpl::begin_update(std::uint32_t index) {
  LeaseTableHeader& h = *header_;
  std::memcpy(&h.undo_entry, entry(index), sizeof(Entry));
  h.undo_index = index;
  // Full fences (seq_cst): the pre-image must be complete before the flag,
  // and the flag set before the first store to the entry, as seen by a
  // process that takes over after this one is killed.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  h.undo_valid = 1;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  crash_point(kAfterUndo);
}

void LeaseTableImpl::end_update() {
  crash_point(kBeforeUndoClear);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  header_->undo_valid = 0;
}

// ---------------------------------------------------------------------------
// Open / attach

Result<std::unique_ptr<LeaseTable>> open_lease_table_with_hooks(const std::string& path,
                                                                const LeaseTableOptions& options,
                                                                const LeaseTableHooks& hooks) {
  return LeaseTableImpl::open(path, options, hooks);
}

namespace {

// Fill a new segment's header at `map` for `epoch` (the file is all zeros):
// the mutex is made process-shared and robust, and `ready` is stored last.
Status init_segment(void* map, std::size_t bytes, std::uint64_t epoch, const LeaseTableOptions& options,
                    const LeaseTableHooks& hooks) {
  auto* h = new (map) LeaseTableHeader();  // zero-initialised (the file is all zeros too)
  h->magic = kLeaseMagic;
  h->layout_version = kLeaseLayoutVersion;
  h->header_bytes = kHeaderBytes;
  h->abi_tag = lease_abi_tag();
  h->entry_bytes = sizeof(Entry);
  h->capacity = options.capacity;
  h->total_bytes = bytes;
  h->creator_uid = geteuid();
  h->time_ns_inode = inode_of("/proc/self/ns/time");
  h->pid_ns_inode = inode_of("/proc/self/ns/pid");
  std::string boot = read_boot_id(hooks);
  std::memcpy(h->boot_id, boot.data(), boot.size());
  h->epoch = epoch;
  h->next_token = (epoch << kSeqBits) | 1;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  int rc = pthread_mutex_init(&h->mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  if (rc != 0) return Status(Code::Internal, std::string("pthread_mutex_init: ") + std::strerror(rc));
  // Release: every store above happens-before a reader that sees kReady.
  h->ready.store(kReady, std::memory_order_release);
  return Status::OK();
}

// Create the segment at `path`: build it in a private temporary file, then
// link it into place. OK also when another creator linked one first (EEXIST):
// the caller attaches to whichever is there.
Status create_segment(const std::string& path, const std::string& epoch_path, const LeaseTableOptions& options,
                      const LeaseTableHooks& hooks) {
  std::uint64_t rnd = 0;
  if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd)) rnd = static_cast<std::uint64_t>(getpid());
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), ".tmp.%d.%016llx", static_cast<int>(getpid()),
                static_cast<unsigned long long>(rnd));
  std::string tmp = path + suffix;
  int tfd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (tfd < 0) return errno_status("open (create)", tmp, errno);
  auto fail = [&](const char* call) {
    int err = errno;
    ::close(tfd);
    ::unlink(tmp.c_str());
    return errno_status(call, tmp, err);
  };
  // umask filters the mode given to open; fchmod makes it exactly 0600.
  if (fchmod(tfd, 0600) != 0) return fail("fchmod");
  std::size_t bytes = segment_bytes(options.capacity);
  if (ftruncate(tfd, static_cast<off_t>(bytes)) != 0) return fail("ftruncate");
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, tfd, 0);
  if (map == MAP_FAILED) return fail("mmap");
  // A new segment is a new incarnation: advance the durable epoch first.
  Result<std::uint64_t> epoch = EpochFile::advance(epoch_path, 1, options.allow_volatile_epoch);
  Status init_status = epoch.ok() ? Status::OK() : epoch.status();
  if (init_status.ok() && *epoch > kMaxEpoch) {
    init_status = Status(Code::Corruption, "epoch file " + quoted(epoch_path) + ": epoch space exhausted");
  }
  if (init_status.ok()) init_status = init_segment(map, bytes, *epoch, options, hooks);
  munmap(map, bytes);
  if (!init_status.ok()) {
    ::close(tfd);
    ::unlink(tmp.c_str());
    return init_status;
  }
  int lrc = ::link(tmp.c_str(), path.c_str());
  int lerr = errno;
  ::unlink(tmp.c_str());
  ::close(tfd);
  if (lrc != 0 && lerr != EEXIST) return errno_status("link", path, lerr);
  return Status::OK();
}

// The segment file must be a regular file of this euid, not group or world writable.
Status check_segment_file(int fd, const std::string& path) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return errno_status("fstat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    return Status(Code::PermissionDenied, "lease table " + quoted(path) + " is not a regular file");
  }
  if (st.st_uid != geteuid()) {
    return Status(Code::PermissionDenied, "lease table " + quoted(path) + " is owned by uid " +
                                              std::to_string(st.st_uid) + ", not this process's euid " +
                                              std::to_string(geteuid()) + "; refusing a foreign segment");
  }
  if ((st.st_mode & 0022) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status(Code::PermissionDenied, "lease table " + quoted(path) + " has mode " + mode +
                                              " (group or world writable); refusing it");
  }
  return Status::OK();
}

// The header's fixed-size prefix, read with pread before mapping anything
// (so a truncated or foreign file never gets mapped past its end): magic,
// version, ABI and a size that matches the capacity. Returns the capacity.
Result<std::uint32_t> check_segment_header(int fd, std::size_t size, const std::string& path) {
  if (size < sizeof(LeaseTableHeader)) {
    return Status(Code::Corruption, "lease table " + quoted(path) + " is too small (" +
                                        std::to_string(size) + " bytes) to be a lease table");
  }
  alignas(LeaseTableHeader) unsigned char probe[offsetof(LeaseTableHeader, ready)];
  if (pread(fd, probe, sizeof(probe), 0) != static_cast<ssize_t>(sizeof(probe))) {
    return errno_status("pread", path, errno);
  }
  std::uint64_t magic;
  std::uint32_t version;
  std::uint64_t abi;
  std::uint32_t entry_bytes;
  std::uint32_t capacity;
  std::uint64_t total;
  std::memcpy(&magic, probe + offsetof(LeaseTableHeader, magic), sizeof(magic));
  std::memcpy(&version, probe + offsetof(LeaseTableHeader, layout_version), sizeof(version));
  std::memcpy(&abi, probe + offsetof(LeaseTableHeader, abi_tag), sizeof(abi));
  std::memcpy(&entry_bytes, probe + offsetof(LeaseTableHeader, entry_bytes), sizeof(entry_bytes));
  std::memcpy(&capacity, probe + offsetof(LeaseTableHeader, capacity), sizeof(capacity));
  std::memcpy(&total, probe + offsetof(LeaseTableHeader, total_bytes), sizeof(total));
  if (magic != kLeaseMagic) {
    return Status(Code::Corruption, "lease table " + quoted(path) +
                                        ": bad magic number (not a lanebus lease table)");
  }
  if (version > kLeaseLayoutVersion) {
    return Status(Code::VersionTooNew, "lease table " + quoted(path) + ": layout version " +
                                           std::to_string(version) + " is newer than this lanebus (" +
                                           std::to_string(kLeaseLayoutVersion) + ")");
  }
  if (version != kLeaseLayoutVersion) {
    return Status(Code::Corruption, "lease table " + quoted(path) + ": unknown layout version " +
                                        std::to_string(version));
  }
  if (abi != lease_abi_tag() || entry_bytes != sizeof(Entry)) {
    return Status(Code::Corruption, "lease table " + quoted(path) +
                                        ": ABI tag mismatch (created by a different arch, libc or "
                                        "build of lanebus)");
  }
  if (capacity == 0 || capacity > kMaxCapacity || total != segment_bytes(capacity) || size != total) {
    return Status(Code::Corruption, "lease table " + quoted(path) + ": size " + std::to_string(size) +
                                        " bytes does not match the header (capacity " +
                                        std::to_string(capacity) + ", expected " +
                                        std::to_string(segment_bytes(capacity)) + " bytes)");
  }
  return capacity;
}

// The mutex's kind word (glibc's pthread_mutex_t.__data.__kind: type,
// robust, process-shared and priority bits) never changes after
// pthread_mutex_init. A damaged one makes pthread_mutex_timedlock assert
// (priority-protect bits) or misbehave: compare it with a mutex made like the
// creator's before locking (found by fuzz/lease_segment_fuzz.cpp).
Status check_mutex_kind(const LeaseTableHeader& header, const std::string& path) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_t reference;
  pthread_mutex_init(&reference, &attr);
  pthread_mutexattr_destroy(&attr);
  const int want = reference.__data.__kind;
  pthread_mutex_destroy(&reference);
  int got = 0;
  std::memcpy(&got, reinterpret_cast<const char*>(&header.mutex) + offsetof(pthread_mutex_t, __data.__kind),
              sizeof got);
  if (got != want) {
    return Status(Code::Corruption, "lease table " + quoted(path) +
                                        ": the segment's mutex is not a process-shared robust mutex (damaged header)");
  }
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<LeaseTable>> LeaseTableImpl::open(const std::string& path,
                                                         const LeaseTableOptions& options,
                                                         const LeaseTableHooks& hooks) {
  if (path.empty()) return Status(Code::InvalidArgument, "lease table path is empty");
  if (options.lock_timeout.count() <= 0) {
    return Status(Code::InvalidArgument, "LeaseTableOptions::lock_timeout must be positive");
  }
  std::unique_ptr<LeaseTableImpl> impl(new LeaseTableImpl());
  impl->path_ = path;
  impl->epoch_path_ = epoch_path_for(path, options);
  impl->options_ = options;
  impl->hooks_ = hooks;

  for (int attempt = 0; attempt < 8; ++attempt) {
    int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      struct stat st {};
      if (fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        return errno_status("fstat", path, err);
      }
      Status s = impl->attach(fd, static_cast<std::size_t>(st.st_size));
      ::close(fd);
      if (!s.ok()) return s;
      return std::unique_ptr<LeaseTable>(new LeaseTable(std::move(impl)));
    }
    if (errno != ENOENT) return errno_status("open", path, errno);
    if (!options.create_if_missing) {
      return Status(Code::NotFound, "lease table " + quoted(path) + " does not exist");
    }
    if (options.capacity == 0 || options.capacity > kMaxCapacity) {
      return Status(Code::InvalidArgument, "LeaseTableOptions::capacity " +
                                               std::to_string(options.capacity) + " is outside 1.." +
                                               std::to_string(kMaxCapacity));
    }
    // Won the race to create it or lost it to another creator: attach either way.
    if (Status s = create_segment(path, impl->epoch_path_, options, hooks); !s.ok()) return s;
  }
  return Status(Code::Busy, "lease table " + quoted(path) +
                                ": the file keeps appearing and disappearing; giving up");
}

Status LeaseTableImpl::attach(int fd, std::size_t size) {
  if (Status s = check_segment_file(fd, path_); !s.ok()) return s;
  auto capacity = check_segment_header(fd, size, path_);
  if (!capacity.ok()) return capacity.status();
  void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return errno_status("mmap", path_, errno);
  map_ = map;
  map_bytes_ = size;
  header_ = static_cast<LeaseTableHeader*>(map);
  entries_ = reinterpret_cast<Entry*>(static_cast<char*>(map) + kHeaderBytes);
  capacity_ = *capacity;
  // Acquire pairs with the creator's release store.
  if (header_->ready.load(std::memory_order_acquire) != kReady) {
    return Status(Code::Corruption, "lease table " + quoted(path_) + ": segment was never initialised");
  }
  if (Status s = check_mutex_kind(*header_, path_); !s.ok()) return s;
  std::uint64_t my_time_ns = inode_of("/proc/self/ns/time");
  std::string boot = read_boot_id(hooks_);

  LockedTable locked(*this);
  if (!locked.status().ok()) return locked.status();
  if (std::strncmp(header_->boot_id, boot.c_str(), sizeof(header_->boot_id)) != 0) {
    Status s = handle_boot_change(boot);
    if (!s.ok()) return s;
    header_->time_ns_inode = my_time_ns;
  } else if (header_->time_ns_inode != 0 && my_time_ns != 0 && header_->time_ns_inode != my_time_ns) {
    return Status(Code::InvalidArgument,
                  "lease table " + quoted(path_) + " belongs to time namespace " +
                      std::to_string(header_->time_ns_inode) + ", this process is in " +
                      std::to_string(my_time_ns) +
                      "; their monotonic clocks differ, so it cannot take part");
  }
  if (header_->epoch == 0 || header_->epoch > kMaxEpoch ||
      (header_->next_token >> kSeqBits) < header_->epoch ||
      (header_->next_token >> kSeqBits) > header_->epoch + 1) {
    return Status(Code::Corruption, "lease table " + quoted(path_) +
                                        ": token counter does not match the epoch (damaged header)");
  }
  // The epoch file may have been deleted while the segment lived: restore it,
  // so a later recreation still starts above every token of this segment.
  Status es = EpochFile::ensure_at_least(epoch_path_, header_->epoch, options_.allow_volatile_epoch);
  if (!es.ok()) return es;
  return Status::OK();
}

Status LeaseTableImpl::handle_boot_change(const std::string& boot_id) {
  // Every stored monotonic time is from the previous boot: expire every lease
  // but keep each name's token record, and move to a new epoch (durably,
  // before any token of it exists). The boot id is written last, so a process
  // killed part-way makes the next opener redo all of it.
  Result<std::uint64_t> epoch =
      EpochFile::advance(epoch_path_, header_->epoch + 1, options_.allow_volatile_epoch);
  if (!epoch.ok()) return epoch.status();
  if (*epoch > kMaxEpoch) {
    return Status(Code::Corruption, "epoch file " + quoted(epoch_path_) + ": epoch space exhausted");
  }
  header_->epoch = *epoch;
  header_->next_token = (*epoch << kSeqBits) | 1;
  for (std::uint32_t i = 0; i < capacity_; ++i) {
    if (entries_[i].name_hash == 0) continue;
    begin_update(i);
    entries_[i].expires_at = 0;
    entries_[i].granted_at = 0;
    end_update();
  }
  std::memset(header_->boot_id, 0, sizeof(header_->boot_id));
  std::memcpy(header_->boot_id, boot_id.data(), boot_id.size());
  return Status::OK();
}

LeaseTableImpl::~LeaseTableImpl() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

std::uint64_t LeaseTableImpl::epoch() const noexcept {
  // Informational; a torn read is impossible for an aligned u64 on the
  // supported 64-bit targets and the value only ever grows.
  return __atomic_load_n(&header_->epoch, __ATOMIC_RELAXED);
}

// ---------------------------------------------------------------------------
// Operations (all REQUIRE the lock where noted)

std::int64_t LeaseTableImpl::find(std::string_view name, std::uint64_t hash) {
  std::uint32_t i = static_cast<std::uint32_t>(hash % capacity_);
  for (std::uint32_t probes = 0; probes < capacity_; ++probes) {
    const Entry& e = entries_[i];
    if (e.name_hash == 0) return -1;  // end of the probe chain
    if (e.name_hash == hash && e.name_len == name.size() &&
        std::memcmp(e.name, name.data(), name.size()) == 0) {
      return i;
    }
    i = (i + 1 == capacity_) ? 0 : i + 1;
  }
  return -1;
}

std::int64_t LeaseTableImpl::place(std::string_view name, std::uint64_t hash, std::int64_t now) {
  // A never-named slot on the probe chain keeps lookups short. Only when none
  // is left (then find() scans everything) is a released or expired entry of
  // another name reused.
  std::uint32_t i = static_cast<std::uint32_t>(hash % capacity_);
  std::int64_t victim = -1;
  for (std::uint32_t probes = 0; probes < capacity_; ++probes) {
    if (entries_[i].name_hash == 0) {
      victim = i;
      break;
    }
    i = (i + 1 == capacity_) ? 0 : i + 1;
  }
  if (victim < 0) {
    for (std::uint32_t j = 0; j < capacity_; ++j) {
      if (!held_at(entries_[j], now)) {
        victim = j;
        break;
      }
    }
  }
  if (victim < 0) return -1;
  auto idx = static_cast<std::uint32_t>(victim);
  begin_update(idx);
  Entry& e = entries_[idx];
  bool was_unnamed = e.name_hash == 0;
  std::memset(static_cast<void*>(&e), 0, sizeof(Entry));
  std::memcpy(e.name, name.data(), name.size());
  e.name_len = static_cast<std::uint32_t>(name.size());
  e.name_hash = hash;
  if (was_unnamed) header_->used += 1;
  // The undo record stays valid until the caller's grant completes, so a
  // crash between naming and granting rolls the naming back too.
  return victim;
}

Result<std::uint64_t> LeaseTableImpl::next_token_locked() {
  std::uint64_t t = header_->next_token;
  if ((t >> kSeqBits) > header_->epoch) {
    // 2^40 tokens used in this epoch: persist the next one before using it.
    Result<std::uint64_t> e =
        EpochFile::advance(epoch_path_, t >> kSeqBits, options_.allow_volatile_epoch);
    if (!e.ok()) return e.status();
    if (*e > kMaxEpoch) return Status(Code::Internal, "lease token space exhausted");
    header_->epoch = *e;
    if ((t >> kSeqBits) < *e) t = (*e << kSeqBits) | 1;
  }
  header_->next_token = t + 1;
  return t;
}

Result<Lease> LeaseTableImpl::acquire(std::string_view name, const LeaseOwner& owner,
                                      std::int64_t ttl_ns) {
  Status ns = validate_lease_name(name);
  if (!ns.ok()) return ns;
  std::uint64_t hash = lease_name_hash(name);
  LockedTable locked(*this);
  if (!locked.status().ok()) return locked.status();
  std::int64_t now = LeaseTable::now();
  std::int64_t idx = find(name, hash);
  bool placed = false;
  if (idx >= 0) {
    const Entry& e = entries_[idx];
    if (held_at(e, now)) {
      return Status(Code::Busy, "lease " + quoted(name) + " is held by " +
                                    owner_of(e.owner).to_string() + " (token " +
                                    std::to_string(e.token) + ") for another " +
                                    ms_text(e.expires_at - now));
    }
  } else {
    idx = place(name, hash, now);
    if (idx < 0) {
      return Status(Code::QuotaExceeded, "lease table " + quoted(path_) + " is full: " +
                                             std::to_string(capacity_) +
                                             " names, all held; raise LeaseTableOptions::capacity");
    }
    placed = true;
  }
  if (!placed) begin_update(static_cast<std::uint32_t>(idx));
  Result<std::uint64_t> token = next_token_locked();
  if (!token.ok()) {
    // Roll back the (possibly just placed) entry by hand: nothing changed yet.
    std::memcpy(static_cast<void*>(entry(static_cast<std::uint32_t>(idx))), &header_->undo_entry,
                sizeof(Entry));
    if (placed && header_->undo_entry.name_hash == 0) header_->used -= 1;
    end_update();
    return token.status();
  }
  Entry& e = entries_[idx];
  e.token = *token;
  crash_point(kMidUpdate);
  for (std::size_t k = kGrantHistory - 1; k > 0; --k) e.history[k] = e.history[k - 1];
  e.history[0] = *token;
  e.owner = OwnerRecord{owner.pid, 0, owner.start_time, owner.nonce};
  e.granted_at = now;
  e.expires_at = now + ttl_ns;
  e.ttl_ns = ttl_ns;
  e.grants += 1;
  end_update();
  return Lease{std::string(name), owner, *token, now, now + ttl_ns};
}

Result<Lease> LeaseTableImpl::renew(std::string_view name, const LeaseOwner& owner,
                                    std::uint64_t token) {
  Status ns = validate_lease_name(name);
  if (!ns.ok()) return ns;
  std::uint64_t hash = lease_name_hash(name);
  LockedTable locked(*this);
  if (!locked.status().ok()) return locked.status();
  std::int64_t now = LeaseTable::now();
  std::int64_t idx = find(name, hash);
  if (idx < 0) return Status(Code::NotFound, "lease " + quoted(name) + " was never granted here");
  Entry& e = entries_[idx];
  if (token > e.token) {
    return Status(Code::FenceViolation, "renew " + quoted(name) + ": token " + std::to_string(token) +
                                            " was never granted (last grant " +
                                            std::to_string(e.token) + ")");
  }
  if (token < e.token) {
    return Status(Code::StaleToken, "renew " + quoted(name) + ": token " + std::to_string(token) +
                                        " was superseded by token " + std::to_string(e.token));
  }
  if (!same_owner(e.owner, owner)) {
    return Status(Code::StaleToken, "renew " + quoted(name) + ": token " + std::to_string(token) +
                                        " belongs to owner " + owner_of(e.owner).to_string() +
                                        ", not " + owner.to_string());
  }
  if (e.expires_at == 0) {
    return Status(Code::StaleToken, "renew " + quoted(name) + ": lease with token " +
                                        std::to_string(token) + " was released");
  }
  if (now >= e.expires_at) {
    return Status(Code::StaleToken, "renew " + quoted(name) + ": lease with token " +
                                        std::to_string(token) + " expired " +
                                        ms_text(now - e.expires_at) +
                                        " ago; an expired lease is never renewed");
  }
  begin_update(static_cast<std::uint32_t>(idx));
  e.expires_at = now + e.ttl_ns;
  crash_point(kMidUpdate);
  end_update();
  return Lease{std::string(name), owner, token, e.granted_at, e.expires_at};
}

Status LeaseTableImpl::release(std::string_view name, const LeaseOwner& owner, std::uint64_t token) {
  Status ns = validate_lease_name(name);
  if (!ns.ok()) return ns;
  std::uint64_t hash = lease_name_hash(name);
  LockedTable locked(*this);
  if (!locked.status().ok()) return locked.status();
  std::int64_t idx = find(name, hash);
  if (idx < 0) return Status(Code::NotFound, "lease " + quoted(name) + " was never granted here");
  Entry& e = entries_[idx];
  if (token > e.token) {
    return Status(Code::FenceViolation, "release " + quoted(name) + ": token " +
                                            std::to_string(token) + " was never granted (last grant " +
                                            std::to_string(e.token) + ")");
  }
  if (token < e.token) {
    return Status(Code::StaleToken, "release " + quoted(name) + ": token " + std::to_string(token) +
                                        " was superseded by token " + std::to_string(e.token));
  }
  if (!same_owner(e.owner, owner)) {
    return Status(Code::StaleToken, "release " + quoted(name) + ": token " + std::to_string(token) +
                                        " belongs to owner " + owner_of(e.owner).to_string() +
                                        ", not " + owner.to_string());
  }
  if (e.expires_at == 0) return Status::OK();
  begin_update(static_cast<std::uint32_t>(idx));
  e.expires_at = 0;
  crash_point(kMidUpdate);
  end_update();
  return Status::OK();
}

Status LeaseTableImpl::confirm_grant(std::string_view name, std::uint64_t token) {
  Status ns = validate_lease_name(name);
  if (!ns.ok()) return ns;
  std::uint64_t hash = lease_name_hash(name);
  LockedTable locked(*this);
  if (!locked.status().ok()) return locked.status();
  std::int64_t idx = find(name, hash);
  if (idx < 0 || entries_[idx].token == 0) {
    return Status(Code::NotFound, "lease " + quoted(name) + " was never granted by this segment");
  }
  const Entry& e = entries_[idx];
  std::uint64_t oldest = e.token;
  for (std::uint64_t h : e.history) {
    if (h == token) return Status::OK();
    if (h != 0) oldest = h;
  }
  if (token > e.token) {
    return Status(Code::FenceViolation, "token " + std::to_string(token) +
                                            " was never granted for lease " + quoted(name) +
                                            " (last grant " + std::to_string(e.token) + ")");
  }
  if (token < oldest && e.grants > kGrantHistory) {
    return Status(Code::StaleToken, "token " + std::to_string(token) + " for lease " + quoted(name) +
                                        " is older than the remembered grants (oldest " +
                                        std::to_string(oldest) + ")");
  }
  return Status(Code::FenceViolation, "token " + std::to_string(token) +
                                          " was not granted for lease " + quoted(name) +
                                          " (forged, or a token of another name)");
}

LeaseInfo LeaseTableImpl::info_of(const Entry& e, std::int64_t now) const {
  LeaseInfo info;
  // name_len comes from the shared segment: never read past the name field,
  // whatever a damaged segment says (found by fuzz/lease_segment_fuzz.cpp).
  info.name.assign(e.name, std::min<std::size_t>(e.name_len, sizeof(e.name)));
  info.owner = owner_of(e.owner);
  info.token = e.token;
  info.granted_at_ns = e.granted_at;
  info.expires_at_ns = e.expires_at;
  info.held = held_at(e, now);
  info.now_ns = now;
  info.grants = e.grants;
  return info;
}

Result<LeaseInfo> LeaseTableImpl::inspect(std::string_view name) {
  Status ns = validate_lease_name(name);
  if (!ns.ok()) return ns;
  std::uint64_t hash = lease_name_hash(name);
  LockedTable locked(*this);
  if (!locked.status().ok()) return locked.status();
  std::int64_t idx = find(name, hash);
  if (idx < 0) return Status(Code::NotFound, "lease " + quoted(name) + " is not in the table");
  return info_of(entries_[idx], LeaseTable::now());
}

Result<std::vector<LeaseInfo>> LeaseTableImpl::list() {
  std::vector<LeaseInfo> out;
  LockedTable locked(*this);
  if (!locked.status().ok()) return locked.status();
  std::int64_t now = LeaseTable::now();
  for (std::uint32_t i = 0; i < capacity_; ++i) {
    if (entries_[i].name_hash != 0) out.push_back(info_of(entries_[i], now));
  }
  return out;
}

Status LeaseTableImpl::check_consistency() {
  LockedTable locked(*this);
  if (!locked.status().ok()) return locked.status();
  const LeaseTableHeader& h = *header_;
  auto bad = [&](std::uint32_t i, const std::string& what) {
    return Status(Code::Corruption, "lease table " + quoted(path_) + " entry " + std::to_string(i) +
                                        ": " + what);
  };
  if ((h.next_token >> kSeqBits) > h.epoch + 1 || (h.next_token >> kSeqBits) < h.epoch) {
    return Status(Code::Corruption, "token counter outside the durable epoch");
  }
  std::uint32_t used = 0;
  for (std::uint32_t i = 0; i < capacity_; ++i) {
    const Entry& e = entries_[i];
    if (e.name_hash == 0) continue;
    ++used;
    std::string_view name(e.name, e.name_len);
    if (e.name_len > kMaxLeaseNameBytes || !validate_lease_name(name).ok()) return bad(i, "bad name");
    if (lease_name_hash(name) != e.name_hash) return bad(i, "name hash mismatch");
    if (e.token >= h.next_token) return bad(i, "token not below the counter");
    if (e.token != 0 && e.history[0] != e.token) return bad(i, "torn grant: history[0] != token");
    for (std::size_t k = 1; k < kGrantHistory; ++k) {
      if (e.history[k] != 0 && e.history[k] >= e.history[k - 1]) return bad(i, "history not decreasing");
    }
    if (e.token != 0 && e.owner.pid == 0) return bad(i, "granted without an owner");
    if (e.expires_at != 0 && e.expires_at < e.granted_at) return bad(i, "expiry before grant");
  }
  if (used != h.used) return Status(Code::Corruption, "used count mismatch");
  if (h.undo_valid != 0) return Status(Code::Corruption, "undo record left valid outside an operation");
  return Status::OK();
}

std::uint64_t LeaseTableImpl::next_token_for_test() {
  LockedTable locked(*this);
  return header_->next_token;
}

std::uint64_t LeaseTableImpl::repairs_for_test() {
  LockedTable locked(*this);
  return header_->repairs;
}

}  // namespace lanebus::detail
