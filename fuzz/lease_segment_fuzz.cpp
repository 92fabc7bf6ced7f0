// lanebus — MIT License.
// libFuzzer target: lease-segment validation (LeaseTable::open attaching an
// existing segment, lib/features/lease_table.cpp attach). The input is the whole
// segment file; the seed corpus holds real segments, so mutations start from
// a valid header. Property: a damaged or foreign segment is refused with a
// Status, never a crash or an over-read (attach checks sizes before mapping).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "scratch_dir.hpp"
#include "lanebus/lease.hpp"
#include "lease_table.hpp"

namespace {

const std::string& scratch() { return lanebus::fuzz::scratch_dir("lease"); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = scratch() + "/leases";
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return 0;
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::fchmod(fd, 0600);
  ::close(fd);
  lanebus::LeaseTableOptions o;
  o.create_if_missing = false;
  o.allow_volatile_epoch = true;
  o.epoch_path = scratch() + "/leases.epoch";
  o.lock_timeout = std::chrono::milliseconds(1);
  lanebus::detail::LeaseTableHooks hooks;
  hooks.boot_id_override = "fuzz-boot";
  auto t = lanebus::detail::open_lease_table_with_hooks(path, o, hooks);
  if (t.ok()) {
    // An accepted segment must hold together for reads.
    (void)(*t)->list();
    (void)(*t)->inspect("fuzz.lease");
  }
  return 0;
}
