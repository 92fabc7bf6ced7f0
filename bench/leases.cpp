// lanebus — MIT License.
// bench/leases: lease acquire+release and renew throughput, one process and two contending,
// against the same protocol as a SQLite table with a conditional UPDATE (WAL, synchronous=NORMAL).
#include <spawn.h>
#include <sqlite3.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "lanebus/lease.hpp"

#ifndef BENCH_BUILDTYPE
#define BENCH_BUILDTYPE "unknown"
#endif

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

struct Scenario {
  const char* name;
  const char* description;
  bool renew;
  int processes;
};

constexpr Scenario kScenarios[] = {
    {"acquire_release_1p", "one process: acquire a name, release it, repeat", false, 1},
    {"renew_1p", "one process: renew a held lease, repeat", true, 1},
    {"acquire_release_2p", "two processes contend for one name: acquire (may be Busy), release on success", false, 2},
    {"renew_2p", "two processes each renew their own lease", true, 2},
};

// ---- the SQLite baseline: what a user would otherwise write ----
class SqliteLeases {
 public:
  explicit SqliteLeases(const std::string& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) std::abort();
    sqlite3_busy_timeout(db_, 5000);
    exec("PRAGMA journal_mode=WAL");
    exec("PRAGMA synchronous=NORMAL");
    exec("CREATE TABLE IF NOT EXISTS leases(name TEXT PRIMARY KEY, owner INTEGER, token INTEGER, "
         "expires_at INTEGER)");
    exec("CREATE TABLE IF NOT EXISTS counter(id INTEGER PRIMARY KEY, next INTEGER)");
    exec("INSERT OR IGNORE INTO counter VALUES(1, 0)");
    prepare(&next_, "UPDATE counter SET next = next + 1 WHERE id = 1 RETURNING next");
    // One conditional statement stamps owner, token and expiry, only if free or expired.
    prepare(&acquire_,
            "INSERT INTO leases(name, owner, token, expires_at) VALUES(?1, ?2, ?3, ?4) "
            "ON CONFLICT(name) DO UPDATE SET owner = ?2, token = ?3, expires_at = ?4 "
            "WHERE leases.expires_at < ?5");
    prepare(&renew_, "UPDATE leases SET expires_at = ?4 WHERE name = ?1 AND owner = ?2 AND token = ?3 "
                     "AND expires_at > ?5");
    prepare(&release_, "UPDATE leases SET expires_at = 0 WHERE name = ?1 AND owner = ?2 AND token = ?3");
  }
  ~SqliteLeases() {
    for (sqlite3_stmt* s : {next_, acquire_, renew_, release_}) sqlite3_finalize(s);
    sqlite3_close(db_);
  }
  // Returns the token, or 0 when held by someone else.
  std::int64_t acquire(const char* name, std::int64_t owner, std::int64_t now, std::int64_t ttl) {
    exec("BEGIN IMMEDIATE");
    sqlite3_reset(next_);
    std::int64_t token = sqlite3_step(next_) == SQLITE_ROW ? sqlite3_column_int64(next_, 0) : 0;
    while (sqlite3_step(next_) == SQLITE_ROW) {
    }
    sqlite3_reset(acquire_);
    sqlite3_bind_text(acquire_, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(acquire_, 2, owner);
    sqlite3_bind_int64(acquire_, 3, token);
    sqlite3_bind_int64(acquire_, 4, now + ttl);
    sqlite3_bind_int64(acquire_, 5, now);
    bool won = sqlite3_step(acquire_) == SQLITE_DONE && sqlite3_changes(db_) == 1;
    exec("COMMIT");
    return won ? token : 0;
  }
  bool renew(const char* name, std::int64_t owner, std::int64_t token, std::int64_t now, std::int64_t ttl) {
    return run(renew_, name, owner, token, now + ttl, now);
  }
  bool release(const char* name, std::int64_t owner, std::int64_t token) {
    return run(release_, name, owner, token, 0, 0);
  }

 private:
  void exec(const char* sql) {
    if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) {
      std::fprintf(stderr, "sqlite: %s: %s\n", sql, sqlite3_errmsg(db_));
      std::abort();
    }
  }
  void prepare(sqlite3_stmt** s, const char* sql) {
    if (sqlite3_prepare_v2(db_, sql, -1, s, nullptr) != SQLITE_OK) std::abort();
  }
  bool run(sqlite3_stmt* s, const char* name, std::int64_t owner, std::int64_t token, std::int64_t a,
           std::int64_t b) {
    sqlite3_reset(s);
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, owner);
    sqlite3_bind_int64(s, 3, token);
    if (sqlite3_bind_parameter_count(s) >= 4) sqlite3_bind_int64(s, 4, a);
    if (sqlite3_bind_parameter_count(s) >= 5) sqlite3_bind_int64(s, 5, b);
    return sqlite3_step(s) == SQLITE_DONE && sqlite3_changes(db_) == 1;
  }
  sqlite3* db_ = nullptr;
  sqlite3_stmt* next_ = nullptr;
  sqlite3_stmt* acquire_ = nullptr;
  sqlite3_stmt* renew_ = nullptr;
  sqlite3_stmt* release_ = nullptr;
};

