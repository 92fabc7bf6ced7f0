// lanebus — MIT License.
// bench/durable: durable publish (sync/async group commit) and replay against raw
// LMDB and SQLite doing the same work, in one run. `--smoke` = tiny run; `--run CASE`.
//
// Cases (64-byte payloads; every producer keeps up to 512 publishes in flight
// through the completion form):
//   sync_1p   1 producer, Durability::Sync     vs lmdb_fsync, sqlite_full
//   sync_4p   4 producers, Durability::Sync    vs lmdb_fsync, sqlite_full, sqlite_full_batched
//   async_4p  4 producers, Durability::Async   vs lmdb_nosync
//   replay    one group reads a lane from offset 0  vs lmdb_cursor (raw cursor scan)
// Baselines: raw LMDB through lanebus's thin wrapper (lib/lmdb_store.hpp, one
// write txn per batch with MDB_APPEND; batch = lanebus's average commit in the
// matching case — the ceiling); SQLite WAL synchronous=FULL, one transaction
// per message per producer thread (durable on return), and batched like lanebus.
#include <sqlite3.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "durable_store.hpp"
#include "lmdb_store.hpp"

#ifndef BENCH_BUILDTYPE
#define BENCH_BUILDTYPE "unknown"
#endif

using lanebus::detail::AppendRequest;
using lanebus::detail::DurableStore;
using Clock = std::chrono::steady_clock;

namespace {

double g_seconds = 2.0;  // per measured case
constexpr int kWindow = 512;
const std::string kPayload(64, 'p');

struct Run {
  double msgs_per_sec = 0;
  double avg_batch = 1;
  std::uint64_t p50_ns = 0, p99_ns = 0, p999_ns = 0;
  std::uint64_t msgs = 0;
};

std::string fresh_dir(const std::string& name) {
  static std::string root;
  if (root.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "lanebus-bench-XXXXXX").string();
    root = mkdtemp(tmpl.data());
  }
  std::string d = root + "/" + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

std::uint64_t pct(std::vector<std::uint64_t>& v, double p) {
  if (v.empty()) return 0;
  std::size_t i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

// lanebus durable publish: `producers` threads, each with kWindow in flight.
Run lanebus_publish(int producers, lanebus::Durability mode, const std::string& dir) {
  lanebus::StoreOptions o;
  o.directory = dir;
  o.durability = mode;
  o.map_size_initial = 256ull << 20;
  auto store = DurableStore::open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().to_string().c_str());
    std::exit(1);
  }
  auto t = (*store)->open_topic("bench.topic", lanebus::detail::TopicSpec{8, false, {}});
  if (!t.ok()) std::exit(1);
  // Completions all run on the store's writer thread: `lat` is only touched there.
  std::vector<std::uint64_t> lat;
  lat.reserve(4 << 20);
  std::atomic<std::uint64_t> done{0};
  std::atomic<bool> stop{false};
  auto before = (*store)->counters();
  auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      std::atomic<int> in_flight{0};
      for (std::uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        // Sleep rather than spin: on 2 cores a spinning producer steals the writer's CPU.
        while (in_flight.load(std::memory_order_acquire) >= kWindow) std::this_thread::sleep_for(std::chrono::microseconds(50));
        AppendRequest r;
        r.topic_id = t->id;
        r.key = "key" + std::to_string((i * 4 + static_cast<std::uint64_t>(p)) % 64);
        r.lane = lanebus::lane_for_key(r.key, 8);
        r.payload = kPayload;
        auto t0 = Clock::now();
        in_flight.fetch_add(1, std::memory_order_relaxed);
        auto s = (*store)->append_async(std::move(r), [&, t0](const lanebus::Status& st,
                                                              const lanebus::detail::AppendResult&) {
          if (st.ok()) {
            lat.push_back(static_cast<std::uint64_t>(
                std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()));
          }
          done.fetch_add(1, std::memory_order_relaxed);
          in_flight.fetch_sub(1, std::memory_order_release);
        });
        if (!s.ok()) std::exit(1);
      }
      while (in_flight.load(std::memory_order_acquire) > 0) std::this_thread::yield();
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(g_seconds));
  stop.store(true);
  for (auto& th : threads) th.join();
  auto elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  auto after = (*store)->counters();
  if (!(*store)->close().ok()) std::exit(1);  // joins the writer: `lat` is complete and ours now
  Run r;
  r.msgs = done.load();
  r.msgs_per_sec = static_cast<double>(r.msgs) / elapsed;
  std::uint64_t commits = after.commits - before.commits;
  r.avg_batch = commits > 0 ? static_cast<double>(after.batched_ops - before.batched_ops) / static_cast<double>(commits) : 1;
  r.p50_ns = pct(lat, 0.50);
  r.p99_ns = pct(lat, 0.99);
  r.p999_ns = pct(lat, 0.999);
  return r;
}

