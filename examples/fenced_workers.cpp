// lanebus — MIT License.
// Two worker processes share a lease table and a durable store; worker A freezes past its TTL,
// worker B takes over, and lanebus::FencedResource rejects A's late write (StaleToken), with
// real processes and the public API only (doc/leases.md).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "lanebus/lanebus.hpp"

extern char** environ;

namespace {

constexpr const char* kTask = "batch-task-42";
constexpr auto kTtl = std::chrono::milliseconds(300);

lanebus::LeaseTableOptions table_options() {
  lanebus::LeaseTableOptions o;
  o.allow_volatile_epoch = true;  // a demo in a temporary directory
  return o;
}

// The downstream resource: rows in the `results` table of a durable bus's
// store, shared by both worker processes, fenced by lanebus::FencedResource.
// Every write passes the worker's token: below the resource's high-water is
// stale; above it, the lease table must confirm the token was really granted
// for this task (a generation barrier), so a forged token cannot poison it.
constexpr const char* kResource = "batch.results";

lanebus::Result<std::unique_ptr<lanebus::Bus>> open_bus(const std::string& store, lanebus::LeaseTable* table) {
  lanebus::BusOptions o;
  o.name = "fenced-workers";
  o.workers = 1;
  o.store.directory = store;
  o.lease_table = table;
  return lanebus::Bus::open(o);
}

std::string write(lanebus::LeaseTable& table, const std::string& store, const std::string& worker,
                  std::uint64_t token, const std::string& value) {
  auto bus = open_bus(store, &table);
  if (!bus.ok()) return "{'accepted': False, 'reason': '" + bus.status().to_string() + "'}";
  lanebus::FencedResource resource(table);
  lanebus::Status s = resource.write(**bus, kResource, kTask, token, [&](lanebus::Transaction& tx) {
    return tx.put("results", worker, "{'task_id': '" + std::string(kTask) + "', 'worker_id': '" + worker +
                                         "', 'token': " + std::to_string(token) + ", 'value': '" + value + "'}");
  });
  if (s.ok()) return "{'accepted': True}";
  return "{'accepted': False, 'reason': '" + std::string(lanebus::to_string(s.code())) + ": " +
         std::string(s.message()) + "'}";
}

int fail(const char* what, const lanebus::Status& s) {
  std::printf("%s failed: %s\n", what, s.to_string().c_str());
  return 1;
}

// A worker process: argv = self, "worker", A|B, table path, store directory.
int worker(const std::string& id, const std::string& table_path, const std::string& store) {
  auto table = lanebus::LeaseTable::open(table_path, table_options());
  if (!table.ok()) return fail("open", table.status());
  auto me = lanebus::LeaseOwner::generate();
  if (!me.ok()) return fail("owner", me.status());
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
    // (A opens the bus after the pause: a process stopped inside a store
    // transaction would hold the store's writer lock and stall worker B.)
    kill(getpid(), SIGSTOP);
    std::string v = write(**table, store, "worker-A", lease->token, "result-from-A");
    std::printf("step 7: worker-A (stale) write -> %s\n", v.c_str());
    auto r = (*table)->renew(kTask, *me, lease->token);
    std::printf("        worker-A renew after resuming -> %s\n", r.status().to_string().c_str());
  } else {
    std::printf("step 5: worker-B acquires expired task, token=%llu\n",
                static_cast<unsigned long long>(lease->token));
    std::string v = write(**table, store, "worker-B", lease->token, "result-from-B");
    std::printf("step 6: worker-B write -> %s\n", v.c_str());
    (void)(*table)->release(kTask, *me, lease->token);
  }
  std::fflush(stdout);
  return 0;
}

pid_t spawn(const char* self, const char* id, const std::string& table, const std::string& store) {
  pid_t pid = -1;
  const char* args[] = {self, "worker", id, table.c_str(), store.c_str(), nullptr};
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
  const std::string store = dir + "/store";
  auto table = lanebus::LeaseTable::open(table_path, table_options());
  if (!table.ok()) return fail("open", table.status());
  std::printf("lease table %s, ttl %lld ms, clock CLOCK_BOOTTIME\n", table_path.c_str(),
              static_cast<long long>(kTtl.count()));

  const char* self = "/proc/self/exe";
  pid_t a = spawn(self, "A", table_path, store);
  int st = 0;
  if (a < 0 || waitpid(a, &st, WUNTRACED) != a || !WIFSTOPPED(st)) return 1;
  // Wait, by the table's clock, until A's lease has expired.
  for (auto info = (*table)->inspect(kTask); !info.ok() || info->held; info = (*table)->inspect(kTask)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid_t b = spawn(self, "B", table_path, store);
  if (b < 0 || waitpid(b, &st, 0) != b || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 1;
  kill(a, SIGCONT);
  if (waitpid(a, &st, 0) != a || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 1;

  // What the store committed: one row per worker whose write was accepted.
  auto bus = open_bus(store, table->get());
  if (!bus.ok()) return fail("open store", bus.status());
  auto from_a = (*bus)->table_get("results", "worker-A");
  auto from_b = (*bus)->table_get("results", "worker-B");
  std::printf("committed writes: [%s%s%s]\n", from_b.ok() ? from_b->c_str() : "", from_a.ok() && from_b.ok() ? ", " : "",
              from_a.ok() ? from_a->c_str() : "");
  auto hwm = lanebus::FencedResource::high_water(**bus, kResource);
  std::printf("fence high-water of %s: %llu\n", kResource,
              static_cast<unsigned long long>(hwm.ok() ? *hwm : 0));
  bool one_from_b = from_b.ok() && from_a.code() == lanebus::Code::NotFound;
  std::printf("%s\n", one_from_b ? "invariant holds: exactly one committed write, from the worker holding the live lease"
                                 : "INVARIANT BROKEN");
  bus->reset();
  std::error_code ec;
  table->reset();
  std::filesystem::remove_all(dir, ec);
  return one_from_b ? 0 : 1;
}
