// lanebus — MIT License.
// bench/inproc: the in-process bus against raw moodycamel ConcurrentQueue (the
// ceiling), Boost.Asio strands (what a C++ developer writes for per-key ordered
// work on a thread pool), a std::mutex + condition_variable queue, and ZeroMQ
// inproc PUSH/PULL, on the same work (64-byte payload), in one process.
//
// Usage: inproc [--smoke] [--run NAME] [--msgs N] [--repeats N] [--workers N] [--list]
//   --smoke    tiny counts, one run per case (the bench-smoke test suite); checks
//              that every case runs and loses nothing
//   --run      one scenario: 1to1, 1to1_batch64, 2to2, fanout1to4, metrics_overhead, latency1to1,
//              record_1to1, typed_1to1, typed_string_1to1, payload_4k_1to1, payload_64k_1to1,
//              delayed_1to1
//   --msgs     messages published per run (throughput cases; latency uses N/10)
//   --workers  override the lanebus worker count of every case
//
// Output: a machine line, a WARNING line for unoptimised or assert-enabled
// builds, then one `key=value` line per comparison ending in `ratio=` plus
// extra fields (spread, thread counts). msgs_per_sec counts published messages
// per second, measured from just before the first publish until the last
// handler call (lanebus) / last dequeue (baselines) of EVERY group, so a
// fan-out case delivers groups x msgs in that time. Throughput runs repeat
// (default 3) and report the median with the spread min..max; BENCH_EACH=1
// also prints each run's rate to stderr, in order.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <span>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <concurrentqueue/concurrentqueue.h>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "lanebus/bus.hpp"
#include "lanebus/client.hpp"  // tenancy_1to1
#include "lanebus/version.hpp"

#if BENCH_HAVE_ZMQ
#include <zmq.h>
#endif

#ifndef BENCH_BUILDTYPE
#define BENCH_BUILDTYPE "unknown"
#endif
#ifndef BENCH_MOODYCAMEL_VERSION
#define BENCH_MOODYCAMEL_VERSION "unknown"
#endif

namespace {

using lanebus::Bus;
using lanebus::MessageView;
using lanebus::Outcome;

// ---------------------------------------------------------------- helpers

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

template <typename T>
inline void do_not_optimize(const T& v) noexcept {
  asm volatile("" : : "r,m"(v) : "memory");
}

// Where the run is (the case, then the step of a lanebus run), for the
// smoke's hang report: set by the main thread, read by the watchdog.
std::atomic<const char*> g_case{"start"};
std::atomic<const char*> g_step{""};
void step(const char* what) noexcept { g_step.store(what, std::memory_order_relaxed); }

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench=inproc ERROR: %s\n", what.c_str());
  std::fflush(stdout);
  std::_Exit(1);  // threads may be stuck; do not try to join them
}

/// The 64-byte message every case moves: a sequence number, a steady_clock
/// timestamp (latency cases) and padding.
struct Msg {
  std::uint64_t seq = 0;
  std::int64_t ts_ns = 0;
  char pad[48] = {};
};
static_assert(sizeof(Msg) == 64);

struct Config {
  std::uint64_t msgs = 1'000'000;  // throughput cases; latency uses msgs / 10
  int repeats = 3;
  int workers_override = 0;
  bool smoke = false;
  std::string run;
  std::int64_t wait_limit_ns = 60'000'000'000;  // a run that takes longer is a hang
};

// Keys spread messages over the topic's lanes (8 lanes by default).
constexpr int kKeys = 16;
const std::vector<std::string>& keys() {
  static const std::vector<std::string> k = [] {
    std::vector<std::string> v;
    for (int i = 0; i < kKeys; ++i) v.push_back("key-" + std::to_string(i));
    return v;
  }();
  return k;
}

/// Producers spin on `go` so that the clock starts just before the first publish.
struct Gate {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  void arrive_and_wait() {
    ready.fetch_add(1);
    while (!go.load(std::memory_order_acquire)) cpu_relax();
  }
  std::int64_t open_when(int n) {
    while (ready.load() < n) std::this_thread::yield();
    std::int64_t t0 = now_ns();
    go.store(true, std::memory_order_release);
    return t0;
  }
};

/// Per consumer group (or baseline consumer): messages seen and the time of the last one.
struct alignas(64) GroupDone {
  std::atomic<std::uint64_t> count{0};
  std::atomic<std::int64_t> done_ns{0};
};

/// Wait until every group has recorded its last message; the latest time.
std::int64_t wait_all(const std::vector<std::unique_ptr<GroupDone>>& groups, const Config& cfg, const char* what) {
  std::int64_t deadline = now_ns() + cfg.wait_limit_ns;
  for (;;) {
    std::int64_t end = 0;
    bool all = true;
    for (auto& g : groups) {
      std::int64_t d = g->done_ns.load(std::memory_order_acquire);
      if (d == 0) all = false;
      end = std::max(end, d);
    }
    if (all) return end;
    if (now_ns() > deadline) die(std::string(what) + ": timed out waiting for consumers (lost messages?)");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

double rate(std::uint64_t n, std::int64_t ns) { return ns > 0 ? static_cast<double>(n) * 1e9 / ns : 0.0; }

// ---------------------------------------------------------------- lanebus

std::unique_ptr<Bus> open_bus(int workers, bool metrics = true) {
  auto b = Bus::open({.name = "bench", .workers = static_cast<std::size_t>(workers), .metrics = metrics});
  if (!b.ok()) die("Bus::open: " + b.status().to_string());
  return std::move(*b);
}

void publish_or_die(lanebus::Publisher& pub, const lanebus::Topic& topic, const Msg& m, std::uint64_t i) {
  lanebus::OutgoingMessage om{.key = keys()[i % kKeys],
                              .payload = std::string_view(reinterpret_cast<const char*>(&m), sizeof m)};
  for (;;) {
    lanebus::Status s = pub.publish(topic, om);
    if (s.ok()) return;
    if (s.code() != lanebus::Code::TimedOut) die("publish: " + s.to_string());
    // Block policy timed out (1 s full): consumers are behind; keep trying.
  }
}

/// `producers` threads publish `n` messages in total to one topic with `groups` groups.
/// Returns published msgs/s, measured until every group handled all n.
double lanebus_throughput(int producers, int groups, int workers, std::uint64_t n, const Config& cfg,
                          bool metrics = true) {
  auto bus = open_bus(workers, metrics);
  auto topic_r = bus->create_topic("bench.throughput", {.lanes = 8});
  if (!topic_r.ok()) die("create_topic: " + topic_r.status().to_string());
  lanebus::Topic topic = *topic_r;

  std::vector<std::unique_ptr<GroupDone>> done;
  std::vector<lanebus::Subscription> subs;
  for (int g = 0; g < groups; ++g) {
    done.push_back(std::make_unique<GroupDone>());
    GroupDone* gd = done.back().get();
    auto sub = bus->subscribe(topic, "group-" + std::to_string(g), [gd, n](const MessageView& m) {
      std::uint64_t seq;
      std::memcpy(&seq, m.payload().data(), sizeof seq);  // touch the payload like the baselines do
      do_not_optimize(seq);
      if (gd->count.fetch_add(1, std::memory_order_relaxed) + 1 == n) gd->done_ns.store(now_ns(), std::memory_order_release);
      return Outcome::ack();
    });
    if (!sub.ok()) die("subscribe: " + sub.status().to_string());
    subs.push_back(std::move(*sub));
  }

  Gate gate;
  std::vector<std::thread> threads;
  const std::uint64_t per = n / producers;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p, pub = bus->publisher()]() mutable {
      Msg m;
      gate.arrive_and_wait();
      for (std::uint64_t i = 0; i < per; ++i) {
        m.seq = p * per + i;
        publish_or_die(pub, topic, m, m.seq);
      }
    });
  }
  step("lanebus: publish and deliver");
  std::int64_t t0 = gate.open_when(producers);
  std::int64_t end = wait_all(done, cfg, "lanebus");
  step("lanebus: join the producers");
  for (auto& t : threads) t.join();
  for (auto& d : done)
    if (d->count.load() != n) die("lanebus: a group handled " + std::to_string(d->count.load()) + " of " + std::to_string(n));
  step("lanebus: unsubscribe");
  subs.clear();
  step("lanebus: shutdown(Drain)");
  (void)bus->shutdown(lanebus::ShutdownMode::Drain);
  step("lanebus: destroy the topic handle and the bus, or the next run");
  return rate(n, end - t0);
}

// ---------------------------------------------------------------- moodycamel

using McQueue = moodycamel::ConcurrentQueue<Msg>;

