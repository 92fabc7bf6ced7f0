// lanebus — MIT License.
// bench/idempotency: the idempotency tables (doc/idempotency.md) and transactional
// consume next to what a user would otherwise write, in one run:
//   hot_lookup   claim() of a key already done (hot tier)   vs std::unordered_map + std::mutex
//   durable_claim claim() of new keys, Sync store, 4 threads  vs raw LMDB: one fsynced txn per put
//   tx_consume   durable queue, consume_tx (write + dedup + ack in one txn) vs plain consume (ack only)
// Each line: bench=idempotency case=<name> lanebus_ops_per_sec=<x> baseline=<b> baseline_ops_per_sec=<y> ratio=<x/y>
//   idempotency [--smoke]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "lmdb_store.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

namespace {

double secs(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }

fs::path fresh_dir(const char* name) {
  fs::path p = fs::temp_directory_path() / (std::string("lanebus-bench-idem-") + name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void line(const char* c, double x, const char* base, double y, const char* extra = "") {
  std::printf("bench=idempotency case=%s lanebus_ops_per_sec=%.0f baseline=%s baseline_ops_per_sec=%.0f ratio=%.2f%s\n", c,
              x, base, y, y > 0 ? x / y : 0.0, extra);
  std::fflush(stdout);
}

BusOptions store_bus(const fs::path& dir) {
  BusOptions o;
  o.workers = 2;
  o.store.directory = (dir / "store").string();
  o.durable_poll = 5ms;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const bool smoke = argc > 1 && std::strcmp(argv[1], "--smoke") == 0;
  std::printf("bench=idempotency machine_cpus=%u build=%s%s\n", std::thread::hardware_concurrency(),
#ifdef __OPTIMIZE__
              "optimized",
#else
              "unoptimized",
#endif
#ifdef NDEBUG
              ""
#else
              " asserts=on"
#endif
  );
#if !defined(__OPTIMIZE__)
  std::printf("WARNING: unoptimized build; numbers are not representative\n");
#endif
  const int hot_ops = smoke ? 20'000 : 2'000'000;
  const int durable_ops = smoke ? 200 : 20'000;
  const int tx_msgs = smoke ? 200 : 5'000;

  // ---- hot_lookup
  {
    fs::path dir = fresh_dir("hot");
    auto bus = Bus::open(store_bus(dir)).value();
    IdempotencyTable* t = bus->idempotency("bench.hot", {.hot_capacity = 4096}).value();
    std::vector<std::string> keys;
    for (int i = 0; i < 1000; ++i) {
      keys.push_back("order-" + std::to_string(i));
      (void)t->claim(keys.back());
      (void)t->complete(keys.back());
    }
    auto a = clk::now();
    std::uint64_t done = 0;
    for (int i = 0; i < hot_ops; ++i) done += t->claim(keys[i % 1000]).value().state == ClaimState::Done;
    double lb = hot_ops / secs(a, clk::now());
    std::unordered_map<std::string, int> map;
    std::mutex mu;
    for (auto& k : keys) map[k] = 2;
    a = clk::now();
    std::uint64_t done2 = 0;
    for (int i = 0; i < hot_ops; ++i) {
      std::lock_guard l(mu);
      done2 += map.find(keys[i % 1000])->second == 2;
    }
    double base = hot_ops / secs(a, clk::now());
    if (done != done2) std::printf("ERROR: hot lookups disagree\n");
    char extra[96];
    std::snprintf(extra, sizeof extra, " lanebus_ns_per_op=%.0f baseline_ns_per_op=%.0f", 1e9 / lb, 1e9 / base);
    line("hot_lookup", lb, "unordered_map_mutex", base, extra);
    fs::remove_all(dir);
  }

  // ---- durable_claim (4 threads share group commits) vs raw LMDB put per fsynced txn
  {
    fs::path dir = fresh_dir("durable");
    double lb = 0;
    {
      auto bus = Bus::open(store_bus(dir)).value();
      IdempotencyTable* t = bus->idempotency("bench.durable").value();
      std::atomic<int> next{0};
      auto a = clk::now();
      std::vector<std::thread> th;
      for (int w = 0; w < 4; ++w)
        th.emplace_back([&] {
          for (int i; (i = next.fetch_add(1)) < durable_ops;) (void)t->claim("payment-" + std::to_string(i));
        });
      for (auto& x : th) x.join();
      lb = durable_ops / secs(a, clk::now());
    }
    double base = 0;
    {
      detail::LmdbEnv::Config cfg;
      cfg.path = (dir / "raw").string();
      auto env = detail::LmdbEnv::open(cfg).value();
      auto txn0 = env->begin_write().value();
      auto dbi = env->open_dbi(txn0, "idem", true).value();
      (void)txn0.commit();
      const int n = durable_ops / 10;  // one fsync per op: keep the run short
      auto a = clk::now();
      for (int i = 0; i < n; ++i) {
        auto txn = env->begin_write().value();
        std::string k = "payment-" + std::to_string(i);
        auto cur = txn.get(dbi, k);
        if (!cur.ok()) (void)txn.put(dbi, k, "in_progress");
        (void)txn.commit();
      }
      base = n / secs(a, clk::now());
    }
    line("durable_claim", lb, "lmdb_fsync_per_op", base, " lanebus_threads=4 baseline_threads=1");
    fs::remove_all(dir);
  }

  // ---- tx_consume vs plain durable consume
  {
    double rates[2] = {0, 0};
    for (int mode = 0; mode < 2; ++mode) {
      fs::path dir = fresh_dir(mode ? "tx" : "plain");
      auto bus = Bus::open(store_bus(dir)).value();
      auto q = bus->create_queue("bench.jobs", {.lanes = 4, .durable = true}).value();
      for (int i = 0; i < tx_msgs; ++i) (void)q.publish_async({.key = std::to_string(i), .payload = "job"}, [](const Status&, std::uint64_t) {});
      std::atomic<int> got{0};
      auto a = clk::now();
      Subscription sub;
      if (mode == 0) {
        sub = bus->consume(q, [&](const MessageView&) {
                     ++got;
                     return Outcome::ack();
                   }).value();
      } else {
        sub = bus->consume_tx(q, [&](const MessageView& m, Transaction& tx) {
                     (void)tx.put("results", std::to_string(m.offset()) + "/" + std::to_string(m.lane()), "done");
                     ++got;
                     return Outcome::ack();
                   }).value();
      }
      while (got < tx_msgs) std::this_thread::sleep_for(1ms);
      rates[mode] = tx_msgs / secs(a, clk::now());
      (void)sub.close();
      (void)bus->shutdown(ShutdownMode::Drain);
      fs::remove_all(dir);
    }
    line("tx_consume", rates[1], "plain_durable_consume", rates[0]);
  }
  return 0;
}
