// lanebus — MIT License.
// bench/bridge: the bridge to NATS JetStream against nats.c's own async
// JetStream publish, on the same messages and the same nats-server, in the
// same run. Scenarios (--run NAME):
//   out      stored messages -> JetStream through Bridge::mirror_out, vs
//            js_PublishMsgAsync of the same messages (same headers, msg ids)
//   in       JetStream -> a durable topic through Bridge::mirror_in
//   e2e      local publish -> JetStream -> local delivery in a second store:
//            p50 / p99 of created_at -> handler (paced, not a throughput run)
// --smoke: tiny counts (suite bench-smoke). --messages N overrides the count.
#include <nats/nats.h>
#include <sys/utsname.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/bridge.hpp"
#include "lanebus/lanebus.hpp"
#include "nats_server.hpp"
#include "temp_dir.hpp"

using namespace lanebus;
using Clock = std::chrono::steady_clock;

namespace {

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

template <class Pred>
bool wait_for(Pred p, std::chrono::seconds limit) {
  const auto end = Clock::now() + limit;
  while (!p()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

std::string key_of(std::uint64_t i) { return "k" + std::to_string(i % 64); }
std::string payload_of(std::uint64_t i) {
  std::string p = key_of(i) + ":" + std::to_string(i / 64) + ":";
  p.resize(64, 'x');
  return p;
}

std::unique_ptr<Bus> open_bus(const std::string& dir, std::size_t workers) {
  BusOptions o;
  o.store.directory = dir;
  o.workers = workers;
  o.durable_poll = std::chrono::milliseconds(5);
  o.dlq.poison_after_crashes = 0;
  auto b = Bus::open(o);
  if (!b.ok()) {
    std::fprintf(stderr, "bench/bridge: %s\n", b.status().to_string().c_str());
    std::exit(1);
  }
  return std::move(*b);
}

Topic topic(Bus& bus, const char* name, std::uint32_t lanes) {
  TopicOptions t;
  t.durable = true;
  t.lanes = lanes;
  auto r = bus.create_topic(name, t);
  if (!r.ok()) std::exit(1);
  return *r;
}

void fill(Topic& t, std::uint64_t n) {
  std::atomic<std::uint64_t> done{0};
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::string k = key_of(i), p = payload_of(i);
    OutgoingMessage m;
    m.key = k;
    m.payload = p;
    if (!t.publish_async(m, [&](const Status&, std::uint64_t) { done.fetch_add(1); }).ok()) std::exit(1);
  }
  wait_for([&] { return done.load() == n; }, std::chrono::seconds(300));
}

BridgeOptions bridge_options(const std::string& url) {
  BridgeOptions o;
  o.urls = {url};
  o.backoff_initial = std::chrono::milliseconds(10);
  return o;
}

/// nats.c's own async JetStream publish of the same n messages (same
/// subject scheme and headers, a Nats-Msg-Id each). Returns msgs/s.
double baseline_async(const std::string& url, std::uint64_t n) {
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  if (natsConnection_ConnectTo(&nc, url.c_str()) != NATS_OK) return 0;
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.PublishAsync.MaxPending = 4096;
  if (natsConnection_JetStream(&js, nc, &jo) != NATS_OK) return 0;
  jsStreamConfig cfg;
  jsStreamConfig_Init(&cfg);
  cfg.Name = "BASE";
  const char* subj[] = {"base.*"};
  cfg.Subjects = subj;
  cfg.SubjectsLen = 1;
  cfg.Storage = js_FileStorage;
  jsStreamInfo* si = nullptr;
  if (js_AddStream(&si, js, &cfg, nullptr, nullptr) != NATS_OK) return 0;
  jsStreamInfo_Destroy(si);
  const auto t0 = Clock::now();
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::string subject = "base." + key_of(i), p = payload_of(i);
    const std::string id = "0123456789abcdef.orders.0." + std::to_string(i);
    natsMsg* m = nullptr;
    natsMsg_Create(&m, subject.c_str(), nullptr, p.data(), static_cast<int>(p.size()));
    natsMsgHeader_Set(m, "Lanebus-Key", key_of(i).c_str());
    natsMsgHeader_Set(m, "Lanebus-Created-At", "1764576000000000000");
    natsMsgHeader_Set(m, "Lanebus-Attempt", "1");
    natsMsgHeader_Set(m, "Lanebus-Topic", "orders");
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MsgId = id.c_str();
    if (js_PublishMsgAsync(js, &m, &po) != NATS_OK) {
      natsMsg_Destroy(m);
      return 0;
    }
  }
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MaxWait = 60000;
  const natsStatus st = js_PublishAsyncComplete(js, &po);
  const double s = secs(Clock::now() - t0);
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
  return st == NATS_OK ? static_cast<double>(n) / s : 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool smoke = false;
  std::string run;
  std::uint64_t n = 20000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--smoke") == 0) {
      smoke = true;
      n = 1000;
    } else if (std::strcmp(argv[i], "--run") == 0 && i + 1 < argc) {
      run = argv[++i];
    } else if (std::strcmp(argv[i], "--messages") == 0 && i + 1 < argc) {
      n = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: bridge [--smoke] [--run out|in|e2e] [--messages N]\n");
      return 2;
    }
  }
  utsname u{};
  uname(&u);
  std::printf("machine=%s cores=%u compiler=%s build=%s nats.c=%s\n", u.machine, std::thread::hardware_concurrency(),
              __VERSION__, BENCH_BUILDTYPE, nats_GetVersion());