/// Spinning consumer of one queue: `n` messages, then record the time.
///   `pure_spin`: never give the core away (one consumer per core).
///   `sleepy`: after an idle stretch, sleep 50 µs instead of yielding. The
///   smoke run uses it: on a sanitizer build with more spinning threads than
///   cores, yield alone let the fan-out baseline crawl past its time limit
///   (the smoke checks that every case runs, not the numbers).
void mc_consume(McQueue& q, GroupDone& gd, std::uint64_t n, bool pure_spin, bool sleepy) {
  moodycamel::ConsumerToken ctok(q);
  Msg m;
  std::uint64_t got = 0;
  unsigned idle = 0;
  while (got < n) {
    if (q.try_dequeue(ctok, m)) {
      do_not_optimize(m.seq);
      ++got;
      idle = 0;
    } else {
      cpu_relax();
      // Oversubscribed cases: let the producer have the core now and then.
      if (!pure_spin && (++idle & 63) == 0) {
        if (sleepy)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        else
          std::this_thread::yield();
      }
    }
  }
  gd.count.store(got, std::memory_order_relaxed);
  gd.done_ns.store(now_ns(), std::memory_order_release);
}

/// `producers` threads, one bounded queue per group (4096 messages, the
/// lanebus topic's default capacity), each producer enqueues every message
/// into every queue; a full queue makes the producer yield (like lanebus's
/// Block policy).
///
/// Bounding: try_enqueue never allocates, and an explicit producer keeps every
/// block it ever took (it reuses its own emptied blocks), so the first producer
/// to run would take all of a queue's blocks and starve the others. Each
/// producer therefore claims an equal share up front (fill, then drain).
double mc_throughput(int producers, int groups, std::uint64_t n, const Config& cfg) {
  constexpr std::size_t kCapacity = 4096;
  std::vector<std::unique_ptr<McQueue>> queues;
  // toks[p][g]: producer p's token for queue g.
  std::vector<std::vector<std::unique_ptr<moodycamel::ProducerToken>>> toks(producers);
  for (int g = 0; g < groups; ++g) {
    queues.push_back(std::make_unique<McQueue>(kCapacity));
    McQueue& q = *queues.back();
    for (int p = 0; p < producers; ++p) {
      toks[p].push_back(std::make_unique<moodycamel::ProducerToken>(q));
      for (std::size_t i = 0; i < kCapacity / producers; ++i)
        if (!q.try_enqueue(*toks[p].back(), Msg{})) die("moodycamel: pre-sized queue refused its share");
    }
    moodycamel::ConsumerToken ctok(q);
    Msg m;
    while (q.try_dequeue(ctok, m)) {
    }
  }
  std::vector<std::unique_ptr<GroupDone>> done;
  for (int g = 0; g < groups; ++g) done.push_back(std::make_unique<GroupDone>());

  const std::uint64_t per = n / producers;
  std::vector<std::thread> consumers;
  for (int g = 0; g < groups; ++g)
    consumers.emplace_back([&, g] { mc_consume(*queues[g], *done[g], per * producers, false, cfg.smoke); });
  Gate gate;
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      Msg m;
      gate.arrive_and_wait();
      for (std::uint64_t i = 0; i < per; ++i) {
        m.seq = p * per + i;
        for (int g = 0; g < groups; ++g)
          while (!queues[g]->try_enqueue(*toks[p][g], m)) std::this_thread::yield();
      }
    });
  }
  std::int64_t t0 = gate.open_when(producers);
  std::int64_t end = wait_all(done, cfg, "moodycamel");
  for (auto& t : threads) t.join();
  for (auto& t : consumers) t.join();
  return rate(per * producers, end - t0);
}

// ---------------------------------------------------------------- boost.asio strands

/// The idiom for per-key ordered work on a thread pool: an io_context run by
/// `workers` threads, a strand per lane (8, as the lanebus topic; key i goes to
/// lane i % 8), and per message a `post` of a lambda that owns a copy of the
/// 64-byte payload. Each group has its own strands; a producer posts every
/// message to every group. Asio has no backpressure: the queue is unbounded.
double asio_throughput(int producers, int groups, int workers, std::uint64_t n, const Config& cfg) {
  constexpr int kLanes = 8;
  boost::asio::io_context ioc(workers);
  auto guard = boost::asio::make_work_guard(ioc);
  using Strand = boost::asio::strand<boost::asio::io_context::executor_type>;
  std::vector<std::vector<Strand>> strands(groups);
  for (auto& g : strands)
    for (int l = 0; l < kLanes; ++l) g.push_back(boost::asio::make_strand(ioc));
  std::vector<std::unique_ptr<GroupDone>> done;
  for (int g = 0; g < groups; ++g) done.push_back(std::make_unique<GroupDone>());
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) pool.emplace_back([&] { ioc.run(); });

  const std::uint64_t per = n / producers;
  const std::uint64_t total = per * producers;
  Gate gate;
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      Msg m;
      gate.arrive_and_wait();
      for (std::uint64_t i = 0; i < per; ++i) {
        m.seq = p * per + i;
        const int lane = static_cast<int>(m.seq % kKeys) % kLanes;
        for (int g = 0; g < groups; ++g) {
          GroupDone* gd = done[g].get();
          boost::asio::post(strands[g][lane], [m, gd, total] {
            do_not_optimize(m.seq);
            if (gd->count.fetch_add(1, std::memory_order_relaxed) + 1 == total)
              gd->done_ns.store(now_ns(), std::memory_order_release);
          });
        }
      }
    });
  }
  std::int64_t t0 = gate.open_when(producers);
  std::int64_t end = wait_all(done, cfg, "asio_strand");
  for (auto& t : threads) t.join();
  guard.reset();
  ioc.stop();
  for (auto& t : pool) t.join();
  return rate(total, end - t0);
}

// ---------------------------------------------------------------- mutex + condition_variable queue

/// The other thing people write: a bounded (4096, the topic's capacity) deque
/// guarded by a std::mutex with two condition variables. A queue per lane,
/// served by `workers` threads: lane l belongs to worker l % workers (one
/// worker per lane keeps per-key order), and a worker waits on its own
/// condition variable for any of its lanes. The worker takes everything
/// queued in a lane under one lock (swap), the usual optimisation.
struct MutexLaneQueue {
  std::deque<Msg> q;
};
struct alignas(64) MutexWorker {
  std::mutex mu;
  std::condition_variable has_work, has_room;
  std::vector<MutexLaneQueue*> lanes;  // the lanes this worker serves
  std::size_t queued = 0;              // over its lanes, guarded by mu
  bool stop = false;
};

double mutex_throughput(int producers, int groups, int workers, std::uint64_t n, const Config& cfg) {
  constexpr int kLanes = 8;
  constexpr std::size_t kCapacity = 4096;
  std::vector<std::unique_ptr<MutexWorker>> ws;
  for (int w = 0; w < workers; ++w) ws.push_back(std::make_unique<MutexWorker>());
  // lanes[g][l]; lane l of every group belongs to worker l % workers.
  std::vector<std::vector<std::unique_ptr<MutexLaneQueue>>> lanes(groups);
  for (int g = 0; g < groups; ++g)
    for (int l = 0; l < kLanes; ++l) {
      lanes[g].push_back(std::make_unique<MutexLaneQueue>());
      ws[l % workers]->lanes.push_back(lanes[g].back().get());
    }
  std::vector<std::unique_ptr<GroupDone>> done;
  for (int g = 0; g < groups; ++g) done.push_back(std::make_unique<GroupDone>());
  const std::uint64_t per = n / producers;
  const std::uint64_t total = per * producers;
  // Which group a lane queue belongs to, for the done counters.
  auto group_of = [&](const MutexLaneQueue* lq) {
    for (int g = 0; g < groups; ++g)
      for (auto& l : lanes[g])
        if (l.get() == lq) return g;
    return 0;
  };
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      MutexWorker& me = *ws[w];
      std::vector<int> gidx;
      for (auto* lq : me.lanes) gidx.push_back(group_of(lq));
      std::deque<Msg> batch;
      std::unique_lock l(me.mu);
      for (;;) {
        me.has_work.wait(l, [&] { return me.queued > 0 || me.stop; });
        if (me.queued == 0 && me.stop) return;
        for (std::size_t i = 0; i < me.lanes.size(); ++i) {
          if (me.lanes[i]->q.empty()) continue;
          batch.swap(me.lanes[i]->q);
          me.queued -= batch.size();
          l.unlock();
          me.has_room.notify_all();
          GroupDone* gd = done[gidx[i]].get();
          for (const Msg& m : batch) {
            do_not_optimize(m.seq);
            if (gd->count.fetch_add(1, std::memory_order_relaxed) + 1 == total)
              gd->done_ns.store(now_ns(), std::memory_order_release);
          }
          batch.clear();
          l.lock();
        }
      }
    });
  }
  Gate gate;
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      Msg m;
      gate.arrive_and_wait();
      for (std::uint64_t i = 0; i < per; ++i) {
        m.seq = p * per + i;
        const int lane = static_cast<int>(m.seq % kKeys) % kLanes;
        MutexWorker& w = *ws[lane % workers];
        for (int g = 0; g < groups; ++g) {
          {
            std::unique_lock l(w.mu);
            w.has_room.wait(l, [&] { return lanes[g][lane]->q.size() < kCapacity; });
            lanes[g][lane]->q.push_back(m);
            ++w.queued;
          }
          w.has_work.notify_one();
        }
      }
    });
  }
  std::int64_t t0 = gate.open_when(producers);
  std::int64_t end = wait_all(done, cfg, "mutex_queue");
  for (auto& t : threads) t.join();
  for (auto& w : ws) {
    {
      std::lock_guard l(w->mu);
      w->stop = true;
    }
    w->has_work.notify_all();
  }
  for (auto& t : pool) t.join();
  return rate(total, end - t0);
}

