// lanebus — MIT License.
// Worker processes for fence_multiprocess_test: the freeze/takeover scenario's A and B, a
// contending worker, and a flooding appender to kill -9. All write through a fenced
// durable lane of a real LMDB store, confirmed by a real LeaseTable.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <vector>

#include "durable_store.hpp"
#include "fence_support.hpp"
#include "lanebus/lease.hpp"

using lanebus::LeaseOwner;
using lanebus::LeaseTable;
using lanebus::Status;
using lanebus::detail::AppendRequest;
using lanebus::detail::AppendResult;
using lanebus::detail::DurableStore;
using lanebus::detail::TopicRef;
using lanebus::detail::TopicSpec;

namespace {

void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stdout, fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

[[noreturn]] void die(const char* what, const Status& s) {
  say("error %s %s", what, s.to_string().c_str());
  std::exit(1);
}

struct World {
  std::unique_ptr<LeaseTable> table;
  std::unique_ptr<DurableStore> store;
  LeaseOwner me;
};

World open_world(const std::string& store_dir, const std::string& table_path, bool fence) {
  World w;
  auto t = LeaseTable::open(table_path, lanebus::test::fence_table_options());
  if (!t.ok()) die("table", t.status());
  w.table = std::move(*t);
  auto s = lanebus::test::open_fenced_store(store_dir, w.table.get(), fence);
  if (!s.ok()) die("store", s.status());
  w.store = std::move(*s);
  auto o = LeaseOwner::generate();
  if (!o.ok()) die("owner", o.status());
  w.me = *o;
  return w;
}

TopicRef open_topic(DurableStore& store, const std::string& name, const std::string& fence, std::uint32_t lanes,
                    bool per_lane) {
  TopicSpec spec;
  spec.lanes = lanes;
  spec.fence = fence;
  spec.fence_per_lane = per_lane;
  auto t = store.open_topic(name, spec);
  if (!t.ok()) die("topic", t.status());
  return *t;
}

AppendRequest msg(const TopicRef& t, std::uint32_t lane, std::uint64_t token, std::string payload,
                  std::string idem = "") {
  AppendRequest r;
  r.topic_id = t.id;
  r.lane = lane;
  r.header.fencing_token = token;
  r.payload = std::move(payload);
  r.idempotency_key = std::move(idem);
  return r;
}

constexpr const char* kTask = "batch-task-42";

// A: acquire, renew twice, freeze itself with SIGSTOP (the test resumes it
// after B took over), then write with its old token.
int scenario_a(const std::string& store_dir, const std::string& table_path, long ttl_ms, bool fence) {
  World w = open_world(store_dir, table_path, fence);
  TopicRef t = open_topic(*w.store, "jobs", kTask, 1, false);
  auto lease = w.table->acquire(kTask, w.me, std::chrono::milliseconds(ttl_ms));
  if (!lease.ok()) die("acquire", lease.status());
  say("acquired token=%llu", static_cast<unsigned long long>(lease->token));
  for (int i = 0; i < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ttl_ms / 4));
    say("renew ok=%d", w.table->renew(kTask, w.me, lease->token).ok() ? 1 : 0);
  }
  say("freezing");
  kill(getpid(), SIGSTOP);  // frozen until the test sends SIGCONT
  auto r = w.store->append(msg(t, 0, lease->token, "from-A"));
  say("append code=%s", lanebus::to_string(r.code()));
  return 0;
}

// B: acquire the expired lease and write (the barrier of its generation).
int scenario_b(const std::string& store_dir, const std::string& table_path, long ttl_ms, bool fence) {
  World w = open_world(store_dir, table_path, fence);
  TopicRef t = open_topic(*w.store, "jobs", kTask, 1, false);
  auto lease = w.table->acquire(kTask, w.me, std::chrono::milliseconds(ttl_ms));
  if (!lease.ok()) die("acquire", lease.status());
  say("acquired token=%llu", static_cast<unsigned long long>(lease->token));
  auto r = w.store->append(msg(t, 0, lease->token, "from-B"));
  say("append code=%s", lanebus::to_string(r.code()));
  return 0;
}