// Raw LMDB: one thread, write txns of `batch` MDB_APPEND puts each.
Run lmdb_raw(bool no_sync, std::uint64_t batch, const std::string& dir) {
  lanebus::detail::LmdbEnv::Config c;
  c.path = dir;
  c.map_size_initial = 8ull << 30;  // sparse: only written pages use disk
  c.map_size_max = 8ull << 30;
  c.no_sync = no_sync;
  auto env = lanebus::detail::LmdbEnv::open(c);
  if (!env.ok()) std::exit(1);
  lanebus::detail::LmdbDbi dbi = 0;
  {
    auto txn = (*env)->begin_write();
    auto d = (*env)->open_dbi(*txn, "log", true);
    if (!d.ok() || !txn->commit().ok()) std::exit(1);
    dbi = *d;
  }
  std::uint64_t n = 0;
  auto start = Clock::now();
  auto until = start + std::chrono::duration<double>(g_seconds);
  char key[8];
  while (Clock::now() < until) {
    auto txn = (*env)->begin_write();
    if (!txn.ok()) std::exit(1);
    for (std::uint64_t i = 0; i < batch; ++i, ++n) {
      for (int b = 0; b < 8; ++b) key[b] = static_cast<char>(n >> (56 - 8 * b));
      if (auto st = txn->put_append(dbi, std::string_view(key, 8), kPayload); !st.ok()) {
        std::fprintf(stderr, "lmdb baseline: %s\n", st.to_string().c_str());
        std::exit(1);
      }
    }
    if (auto st = txn->commit(); !st.ok()) {
      std::fprintf(stderr, "lmdb baseline: %s\n", st.to_string().c_str());
      std::exit(1);
    }
  }
  if (no_sync && !(*env)->sync().ok()) std::exit(1);
  Run r;
  r.msgs = n;
  r.msgs_per_sec = static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

// SQLite WAL, synchronous=FULL: `threads` connections, `batch` inserts per transaction.
Run sqlite_full(int threads, std::uint64_t batch, const std::string& dir) {
  const std::string path = dir + "/q.db";
  {
    sqlite3* db = nullptr;
    sqlite3_open(path.c_str(), &db);
    sqlite3_exec(db, "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS q(id INTEGER PRIMARY KEY, k BLOB, v BLOB);",
                 nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  std::atomic<std::uint64_t> total{0};
  auto start = Clock::now();
  auto until = start + std::chrono::duration<double>(g_seconds);
  std::vector<std::thread> ts;
  for (int p = 0; p < threads; ++p) {
    ts.emplace_back([&, p] {
      sqlite3* db = nullptr;
      sqlite3_open(path.c_str(), &db);
      sqlite3_busy_timeout(db, 10000);
      sqlite3_exec(db, "PRAGMA synchronous=FULL;", nullptr, nullptr, nullptr);
      sqlite3_stmt* ins = nullptr;
      sqlite3_prepare_v2(db, "INSERT INTO q(k, v) VALUES(?, ?)", -1, &ins, nullptr);
      std::uint64_t n = 0;
      while (Clock::now() < until) {
        if (sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) continue;
        for (std::uint64_t i = 0; i < batch; ++i) {
          std::string k = "key" + std::to_string((n + i) * 4 + static_cast<std::uint64_t>(p));
          sqlite3_bind_blob(ins, 1, k.data(), static_cast<int>(k.size()), SQLITE_TRANSIENT);
          sqlite3_bind_blob(ins, 2, kPayload.data(), static_cast<int>(kPayload.size()), SQLITE_STATIC);
          sqlite3_step(ins);
          sqlite3_reset(ins);
        }
        if (sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK) n += batch;
      }
      sqlite3_finalize(ins);
      sqlite3_close(db);
      total.fetch_add(n);
    });
  }
  for (auto& t : ts) t.join();
  Run r;
  r.msgs = total.load();
  r.msgs_per_sec = static_cast<double>(r.msgs) / std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

// Replay: a new group reads every lane of the sync_4p topic from offset 0.
Run lanebus_replay(const std::string& dir) {
  lanebus::StoreOptions o;
  o.directory = dir;
  auto store = DurableStore::open(o);
  if (!store.ok()) std::exit(1);
  auto t = (*store)->find_topic("bench.topic");
  if (!t.ok()) std::exit(1);
  auto g = (*store)->open_group(*t, "replay", lanebus::StartPosition::earliest());
  if (!g.ok()) std::exit(1);
  std::uint64_t n = 0;
  std::size_t bytes = 0;
  auto start = Clock::now();
  for (std::uint32_t lane = 0; lane < t->lanes; ++lane) {
    for (std::uint64_t from = 0;;) {
      auto b = (*store)->read(*t, lane, from, {1024, 4 << 20});
      if (!b.ok()) std::exit(1);
      if (b->messages.empty()) break;
      for (const auto& m : b->messages) bytes += m.payload.size();
      n += b->messages.size();
      from = b->next_offset;
    }
  }
  Run r;
  r.msgs = n;
  r.msgs_per_sec = static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - start).count();
  if (bytes == 0 && n > 0) std::exit(1);
  (void)(*store)->close();
  return r;
}

// Raw cursor scan of the lmdb_fsync baseline's table, copying each value.
Run lmdb_cursor(const std::string& dir) {
  lanebus::detail::LmdbEnv::Config c;
  c.path = dir;
  c.map_size_initial = 8ull << 30;
  c.map_size_max = 8ull << 30;
  c.read_only = true;
  auto env = lanebus::detail::LmdbEnv::open(c);
  if (!env.ok()) std::exit(1);
  auto txn = (*env)->begin_read();
  auto dbi = (*env)->open_dbi(*txn, "log", false);
  if (!dbi.ok()) std::exit(1);
  auto cur = lanebus::detail::LmdbCursor::open(*txn, *dbi, dir);
  std::uint64_t n = 0;
  std::string copy;
  auto start = Clock::now();
  for (auto r = cur->first(); r.ok() && *r; r = cur->next()) {
    copy.assign(cur->value());
    ++n;
  }
  Run out;
  out.msgs = n;
  out.msgs_per_sec = static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

void line(const char* name, const Run& x, const char* baseline, const Run& y, bool latency) {
  std::printf("bench=durable case=%s lanebus_msgs_per_sec=%.0f baseline=%s baseline_msgs_per_sec=%.0f ratio=%.2f", name,
              x.msgs_per_sec, baseline, y.msgs_per_sec, y.msgs_per_sec > 0 ? x.msgs_per_sec / y.msgs_per_sec : 0.0);
  if (latency) {
    std::printf(" lanebus_p50_ns=%llu lanebus_p99_ns=%llu lanebus_p999_ns=%llu lanebus_avg_batch=%.1f",
                static_cast<unsigned long long>(x.p50_ns), static_cast<unsigned long long>(x.p99_ns),
                static_cast<unsigned long long>(x.p999_ns), x.avg_batch);
  }
  std::printf("\n");
  std::fflush(stdout);
}

void banner() {
  utsname u{};
  uname(&u);
  std::string cpu = "unknown";
  std::ifstream in("/proc/cpuinfo");
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("model name", 0) == 0) {
      cpu = l.substr(l.find(':') + 2);
      break;
    }
  }
  std::printf("bench=durable machine=\"%s, %u cpus, %s %s\" compiler=\"%s\" build=%s lmdb=\"%s\" sqlite=%s tmp=%s\n",
              cpu.c_str(), std::thread::hardware_concurrency(), u.sysname, u.release, __VERSION__, BENCH_BUILDTYPE,
              lanebus::detail::lmdb_version_string(), sqlite3_libversion(),
              std::filesystem::temp_directory_path().c_str());
#if !defined(__OPTIMIZE__)
  std::printf("WARNING: built without optimization; numbers are not representative\n");
#endif
#if !defined(NDEBUG)
  std::printf("WARNING: asserts are enabled (build with -Dbuildtype=release for real numbers)\n");
#endif
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--smoke") == 0) g_seconds = 0.15;
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) g_seconds = std::atof(argv[++i]);
    if (std::strcmp(argv[i], "--run") == 0 && i + 1 < argc) only = argv[++i];
  }
  banner();
  auto want = [&](const char* c) { return only.empty() || only == c; };
  std::string sync4_dir;
  if (want("sync_1p")) {
    Run x = lanebus_publish(1, lanebus::Durability::Sync, fresh_dir("sync_1p"));
    auto b = static_cast<std::uint64_t>(std::max(1.0, x.avg_batch + 0.5));
    line("sync_1p", x, "lmdb_fsync", lmdb_raw(false, b, fresh_dir("lmdb_fsync_1")), true);
    line("sync_1p", x, "sqlite_full", sqlite_full(1, 1, fresh_dir("sqlite_full_1")), true);
  }
  if (want("sync_4p") || want("replay")) {
    sync4_dir = fresh_dir("sync_4p");
    Run x = lanebus_publish(4, lanebus::Durability::Sync, sync4_dir);
    auto b = static_cast<std::uint64_t>(std::max(1.0, x.avg_batch + 0.5));
    std::string lmdb_dir = fresh_dir("lmdb_fsync_4");
    Run lm = lmdb_raw(false, b, lmdb_dir);
    if (want("sync_4p")) {
      std::printf("bench=durable note=\"lmdb_fsync and sqlite_full_batched commit %llu messages per txn (lanebus's average batch in sync_4p)\"\n",
                  static_cast<unsigned long long>(b));
      line("sync_4p", x, "lmdb_fsync", lm, true);
      line("sync_4p", x, "sqlite_full", sqlite_full(4, 1, fresh_dir("sqlite_full_4")), true);
      line("sync_4p", x, "sqlite_full_batched", sqlite_full(4, b, fresh_dir("sqlite_batched_4")), true);
    }
    if (want("replay")) line("replay", lanebus_replay(sync4_dir), "lmdb_cursor", lmdb_cursor(lmdb_dir), false);
  }
  if (want("async_4p")) {
    Run x = lanebus_publish(4, lanebus::Durability::Async, fresh_dir("async_4p"));
    auto b = static_cast<std::uint64_t>(std::max(1.0, x.avg_batch + 0.5));
    line("async_4p", x, "lmdb_nosync", lmdb_raw(true, b, fresh_dir("lmdb_nosync")), false);
  }
  std::error_code ec;
  std::filesystem::remove_all(std::filesystem::path(fresh_dir("x")).parent_path(), ec);
  return 0;
}