// ---------------------------------------------------------------- zeromq

#if BENCH_HAVE_ZMQ
double zmq_throughput(std::uint64_t n, const Config& cfg) {
  void* ctx = zmq_ctx_new();
  void* pull = zmq_socket(ctx, ZMQ_PULL);
  void* push = zmq_socket(ctx, ZMQ_PUSH);
  int linger = 0;
  zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
  if (zmq_bind(pull, "inproc://bench") != 0) die(std::string("zmq_bind: ") + zmq_strerror(zmq_errno()));
  if (zmq_connect(push, "inproc://bench") != 0) die(std::string("zmq_connect: ") + zmq_strerror(zmq_errno()));

  std::vector<std::unique_ptr<GroupDone>> done;
  done.push_back(std::make_unique<GroupDone>());
  // Sockets are handed to their threads (thread start is a full barrier).
  std::thread consumer([&] {
    Msg buf;
    for (std::uint64_t i = 0; i < n;) {
      int r = zmq_recv(pull, &buf, sizeof buf, 0);
      if (r == static_cast<int>(sizeof buf)) {
        do_not_optimize(buf.seq);
        ++i;
      } else if (zmq_errno() != EINTR) {
        die(std::string("zmq_recv: ") + zmq_strerror(zmq_errno()));
      }
    }
    done[0]->count.store(n);
    done[0]->done_ns.store(now_ns(), std::memory_order_release);
  });
  Gate gate;
  std::thread producer([&] {
    Msg m;
    gate.arrive_and_wait();
    for (std::uint64_t i = 0; i < n; ++i) {
      m.seq = i;
      while (zmq_send(push, &m, sizeof m, 0) != static_cast<int>(sizeof m))
        if (zmq_errno() != EINTR) die(std::string("zmq_send: ") + zmq_strerror(zmq_errno()));
    }
  });
  std::int64_t t0 = gate.open_when(1);
  std::int64_t end = wait_all(done, cfg, "zmq");
  producer.join();
  consumer.join();
  zmq_close(push);
  zmq_close(pull);
  zmq_ctx_term(ctx);
  return rate(n, end - t0);
}
#endif

// ---------------------------------------------------------------- latency

struct Latency {
  double msgs_per_sec = 0;
  std::int64_t p50 = 0, p99 = 0, p999 = 0, max = 0;
};

Latency summarize(std::vector<std::int64_t>& samples, std::uint64_t skip, std::uint64_t n, std::int64_t elapsed_ns) {
  std::vector<std::int64_t> s(samples.begin() + static_cast<std::ptrdiff_t>(skip), samples.end());
  std::sort(s.begin(), s.end());
  auto at = [&](double q) { return s[std::min(s.size() - 1, static_cast<std::size_t>(q * s.size()))]; };
  Latency l;
  l.msgs_per_sec = rate(n, elapsed_ns);
  l.p50 = at(0.50);
  l.p99 = at(0.99);
  l.p999 = at(0.999);
  l.max = s.back();
  return l;
}

constexpr std::int64_t kPaceNs = 10'000;  // 100,000 msg/s

/// Paced producer: message i goes out at t0 + i * 10 us (busy-waiting for the
/// slot, so the worker is not descheduled by a sleeping producer).
template <typename Send>
void paced(std::uint64_t n, std::int64_t t0, Send&& send) {
  Msg m;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::int64_t due = t0 + static_cast<std::int64_t>(i) * kPaceNs;
    while (now_ns() < due) cpu_relax();
    m.seq = i;
    m.ts_ns = now_ns();
    send(m, i);
  }
}

Latency lanebus_latency(int workers, std::uint64_t n, std::uint64_t skip, const Config& cfg) {
  auto bus = open_bus(workers);
  auto topic_r = bus->create_topic("bench.latency", {.lanes = 8});
  if (!topic_r.ok()) die("create_topic: " + topic_r.status().to_string());
  lanebus::Topic topic = *topic_r;
  std::vector<std::int64_t> samples(n);
  std::vector<std::unique_ptr<GroupDone>> done;
  done.push_back(std::make_unique<GroupDone>());
  GroupDone* gd = done[0].get();
  auto sub = bus->subscribe(topic, "latency", [gd, n, &samples](const MessageView& mv) {
    std::int64_t t = now_ns();
    Msg m;
    std::memcpy(&m, mv.payload().data(), sizeof m);
    samples[m.seq] = t - m.ts_ns;
    if (gd->count.fetch_add(1, std::memory_order_relaxed) + 1 == n) gd->done_ns.store(now_ns(), std::memory_order_release);
    return Outcome::ack();
  });
  if (!sub.ok()) die("subscribe: " + sub.status().to_string());
  auto pub = bus->publisher();
  std::int64_t t0 = now_ns();
  paced(n, t0, [&](const Msg& m, std::uint64_t i) { publish_or_die(pub, topic, m, i); });
  std::int64_t end = wait_all(done, cfg, "lanebus latency");
  (void)sub->close();
  (void)bus->shutdown(lanebus::ShutdownMode::Drain);
  return summarize(samples, skip, n, end - t0);
}

Latency mc_latency(std::uint64_t n, std::uint64_t skip, const Config& cfg) {
  McQueue q(4096);
  std::vector<std::int64_t> samples(n);
  std::vector<std::unique_ptr<GroupDone>> done;
  done.push_back(std::make_unique<GroupDone>());
  std::thread consumer([&] {
    moodycamel::ConsumerToken ctok(q);
    Msg m;
    for (std::uint64_t got = 0; got < n;) {
      if (q.try_dequeue(ctok, m)) {
        samples[m.seq] = now_ns() - m.ts_ns;
        ++got;
      } else {
        cpu_relax();  // spinning consumer
      }
    }
    done[0]->count.store(n);
    done[0]->done_ns.store(now_ns(), std::memory_order_release);
  });
  moodycamel::ProducerToken ptok(q);
  std::int64_t t0 = now_ns();
  paced(n, t0, [&](const Msg& m, std::uint64_t) {
    while (!q.try_enqueue(ptok, m)) std::this_thread::yield();
  });
  std::int64_t end = wait_all(done, cfg, "moodycamel latency");
  consumer.join();
  return summarize(samples, skip, n, end - t0);
}

// ---------------------------------------------------------------- batch publish (1to1_batch64)

constexpr std::uint32_t kBatch = 64;

/// 1 producer publishes n messages in spans of 64 (Publisher::publish_batch)
/// to one topic with one group on `workers` workers.
double lanebus_batch_throughput(int workers, std::uint64_t n, const Config& cfg) {
  auto bus = open_bus(workers);
  auto topic_r = bus->create_topic("bench.batch", {.lanes = 8});
  if (!topic_r.ok()) die("create_topic: " + topic_r.status().to_string());
  lanebus::Topic topic = *topic_r;
  std::vector<std::unique_ptr<GroupDone>> done;
  done.push_back(std::make_unique<GroupDone>());
  GroupDone* gd = done[0].get();
  // A batch handler (Bus::subscribe_batch): spans of up to 64 of one lane.
  auto sub = bus->subscribe_batch(
      topic, "group-0",
      [gd, n](std::span<const MessageView> ms) {
        for (const MessageView& m : ms) {
          std::uint64_t seq;
          std::memcpy(&seq, m.payload().data(), sizeof seq);  // touch the payload like the baseline does
          do_not_optimize(seq);
        }
        if (gd->count.fetch_add(ms.size(), std::memory_order_relaxed) + ms.size() == n)
          gd->done_ns.store(now_ns(), std::memory_order_release);
        return lanebus::BatchOutcome::all_acked();
      },
      {.batch_max = kBatch});
  if (!sub.ok()) die("subscribe: " + sub.status().to_string());
  Gate gate;
  std::thread producer([&, pub = bus->publisher()]() mutable {
    Msg ms[kBatch];
    lanebus::OutgoingMessage om[kBatch];
    gate.arrive_and_wait();
    for (std::uint64_t i = 0; i < n;) {
      const std::uint32_t b = static_cast<std::uint32_t>(std::min<std::uint64_t>(kBatch, n - i));
      for (std::uint32_t j = 0; j < b; ++j) {
        ms[j].seq = i + j;
        om[j] = {.key = keys()[(i + j) % kKeys],
                 .payload = std::string_view(reinterpret_cast<const char*>(&ms[j]), sizeof(Msg))};
      }
      std::span<const lanebus::OutgoingMessage> rest(om, b);
      while (!rest.empty()) {  // a TimedOut batch (Block, 1 s full) publishes a prefix: go on from there
        auto r = pub.publish_batch(topic, rest);
        if (!r.ok() && r.status.code() != lanebus::Code::TimedOut) die("publish_batch: " + r.status.to_string());
        rest = rest.subspan(r.published);
      }
      i += b;
    }
  });
  std::int64_t t0 = gate.open_when(1);
  std::int64_t end = wait_all(done, cfg, "lanebus batch");
  producer.join();
  if (gd->count.load() != n) die("lanebus batch: handled " + std::to_string(gd->count.load()) + " of " + std::to_string(n));
  (void)sub->close();
  (void)bus->shutdown(lanebus::ShutdownMode::Drain);
  return rate(n, end - t0);
}