// One worker's loop: returns operations done in `seconds`.
std::uint64_t run_worker(bool lanebus, bool renew, const std::string& path, double seconds, int id) {
  const std::string name = renew ? "bench.renew-" + std::to_string(id) : "bench.contended";
  const auto ttl = std::chrono::milliseconds(60000);
  const auto span = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::uint64_t ops = 0;
  if (lanebus) {
    lanebus::LeaseTableOptions o;
    o.allow_volatile_epoch = true;
    auto table = lanebus::LeaseTable::open(path, o);
    auto me = lanebus::LeaseOwner::generate();
    if (!table.ok() || !me.ok()) std::abort();
    lanebus::LeaseTable& t = **table;
    std::uint64_t token = 0;
    if (renew) {
      auto l = t.acquire(name, *me, ttl);
      if (!l.ok()) std::abort();
      token = l->token;
    }
    const auto end = Clock::now() + span;  // setup (open, create) is not timed
    while (Clock::now() < end) {
      for (int i = 0; i < 64; ++i) {
        if (renew) {
          if (!t.renew(name, *me, token).ok()) std::abort();
          ++ops;
        } else {
          auto l = t.acquire(name, *me, ttl);
          ++ops;
          if (l.ok()) {
            if (!t.release(name, *me, l->token).ok()) std::abort();
            ++ops;
          }
        }
      }
    }
  } else {
    SqliteLeases db(path);
    const std::int64_t owner = getpid() * 16 + id;
    const std::int64_t ttl_ns = 60000000000LL;
    std::int64_t token = 0;
    if (renew) token = db.acquire(name.c_str(), owner, lanebus::LeaseTable::now(), ttl_ns);
    const auto end = Clock::now() + span;
    while (Clock::now() < end) {
      for (int i = 0; i < 16; ++i) {
        std::int64_t now = lanebus::LeaseTable::now();
        if (renew) {
          if (!db.renew(name.c_str(), owner, token, now, ttl_ns)) std::abort();
          ++ops;
        } else {
          std::int64_t tk = db.acquire(name.c_str(), owner, now, ttl_ns);
          ++ops;
          if (tk != 0) {
            db.release(name.c_str(), owner, tk);
            ++ops;
          }
        }
      }
    }
  }
  return ops;
}