// A contending worker: acquire any slot of "work" (lane = slot), then a few
// rounds of {work, append with the token, renew}; release. Appending before
// renewing is the pattern a pause exposes: a worker frozen during "work"
// resumes and appends with its old token. Runs until STOP_FILE exists.
// Log lines: "A lane token" accepted, "S lane token" StaleToken, "E lane token code".
int contend(const std::string& store_dir, const std::string& table_path, std::uint32_t slots, long ttl_ms,
            bool fence, std::uint64_t seed, const std::string& stop_file, const std::string& log_path, int worker) {
  World w = open_world(store_dir, table_path, fence);
  TopicRef t = open_topic(*w.store, "work", "work", slots, true);
  std::FILE* log = std::fopen(log_path.c_str(), "w");
  if (log == nullptr) return 3;
  std::mt19937_64 rng(seed);
  std::uint64_t seq = 0;
  say("ready");
  struct stat st {};
  while (::stat(stop_file.c_str(), &st) != 0) {
    auto lease = w.table->acquire_any_slot("work", slots, w.me, std::chrono::milliseconds(ttl_ms));
    if (!lease.ok()) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
      continue;
    }
    const auto lane = static_cast<std::uint32_t>(std::strtoul(lease->name.c_str() + lease->name.rfind('-') + 1, nullptr, 10));
    for (int round = 0; round < 4; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ttl_ms / 5 + static_cast<long>(rng() % 10)));
      ++seq;
      const std::string id = "w" + std::to_string(worker) + "-" + std::to_string(seq);
      auto r = w.store->append(msg(t, lane, lease->token, id, id));
      const char kind = r.ok() ? 'A' : (r.code() == lanebus::Code::StaleToken ? 'S' : 'E');
      std::fprintf(log, "%c %u %llu %s\n", kind, lane, static_cast<unsigned long long>(lease->token),
                   lanebus::to_string(r.code()));
      std::fflush(log);
      if (!r.ok()) break;
      if (!w.table->renew(lease->name, w.me, lease->token).ok()) break;
    }
    (void)w.table->release(lease->name, w.me, lease->token);
  }
  std::fclose(log);
  return 0;
}

// Appends forever in generations: each generation acquires "flood-owner",
// queues 64 appends across 4 lanes (append_async, so batches are in flight
// when the test kills it), some with repeated idempotency keys, plus one
// append with the previous generation's token. Prints "acked lane offset
// token" for every accepted message after its commit.
int flood(const std::string& store_dir, const std::string& table_path, std::uint64_t seed) {
  World w = open_world(store_dir, table_path, true);
  TopicRef t = open_topic(*w.store, "flood", "flood-owner", 4, false);
  std::mt19937_64 rng(seed);
  std::uint64_t prev = 0;
  say("ready");
  for (std::uint64_t gen = 0;; ++gen) {
    // A killed predecessor's lease runs out after its short TTL.
    auto lease = w.table->acquire("flood-owner", w.me, std::chrono::milliseconds(300));
    while (lease.code() == lanebus::Code::Busy) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      lease = w.table->acquire("flood-owner", w.me, std::chrono::milliseconds(300));
    }
    if (!lease.ok()) die("acquire", lease.status());
    std::mutex m;
    std::condition_variable cv;
    int pending = 0;
    auto queue = [&](AppendRequest r) {
      {
        std::lock_guard<std::mutex> l(m);
        ++pending;
      }
      const std::uint32_t lane = r.lane;
      const std::uint64_t token = r.header.fencing_token;
      Status s = w.store->append_async(std::move(r), [&, lane, token](const Status& st, const AppendResult& res) {
        if (st.ok() && !res.duplicate) {
          say("acked %u %llu %llu", lane, static_cast<unsigned long long>(res.offset),
              static_cast<unsigned long long>(token));
        }
        std::lock_guard<std::mutex> l(m);
        --pending;
        cv.notify_all();
      });
      if (!s.ok()) die("append_async", s);
    };
    for (int i = 0; i < 64; ++i) {
      const auto lane = static_cast<std::uint32_t>(rng() % 4);
      const std::string idem = "g" + std::to_string(gen) + "-" + std::to_string(rng() % 48);
      queue(msg(t, lane, lease->token, "p", idem));
      if (i == 32 && prev != 0) queue(msg(t, lane, prev, "stale"));
    }
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return pending == 0; });
    l.unlock();
    (void)w.table->release("flood-owner", w.me, lease->token);
    prev = lease->token;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv, argv + argc);
  if (argc >= 6 && a[1] == "scenario-a") return scenario_a(a[2], a[3], std::atol(argv[4]), a[5] == "1");
  if (argc >= 6 && a[1] == "scenario-b") return scenario_b(a[2], a[3], std::atol(argv[4]), a[5] == "1");
  if (argc >= 11 && a[1] == "contend") {
    return contend(a[2], a[3], static_cast<std::uint32_t>(std::atoi(argv[4])), std::atol(argv[5]), a[6] == "1",
                   std::strtoull(argv[7], nullptr, 10), a[8], a[9], std::atoi(argv[10]));
  }
  if (argc >= 5 && a[1] == "flood") return flood(a[2], a[3], std::strtoull(argv[4], nullptr, 10));
  std::fprintf(stderr, "usage: fence_helper scenario-a|scenario-b|contend|flood ...\n");
  return 2;
}