// GCC 12 reports a bogus -Wstringop-overflow inside moodycamel's inlined
// ExplicitProducer::enqueue_bulk (an atomic load it thinks writes 8 bytes).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow"
/// moodycamel bulk: one bounded queue (4096), the producer try_enqueue_bulk's
/// spans of 64 (yielding when full), the consumer try_dequeue_bulk's up to 64.
double mc_bulk_throughput(std::uint64_t n, const Config& cfg) {
  constexpr std::size_t kCapacity = 4096;
  McQueue q(kCapacity);
  moodycamel::ProducerToken ptok(q);
  std::vector<std::unique_ptr<GroupDone>> done;
  done.push_back(std::make_unique<GroupDone>());
  std::thread consumer([&] {
    moodycamel::ConsumerToken ctok(q);
    Msg ms[kBatch];
    std::uint64_t got = 0;
    unsigned idle = 0;
    while (got < n) {
      std::size_t k = q.try_dequeue_bulk(ctok, ms, kBatch);
      if (k > 0) {
        for (std::size_t j = 0; j < k; ++j) do_not_optimize(ms[j].seq);
        got += k;
        idle = 0;
      } else {
        cpu_relax();
        if ((++idle & 63) == 0) {
          if (cfg.smoke)
            std::this_thread::sleep_for(std::chrono::microseconds(50));
          else
            std::this_thread::yield();
        }
      }
    }
    done[0]->count.store(got, std::memory_order_relaxed);
    done[0]->done_ns.store(now_ns(), std::memory_order_release);
  });
  Gate gate;
  std::thread producer([&] {
    Msg ms[kBatch];
    gate.arrive_and_wait();
    for (std::uint64_t i = 0; i < n;) {
      const std::uint32_t b = static_cast<std::uint32_t>(std::min<std::uint64_t>(kBatch, n - i));
      for (std::uint32_t j = 0; j < b; ++j) ms[j].seq = i + j;
      while (!q.try_enqueue_bulk(ptok, ms, b)) std::this_thread::yield();
      i += b;
    }
  });
  std::int64_t t0 = gate.open_when(1);
  std::int64_t end = wait_all(done, cfg, "moodycamel bulk");
  producer.join();
  consumer.join();
  return rate(n, end - t0);
}
#pragma GCC diagnostic pop

// ---------------------------------------------------------------- reporting

struct Runs {
  std::vector<double> v;
  double median() const {
    auto s = v;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
  double min() const { return *std::min_element(v.begin(), v.end()); }
  double max() const { return *std::max_element(v.begin(), v.end()); }
};

Runs repeat(int times, const std::function<double()>& f) {
  Runs r;
  const bool each = std::getenv("BENCH_EACH") != nullptr;
  for (int i = 0; i < times; ++i) {
    r.v.push_back(f());
    if (each) std::fprintf(stderr, "run %d: %.2f M msg/s\n", i, r.v.back() / 1e6);
  }
  return r;
}

/// `times` rounds of every side, one run each per round, instead of all of
/// one side's runs and then all of the next's. This VM moves its two vCPUs
/// between a near and a far placement for seconds at a time, which halves
/// some rates (doc/benchmarks.md): run in blocks, a side could have all its
/// runs in one placement and its baseline all in the other, and the ratio
/// measured the placement. In rounds, run i of every side is taken within a
/// second or so of the others, so the ratio of round i (pair_ratio) compares
/// like with like. The order rotates by one each round, so every side runs
/// in every position equally often (the second of two runs gained up to
/// 40 % on this VM: run_tenancy_overhead). Returns one Runs per side.
std::vector<Runs> interleave(int times, const std::vector<std::function<double()>>& sides) {
  std::vector<Runs> out(sides.size());
  const bool each = std::getenv("BENCH_EACH") != nullptr;
  for (int i = 0; i < times; ++i) {
    for (std::size_t j = 0; j < sides.size(); ++j) {
      const std::size_t k = (j + static_cast<std::size_t>(i)) % sides.size();
      out[k].v.push_back(sides[k]());
      if (each) std::fprintf(stderr, "round %d side %zu: %.2f M msg/s\n", i, k, out[k].v.back() / 1e6);
    }
  }
  return out;
}

/// One result line. `ratio` is the ratio of the two medians; with `paired`
/// (both sides from interleave) the line also gives pair_ratio_median, the
/// median of the rounds' own ratios, and pair_ratio_spread.
void print_line(const char* name, std::uint64_t n, const Runs& lb, const char* baseline, const Runs& base,
                const std::string& extra, bool paired = false) {
  std::string pairs;
  if (paired && lb.v.size() == base.v.size() && !lb.v.empty()) {
    Runs r;
    for (std::size_t i = 0; i < lb.v.size(); ++i) r.v.push_back(lb.v[i] / base.v[i]);
    char buf[96];
    std::snprintf(buf, sizeof buf, " pair_ratio_median=%.2f pair_ratio_spread=%.2f..%.2f", r.median(), r.min(), r.max());
    pairs = buf;
  }
  std::printf(
      "bench=inproc case=%s msgs=%llu lanebus_msgs_per_sec=%.0f baseline=%s baseline_msgs_per_sec=%.0f ratio=%.2f "
      "lanebus_spread=%.0f..%.0f baseline_spread=%.0f..%.0f%s%s\n",
      name, static_cast<unsigned long long>(n), lb.median(), baseline, base.median(), lb.median() / base.median(),
      lb.min(), lb.max(), base.min(), base.max(), pairs.c_str(), extra.c_str());
  std::fflush(stdout);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto c = line.find(':');
      if (c != std::string::npos) {
        auto s = line.substr(c + 1);
        s.erase(0, s.find_first_not_of(" \t"));
        return s;
      }
    }
  }
  return "unknown";
}

void print_header() {
#if BENCH_HAVE_ZMQ
  int major, minor, patch;
  zmq_version(&major, &minor, &patch);
  std::string zmq = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
#else
  std::string zmq = "none";
#endif
#if defined(__clang__)
  std::string compiler = "clang-" __clang_version__;
#elif defined(__GNUC__)
  std::string compiler = "gcc-" __VERSION__;
#else
  std::string compiler = "unknown";
#endif
  std::replace(compiler.begin(), compiler.end(), ' ', '_');
#ifdef __OPTIMIZE__
  const int optimized = 1;
#else
  const int optimized = 0;
#endif
#ifdef NDEBUG
  const int asserts = 0;
#else
  const int asserts = 1;
#endif
  std::string cpu = cpu_model();
  // The 1-minute load average at start: other work on the machine skews every number.
  std::string load = "unknown";
  if (std::ifstream in("/proc/loadavg"); in) in >> load;
  std::printf(
      "bench=inproc machine nproc=%u cpu=\"%s\" loadavg1=%s compiler=%s buildtype=%s optimized=%d asserts=%d "
      "lanebus=%s moodycamel=%s zmq=%s\n",
      std::thread::hardware_concurrency(), cpu.c_str(), load.c_str(), compiler.c_str(), BENCH_BUILDTYPE, optimized,
      asserts, LANEBUS_VERSION_STRING, BENCH_MOODYCAMEL_VERSION, zmq.c_str());
  if (!optimized || asserts)
    std::printf("WARNING: built %s%s%s; numbers are not representative (use --buildtype=release)\n",
                optimized ? "" : "without optimization", (!optimized && asserts) ? " and " : "",
                asserts ? "with asserts enabled (NDEBUG unset)" : "");
  std::fflush(stdout);
}

// ---------------------------------------------------------------- scenarios

struct Scenario {
  const char* name;
  const char* description;
  void (*run)(const Config&);
};

int workers_for(const Config& cfg, int dflt) { return cfg.workers_override > 0 ? cfg.workers_override : dflt; }

std::string oversub(int threads) {
  return threads > static_cast<int>(std::thread::hardware_concurrency()) ? " oversubscribed=1" : "";
}