#ifndef NDEBUG
  std::printf("WARNING: asserts are enabled (not a release build); numbers are pessimistic\n");
#endif
  std::fflush(stdout);
  if (lanebus::test::nats_server_binary().empty()) {
    std::fprintf(stderr, "bench/bridge: nats-server not found (apt-get install nats-server)\n");
    return smoke && !lanebus::test::nats_server_required() ? 77 : 1;
  }
  lanebus::test::TempDir tmp;
  lanebus::test::NatsServer server(tmp.file("nats"));
  if (!server.start()) {
    std::fprintf(stderr, "bench/bridge: nats-server did not start\n");
    return 1;
  }
  const std::string url = server.url();
  int rc = 0;

  double out_rate = 0;
  if (run.empty() || run == "out" || run == "in") {
    // Baseline first, then lanebus on a separate stream (same server, same run).
    const double base = baseline_async(url, n);
    auto edge = open_bus(tmp.file("edge"), 16);
    Topic orders = topic(*edge, "orders", 16);
    fill(orders, n);  // stored before the clock starts: the bridge reads a backlog
    auto b = Bridge::open(*edge, bridge_options(url));
    if (!b.ok()) return 1;
    const auto t0 = Clock::now();
    if (!(*b)->mirror_out(orders, "orders.{key}", "ORDERS").ok()) return 1;
    if (!wait_for([&] { return (*b)->stats().total.acked >= n; }, std::chrono::seconds(600))) rc = 1;
    out_rate = static_cast<double>(n) / secs(Clock::now() - t0);
    std::printf("case=out messages=%llu lanes=16 workers=16 lanebus_msgs_per_s=%.0f baseline=nats_c_async_js "
                "baseline_msgs_per_s=%.0f ratio=%.2f\n",
                static_cast<unsigned long long>(n), out_rate, base, base > 0 ? out_rate / base : 0.0);
    std::fflush(stdout);
    if (run.empty() || run == "in") {
      auto cloud = open_bus(tmp.file("cloud"), 2);
      Topic in = topic(*cloud, "orders-in", 16);
      auto back = Bridge::open(*cloud, bridge_options(url));
      if (!back.ok()) return 1;
      const auto t1 = Clock::now();
      if (!(*back)->mirror_in("ORDERS", "bench", in).ok()) return 1;
      if (!wait_for([&] { return (*back)->stats().total.stored >= n; }, std::chrono::seconds(600))) rc = 1;
      const double in_rate = static_cast<double>(n) / secs(Clock::now() - t1);
      std::printf("case=in messages=%llu fetch_batch=256 lanebus_msgs_per_s=%.0f\n", static_cast<unsigned long long>(n),
                  in_rate);
      std::fflush(stdout);
    }
  }

  if (run.empty() || run == "e2e") {
    const std::uint64_t m = smoke ? 200 : 2000;
    auto a = open_bus(tmp.file("e2e-a"), 8);
    auto c = open_bus(tmp.file("e2e-b"), 2);
    Topic src = topic(*a, "e2e", 8);
    Topic dst = topic(*c, "e2e-in", 8);
    std::atomic<std::uint64_t> got{0};
    auto sub = c->subscribe(dst, "sink", [&](const MessageView&) {
      got.fetch_add(1);
      return Outcome::ack();
    });
    if (!sub.ok()) return 1;
    auto ba = Bridge::open(*a, bridge_options(url));
    auto bc = Bridge::open(*c, bridge_options(url));
    if (!ba.ok() || !bc.ok()) return 1;
    if (!(*ba)->mirror_out(src, "e2e.{key}", "E2E").ok() || !(*bc)->mirror_in("E2E", "sink", dst).ok()) return 1;
    // Paced at ~2,000 msgs/s so the figure is latency, not queueing.
    for (std::uint64_t i = 0; i < m; ++i) {
      const std::string k = key_of(i), p = payload_of(i);
      OutgoingMessage om;
      om.key = k;
      om.payload = p;
      (void)src.publish_async(om, [](const Status&, std::uint64_t) {});
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    if (!wait_for([&] { return got.load() >= m; }, std::chrono::seconds(120))) rc = 1;
    LatencyHistogram h;
    for (const TopicStats& t : c->stats().topics)
      if (t.name == "e2e-in")
        for (const GroupStats& g : t.groups) h = g.latency;
    std::printf("case=e2e messages=%llu path=\"publish(sync) -> JetStream -> durable topic -> handler\" "
                "p50_us=%.0f p99_us=%.0f\n",
                static_cast<unsigned long long>(m), static_cast<double>(h.quantile_ns(0.5)) / 1e3,
                static_cast<double>(h.quantile_ns(0.99)) / 1e3);
  }
  return rc;
}
