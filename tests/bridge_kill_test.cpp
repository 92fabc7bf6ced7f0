// lanebus — MIT License.
// kill -9 loop of the standalone bridge process (`lanebus bridge`) against a
// real nats-server: JetStream ends with every message exactly once, the
// in-direction stores every message once and in per-key order, and the
// re-sends and consumer rewinds are counted.
// LANEBUS_BRIDGE_KILLS cycles (default 50), LANEBUS_BRIDGE_KILL_MESSAGES
// messages (default 4,000); LANEBUS_SEED replays the kill moments.
#include <nats/nats.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <string>

#include "doctest/doctest.h"
#include "lanebus/lanebus.hpp"
#include "nats_server.hpp"
#include "process.hpp"
#include "seed.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using lanebus::test::Child;
using lanebus::test::NatsServer;
using lanebus::test::TempDir;
using lanebus::test::wait_until;

namespace {

std::uint64_t env_u64(const char* name, std::uint64_t def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : def;
}

/// "name=123" out of a progress line; 0 if absent.
std::uint64_t field(const std::string& line, const std::string& name) {
  const auto p = line.find(" " + name + "=");
  return p == std::string::npos ? 0 : std::strtoull(line.c_str() + p + name.size() + 2, nullptr, 10);
}

struct StreamState {
  std::int64_t msgs = -1;
  std::set<std::string> ids;  // distinct Nats-Msg-Id values
};

/// Read every message of `stream` with js_GetMsg and collect the Nats-Msg-Id headers.
StreamState read_stream(const std::string& url, const std::string& stream) {
  StreamState out;
  natsConnection* nc = nullptr;
  if (natsConnection_ConnectTo(&nc, url.c_str()) != NATS_OK) return out;
  jsCtx* js = nullptr;
  if (natsConnection_JetStream(&js, nc, nullptr) == NATS_OK) {
    jsStreamInfo* si = nullptr;
    if (js_GetStreamInfo(&si, js, stream.c_str(), nullptr, nullptr) == NATS_OK) {
      out.msgs = static_cast<std::int64_t>(si->State.Msgs);
      const std::uint64_t first = si->State.FirstSeq, last = si->State.LastSeq;
      jsStreamInfo_Destroy(si);
      for (std::uint64_t seq = first; seq <= last && seq > 0; ++seq) {
        natsMsg* m = nullptr;
        if (js_GetMsg(&m, js, stream.c_str(), seq, nullptr, nullptr) != NATS_OK) continue;
        const char* id = nullptr;
        if (natsMsgHeader_Get(m, "Nats-Msg-Id", &id) == NATS_OK && id != nullptr) out.ids.insert(id);
        natsMsg_Destroy(m);
      }
    }
    jsCtx_Destroy(js);
  }
  natsConnection_Destroy(nc);
  return out;
}

/// True when the durable consumer has nothing pending and nothing unacked.
bool consumer_idle(const std::string& url, const std::string& stream, const std::string& consumer) {
  natsConnection* nc = nullptr;
  if (natsConnection_ConnectTo(&nc, url.c_str()) != NATS_OK) return false;
  jsCtx* js = nullptr;
  bool idle = false;
  if (natsConnection_JetStream(&js, nc, nullptr) == NATS_OK) {
    jsConsumerInfo* ci = nullptr;
    if (js_GetConsumerInfo(&ci, js, stream.c_str(), consumer.c_str(), nullptr, nullptr) == NATS_OK) {
      idle = ci->NumPending == 0 && ci->NumAckPending == 0;
      jsConsumerInfo_Destroy(ci);
    }
    jsCtx_Destroy(js);
  }
  natsConnection_Destroy(nc);
  return idle;
}

}  // namespace

