// lanebus — MIT License.
// EpochFile: durable, monotonic incarnation epoch in a sidecar file (see epoch_file.hpp).
#include "epoch_file.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "errno_status.hpp"
#include "hash.hpp"

namespace lanebus::detail {
namespace {

constexpr std::uint64_t kEpochMagic = 0x3148434f50454c4cULL;  // "LLEPOCH1" little-endian
constexpr std::size_t kRecordBytes = 32;

struct Record {
  std::uint64_t magic;
  std::uint64_t epoch;
  std::uint64_t reserved;
  std::uint64_t checksum;
};
static_assert(sizeof(Record) == kRecordBytes);

std::uint64_t checksum(const Record& r) {
  std::uint64_t h = kFnv1a64ShortOffset;  // the basis epoch files were written with (hash.hpp)
  const std::uint64_t words[3] = {r.magic, r.epoch, r.reserved};
  for (std::uint64_t w : words) {
    for (int i = 0; i < 8; ++i) h = fnv1a64_byte(h, static_cast<unsigned char>((w >> (8 * i)) & 0xff));
  }
  return h;
}

bool is_volatile_fs(int fd) {
  struct statfs sfs {};
  if (fstatfs(fd, &sfs) != 0) return false;
  return sfs.f_type == TMPFS_MAGIC || sfs.f_type == RAMFS_MAGIC;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// Reads both records; `slot` gets the index of the copy holding the lower
// epoch (the one to overwrite next).
Result<std::uint64_t> read_fd(int fd, const std::string& path, int* slot) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return errno_status("fstat", path, errno);
  if (st.st_size == 0) {
    *slot = 0;
    return std::uint64_t{0};
  }
  Record recs[2] = {};
  ssize_t n = pread(fd, recs, sizeof(recs), 0);
  if (n < 0) return errno_status("pread", path, errno);
  bool ok[2] = {false, false};
  for (int i = 0; i < 2; ++i) {
    if (static_cast<std::size_t>(n) >= (i + 1) * kRecordBytes && recs[i].magic == kEpochMagic &&
        recs[i].checksum == checksum(recs[i])) {
      ok[i] = true;
    }
  }
  if (!ok[0] && !ok[1]) {
    return Status(Code::Corruption,
                  "epoch file \"" + path +
                      "\": no valid record (not a lanebus epoch file, or damaged); tokens could "
                      "go backwards, so lanebus refuses to guess: restore it or move the table");
  }
  std::uint64_t e0 = ok[0] ? recs[0].epoch : 0;
  std::uint64_t e1 = ok[1] ? recs[1].epoch : 0;
  if (!ok[0]) *slot = 0;
  else if (!ok[1]) *slot = 1;
  else *slot = e0 <= e1 ? 0 : 1;
  return e0 > e1 ? e0 : e1;
}

Result<int> open_locked(const std::string& path, bool allow_volatile) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return errno_status("open", path, errno);
  Fd guard(fd);
  struct stat st {};
  if (fstat(fd, &st) != 0) return errno_status("fstat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    return Status(Code::PermissionDenied, "epoch file \"" + path + "\" is not a regular file");
  }
  if (st.st_uid != geteuid()) {
    return Status(Code::PermissionDenied,
                  "epoch file \"" + path + "\" is owned by uid " + std::to_string(st.st_uid) +
                      ", not by this process (euid " + std::to_string(geteuid()) + ")");
  }
  if ((st.st_mode & 0022) != 0) {
    return Status(Code::PermissionDenied,
                  "epoch file \"" + path + "\" is group or world writable; refusing it");
  }
  if (!allow_volatile && is_volatile_fs(fd)) {
    return Status(Code::InvalidArgument,
                  "epoch file \"" + path +
                      "\" is on tmpfs and would not survive a reboot; set "
                      "LeaseTableOptions::epoch_path to persistent storage (or allow_volatile_epoch)");
  }
  if (flock(fd, LOCK_EX) != 0) return errno_status("flock", path, errno);
  return guard.release();
}

Status write_record(int fd, const std::string& path, int slot, std::uint64_t epoch) {
  Record r{kEpochMagic, epoch, 0, 0};
  r.checksum = checksum(r);
  if (pwrite(fd, &r, sizeof(r), static_cast<off_t>(slot) * kRecordBytes) != sizeof(r)) {
    return errno_status("pwrite", path, errno);
  }
  // The new epoch must be durable before any token carrying it exists.
  if (fsync(fd) != 0) return errno_status("fsync", path, errno);
  return Status::OK();
}

}  // namespace

Result<std::uint64_t> EpochFile::advance(const std::string& path, std::uint64_t at_least,
                                         bool allow_volatile) {
  Result<int> fdr = open_locked(path, allow_volatile);
  if (!fdr.ok()) return fdr.status();
  Fd fd(*fdr);
  int slot = 0;
  Result<std::uint64_t> cur = read_fd(fd.get(), path, &slot);
  if (!cur.ok()) return cur.status();
  std::uint64_t next = *cur + 1 > at_least ? *cur + 1 : at_least;
  Status s = write_record(fd.get(), path, slot, next);
  if (!s.ok()) return s;
  return next;
}

Status EpochFile::ensure_at_least(const std::string& path, std::uint64_t epoch, bool allow_volatile) {
  Result<int> fdr = open_locked(path, allow_volatile);
  if (!fdr.ok()) return fdr.status();
  Fd fd(*fdr);
  int slot = 0;
  Result<std::uint64_t> cur = read_fd(fd.get(), path, &slot);
  if (!cur.ok()) return cur.status();
  if (*cur >= epoch) return Status::OK();
  return write_record(fd.get(), path, slot, epoch);
}

Result<std::uint64_t> EpochFile::read(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::uint64_t{0};
    return errno_status("open", path, errno);
  }
  Fd guard(fd);
  int slot = 0;
  return read_fd(fd, path, &slot);
}

}  // namespace lanebus::detail