void run_1to1(const Config& cfg) {
  const std::uint64_t n = cfg.msgs;
  // 1 producer + 1 worker = 2 threads, the same as the baselines' 1 producer + 1 consumer.
  const int w = workers_for(cfg, 1);
  std::vector<std::function<double()>> sides = {
      [&] { return lanebus_throughput(1, 1, w, n, cfg); },
      [&] { return mc_throughput(1, 1, n, cfg); },
      [&] { return asio_throughput(1, 1, w, n, cfg); },
      [&] { return mutex_throughput(1, 1, w, n, cfg); },
  };
#if BENCH_HAVE_ZMQ
  sides.push_back([&] { return zmq_throughput(n, cfg); });
#endif
  const std::vector<Runs> r = interleave(cfg.repeats, sides);  // rounds, not blocks
  const Runs& lb = r[0];
  std::string extra = " lanebus_workers=" + std::to_string(w) + " lanebus_threads=" + std::to_string(1 + w) +
                      " baseline_threads=2" + oversub(std::max(1 + w, 2));
  print_line("1to1", n, lb, "moodycamel", r[1], extra, true);
  print_line("1to1", n, lb, "asio_strand", r[2], extra, true);
  print_line("1to1", n, lb, "mutex_queue", r[3], extra, true);
#if BENCH_HAVE_ZMQ
  // zmq also runs an I/O thread per context (idle for inproc).
  print_line("1to1", n, lb, "zmq", r[4], extra, true);
#else
  std::printf("bench=inproc case=1to1 baseline=zmq skipped (built without libzmq)\n");
#endif
}

void run_2to2(const Config& cfg) {
  const std::uint64_t n = cfg.msgs / 2 * 2;
  // 2 workers, as the baseline has 2 consumers; both sides run 4 threads on the machine.
  const int w = workers_for(cfg, 2);
  const std::vector<Runs> r = interleave(cfg.repeats, {[&] { return lanebus_throughput(2, 2, w, n, cfg); },
                                                      [&] { return mc_throughput(2, 2, n, cfg); },
                                                      [&] { return asio_throughput(2, 2, w, n, cfg); },
                                                      [&] { return mutex_throughput(2, 2, w, n, cfg); }});
  print_line("2to2", n, r[0], "moodycamel", r[1],
             " lanebus_workers=" + std::to_string(w) + " lanebus_threads=" + std::to_string(2 + w) +
                 " baseline_threads=4" + oversub(std::max(2 + w, 4)),
             true);
  const std::string same = " lanebus_workers=" + std::to_string(w) + " lanebus_threads=" + std::to_string(2 + w) +
                           " baseline_threads=" + std::to_string(2 + w) + oversub(2 + w);
  print_line("2to2", n, r[0], "asio_strand", r[2], same, true);
  print_line("2to2", n, r[0], "mutex_queue", r[3], same, true);
}

void run_fanout(const Config& cfg) {
  const std::uint64_t n = cfg.msgs / 2;
  // lanebus: 2 workers (the default pool size on 2 cores) serve 4 groups; the
  // baseline needs a consumer thread per queue: 5 threads on the machine.
  const int w = workers_for(cfg, 2);
  const std::vector<Runs> r = interleave(cfg.repeats, {[&] { return lanebus_throughput(1, 4, w, n, cfg); },
                                                      [&] { return mc_throughput(1, 4, n, cfg); },
                                                      [&] { return asio_throughput(1, 4, w, n, cfg); },
                                                      [&] { return mutex_throughput(1, 4, w, n, cfg); }});
  print_line("fanout1to4", n, r[0], "moodycamel", r[1],
             " lanebus_workers=" + std::to_string(w) + " lanebus_threads=" + std::to_string(1 + w) +
                 " baseline_threads=5" + oversub(std::max(1 + w, 5)),
             true);
  // Asio and the mutex queue run on the lanebus worker count (1 + w threads).
  const std::string same = " lanebus_workers=" + std::to_string(w) + " lanebus_threads=" + std::to_string(1 + w) +
                           " baseline_threads=" + std::to_string(1 + w) + oversub(1 + w);
  print_line("fanout1to4", n, r[0], "asio_strand", r[2], same, true);
  print_line("fanout1to4", n, r[0], "mutex_queue", r[3], same, true);
}

void run_latency(const Config& cfg) {
  const std::uint64_t n = std::max<std::uint64_t>(cfg.msgs / 10, 1000);
  const std::uint64_t skip = n / 10;  // warm-up samples left out of the percentiles
  const int w = workers_for(cfg, 1);
  Latency lb = lanebus_latency(w, n, skip, cfg);
  Latency mc = mc_latency(n, skip, cfg);
  std::printf(
      "bench=inproc case=latency1to1 msgs=%llu lanebus_msgs_per_sec=%.0f baseline=moodycamel "
      "baseline_msgs_per_sec=%.0f ratio=%.2f lanebus_p50_ns=%lld lanebus_p99_ns=%lld baseline_p50_ns=%lld "
      "baseline_p99_ns=%lld lanebus_p999_ns=%lld baseline_p999_ns=%lld lanebus_max_ns=%lld baseline_max_ns=%lld "
      "pace_msgs_per_sec=100000 warmup_msgs=%llu lanebus_workers=%d\n",
      static_cast<unsigned long long>(n), lb.msgs_per_sec, mc.msgs_per_sec, lb.msgs_per_sec / mc.msgs_per_sec,
      static_cast<long long>(lb.p50), static_cast<long long>(lb.p99), static_cast<long long>(mc.p50),
      static_cast<long long>(mc.p99), static_cast<long long>(lb.p999), static_cast<long long>(mc.p999),
      static_cast<long long>(lb.max), static_cast<long long>(mc.max), static_cast<unsigned long long>(skip), w);
  std::fflush(stdout);
}

void run_1to1_batch64(const Config& cfg) {
  const std::uint64_t n = cfg.msgs;
  const int w = workers_for(cfg, 1);
  // Third side: the gain of batching itself, the same bus with one publish per message.
  const std::vector<Runs> r = interleave(cfg.repeats, {[&] { return lanebus_batch_throughput(w, n, cfg); },
                                                      [&] { return mc_bulk_throughput(n, cfg); },
                                                      [&] { return lanebus_throughput(1, 1, w, n, cfg); }});
  print_line("1to1_batch64", n, r[0], "moodycamel_bulk", r[1],
             " batch=64 lanebus_workers=" + std::to_string(w) + " lanebus_threads=" + std::to_string(1 + w) +
                 " baseline_threads=2" + oversub(std::max(1 + w, 2)),
             true);
  print_line("1to1_batch64", n, r[0], "lanebus_publish", r[2],
             " batch=64 lanebus_workers=" + std::to_string(w) + " baseline_threads=" + std::to_string(1 + w), true);
}

void run_metrics_overhead(const Config& cfg) {
  const std::uint64_t n = cfg.msgs;
  const int w = workers_for(cfg, 1);
  // The 1to1 case with BusOptions::metrics on (latency histogram + oldest-age
  // stores per message) against the same bus with it off. Runs alternate so
  // that drift on a shared machine hits both sides alike.
  const int times = cfg.smoke ? cfg.repeats : std::max(cfg.repeats, 5);
  Runs on, off;
  for (int i = 0; i < times; ++i) {
    on.v.push_back(lanebus_throughput(1, 1, w, n, cfg, true));
    off.v.push_back(lanebus_throughput(1, 1, w, n, cfg, false));
  }
  print_line("metrics_overhead", n, on, "metrics_off", off,
             " lanebus_workers=" + std::to_string(w) + " repeats=" + std::to_string(times));
}

