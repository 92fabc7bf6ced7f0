// lanebus — MIT License.
// libFuzzer target: opening a store from fuzzed bytes (the input is data.mdb).
// The verify walk runs in a child process (verify_store_in_child, what
// StoreOptions::verify_on_open does): LMDB may crash there on a damaged page,
// which only kills the child (forked from a small zygote process, see
// start_zygote). When the walk passes, this process opens the
// store and reads everything: that must never crash (ASan/UBSan watch it). A
// walk child that died of a sanitizer report (an exit status, not a signal)
// is a bug in lanebus's walk and stops the fuzzer.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#if defined(__has_include)
#if __has_include(<sanitizer/allocator_interface.h>)
#include <sanitizer/allocator_interface.h>
#define LANEBUS_HAVE_PURGE 1
#endif
#endif

#include "scratch_dir.hpp"
#include "dlq.hpp"
#include "durable_store.hpp"
#include "verify.hpp"

namespace {

const std::string& scratch() { return lanebus::fuzz::scratch_dir("store"); }

// The verdict on one input's walk.
enum Verdict : char { kNoReport = 'n', kWalkDied = 'd', kWalkBug = 'b', kDamaged = 'x', kIntact = 'o' };

Verdict walk(const std::string& dir) {
  // A damaged page can make LMDB loop: give the walk 2 s without a line and 2.5 s in all
  // (well inside libFuzzer's -timeout=10), then it is killed and reported.
  lanebus::detail::VerifyOptions vo;
  vo.stall_timeout = std::chrono::milliseconds(2000);
  vo.time_limit = std::chrono::milliseconds(2500);
  auto report = lanebus::detail::verify_store_in_child(dir, vo);
  if (!report.ok()) return kNoReport;
  if (report->walk_died) {
    // A walk child that died of a sanitizer report (an exit status, not a
    // signal) is a bug in lanebus's walk.
    for (const auto& p : report->problems) {
      if (p.find("exited with status") != std::string::npos) return kWalkBug;
    }
    return kWalkDied;
  }
  return report->ok() ? kIntact : kDamaged;
}

// The walk children are forked from a small "zygote" process started before
// libFuzzer loads its corpus: forking the fuzzer itself (hundreds of MB of
// ASan heap and shadow to copy page tables for) cost ~10 ms an input. The
// zygote reads a request byte, forks the walk child as verify_on_open does,
// and answers with the verdict. It dies with the fuzzer (PR_SET_PDEATHSIG).
// Every 64 walks it hands ASan's quarantine back to the OS: otherwise the
// zygote grows to ~400 MB and each fork copies its page tables (the rate fell
// from ~540 to ~140 inputs/s within 20 minutes).
int g_to_zygote = -1, g_from_zygote = -1;
pid_t g_zygote = -1;

void start_zygote() {
  int req[2], rsp[2];
  if (::pipe2(req, O_CLOEXEC) != 0 || ::pipe2(rsp, O_CLOEXEC) != 0) std::abort();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) std::abort();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(0);
    ::close(req[1]);
    ::close(rsp[0]);
    const std::string dir = scratch();
    for (unsigned walks = 1;; ++walks) {
#ifdef LANEBUS_HAVE_PURGE
      if (walks % 64 == 0) __sanitizer_purge_allocator();
#endif
      char c;
      const ssize_t n = ::read(req[0], &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n != 1) ::_exit(0);  // the fuzzer is gone
      const char v = walk(dir);
      ssize_t w;
      while ((w = ::write(rsp[1], &v, 1)) < 0 && errno == EINTR) {
      }
      if (w != 1) ::_exit(1);
    }
  }
  ::close(req[0]);
  ::close(rsp[1]);
  g_zygote = pid;
  g_to_zygote = req[1];
  g_from_zygote = rsp[0];
}

Verdict walk_in_zygote() {
  const char c = 'w';
  char v = 0;
  ssize_t w, r;
  while ((w = ::write(g_to_zygote, &c, 1)) < 0 && errno == EINTR) {
  }
  while ((r = ::read(g_from_zygote, &v, 1)) < 0 && errno == EINTR) {
  }
  if (w != 1 || r != 1) {
    int st = 0;
    (void)::waitpid(g_zygote, &st, 0);
    std::fprintf(stderr, "store_open_fuzz: the walk zygote died (%s %d)\n", WIFSIGNALED(st) ? "signal" : "exit status",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    __builtin_trap();
  }
  return static_cast<Verdict>(v);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)scratch();  // made before the zygote forks, so both use the same directory
  start_zygote();
  return 0;
}

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
  const Verdict v = walk_in_zygote();
  if (v == kWalkBug) __builtin_trap();
  if (v != kIntact) return 0;
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