TEST_CASE("kill -9 of the bridge process in a loop: every message exactly once in JetStream and in the store") {
  const std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");
  REQUIRE_MESSAGE(!tool.empty(), "LANEBUS_TOOL is not set");
  if (lanebus::test::nats_server_binary().empty()) {
    if (lanebus::test::nats_server_required()) FAIL("nats-server is not installed; CI=true makes this a failure");
    std::exit(77);
  }
  const std::uint64_t kills = env_u64("LANEBUS_BRIDGE_KILLS", 50);
  const std::uint64_t n = env_u64("LANEBUS_BRIDGE_KILL_MESSAGES", 4000);
  const std::uint64_t seed = lanebus::test::test_seed("bridge_kill_test");
  std::mt19937_64 rng(seed);
  TempDir tmp;
  NatsServer server(tmp.file("nats"));
  REQUIRE(server.start());
  const std::string dir = tmp.file("store");

  // The application: N messages over 64 keys, published while the bridge
  // processes come and go (the store is shared between processes), paced so
  // that the kills land mid-stream.
  BusOptions ao;
  ao.store.directory = dir;
  ao.workers = 1;
  auto app = Bus::open(ao);
  REQUIRE(app.ok());
  TopicOptions to;
  to.durable = true;
  to.lanes = 8;
  auto orders = (*app)->create_topic("orders", to);
  REQUIRE(orders.ok());
  std::atomic<std::uint64_t> published{0}, publish_failed{0};
  const auto pace = std::chrono::microseconds(std::max<std::uint64_t>(50, kills * 120'000 / std::max<std::uint64_t>(n, 1)));
  std::thread producer([&] {
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::string key = "k" + std::to_string(i % 64);
      const std::string payload = key + ":" + std::to_string(i / 64);
      OutgoingMessage m;
      m.key = key;
      m.payload = payload;
      if (orders->publish(m).ok()) {
        published.fetch_add(1);
      } else {
        publish_failed.fetch_add(1);
      }
      std::this_thread::sleep_for(pace);
    }
  });

  const std::vector<std::string> argv = {tool,    "bridge", dir, "--nats", server.url(), "--out",
                                         "orders=orders.{key}@ORDERS", "--in", "ORDERS:back=orders-back",
                                         "--progress-ms", "50", "--ack-wait-ms", "1000"};
  std::uint64_t resends_removed = 0, published_seen = 0, killed = 0, rewinds = 0;
  std::uniform_int_distribution<int> delay_ms(20, 250);
  for (std::uint64_t cycle = 0; cycle < kills; ++cycle) {
    Child c(argv);
    REQUIRE(c.started());
    const std::string first = c.read_line(std::chrono::seconds(60));
    REQUIRE_MESSAGE(first.find("bridge: started") == 0, first);
    std::string last = first;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_ms(rng));
    while (std::chrono::steady_clock::now() < until) {
      std::string l = c.read_line(std::chrono::milliseconds(60));
      if (!l.empty()) last = l;
    }
    c.signal(SIGKILL);
    c.wait();
    ++killed;
    resends_removed += field(last, "duplicates");
    published_seen += field(last, "published");
    rewinds += field(last, "rewinds");
  }
  producer.join();
  REQUIRE(publish_failed.load() == 0);
  REQUIRE(published.load() == n);
  (void)(*app)->shutdown(ShutdownMode::Drain);
  app->reset();
  // A last run drains everything, then stops on SIGTERM.
  Child c(argv);
  REQUIRE(c.started());
  std::string last;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  while (std::chrono::steady_clock::now() < deadline) {
    std::string l = c.read_line(std::chrono::seconds(5));
    if (l.empty()) continue;
    last = l;
    // Out drained (lag 0 covers the out group; the stream then holds everything)
    // and the in consumer has nothing pending or unacked.
    if (l.find("bridge: progress") == 0 && l.find("state=connected") != std::string::npos && field(l, "lag") == 0 &&
        consumer_idle(server.url(), "ORDERS", "back"))
      break;
  }
  c.signal(SIGTERM);
  std::string stop_line;
  for (std::string l = c.read_line(std::chrono::seconds(30)); !l.empty(); l = c.read_line(std::chrono::seconds(30)))
    stop_line = l;
  CHECK(c.wait() == 0);
  CHECK(stop_line.find("bridge: stopped") == 0);
  resends_removed += field(last, "duplicates");
  rewinds += field(last, "rewinds");

  const StreamState js = read_stream(server.url(), "ORDERS");
  CHECK(js.msgs == static_cast<std::int64_t>(n));
  CHECK(js.ids.size() == n);
  MESSAGE("bridge kill loop: " << killed << " kill -9 cycles, seed " << seed << ", " << n
                               << " messages; JetStream holds " << js.msgs << " (" << js.ids.size()
                               << " distinct ids); re-sends removed by the server (seen in progress lines) "
                               << resends_removed);

  // The in-direction: orders-back holds each message exactly once (drain with a fresh group).
  BusOptions o;
  o.store.directory = dir;
  o.workers = 2;
  auto bus = Bus::open(o);
  REQUIRE(bus.ok());
  TopicOptions bto;
  bto.durable = true;
  bto.lanes = 8;  // as `lanebus bridge --in` created it (its --lanes default)
  auto back = (*bus)->create_topic("orders-back", bto);
  REQUIRE(back.ok());
  std::mutex mu;
  std::map<std::string, std::uint64_t> seen;
  std::uint64_t received = 0, dups = 0, disorder = 0;
  std::map<std::string, std::uint64_t> next;
  auto sub = (*bus)->subscribe(*back, "verify", [&](const MessageView& v) {
    std::lock_guard<std::mutex> l(mu);
    const std::string p(v.payload());
    ++received;
    if (++seen[p] > 1) ++dups;
    const auto colon = p.find(':');
    const std::uint64_t idx = std::strtoull(p.c_str() + colon + 1, nullptr, 10);
    std::uint64_t& nx = next[p.substr(0, colon)];
    if (idx != nx) ++disorder;
    nx = idx + 1;
    return Outcome::ack();
  });
  REQUIRE(sub.ok());
  REQUIRE(wait_until([&] {
    std::lock_guard<std::mutex> l(mu);
    return received >= n;
  }, std::chrono::seconds(60)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a late duplicate would show up here
  std::lock_guard<std::mutex> l(mu);
  CHECK(received == n);
  CHECK(dups == 0);
  // Per-key order across the kills: a delivery a killed bridge took is not
  // waited for behind newer ones; the restarted bridge rewinds the consumer to
  // the first un-stored sequence (doc/bridge.md, "In: per-key order").
  CHECK(disorder == 0);
  CHECK(seen.size() == n);
  auto dlq = (*bus)->dead_letters();
  REQUIRE(dlq.ok());
  auto entries = (*dlq)->list();
  REQUIRE(entries.ok());
  CHECK(entries->empty());  // a killed bridge never dead-letters a message as poison
  MESSAGE("in-direction: " << received << " stored, " << dups << " duplicates, " << disorder
                           << " per-key order breaks, " << rewinds << " consumer rewinds (seen in progress lines)");
}

namespace {

/// The whole stdout of `lanebus stats DIR [args]` (a short-lived process).
std::string run_stats(const std::string& tool, const std::string& dir, const std::vector<std::string>& args) {
  std::string cmd = "'" + tool + "' stats '" + dir + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  std::FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return "";
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  ::pclose(f);
  return out;
}

/// The JSON object of the out mirror in a `lanebus stats --json` line ("" if none).
std::string out_mirror(const std::string& json) {
  const auto p = json.find("\"direction\":\"out\"");
  if (p == std::string::npos) return "";
  const auto e = json.find("\"rewinds\"", p);  // its last member (a '}' may be in the template)
  return json.substr(p, e == std::string::npos ? std::string::npos : e - p);
}

}  // namespace

TEST_CASE("lanebus stats from another process shows the bridge's status record; stale after kill -9, stopped after SIGTERM") {
  const std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");
  REQUIRE_MESSAGE(!tool.empty(), "LANEBUS_TOOL is not set");
  if (lanebus::test::nats_server_binary().empty()) {
    if (lanebus::test::nats_server_required()) FAIL("nats-server is not installed; CI=true makes this a failure");
    std::exit(77);
  }
  TempDir tmp;
  NatsServer server(tmp.file("nats"));
  REQUIRE(server.start());
  const std::string dir = tmp.file("store");
  constexpr std::uint64_t kMessages = 300;
  {
    BusOptions ao;
    ao.store.directory = dir;
    ao.workers = 1;
    auto app = Bus::open(ao);
    REQUIRE(app.ok());
    TopicOptions to;
    to.durable = true;
    to.lanes = 4;
    auto orders = (*app)->create_topic("orders", to);
    REQUIRE(orders.ok());
    for (std::uint64_t i = 0; i < kMessages; ++i) {
      OutgoingMessage m;
      const std::string key = "k" + std::to_string(i % 16), payload = "p" + std::to_string(i);
      m.key = key;
      m.payload = payload;
      REQUIRE(orders->publish(m).ok());
    }
    REQUIRE((*app)->shutdown(ShutdownMode::Drain).ok());
  }
  const std::vector<std::string> argv = {tool, "bridge", dir, "--nats", server.url(), "--name", "edge-1",
                                         "--out", "orders=orders.{key}@ORDERS", "--in", "ORDERS:back=orders-back",
                                         "--progress-ms", "100"};
  const std::string acked = "\"acked\":" + std::to_string(kMessages) + ",";
  {
    Child c(argv);
    REQUIRE(c.started());
    // Running: another process sees state and counts (the record is rewritten every second).
    std::string json;
    REQUIRE_MESSAGE(wait_until(
                        [&] {
                          (void)c.read_line(std::chrono::milliseconds(1));  // keep the pipe drained
                          json = run_stats(tool, dir, {"--json"});
                          return json.find("\"name\":\"edge-1\",\"state\":\"connected\"") != std::string::npos &&
                                 json.find("\"stale\":false") != std::string::npos &&
                                 out_mirror(json).find(acked) != std::string::npos;
                        },
                        std::chrono::seconds(60)),
                    json);
    CHECK(json.find("\"stopped\":false") != std::string::npos);
    CHECK(json.find("\"pid\":" + std::to_string(c.pid())) != std::string::npos);
    const std::string text = run_stats(tool, dir, {});
    CHECK_MESSAGE(text.find("bridge edge-1  state=connected  pid=" + std::to_string(c.pid())) != std::string::npos,
                  text);
    CHECK_MESSAGE(text.find("out orders -> ORDERS (orders.{key})  published=") != std::string::npos, text);
    CHECK(text.find("STALE") == std::string::npos);

    // kill -9: the record stays "connected" but is marked stale once it is
    // older than 3 intervals (at least 5 s), never "running" for ever.
    c.signal(SIGKILL);
    c.wait();
    REQUIRE_MESSAGE(wait_until(
                        [&] {
                          json = run_stats(tool, dir, {"--json"});
                          return json.find("\"stale\":true") != std::string::npos;
                        },
                        std::chrono::seconds(60)),
                    json);
    const std::string stale = run_stats(tool, dir, {});
    CHECK_MESSAGE(stale.find("STALE: not updated for") != std::string::npos, stale);
  }
  {
    // A clean stop writes a last record: state "stopped", not stale.
    Child c(argv);
    REQUIRE(c.started());
    REQUIRE(c.read_line(std::chrono::seconds(60)).find("bridge: started") == 0);
    c.signal(SIGTERM);
    while (!c.read_line(std::chrono::seconds(30)).empty()) {
    }
    CHECK(c.wait() == 0);
    const std::string json = run_stats(tool, dir, {"--json"});
    CHECK_MESSAGE(json.find("\"name\":\"edge-1\",\"state\":\"stopped\"") != std::string::npos, json);
    CHECK_MESSAGE(json.find("\"stopped\":true,\"stale\":false") != std::string::npos, json);
    CHECK(!out_mirror(json).empty());  // counters count from the process start: nothing new to send here
    const std::string text = run_stats(tool, dir, {});
    CHECK_MESSAGE(text.find("bridge edge-1  state=stopped") != std::string::npos, text);
  }
}