// ---------------------------------------------------------------- tenancy_1to1
// 1to1 published through an access-checked Client into a namespace whose
// publish and consume quotas are far above the rate, against the plain 1to1
// (doc/tenancy.md). Target: ratio >= 0.9.
double tenancy_throughput(std::uint64_t n, int workers, const Config& cfg, bool tenancy) {
  auto b = Bus::open({.name = "bench", .workers = static_cast<std::size_t>(workers), .access_control = tenancy});
  if (!b.ok()) die("Bus::open: " + b.status().to_string());
  auto bus = std::move(*b);
  lanebus::Client client;
  if (tenancy) {
    lanebus::NamespacePolicy p;
    p.publish = {.msgs_per_s = 1e12, .bytes_per_s = 1e15, .burst_s = 1};
    p.consume = {.msgs_per_s = 1e12, .bytes_per_s = 1e15, .burst_s = 1};
    if (!bus->namespaces()->create("bench", p).ok()) die("namespaces: create");
    if (!bus->namespaces()->add_credential({"bench-svc", "bench-secret"}, {{.prefix = "bench", .publish = true,
                                                                           .consume = true}}).ok())
      die("namespaces: add_credential");
  }
  auto cr = bus->client({"bench-svc", "bench-secret"});
  if (!cr.ok()) die("client: " + cr.status().to_string());
  client = std::move(*cr);
  lanebus::Topic topic = bus->create_topic("bench.tenancy", {.lanes = 8}).value();
  GroupDone gd;
  auto sub = client.subscribe(topic, "g", [&gd, n](const MessageView& m) {
    std::uint64_t seq;
    std::memcpy(&seq, m.payload().data(), sizeof seq);
    do_not_optimize(seq);
    if (gd.count.fetch_add(1, std::memory_order_relaxed) + 1 == n) gd.done_ns.store(now_ns(), std::memory_order_release);
    return Outcome::ack();
  });
  if (!sub.ok()) die("subscribe: " + sub.status().to_string());
  Msg m;
  const std::int64_t t0 = now_ns();
  for (std::uint64_t i = 0; i < n; ++i) {
    m.seq = i;
    lanebus::OutgoingMessage om{.key = keys()[i % kKeys],
                                .payload = std::string_view(reinterpret_cast<const char*>(&m), sizeof m)};
    lanebus::Status s;
    while ((s = tenancy ? client.publish(topic, om) : topic.publish(om)).code() == lanebus::Code::TimedOut) {
    }
    if (!s.ok()) die("publish: " + s.to_string());
  }
  while (gd.done_ns.load(std::memory_order_acquire) == 0) {
    if (cfg.smoke) std::this_thread::sleep_for(std::chrono::microseconds(50));
    cpu_relax();
  }
  const std::int64_t end = gd.done_ns.load();
  (void)sub->close();
  (void)bus->shutdown(lanebus::ShutdownMode::Drain);
  return rate(n, end - t0);
}

// ---------------------------------------------------------------- record_1to1
// Typed records (doc/schemas.md) against the same flow with a raw payload:
// the producer builds a 3-field record (RecordBuilder, allocation-free) and
// publishes it to a topic with a schema (checked at publish); the handler
// reads the 3 fields by name through Schemas::view (usage-counted). The raw
// side memcpy's a struct of the same 3 fields both ways.

struct RawShipment {
  std::uint64_t seq;
  double weight;
  char zone[8];
};

// How the typed side reads its fields: FieldKeys (names resolved once, the
// documented way) or a name string per read.
enum class Reads { Raw, Keys, Names };

double record_throughput(Reads reads, std::uint64_t n, const Config& cfg) {
  const bool typed = reads != Reads::Raw;
  auto bus = open_bus(1);
  if (typed) {
    auto sv = lanebus::SchemaVersion::from_json(R"({"fields": [
      {"id": 1, "name": "seq", "type": "uint64"},
      {"id": 2, "name": "weight", "type": "double", "default": 0},
      {"id": 3, "name": "zone", "type": "string", "default": ""}]})");
    if (!sv.ok() || !bus->schemas().register_schema("bench.records", *sv).ok()) die("register_schema");
  }
  auto topic_r = bus->create_topic("bench.records", {.lanes = 8});
  if (!topic_r.ok()) die("create_topic: " + topic_r.status().to_string());
  lanebus::Topic topic = *topic_r;
  lanebus::Schemas schemas = bus->schemas();
  std::vector<std::unique_ptr<GroupDone>> done;
  done.push_back(std::make_unique<GroupDone>());
  GroupDone* gd = done.back().get();
  auto sub = bus->subscribe(topic, "reader", [gd, n, reads, &schemas](const MessageView& m) {
    static const lanebus::FieldKey kSeq("seq"), kWeight("weight"), kZone("zone");
    if (reads == Reads::Keys) {
      auto v = schemas.view("bench.records", m);
      if (!v.ok()) die("view: " + v.status().to_string());
      do_not_optimize(*v->get_uint64(kSeq));
      do_not_optimize(*v->get_double(kWeight));
      do_not_optimize(v->get_string(kZone)->size());
    } else if (reads == Reads::Names) {
      auto v = schemas.view("bench.records", m);
      if (!v.ok()) die("view: " + v.status().to_string());
      do_not_optimize(*v->get_uint64("seq"));
      do_not_optimize(*v->get_double("weight"));
      do_not_optimize(v->get_string("zone")->size());
    } else {
      RawShipment r;
      std::memcpy(&r, m.payload().data(), sizeof r);
      do_not_optimize(r.seq);
      do_not_optimize(r.weight);
      do_not_optimize(r.zone[0]);
    }
    if (gd->count.fetch_add(1, std::memory_order_relaxed) + 1 == n) gd->done_ns.store(now_ns(), std::memory_order_release);
    return Outcome::ack();
  });
  if (!sub.ok()) die("subscribe: " + sub.status().to_string());
  Gate gate;
  std::thread producer([&, pub = bus->publisher()]() mutable {
    char buf[64];
    gate.arrive_and_wait();
    for (std::uint64_t i = 0; i < n; ++i) {
      lanebus::OutgoingMessage om{.key = keys()[i % kKeys]};
      RawShipment r{i, 1.5, "EU-7"};
      if (typed) {
        lanebus::RecordBuilder b(buf, sizeof buf);
        b.add_uint64(1, i).add_double(2, 1.5).add_string(3, "EU-7");
        om.payload = *b.finish();
      } else {
        om.payload = std::string_view(reinterpret_cast<const char*>(&r), sizeof r);
      }
      for (;;) {
        lanebus::Status s = pub.publish(topic, om);
        if (s.ok()) break;
        if (s.code() != lanebus::Code::TimedOut) die("publish: " + s.to_string());
      }
    }
  });
  std::int64_t t0 = gate.open_when(1);
  std::int64_t end = wait_all(done, cfg, typed ? "record" : "raw");
  producer.join();
  if (gd->count.load() != n) die("record_1to1: handled " + std::to_string(gd->count.load()));
  (void)sub->close();
  (void)bus->shutdown(lanebus::ShutdownMode::Drain);
  return rate(n, end - t0);
}

void run_tenancy_overhead(const Config& cfg) {
  const std::uint64_t n = cfg.msgs;
  const int w = workers_for(cfg, 1);
  const int times = cfg.smoke ? cfg.repeats : std::max(cfg.repeats, 5);
  Runs on, off, pairs;
  // The second run of a pair is faster on this kind of VM (measured: the
  // side run second gained up to 40 %), so: one discarded warm-up of each,
  // then the order alternates (ABBA), and drift and position hit both sides alike.
  if (!cfg.smoke) {
    (void)tenancy_throughput(n, w, cfg, true);
    (void)tenancy_throughput(n, w, cfg, false);
  }
  for (int i = 0; i < times; ++i) {
    const bool on_first = (i % 2) == 0;
    if (on_first) on.v.push_back(tenancy_throughput(n, w, cfg, true));
    off.v.push_back(tenancy_throughput(n, w, cfg, false));
    if (!on_first) on.v.push_back(tenancy_throughput(n, w, cfg, true));
    pairs.v.push_back(on.v.back() / off.v.back());
  }
  char pr[48];
  std::snprintf(pr, sizeof pr, " pair_ratio_median=%.2f", pairs.median());
  print_line("tenancy_1to1", n, on, "no_access_control", off,
             " lanebus_workers=" + std::to_string(w) + " repeats=" + std::to_string(times) + pr + " target_ratio=0.90");
}

void run_record_1to1(const Config& cfg) {
  const std::uint64_t n = cfg.msgs;
  const int times = cfg.smoke ? cfg.repeats : std::max(cfg.repeats, 5);
  // Alternate the two sides so drift on a shared machine hits both alike;
  // the ratio of each adjacent pair is less exposed to load swings than the
  // ratio of the medians, so both are printed.
  Runs rec, named, raw, pairs, named_pairs;
  for (int i = 0; i < times; ++i) {
    rec.v.push_back(record_throughput(Reads::Keys, n, cfg));
    raw.v.push_back(record_throughput(Reads::Raw, n, cfg));
    named.v.push_back(record_throughput(Reads::Names, n, cfg));
    pairs.v.push_back(rec.v.back() / raw.v.back());
    named_pairs.v.push_back(named.v.back() / raw.v.back());
  }
  char extra[160];
  std::snprintf(extra, sizeof extra,
                " lanebus_workers=1 fields_read=3 reads=field_keys repeats=%d pair_ratio_median=%.2f target_ratio=0.70",
                times, pairs.median());
  print_line("record_1to1", n, rec, "raw_payload", raw, extra);
  std::snprintf(extra, sizeof extra, " lanebus_workers=1 fields_read=3 reads=name_strings repeats=%d pair_ratio_median=%.2f",
                times, named_pairs.median());
  print_line("record_1to1_names", n, named, "raw_payload", raw, extra);
}

// ---------------------------------------------------------------- typed topics and large payloads

/// The 48-byte trivially copyable event of typed_1to1.
struct Tick48 {
  std::uint64_t seq = 0;
  double v[5] = {};
};
static_assert(sizeof(Tick48) == 48 && std::is_trivially_copyable_v<Tick48>);

