// lanebus — MIT License.
// A test-only fenced sink shared between processes: a file holding a token high-water mark
// and the list of accepted writes, serialised by flock(2). The fence check can be switched off
// (negative control) to show that stale writes then get through.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lanebus::test {

struct SinkWrite {
  std::uint64_t token;
  std::uint32_t writer;
  std::uint32_t value;
};

/// Layout: [u64 high-water][SinkWrite ...]. flock is released by the kernel
/// when a writer dies, so a killed writer cannot wedge the sink.
class FencedSink {
 public:
  explicit FencedSink(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  }
  ~FencedSink() {
    if (fd_ >= 0) ::close(fd_);
  }
  FencedSink(const FencedSink&) = delete;
  FencedSink& operator=(const FencedSink&) = delete;
  bool ok() const { return fd_ >= 0; }

  /// Accepts the write unless `check_fence` and token < high-water. Returns
  /// accepted; `hwm_out` gets the high-water seen.
  bool write(std::uint64_t token, std::uint32_t writer, std::uint32_t value, bool check_fence,
             std::uint64_t* hwm_out = nullptr) {
    flock(fd_, LOCK_EX);
    std::uint64_t hwm = 0;
    if (pread(fd_, &hwm, sizeof(hwm), 0) != sizeof(hwm)) hwm = 0;
    if (hwm_out != nullptr) *hwm_out = hwm;
    bool accepted = !(check_fence && token < hwm);
    if (accepted) {
      struct stat st {};
      fstat(fd_, &st);
      off_t end = st.st_size < static_cast<off_t>(sizeof(hwm)) ? static_cast<off_t>(sizeof(hwm)) : st.st_size;
      SinkWrite w{token, writer, value};
      bool wrote = pwrite(fd_, &w, sizeof(w), end) == static_cast<ssize_t>(sizeof(w));
      if (wrote && token > hwm) {
        hwm = token;
        wrote = pwrite(fd_, &hwm, sizeof(hwm), 0) == static_cast<ssize_t>(sizeof(hwm));
      }
      accepted = wrote;
    }
    flock(fd_, LOCK_UN);
    return accepted;
  }

  /// Every accepted write, in acceptance order.
  std::vector<SinkWrite> writes() {
    std::vector<SinkWrite> out;
    flock(fd_, LOCK_SH);
    struct stat st {};
    fstat(fd_, &st);
    for (off_t off = sizeof(std::uint64_t); off + static_cast<off_t>(sizeof(SinkWrite)) <= st.st_size;
         off += sizeof(SinkWrite)) {
      SinkWrite w{};
      if (pread(fd_, &w, sizeof(w), off) == static_cast<ssize_t>(sizeof(w))) out.push_back(w);
    }
    flock(fd_, LOCK_UN);
    return out;
  }

  /// Number of times an accepted token was lower than one accepted before it.
  static std::size_t regressions(const std::vector<SinkWrite>& writes) {
    std::size_t n = 0;
    std::uint64_t hwm = 0;
    for (const SinkWrite& w : writes) {
      if (w.token < hwm) ++n;
      if (w.token > hwm) hwm = w.token;
    }
    return n;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace lanebus::test
