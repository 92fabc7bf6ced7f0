// lanebus — MIT License.
// lease_helper: the worker processes of the lease tests (scenario workers A and B, contention
// workers, crash-point and hammer processes). Reports on stdout, one line per event.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fenced_sink.hpp"
#include "lanebus/lease.hpp"
#include "lease_table.hpp"

using lanebus::LeaseOwner;
using lanebus::LeaseTable;
using lanebus::test::FencedSink;

namespace {

constexpr const char* kTask = "batch-task-42";

void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::printf("\n");
  std::fflush(stdout);
}

lanebus::LeaseTableOptions options() {
  lanebus::LeaseTableOptions o;
  o.allow_volatile_epoch = true;
  o.capacity = 256;
  return o;
}

std::unique_ptr<LeaseTable> open_or_die(const std::string& path,
                                        const lanebus::detail::LeaseTableHooks& hooks = {}) {
  auto t = lanebus::detail::open_lease_table_with_hooks(path, options(), hooks);
  if (!t.ok()) {
    say("error open %s", t.status().to_string().c_str());
    std::exit(3);
  }
  return std::move(*t);
}

LeaseOwner owner_or_die() {
  auto o = LeaseOwner::generate();
  if (!o.ok()) {
    say("error owner %s", o.status().to_string().c_str());
    std::exit(3);
  }
  return *o;
}

void sleep_ms(long ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Worker A of the freeze/takeover scenario: acquire, renew twice, freeze (a real
// SIGSTOP it raises at a known point), then, once resumed, write with its old
// token as if it still held the lease.
int scenario_a(const std::string& table_path, const std::string& sink_path, long ttl_ms, bool fence) {
  auto table = open_or_die(table_path);
  FencedSink sink(sink_path);
  LeaseOwner me = owner_or_die();
  auto lease = table->acquire(kTask, me, std::chrono::milliseconds(ttl_ms));
  if (!lease.ok()) {
    say("error acquire %s", lease.status().to_string().c_str());
    return 1;
  }
  say("acquired token=%llu", static_cast<unsigned long long>(lease->token));
  for (int i = 0; i < 2; ++i) {
    sleep_ms(ttl_ms / 4);
    auto r = table->renew(kTask, me, lease->token);
    say("renew ok=%d", r.ok() ? 1 : 0);
  }
  say("freezing");
  kill(getpid(), SIGSTOP);  // frozen until the test sends SIGCONT
  std::uint64_t hwm = 0;
  bool accepted = sink.write(lease->token, 1, 111, fence, &hwm);
  say("write accepted=%d hwm=%llu", accepted ? 1 : 0, static_cast<unsigned long long>(hwm));
  auto r = table->renew(kTask, me, lease->token);
  say("renew-after-resume code=%s", lanebus::to_string(r.code()));
  return 0;
}

int scenario_b(const std::string& table_path, const std::string& sink_path, long ttl_ms, bool fence) {
  auto table = open_or_die(table_path);
  FencedSink sink(sink_path);
  LeaseOwner me = owner_or_die();
  auto lease = table->acquire(kTask, me, std::chrono::milliseconds(ttl_ms));
  if (!lease.ok()) {
    say("error acquire %s", lease.status().to_string().c_str());
    return 1;
  }
  say("acquired token=%llu", static_cast<unsigned long long>(lease->token));
  bool accepted = sink.write(lease->token, 2, 222, fence);
  say("write accepted=%d", accepted ? 1 : 0);
  (void)table->release(kTask, me, lease->token);
  return 0;
}

// A contention worker: acquire a random name, then up to three rounds of
// (check local validity, sleep, write to the fenced sink, renew), then
// release. Every event goes to its log with table-clock times.
int contend(const std::string& table_path, const std::string& sink_dir, const std::string& log_path,
            int names, long ttl_ms, bool fence, std::uint64_t seed, long duration_ms, int worker) {
  auto table = open_or_die(table_path);
  LeaseOwner me = owner_or_die();
  std::FILE* log = std::fopen(log_path.c_str(), "w");
  if (log == nullptr) {
    say("error log %s: %s", log_path.c_str(), std::strerror(errno));
    return 3;
  }
  std::mt19937_64 rng(seed);
  std::map<std::string, std::unique_ptr<FencedSink>> sinks;
  const std::int64_t ttl_ns = ttl_ms * 1000000;
  const std::int64_t end = LeaseTable::now() + duration_ms * 1000000;
  std::uint32_t value = 0;
  say("ready");
  while (LeaseTable::now() < end) {
    std::string name = "c" + std::to_string(rng() % static_cast<std::uint64_t>(names));
    auto lease = table->acquire(name, me, std::chrono::milliseconds(ttl_ms));
    if (!lease.ok()) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1000));
      continue;
    }
    std::fprintf(log, "G %s %llu %lld %lld\n", name.c_str(), static_cast<unsigned long long>(lease->token),
                 static_cast<long long>(lease->granted_at_ns), static_cast<long long>(lease->expires_at_ns));
    std::fflush(log);
    auto& sink = sinks[name];
    if (!sink) sink = std::make_unique<FencedSink>(sink_dir + "/" + name + ".sink");
    std::int64_t expires = lease->expires_at_ns;
    for (int round = 0; round < 3; ++round) {
      if (LeaseTable::now() >= expires - ttl_ns / 4) break;  // fail closed before side effects
      std::this_thread::sleep_for(std::chrono::milliseconds(ttl_ms / 5));
      bool accepted = sink->write(lease->token, static_cast<std::uint32_t>(worker), ++value, fence);
      std::fprintf(log, "W %s %llu %d\n", name.c_str(), static_cast<unsigned long long>(lease->token),
                   accepted ? 1 : 0);
      std::fflush(log);
      auto r = table->renew(name, me, lease->token);
      if (!r.ok()) {
        std::fprintf(log, "L %s %llu %s\n", name.c_str(), static_cast<unsigned long long>(lease->token),
                     lanebus::to_string(r.code()));
        std::fflush(log);
        break;
      }
      expires = r->expires_at_ns;
      std::fprintf(log, "R %s %llu %lld\n", name.c_str(), static_cast<unsigned long long>(lease->token),
                   static_cast<long long>(expires));
      std::fflush(log);
    }
    std::fprintf(log, "X %s %llu %lld\n", name.c_str(), static_cast<unsigned long long>(lease->token),
                 static_cast<long long>(LeaseTable::now()));
    std::fflush(log);
    (void)table->release(name, me, lease->token);
  }
  std::fclose(log);
  return 0;
}