/// The event of typed_string_1to1: two std::string members (short: in-object
/// storage, so neither side allocates for the characters) and a sequence.
struct Named {
  std::string camera;
  std::string setting;
  std::uint64_t seq = 0;
};

/// One producer -> one group of `make_topic`'s topic, publishing `n` items
/// with `publish(i)`; the handler `seen` reads the item. Returns msgs/s.
template <typename Publish, typename Subscribe>
double lanebus_1to1_with(std::uint64_t n, const Config& cfg, Subscribe&& subscribe, Publish&& publish) {
  auto done = std::make_unique<GroupDone>();
  GroupDone* gd = done.get();
  auto note = [gd, n] {
    if (gd->count.fetch_add(1, std::memory_order_relaxed) + 1 == n) gd->done_ns.store(now_ns(), std::memory_order_release);
  };
  lanebus::Subscription sub = subscribe(note);
  Gate gate;
  std::thread producer([&] {
    gate.arrive_and_wait();
    for (std::uint64_t i = 0; i < n; ++i) {
      for (;;) {
        lanebus::Status st = publish(i);
        if (st.ok()) break;
        if (st.code() != lanebus::Code::TimedOut) die("publish: " + st.to_string());
      }
    }
  });
  std::int64_t t0 = gate.open_when(1);
  std::vector<std::unique_ptr<GroupDone>> all;
  all.push_back(std::move(done));
  std::int64_t end = wait_all(all, cfg, "lanebus");
  producer.join();
  return rate(n, end - t0);
}

double typed48_throughput(std::uint64_t n, const Config& cfg) {
  auto bus = open_bus(1);
  auto topic = bus->create_topic<Tick48>("bench.typed", lanebus::TopicOptions{.lanes = 8});
  if (!topic.ok()) die("create_topic<T>: " + topic.status().to_string());
  return lanebus_1to1_with(
      n, cfg,
      [&](auto note) {
        auto s = bus->subscribe<Tick48>(*topic, "g", [note](const Tick48& t, const lanebus::Delivery&) mutable {
          do_not_optimize(t.seq);
          note();
          return Outcome::ack();
        });
        if (!s.ok()) die("subscribe<T>: " + s.status().to_string());
        return std::move(*s);
      },
      [&](std::uint64_t i) {
        Tick48 t;
        t.seq = i;
        return topic->publish(t, lanebus::OutgoingMessage{.key = keys()[i % kKeys]});
      });
}

// `delay_ns` > 0: every message published with OutgoingMessage::delay (delayed_1to1, doc/delays.md).
// `capacity`: the topic's slots (0: the default, 4096).
double bytes_throughput(std::size_t size, std::uint64_t n, const Config& cfg, std::int64_t delay_ns = 0,
                        std::uint32_t capacity = 0) {
  auto bus = open_bus(1);
  lanebus::TopicOptions to{.lanes = 8};
  if (capacity != 0) to.capacity = capacity;
  auto topic = bus->create_topic("bench.bytes", to);
  if (!topic.ok()) die("create_topic: " + topic.status().to_string());
  std::string payload(size, 'p');
  return lanebus_1to1_with(
      n, cfg,
      [&](auto note) {
        auto s = bus->subscribe(*topic, "g", [note](const MessageView& m) mutable {
          std::uint64_t seq;
          std::memcpy(&seq, m.payload().data(), sizeof seq);
          do_not_optimize(seq);
          note();
          return Outcome::ack();
        });
        if (!s.ok()) die("subscribe: " + s.status().to_string());
        return std::move(*s);
      },
      [&](std::uint64_t i) {
        std::memcpy(payload.data(), &i, sizeof i);
        lanebus::OutgoingMessage m{.key = keys()[i % kKeys], .payload = payload};
        m.delay = std::chrono::nanoseconds(delay_ns);
        return topic->publish(m);
      });
}

double typed_string_throughput(std::uint64_t n, const Config& cfg) {
  auto bus = open_bus(1);
  auto topic = bus->create_topic<Named>("bench.named", lanebus::TopicOptions{.lanes = 8});
  if (!topic.ok()) die("create_topic<T>: " + topic.status().to_string());
  return lanebus_1to1_with(
      n, cfg,
      [&](auto note) {
        auto s = bus->subscribe<Named>(*topic, "g", [note](const Named& e, const lanebus::Delivery&) mutable {
          do_not_optimize(e.seq + e.camera.size() + e.setting.size());
          note();
          return Outcome::ack();
        });
        if (!s.ok()) die("subscribe<T>: " + s.status().to_string());
        return std::move(*s);
      },
      [&](std::uint64_t i) {
        return topic->publish(Named{keys()[i % kKeys], "display.theme", i},
                              lanebus::OutgoingMessage{.key = keys()[i % kKeys]});
      });
}

/// asio_throughput's idiom (a strand per lane on `workers` threads), posting
/// a lambda that owns the Named event (moved in).
double asio_named_throughput(int workers, std::uint64_t n, const Config& cfg) {
  constexpr int kLanes = 8;
  boost::asio::io_context ioc(workers);
  auto guard = boost::asio::make_work_guard(ioc);
  using Strand = boost::asio::strand<boost::asio::io_context::executor_type>;
  std::vector<Strand> strands;
  for (int l = 0; l < kLanes; ++l) strands.push_back(boost::asio::make_strand(ioc));
  std::vector<std::unique_ptr<GroupDone>> done;
  done.push_back(std::make_unique<GroupDone>());
  GroupDone* gd = done.back().get();
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) pool.emplace_back([&] { ioc.run(); });
  Gate gate;
  std::thread producer([&] {
    gate.arrive_and_wait();
    for (std::uint64_t i = 0; i < n; ++i) {
      Named e{keys()[i % kKeys], "display.theme", i};
      boost::asio::post(strands[(i % kKeys) % kLanes], [e = std::move(e), gd, n] {
        do_not_optimize(e.seq + e.camera.size() + e.setting.size());
        if (gd->count.fetch_add(1, std::memory_order_relaxed) + 1 == n) gd->done_ns.store(now_ns(), std::memory_order_release);
      });
    }
  });
  std::int64_t t0 = gate.open_when(1);
  std::int64_t end = wait_all(done, cfg, "asio_strand");
  producer.join();
  guard.reset();
  ioc.stop();
  for (auto& t : pool) t.join();
  return rate(n, end - t0);
}

/// The hand-rolled alternative for large payloads: a preallocated pool of
/// `size`-byte buffers whose free indices live in one moodycamel queue and
/// whose filled indices travel in another; the producer copies the payload
/// into a free buffer, the consumer reads it and gives the buffer back.
double mc_pool_throughput(std::size_t size, std::uint64_t n, const Config& cfg) {
  constexpr std::uint32_t kBuffers = 4096;  // the lanebus topic's capacity
  std::vector<char> memory(std::size_t(kBuffers) * size);
  // Each explicit producer keeps the blocks it took (mc_throughput's note):
  // the free queue has two producers (the initial fill, the consumer's
  // returns), so it is sized for both.
  moodycamel::ConcurrentQueue<std::uint32_t> free_q(2 * kBuffers + 64), full_q(kBuffers + 32);
  moodycamel::ProducerToken free_ptok(free_q), full_ptok(full_q);
  for (std::uint32_t i = 0; i < kBuffers; ++i)
    if (!free_q.try_enqueue(free_ptok, i)) die("moodycamel: pre-sized free queue refused");
  std::string payload(size, 'p');
  std::vector<std::unique_ptr<GroupDone>> done;
  done.push_back(std::make_unique<GroupDone>());
  GroupDone* gd = done.back().get();
  std::thread consumer([&] {
    moodycamel::ConsumerToken ctok(full_q);
    moodycamel::ProducerToken back(free_q);
    std::uint64_t got = 0;
    std::uint32_t idx;
    while (got < n) {
      if (full_q.try_dequeue(ctok, idx)) {
        std::uint64_t seq;
        std::memcpy(&seq, memory.data() + std::size_t(idx) * size, sizeof seq);
        do_not_optimize(seq);
        while (!free_q.try_enqueue(back, idx)) cpu_relax();
        ++got;
      } else {
        cpu_relax();
      }
    }
    gd->count.store(got, std::memory_order_relaxed);
    gd->done_ns.store(now_ns(), std::memory_order_release);
  });
  Gate gate;
  std::thread producer([&] {
    moodycamel::ConsumerToken ftok(free_q);
    gate.arrive_and_wait();
    std::uint32_t idx;
    for (std::uint64_t i = 0; i < n; ++i) {
      while (!free_q.try_dequeue(ftok, idx)) std::this_thread::yield();
      std::memcpy(payload.data(), &i, sizeof i);
      std::memcpy(memory.data() + std::size_t(idx) * size, payload.data(), size);
      while (!full_q.try_enqueue(full_ptok, idx)) std::this_thread::yield();
    }
  });
  std::int64_t t0 = gate.open_when(1);
  std::int64_t end = wait_all(done, cfg, "moodycamel_pool");
  producer.join();
  consumer.join();
  return rate(n, end - t0);
}