// ops/sec of one run of a scenario with `processes` worker processes.
double run_once(const char* self, const Scenario& sc, bool lanebus, const std::string& path, double seconds) {
  if (sc.processes == 1) return static_cast<double>(run_worker(lanebus, sc.renew, path, seconds, 0)) / seconds;
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (int p = 0; p < sc.processes; ++p) {
    int pipefd[2];
    if (pipe(pipefd) != 0) std::abort();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
    std::string secs = std::to_string(seconds), id = std::to_string(p);
    const char* args[] = {self, "--child", lanebus ? "lanebus" : "sqlite", sc.renew ? "renew" : "acquire",
                          path.c_str(), secs.c_str(), id.c_str(), nullptr};
    pid_t pid;
    if (posix_spawn(&pid, self, &fa, nullptr, const_cast<char* const*>(args), environ) != 0) std::abort();
    posix_spawn_file_actions_destroy(&fa);
    close(pipefd[1]);
    pids.push_back(pid);
    fds.push_back(pipefd[0]);
  }
  double total = 0;
  for (std::size_t p = 0; p < pids.size(); ++p) {
    char buf[64] = {};
    ssize_t n = read(fds[p], buf, sizeof(buf) - 1);
    close(fds[p]);
    int st;
    waitpid(pids[p], &st, 0);
    if (n > 0) total += std::strtod(buf, nullptr);
  }
  return total / seconds;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 7 && std::strcmp(argv[1], "--child") == 0) {
    std::uint64_t ops = run_worker(std::strcmp(argv[2], "lanebus") == 0, std::strcmp(argv[3], "renew") == 0,
                                   argv[4], std::strtod(argv[5], nullptr), std::atoi(argv[6]));
    std::printf("%llu\n", static_cast<unsigned long long>(ops));
    return 0;
  }
  double seconds = 0.5;
  int repeats = 3;
  const char* only = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--smoke") == 0) {
      seconds = 0.02;
      repeats = 1;
    } else if (std::strcmp(argv[i], "--run") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::strtod(argv[++i], nullptr);
    } else {
      std::fprintf(stderr, "usage: leases [--smoke] [--seconds S] [--run NAME]\nscenarios:\n");
      for (const Scenario& sc : kScenarios) std::fprintf(stderr, "  %-20s %s\n", sc.name, sc.description);
      return 2;
    }
  }
  struct utsname u {};
  uname(&u);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  std::printf("bench=leases machine=\"%s %s %ld cpus\" compiler=\"gcc %s\" buildtype=%s sqlite=%s "
              "sqlite_mode=\"WAL synchronous=NORMAL\" clock=CLOCK_BOOTTIME repeats=%d seconds_per_run=%.2f\n",
              u.sysname, u.machine, cpus, __VERSION__, BENCH_BUILDTYPE, sqlite3_libversion(), repeats, seconds);
#if !defined(__OPTIMIZE__)
  std::printf("WARNING: built without optimization; numbers are not representative\n");
#endif
#if !defined(NDEBUG)
  std::printf("WARNING: asserts are enabled\n");
#endif
  char tmpl[] = "/tmp/lanebus-bench-leases-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  const char* self = "/proc/self/exe";
  for (const Scenario& sc : kScenarios) {
    if (only != nullptr && std::strcmp(only, sc.name) != 0) continue;
    std::vector<double> ours, theirs;
    for (int r = 0; r < repeats; ++r) {
      std::string suffix = std::string(sc.name) + "-" + std::to_string(r);
      ours.push_back(run_once(self, sc, true, dir + "/table-" + suffix, seconds));
      theirs.push_back(run_once(self, sc, false, dir + "/db-" + suffix + ".sqlite", seconds));
    }
    std::sort(ours.begin(), ours.end());
    std::sort(theirs.begin(), theirs.end());
    double x = ours[ours.size() / 2], y = theirs[theirs.size() / 2];
    std::printf("bench=leases case=%s lanebus_ops_per_sec=%.0f baseline=sqlite baseline_ops_per_sec=%.0f "
                "ratio=%.1f lanebus_spread=%.0f..%.0f baseline_spread=%.0f..%.0f processes=%d\n",
                sc.name, x, y, y > 0 ? x / y : 0.0, ours.front(), ours.back(), theirs.front(), theirs.back(),
                sc.processes);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