struct CrashArm {
  bool armed = false;
  int point = 0;
};

void on_crash_point(int point, void* arg) {
  auto* arm = static_cast<CrashArm*>(arg);
  if (!arm->armed || point != arm->point) return;
  say("at %d", point);
  for (;;) pause();  // holding the table mutex until the test kills us
}

// Run one operation and stop (forever) at a crash point inside it.
int crash_point(const std::string& table_path, const std::string& op, int point, const std::string& name) {
  CrashArm arm;
  arm.point = point;
  lanebus::detail::LeaseTableHooks hooks;
  hooks.crash_point = &on_crash_point;
  hooks.arg = &arm;
  auto table = open_or_die(table_path, hooks);
  LeaseOwner me = owner_or_die();
  std::uint64_t token = 0;
  if (op != "acquire") {
    auto l = table->acquire(name, me, std::chrono::milliseconds(200));
    if (!l.ok()) {
      say("error setup %s", l.status().to_string().c_str());
      return 1;
    }
    token = l->token;
  }
  arm.armed = true;
  bool ok = false;
  if (op == "acquire") ok = table->acquire(name, me, std::chrono::milliseconds(200)).ok();
  else if (op == "renew") ok = table->renew(name, me, token).ok();
  else if (op == "release") ok = table->release(name, me, token).ok();
  say("done ok=%d", ok ? 1 : 0);
  return 0;
}

// Random operations on a few names, forever (killed by the test).
int hammer(const std::string& table_path, std::uint64_t seed) {
  auto table = open_or_die(table_path);
  LeaseOwner me = owner_or_die();
  std::mt19937_64 rng(seed);
  std::map<std::string, std::uint64_t> held;
  say("ready");
  for (;;) {
    std::string name = "h" + std::to_string(rng() % 4);
    auto it = held.find(name);
    if (it == held.end()) {
      auto l = table->acquire(name, me, std::chrono::milliseconds(20 + rng() % 50));
      if (l.ok()) held[name] = l->token;
    } else if (rng() % 2 == 0) {
      if (!table->renew(name, me, it->second).ok()) held.erase(it);
    } else {
      (void)table->release(name, me, it->second);
      held.erase(it);
    }
    if (rng() % 8 == 0) (void)table->inspect(name);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv, argv + argc);
  if (argc >= 6 && a[1] == "scenario-a") return scenario_a(a[2], a[3], std::atol(argv[4]), a[5] == "1");
  if (argc >= 6 && a[1] == "scenario-b") return scenario_b(a[2], a[3], std::atol(argv[4]), a[5] == "1");
  if (argc >= 11 && a[1] == "contend") {
    return contend(a[2], a[3], a[4], std::atoi(argv[5]), std::atol(argv[6]), a[7] == "1",
                   std::strtoull(argv[8], nullptr, 10), std::atol(argv[9]), std::atoi(argv[10]));
  }
  if (argc >= 6 && a[1] == "crash-point") return crash_point(a[2], a[3], std::atoi(argv[4]), a[5]);
  if (argc >= 4 && a[1] == "hammer") return hammer(a[2], std::strtoull(argv[3], nullptr, 10));
  std::fprintf(stderr, "usage: lease_helper scenario-a|scenario-b|contend|crash-point|hammer ...\n");
  return 2;
}