void run_typed_1to1(const Config& cfg) {
  const std::uint64_t n = cfg.msgs;
  Runs typed = repeat(cfg.repeats, [&] { return typed48_throughput(n, cfg); });
  Runs bytes = repeat(cfg.repeats, [&] { return bytes_throughput(sizeof(Tick48), n, cfg); });
  print_line("typed_1to1", n, typed, "bytes_1to1_48B", bytes,
             " payload_bytes=48 lanebus_workers=1 publish=Topic::publish_both");
}

void run_delayed_1to1(const Config& cfg) {
  // Both sides through Topic::publish of 64-byte payloads, 1 worker, the
  // same topic options. A delayed message holds its slot until it is
  // handled, so the slots in use are rate × delay (Little's law): with the
  // default 4096 slots a 1 ms delay caps any implementation at 4.1 M msg/s,
  // and the case measured the pool's size, not the delayed path (2026-12-04:
  // 3.5 M msg/s before and after halving the timer thread's work; perf:
  // the publisher yielding in acquire_slot). Both sides get 64 Ki slots
  // (16 ms of the undelayed rate), as a user would size a topic for the
  // delays it carries (doc/delays.md, "Sizing").
  const std::uint64_t n = cfg.msgs;
  constexpr std::uint32_t kSlots = 1u << 16;
  Runs delayed = repeat(cfg.repeats, [&] { return bytes_throughput(64, n, cfg, 1'000'000, kSlots); });
  Runs plain = repeat(cfg.repeats, [&] { return bytes_throughput(64, n, cfg, 0, kSlots); });
  print_line("delayed_1to1", n, delayed, "1to1_undelayed", plain,
             " delay_ms=1 payload_bytes=64 capacity=65536 lanebus_workers=1 publish=Topic::publish_both");
}

void run_typed_string_1to1(const Config& cfg) {
  const std::uint64_t n = cfg.msgs;
  Runs typed = repeat(cfg.repeats, [&] { return typed_string_throughput(n, cfg); });
  Runs asio = repeat(cfg.repeats, [&] { return asio_named_throughput(1, n, cfg); });
  print_line("typed_string_1to1", n, typed, "asio_strand", asio, " event=2_strings+u64 workers=1");
}

void run_payload_4k_1to1(const Config& cfg) {
  const std::uint64_t n = cfg.msgs;
  Runs lb = repeat(cfg.repeats, [&] { return bytes_throughput(4096, n, cfg); });
  Runs mc = repeat(cfg.repeats, [&] { return mc_pool_throughput(4096, n, cfg); });
  print_line("payload_4k_1to1", n, lb, "moodycamel_pool", mc, " payload_bytes=4096 lanebus_workers=1");
}

void run_payload_64k_1to1(const Config& cfg) {
  const std::uint64_t n = std::max<std::uint64_t>(cfg.msgs / 16, 4);
  Runs lb = repeat(cfg.repeats, [&] { return bytes_throughput(64 * 1024, n, cfg); });
  Runs mc = repeat(cfg.repeats, [&] { return mc_pool_throughput(64 * 1024, n, cfg); });
  print_line("payload_64k_1to1", n, lb, "moodycamel_pool", mc,
             " payload_bytes=65536 lanebus_workers=1 lanebus_MiB_per_sec=" +
                 std::to_string(static_cast<long long>(lb.median() * 65536 / (1 << 20))));
}

const Scenario kScenarios[] = {
    {"1to1",
     "1 producer -> 1 group (lanebus 1 worker, 16 keys over 8 lanes) vs moodycamel 1P/1C, asio strands and a "
     "mutex queue on 1 worker, zmq PUSH/PULL",
     run_1to1},
    {"1to1_batch64",
     "1to1 with Publisher::publish_batch in spans of 64 and a batch handler (subscribe_batch) vs moodycamel try_enqueue_bulk / try_dequeue_bulk of 64",
     run_1to1_batch64},
    {"2to2", "2 producers -> 2 groups, each group gets every message, vs moodycamel 2 queues x 2P, 2C", run_2to2},
    {"fanout1to4", "1 producer -> 4 groups (msgs/2 per run) vs moodycamel 4 queues, 4 consumers", run_fanout},
    {"metrics_overhead", "1to1 with BusOptions::metrics on vs off (the cost of latency/age recording)",
     run_metrics_overhead},
    {"tenancy_1to1", "1to1 through an access-checked Client with quotas far above the rate vs plain 1to1",
     run_tenancy_overhead},
    {"latency1to1", "publish -> handler latency at 100,000 msg/s (msgs/10) vs moodycamel with a spinning consumer",
     run_latency},
    {"record_1to1", "typed records: build + schema check + read 3 fields by name (counted; FieldKeys, and name "
     "strings as record_1to1_names) vs the same flow with a raw struct payload", run_record_1to1},
    {"typed_1to1", "TypedTopic<T> of a 48-byte trivially copyable struct vs bytes 1to1 of 48 bytes (both Topic::publish)",
     run_typed_1to1},
    {"typed_string_1to1", "TypedTopic<T> of a struct with two std::string members (constructed in the slot) vs "
     "asio strands posting the same struct", run_typed_string_1to1},
    {"payload_4k_1to1", "4 KiB bytes payloads (size-classed blocks) vs moodycamel moving 4 KiB buffers of a "
     "preallocated pool", run_payload_4k_1to1},
    {"payload_64k_1to1", "64 KiB bytes payloads (msgs/16) vs the same moodycamel buffer pool", run_payload_64k_1to1},
    {"delayed_1to1", "1to1 with every message delayed by 1 ms (OutgoingMessage::delay, the topic's delay heap) vs "
     "the same 1to1 undelayed (both Topic::publish, 64-byte payloads)", run_delayed_1to1},
};

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: inproc [--smoke] [--run NAME] [--msgs N] [--repeats N] [--workers N] [--list]\n");
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(2);
      return argv[++i];
    };
    if (a == "--smoke") {
      cfg.smoke = true;
    } else if (a == "--run") {
      cfg.run = value();
    } else if (a == "--msgs") {
      cfg.msgs = std::strtoull(value(), nullptr, 10);
    } else if (a == "--repeats") {
      cfg.repeats = std::atoi(value());
    } else if (a == "--workers") {
      cfg.workers_override = std::atoi(value());
    } else if (a == "--list") {
      list = true;
    } else if (a == "--help" || a == "-h") {
      usage(0);
    } else {
      usage(2);
    }
  }
  if (cfg.smoke) {
    bool msgs_given = false, repeats_given = false;
    for (int i = 1; i < argc; ++i) {
      msgs_given |= std::string_view(argv[i]) == "--msgs";
      repeats_given |= std::string_view(argv[i]) == "--repeats";
    }
    // Under TSan every atomic is instrumented and the spinning baselines share
    // 2 cores with 4+ threads: a quarter of the messages still runs every case.
#if defined(__SANITIZE_THREAD__)
    constexpr std::uint64_t kSmokeMsgs = 5'000;
#else
    constexpr std::uint64_t kSmokeMsgs = 20'000;
#endif
    if (!msgs_given) cfg.msgs = kSmokeMsgs;
    // One run per case: the smoke checks that every case runs and loses
    // nothing; under TSan a repeat of the spinning baselines costs seconds.
    if (!repeats_given) cfg.repeats = 1;
    cfg.wait_limit_ns = 20'000'000'000;
  }
  if (cfg.msgs < 4 || cfg.repeats < 1) usage(2);
  if (list) {
    for (const auto& s : kScenarios) std::printf("%-12s %s\n", s.name, s.description);
    return 0;
  }
  bool found = cfg.run.empty();
  for (const auto& s : kScenarios) found |= cfg.run == s.name;
  if (!found) {
    std::fprintf(stderr, "inproc: no scenario named \"%s\" (try --list)\n", cfg.run.c_str());
    return 2;
  }

  print_header();
  if (cfg.smoke) {
    // A smoke run takes seconds; one still running after 100 s is stuck.
    // Say where, and fail, before meson's 120 s timeout kills it silently
    // (a CI run's TSan stage once timed out in case 2to2 with no clue).
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(100));
      std::fprintf(stderr, "bench=inproc ERROR: the smoke run is stuck after 100 s in case %s, step \"%s\"\n",
                   g_case.load(std::memory_order_relaxed), g_step.load(std::memory_order_relaxed));
      std::fflush(stdout);
      std::_Exit(1);
    }).detach();
  }
  for (const auto& s : kScenarios) {
    if (!cfg.run.empty() && cfg.run != s.name) continue;
    std::printf("# case=%s: %s\n", s.name, s.description);
    g_case.store(s.name, std::memory_order_relaxed);
    step("");
    s.run(cfg);
  }
  return 0;
}
