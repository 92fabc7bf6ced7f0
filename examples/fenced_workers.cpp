// lanebus — MIT License.
// Two worker processes share a lease table; worker A freezes past its TTL, worker B takes over,
// and the fenced resource rejects A's late write. The reference's simulation, with real processes.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "lanebus/lease.hpp"

extern char** environ;

namespace {

constexpr const char* kTask = "batch-task-42";
constexpr auto kTtl = std::chrono::milliseconds(300);

lanebus::LeaseTableOptions table_options() {
  lanebus::LeaseTableOptions o;
  o.allow_volatile_epoch = true;  // a demo in a temporary directory
  return o;
}

// The downstream resource: a file with the highest token it accepted and the
// committed writes. Every write runs under flock: below the high-water is
// stale; above it, the lease table must confirm the token was really granted
// for this task (a generation barrier), so a forged token cannot poison it.
struct FencedResource {
  std::string path;

  std::string write(lanebus::LeaseTable& table, const std::string& worker, std::uint64_t token,
                    const std::string& value) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    flock(fd, LOCK_EX);
    std::uint64_t hwm = 0;
    if (pread(fd, &hwm, sizeof(hwm), 0) != sizeof(hwm)) hwm = 0;
    std::string verdict;
    if (token < hwm) {
      verdict = "{'accepted': False, 'reason': 'stale token " + std::to_string(token) + " < " +
                std::to_string(hwm) + "'}";
    } else if (token > hwm && !table.confirm_grant(kTask, token).ok()) {
      verdict = "{'accepted': False, 'reason': 'token not granted for this task'}";
    } else {
      std::string line = "{'task_id': '" + std::string(kTask) + "', 'worker_id': '" + worker +
                         "', 'token': " + std::to_string(token) + ", 'value': '" + value + "'}\n";
      off_t end = lseek(fd, 0, SEEK_END);
      if (end < static_cast<off_t>(sizeof(hwm))) end = sizeof(hwm);
      (void)!pwrite(fd, line.data(), line.size(), end);
      hwm = token;
      (void)!pwrite(fd, &hwm, sizeof(hwm), 0);
      verdict = "{'accepted': True}";
    }
    flock(fd, LOCK_UN);
    ::close(fd);
    return verdict;
  }

  std::string committed() {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    std::string all;
    char buf[4096];
    off_t off = sizeof(std::uint64_t);
    for (ssize_t n; (n = pread(fd, buf, sizeof(buf), off)) > 0; off += n) all.append(buf, n);
    ::close(fd);
    return all;
  }
};

int fail(const char* what, const lanebus::Status& s) {
  std::printf("%s failed: %s\n", what, s.to_string().c_str());
  return 1;
}

// A worker process: argv = self, "worker", A|B, table path, resource path.
int worker(const std::string& id, const std::string& table_path, const std::string& resource_path) {
  auto table = lanebus::LeaseTable::open(table_path, table_options());
  if (!table.ok()) return fail("open", table.status());
  auto me = lanebus::LeaseOwner::generate();
  if (!me.ok()) return fail("owner", me.status());
  FencedResource resource{resource_path};
  auto lease = (*table)->acquire(kTask, *me, kTtl);
  if (!lease.ok()) return fail("acquire", lease.status());
  if (id == "A") {
    std::printf("step 0: worker-A acquires task, token=%llu\n", static_cast<unsigned long long>(lease->token));
    for (int step = 1; step <= 2; ++step) {
      std::this_thread::sleep_for(kTtl / 4);
      auto r = (*table)->renew(kTask, *me, lease->token);
      std::printf("step %d: worker-A renew ok=%s\n", step, r.ok() ? "True" : "False");
    }
    std::printf("        worker-A stalls (SIGSTOP, like a long GC pause) with its write still to do\n");
    std::fflush(stdout);
    kill(getpid(), SIGSTOP);
    std::string v = resource.write(**table, "worker-A", lease->token, "result-from-A");
    std::printf("step 7: worker-A (stale) write -> %s\n", v.c_str());
    auto r = (*table)->renew(kTask, *me, lease->token);
    std::printf("        worker-A renew after resuming -> %s\n", r.status().to_string().c_str());
  } else {
    std::printf("step 5: worker-B acquires expired task, token=%llu\n",
                static_cast<unsigned long long>(lease->token));
    std::string v = resource.write(**table, "worker-B", lease->token, "result-from-B");
    std::printf("step 6: worker-B write -> %s\n", v.c_str());
    (void)(*table)->release(kTask, *me, lease->token);
  }
  std::fflush(stdout);
  return 0;
}

pid_t spawn(const char* self, const char* id, const std::string& table, const std::string& resource) {
  pid_t pid = -1;
  const char* args[] = {self, "worker", id, table.c_str(), resource.c_str(), nullptr};
  if (posix_spawn(&pid, self, nullptr, nullptr, const_cast<char* const*>(args), environ) != 0) return -1;
  return pid;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "worker") == 0) return worker(argv[2], argv[3], argv[4]);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  char tmpl[] = "/tmp/lanebus-fenced-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  const std::string table_path = dir + "/leases";
  FencedResource resource{dir + "/resource"};
  auto table = lanebus::LeaseTable::open(table_path, table_options());
  if (!table.ok()) return fail("open", table.status());
  std::printf("lease table %s, ttl %lld ms, clock CLOCK_BOOTTIME\n", table_path.c_str(),
              static_cast<long long>(kTtl.count()));

  const char* self = "/proc/self/exe";
  pid_t a = spawn(self, "A", table_path, resource.path);
  int st = 0;
  if (a < 0 || waitpid(a, &st, WUNTRACED) != a || !WIFSTOPPED(st)) return 1;
  // Wait, by the table's clock, until A's lease has expired.
  for (auto info = (*table)->inspect(kTask); !info.ok() || info->held; info = (*table)->inspect(kTask)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid_t b = spawn(self, "B", table_path, resource.path);
  if (b < 0 || waitpid(b, &st, 0) != b || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 1;
  kill(a, SIGCONT);
  if (waitpid(a, &st, 0) != a || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 1;

  std::string committed = resource.committed();
  std::printf("committed writes: [%s]\n", committed.empty() ? "" : committed.substr(0, committed.size() - 1).c_str());
  bool one_from_b = committed.find("worker-B") != std::string::npos &&
                    committed.find("worker-A") == std::string::npos &&
                    committed.find('\n') == committed.size() - 1;
  std::printf("%s\n", one_from_b ? "invariant holds: exactly one committed write, from the worker holding the live lease"
                                 : "INVARIANT BROKEN");
  std::error_code ec;
  table->reset();
  std::filesystem::remove_all(dir, ec);
  return one_from_b ? 0 : 1;
}
