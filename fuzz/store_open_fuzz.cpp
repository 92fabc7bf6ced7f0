// lanebus — MIT License.
// libFuzzer target: opening a store from fuzzed bytes (the input is data.mdb).
// The verify walk runs in a child process (verify_store_in_child, what
// StoreOptions::verify_on_open does): LMDB may crash there on a damaged page,
// which only kills the child. When the walk passes, this process opens the
// store and reads everything: that must never crash (ASan/UBSan watch it). A
// walk child that died of a sanitizer report (an exit status, not a signal)
// is a bug in lanebus's walk and stops the fuzzer.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "scratch_dir.hpp"
#include "dlq.hpp"
#include "durable_store.hpp"
#include "verify.hpp"

namespace {

const std::string& scratch() { return lanebus::fuzz::scratch_dir("store"); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace lanebus;
  if (size < 2 * 4096) return 0;  // LMDB needs its two meta pages; smaller is refused up front
  const std::string dir = scratch();
  const std::string file = dir + "/data.mdb";
  ::unlink((dir + "/lock.mdb").c_str());
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return 0;
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  // A damaged page can make LMDB loop: give the walk 2 s without a line and 2.5 s in all
  // (well inside libFuzzer's -timeout=10), then it is killed and reported.
  detail::VerifyOptions vo;
  vo.stall_timeout = std::chrono::milliseconds(2000);
  vo.time_limit = std::chrono::milliseconds(2500);
  auto report = detail::verify_store_in_child(dir, vo);
  if (!report.ok()) return 0;
  if (report->walk_died) {
    for (const auto& p : report->problems) {
      if (p.find("exited with status") != std::string::npos) __builtin_trap();
    }
    return 0;
  }
  if (!report->ok()) return 0;
  StoreOptions o;
  o.directory = dir;
  o.read_only = true;
  auto store = detail::DurableStore::open(o);
  if (!store.ok()) return 0;
  auto topics = (*store)->list_topics();
  if (!topics.ok()) return 0;
  for (const auto& t : *topics) {
    for (std::uint32_t lane = 0; lane < t.lanes && lane < 64; ++lane) {
      auto b = (*store)->read(t, lane, 0);
      (void)b;
      (void)(*store)->lane_info(t, lane);
    }
    auto groups = (*store)->list_groups(t);
    if (groups.ok()) {
      for (const auto& g : *groups) (void)(*store)->group_info(g);
    }
  }
  detail::DlqStore dlq(**store);
  (void)dlq.list();
  return 0;
}
