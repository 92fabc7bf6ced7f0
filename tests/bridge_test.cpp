// lanebus — MIT License.
// Bridge to NATS JetStream against a real nats-server started by each test:
// round trip with per-key order, bad input, kill -9 of the server, server
// down at start; the log hook hears connect, loss, reconnect and rewind. Sizes: LANEBUS_BRIDGE_MESSAGES (round trip, default 50,000;
// 5,000 under sanitizers).
#include <nats/nats.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "doctest/doctest.h"
#include "lanebus/bridge.hpp"
#include "lanebus/lanebus.hpp"
#include "nats_server.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using lanebus::test::NatsServer;
using lanebus::test::TempDir;
using lanebus::test::wait_until;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr std::uint64_t kDefaultMessages = 5000;
#else
constexpr std::uint64_t kDefaultMessages = 50000;
#endif

std::uint64_t env_u64(const char* name, std::uint64_t def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : def;
}

/// Skip (exit 77) when nats-server is missing, unless CI=true: then fail.
bool have_server() {
  if (!lanebus::test::nats_server_binary().empty()) return true;
  if (lanebus::test::nats_server_required()) {
    FAIL("nats-server is not installed (apt-get install nats-server); CI=true makes this a failure");
    return false;
  }
  MESSAGE("nats-server not found: skipping");
  std::exit(77);
}

/// The lines a bus's log hook (BusOptions::log) was given, as "<level>: <text>".
struct LogLines {
  std::mutex mu;
  std::vector<std::string> lines;
  LogHook hook() {
    return [this](LogLevel level, std::string_view text) {
      std::lock_guard<std::mutex> l(mu);
      lines.push_back(std::string(to_string(level)) + ": " + std::string(text));
    };
  }
  /// Waits (up to 30 s) for a line that contains `part`.
  bool seen(std::string_view part) {
    return wait_until([&] {
      std::lock_guard<std::mutex> l(mu);
      for (const auto& line : lines)
        if (line.find(part) != std::string::npos) return true;
      return false;
    }, std::chrono::seconds(30));
  }
  std::string dump() {
    std::lock_guard<std::mutex> l(mu);
    std::string out;
    for (const auto& line : lines) out += line + "\n";
    return out;
  }
};

std::unique_ptr<Bus> open_bus(const std::string& dir, std::size_t workers = 8, LogHook log = {}) {
  BusOptions o;
  o.store.directory = dir;
  o.workers = workers;
  o.durable_poll = std::chrono::milliseconds(10);
  o.log = std::move(log);
  auto b = Bus::open(o);
  REQUIRE_MESSAGE(b.ok(), b.status().to_string());
  return std::move(*b);
}

Topic durable_topic(Bus& bus, const std::string& name, std::uint32_t lanes = 16) {
  TopicOptions t;
  t.durable = true;
  t.lanes = lanes;
  auto r = bus.create_topic(name, t);
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  return *r;
}

BridgeOptions bridge_options(const std::string& url) {
  BridgeOptions o;
  o.urls = {url};
  o.backoff_initial = std::chrono::milliseconds(20);
  o.backoff_max = std::chrono::milliseconds(500);
  o.reconnect_wait = std::chrono::milliseconds(100);
  o.publish_timeout = std::chrono::milliseconds(2000);
  return o;
}

/// The number of messages JetStream holds in `stream`, read with nats.c; -1 on error.
std::int64_t stream_messages(const std::string& url, const std::string& stream) {
  natsConnection* nc = nullptr;
  if (natsConnection_ConnectTo(&nc, url.c_str()) != NATS_OK) return -1;
  jsCtx* js = nullptr;
  std::int64_t n = -1;
  if (natsConnection_JetStream(&js, nc, nullptr) == NATS_OK) {
    jsStreamInfo* si = nullptr;
    if (js_GetStreamInfo(&si, js, stream.c_str(), nullptr, nullptr) == NATS_OK) {
      n = static_cast<std::int64_t>(si->State.Msgs);
      jsStreamInfo_Destroy(si);
    }
    jsCtx_Destroy(js);
  }
  natsConnection_Destroy(nc);
  return n;
}

/// Publish `n` messages over `keys` keys, payload "<key>:<i-th of the key>".
void publish_many(Topic& t, std::uint64_t n, std::uint64_t keys, std::uint64_t first = 0) {
  std::atomic<std::uint64_t> done{0}, failed{0};
  std::vector<std::uint64_t> per_key(keys, 0);
  for (std::uint64_t i = first; i < first + n; ++i) {
    const std::uint64_t k = i % keys;
    const std::string key = "k" + std::to_string(k);
    const std::string payload = key + ":" + std::to_string(i / keys);
    OutgoingMessage m;
    m.key = key;
    m.payload = payload;
    Status s = t.publish_async(m, [&](const Status& st, std::uint64_t) {
      if (!st.ok()) failed.fetch_add(1);
      done.fetch_add(1);
    });
    REQUIRE_MESSAGE(s.ok(), s.to_string());
  }
  REQUIRE(wait_until([&] { return done.load() == n; }, std::chrono::seconds(120)));
  REQUIRE(failed.load() == 0);
}

/// Records deliveries of a local topic and checks per-key order.
struct OrderCheck {
  std::mutex mu;
  std::map<std::string, std::uint64_t> next;  // key -> next expected index
  std::uint64_t received = 0;
  std::uint64_t out_of_order = 0;
  std::uint64_t duplicates = 0;
  Outcome on(const MessageView& v) {
    std::string p(v.payload());
    const auto colon = p.find(':');
    const std::string key = p.substr(0, colon);
    const std::uint64_t idx = std::strtoull(p.c_str() + colon + 1, nullptr, 10);
    std::lock_guard<std::mutex> l(mu);
    ++received;
    std::uint64_t& n = next[key];
    if (key != v.key()) ++out_of_order;
    if (idx < n) {
      ++duplicates;
    } else if (idx != n) {
      ++out_of_order;
      n = idx + 1;
    } else {
      ++n;
    }
    return Outcome::ack();
  }
};

}  // namespace

TEST_CASE("round trip: messages over 64 keys go out to JetStream and come back into another store in per-key order") {
  if (!have_server()) return;
  const std::uint64_t n = env_u64("LANEBUS_BRIDGE_MESSAGES", kDefaultMessages);
  TempDir tmp;
  NatsServer server(tmp.file("nats"));
  REQUIRE(server.start());
  MESSAGE("round trip of " << n << " messages via " << server.url());

  auto edge = open_bus(tmp.file("edge"), 16);
  Topic orders = durable_topic(*edge, "orders", 16);
  auto bridge = Bridge::open(*edge, bridge_options(server.url()));
  REQUIRE_MESSAGE(bridge.ok(), bridge.status().to_string());
  REQUIRE((*bridge)->mirror_out(orders, "orders.{key}", "ORDERS").ok());
  publish_many(orders, n, 64);
  REQUIRE(wait_until([&] { return (*bridge)->stats().total.acked >= n; }, std::chrono::seconds(300)));
  const BridgeStats bs = (*bridge)->stats();
  CHECK(bs.state == BridgeState::Connected);
  CHECK(bs.total.acked == n);
  CHECK(bs.total.dead_lettered == 0);
  CHECK(stream_messages(server.url(), "ORDERS") == static_cast<std::int64_t>(n));
  // Bus::stats carries the bridge too, lag drained.
  REQUIRE(wait_until([&] {
    auto s = edge->stats();
    return s.bridges.size() == 1 && s.bridges[0].total.lag == 0;
  }));

  auto cloud = open_bus(tmp.file("cloud"), 4);
  Topic in = durable_topic(*cloud, "orders-in", 8);
  OrderCheck check;
  auto sub = cloud->subscribe(in, "audit", [&](const MessageView& v) { return check.on(v); });
  REQUIRE(sub.ok());
  auto back = Bridge::open(*cloud, bridge_options(server.url()));
  REQUIRE(back.ok());
  REQUIRE_MESSAGE((*back)->mirror_in("ORDERS", "cloud", in).ok(), "mirror_in");
  REQUIRE(wait_until([&] {
    std::lock_guard<std::mutex> l(check.mu);
    return check.received >= n;
  }, std::chrono::seconds(300)));
  REQUIRE(wait_until([&] { return (*back)->stats().total.acked >= n; }));
  {
    std::lock_guard<std::mutex> l(check.mu);
    CHECK(check.received == n);
    CHECK(check.out_of_order == 0);
    CHECK(check.duplicates == 0);
    CHECK(check.next.size() == 64);
  }
  const BridgeStats in_stats = (*back)->stats();
  CHECK(in_stats.total.stored == n);
  CHECK(in_stats.total.lag == 0);
  CHECK((*back)->close().ok());
  CHECK((*bridge)->close().ok());
}

TEST_CASE("bad input gets a clear Status: bad URL, refused credentials, missing stream, invalid template") {
  if (!have_server()) return;
  TempDir tmp;
  auto bus = open_bus(tmp.file("store"), 2);
  Topic t = durable_topic(*bus, "t", 4);

  SUBCASE("bad URLs and options") {
    BridgeOptions o;
    auto r = Bridge::open(*bus, o);
    CHECK(r.code() == Code::InvalidArgument);
    CHECK(r.status().message().find("urls is empty") != std::string_view::npos);
    for (const char* url : {"http://127.0.0.1:4222", "nats://:4222", "nats://127.0.0.1:99999", "nats://host:abc",
                            "nats://bad host"}) {
      o.urls = {url};
      auto b = Bridge::open(*bus, o);
      CHECK_MESSAGE(b.code() == Code::InvalidArgument, url);
      CHECK(b.status().message().find("server URL") != std::string_view::npos);
    }
    auto mem = Bus::open(BusOptions{});
    REQUIRE(mem.ok());
    o.urls = {"nats://127.0.0.1:4222"};
    CHECK(Bridge::open(**mem, o).code() == Code::InvalidArgument);
  }

  SUBCASE("credentials the server refuses are PermissionDenied, not retried") {
    NatsServer server(tmp.file("nats"), "authorization { token: \"s3cret\" }");
    REQUIRE(server.start());
    BridgeOptions o = bridge_options(server.url());
    o.token = "wrong";
    auto r = Bridge::open(*bus, o);
    CHECK(r.code() == Code::PermissionDenied);
    CHECK(r.status().message().find("refused the credentials") != std::string_view::npos);
    o.token = "s3cret";
    auto ok = Bridge::open(*bus, o);
    CHECK_MESSAGE(ok.ok(), ok.status().to_string());
  }

  SUBCASE("a missing stream is NotFound when BridgeOptions::create_streams is false") {
    NatsServer server(tmp.file("nats"));
    REQUIRE(server.start());
    BridgeOptions o = bridge_options(server.url());
    o.create_streams = false;
    auto b = Bridge::open(*bus, o);
    REQUIRE(b.ok());
    Status s = (*b)->mirror_out(t, "t.{key}", "NOPE");
    CHECK(s.code() == Code::NotFound);
    CHECK(s.message().find("\"NOPE\" does not exist") != std::string_view::npos);
    o.create_consumers = false;
    auto b2 = Bridge::open(*bus, o);
    REQUIRE(b2.ok());
    Status si = (*b2)->mirror_in("NOPE", "c", t);
    CHECK(si.code() == Code::NotFound);
  }

  SUBCASE("invalid subject templates and names are InvalidArgument") {
    auto b = Bridge::open(*bus, bridge_options("nats://127.0.0.1:1"));  // nothing listens: retrying is fine
    REQUIRE_MESSAGE(b.ok(), b.status().to_string());
    CHECK((*b)->stats().state == BridgeState::Retrying);
    struct Case {
      const char* tmpl;
      const char* why;
    };
    for (const Case& c : {Case{"", "is empty"}, Case{"orders..{key}", "empty token"},
                          Case{"orders.*", "wildcard"}, Case{"orders.>", "wildcard"},
                          Case{"orders.{nope}", "unknown placeholder"}, Case{"orders.x{key}", "whole token"},
                          Case{"orders.a b", "whitespace"}, Case{"orders.", "empty token"}}) {
      Status s = (*b)->mirror_out(t, c.tmpl, "S");
      CHECK_MESSAGE(s.code() == Code::InvalidArgument, c.tmpl);
      CHECK_MESSAGE(s.message().find(c.why) != std::string_view::npos, s.to_string());
    }
    CHECK((*b)->mirror_out(t, "t.{key}", "A.B").code() == Code::InvalidArgument);
    CHECK((*b)->mirror_out(t, "t.{key}", "").code() == Code::InvalidArgument);
    CHECK((*b)->mirror_out(Topic{}, "t.{key}", "S").code() == Code::InvalidArgument);
    CHECK((*b)->mirror_in("S", "", t).code() == Code::InvalidArgument);
    CHECK((*b)->mirror_out(t, "t.{key}", "S").ok());
    CHECK((*b)->mirror_out(t, "t.{key}", "S").code() == Code::Conflict);
  }
}

TEST_CASE("a message larger than the server's max_payload goes to the DLQ with a reason and the bridge does not wedge") {
  if (!have_server()) return;
  TempDir tmp;
  NatsServer server(tmp.file("nats"), "max_payload: 4096");
  REQUIRE(server.start());
  auto bus = open_bus(tmp.file("store"), 4);
  Topic t = durable_topic(*bus, "events", 2);
  auto b = Bridge::open(*bus, bridge_options(server.url()));
  REQUIRE(b.ok());
  REQUIRE((*b)->mirror_out(t, "events.{lane}", "EVENTS").ok());
  const std::string big(8192, 'x');
  for (int i = 0; i < 20; ++i) {
    OutgoingMessage m;
    m.key = "same-key";  // one lane: the big one sits in the middle of it
    const std::string small = "small-" + std::to_string(i);
    m.payload = i == 10 ? std::string_view(big) : std::string_view(small);
    REQUIRE(t.publish(m).ok());
  }
  REQUIRE(wait_until([&] { return (*b)->stats().total.acked == 19; }, std::chrono::seconds(60)));
  CHECK((*b)->stats().total.dead_lettered == 1);
  CHECK(stream_messages(server.url(), "EVENTS") == 19);
  auto dlq = bus->dead_letters();
  REQUIRE(dlq.ok());
  std::vector<DlqEntry> entries;
  REQUIRE(wait_until([&] {
    auto l = (*dlq)->list();
    if (l.ok()) entries = *l;
    return entries.size() == 1;
  }));
  CHECK(entries[0].payload.size() == big.size());
  CHECK(entries[0].reason.find("max_payload 4096") != std::string::npos);
}

TEST_CASE("server killed with kill -9 mid-stream and restarted on the same storage: nothing lost, the bridge resumes") {
  if (!have_server()) return;
  const std::uint64_t n = env_u64("LANEBUS_BRIDGE_KILL_MESSAGES", 6000);
  TempDir tmp;
  NatsServer server(tmp.file("nats"));
  REQUIRE(server.start());
  LogLines log;  // the log hook hears the connect, the loss and the reconnect
  auto bus = open_bus(tmp.file("store"), 8, log.hook());
  Topic t = durable_topic(*bus, "orders", 8);
  auto b = Bridge::open(*bus, bridge_options(server.url()));
  REQUIRE(b.ok());
  REQUIRE((*b)->mirror_out(t, "orders.{key}", "ORDERS").ok());
  CHECK_MESSAGE(log.seen("info: bus \"bus\": bridge: connected to the NATS server nats://127.0.0.1:"), log.dump());
  std::thread producer([&] { publish_many(t, n, 64); });
  REQUIRE(wait_until([&] { return (*b)->stats().total.acked >= n / 4; }, std::chrono::seconds(120)));
  server.kill9();
  CHECK_MESSAGE(log.seen("warn: bus \"bus\": bridge: disconnected from the NATS server; reconnecting"), log.dump());
  // Local publishing goes on (the store absorbs it); the bridge lags and retries.
  REQUIRE(wait_until([&] { return (*b)->stats().state == BridgeState::Retrying; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // an outage, not a timing check
  const BridgeStats during = (*b)->stats();
  CHECK(during.last_error.size() > 0);
  // `acked` may still grow here: a lane's window collected its PubAcks before
  // the kill and the handler calls of those messages ack afterwards (slowly
  // under TSan: 1808 -> 2198 seen). Not connected is what the outage shows.
  CHECK(during.state != BridgeState::Connected);
  REQUIRE(server.start());
  producer.join();
  REQUIRE(wait_until([&] { return (*b)->stats().total.acked >= n; }, std::chrono::seconds(180)));
  REQUIRE(wait_until([&] { return (*b)->stats().total.lag == 0; }));
  const BridgeStats after = (*b)->stats();
  CHECK(after.state == BridgeState::Connected);
  CHECK(after.reconnects >= 1);
  CHECK_MESSAGE(log.seen("info: bus \"bus\": bridge: reconnected to the NATS server"), log.dump());
  // Every message exactly once: re-sends of unacknowledged publishes were removed by Nats-Msg-Id.
  CHECK(stream_messages(server.url(), "ORDERS") == static_cast<std::int64_t>(n));
  MESSAGE("published " << after.total.published << " acked " << after.total.acked << " duplicates removed "
                       << after.total.duplicates);
}

TEST_CASE("server down at start: the bridge opens in state Retrying and drains the backlog once the server is up") {
  if (!have_server()) return;
  TempDir tmp;
  NatsServer server(tmp.file("nats"));
  auto bus = open_bus(tmp.file("store"), 4);
  Topic t = durable_topic(*bus, "sensors", 4);
  auto b = Bridge::open(*bus, bridge_options(server.url()));
  REQUIRE_MESSAGE(b.ok(), b.status().to_string());
  CHECK((*b)->stats().state == BridgeState::Retrying);
  REQUIRE((*b)->mirror_out(t, "sensors.{key}", "SENSORS").ok());
  auto cloud = open_bus(tmp.file("cloud"), 2);
  Topic in = durable_topic(*cloud, "sensors-in", 4);
  auto back = Bridge::open(*cloud, bridge_options(server.url()));
  REQUIRE(back.ok());
  REQUIRE((*back)->mirror_in("SENSORS", "cloud", in).ok());  // the stream does not exist yet either
  publish_many(t, 500, 8);
  REQUIRE(wait_until([&] { return bus->stats().bridges.at(0).total.lag == 500; }));
  REQUIRE(server.start());
  REQUIRE(wait_until([&] { return (*b)->stats().total.acked == 500; }, std::chrono::seconds(60)));
  CHECK((*b)->stats().state == BridgeState::Connected);
  CHECK(stream_messages(server.url(), "SENSORS") == 500);
  REQUIRE(wait_until([&] { return (*back)->stats().total.stored == 500; }, std::chrono::seconds(60)));
  CHECK((*back)->stats().total.duplicates == 0);
  // The exports carry the bridge: state set, counters and lag per mirror.
  auto window = MetricsWindow::create({});
  REQUIRE(window.ok());
  REQUIRE(window->add(bus->stats(), 1, 1).ok());
  const std::string prom = to_prometheus(window->snapshot());
  CHECK(prom.find("lanebus_bridge_state{bridge=\"lanebus-bridge\",state=\"connected\"} 1") != std::string::npos);
  CHECK(prom.find("lanebus_bridge_acked_total{bridge=\"lanebus-bridge\",direction=\"out\",topic=\"sensors\","
                  "stream=\"SENSORS\"} 500") != std::string::npos);
  const std::string json = to_json(window->snapshot());
  CHECK(json.find("\"bridges\":[{\"name\":\"lanebus-bridge\",\"state\":\"connected\"") != std::string::npos);
}

TEST_CASE("server down for a while during publishing: local publishing is unaffected, lag rises then drains, the SLA shows it") {
  if (!have_server()) return;
  const auto outage = std::chrono::milliseconds(env_u64("LANEBUS_BRIDGE_OUTAGE_MS", 10000));
  TempDir tmp;
  NatsServer server(tmp.file("nats"));
  REQUIRE(server.start());
  auto bus = open_bus(tmp.file("store"), 4);
  Topic t = durable_topic(*bus, "orders", 8);
  auto b = Bridge::open(*bus, bridge_options(server.url()));
  REQUIRE(b.ok());
  REQUIRE((*b)->mirror_out(t, "orders.{key}", "ORDERS").ok());
  MetricsOptions mo;
  mo.window = std::chrono::seconds(3);
  SlaPolicy sla;
  sla.sla = std::chrono::seconds(2);
  mo.default_sla = sla;
  auto window = MetricsWindow::create(mo);
  REQUIRE(window.ok());
  auto sample = [&] {
    const auto steady = std::chrono::steady_clock::now().time_since_epoch();
    const auto wall = std::chrono::system_clock::now().time_since_epoch();
    REQUIRE(window->add(bus->stats(), std::chrono::duration_cast<std::chrono::nanoseconds>(steady).count(),
                        std::chrono::duration_cast<std::chrono::nanoseconds>(wall).count())
                .ok());
    return window->snapshot().find_group("orders", "bridge.orders");
  };
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> published{0}, failed{0};
  std::thread producer([&] {
    for (std::uint64_t i = 0; !stop.load(); ++i) {
      const std::string key = "k" + std::to_string(i % 64), payload = key + ":" + std::to_string(i / 64);
      OutgoingMessage m;
      m.key = key;
      m.payload = payload;
      if (t.publish(m).ok()) {
        published.fetch_add(1);
      } else {
        failed.fetch_add(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  REQUIRE(wait_until([&] { return (*b)->stats().total.acked >= 100; }));
  server.kill9();
  std::uint64_t max_lag = 0;
  bool breached = false;
  const auto until = std::chrono::steady_clock::now() + outage;
  const std::uint64_t before = published.load();
  while (std::chrono::steady_clock::now() < until) {
    if (const GroupMetrics* g = sample()) {
      max_lag = std::max(max_lag, g->lag);
      if (g->sla && (g->sla->state == SlaState::Breached || g->sla->state == SlaState::AtRisk)) breached = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  const std::uint64_t during = published.load() - before;
  CHECK((*b)->stats().state == BridgeState::Retrying);
  REQUIRE(server.start());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop.store(true);
  producer.join();
  REQUIRE(wait_until([&] { return (*b)->stats().total.acked >= published.load(); }, std::chrono::seconds(120)));
  const GroupMetrics* g = nullptr;
  REQUIRE(wait_until([&] {
    g = sample();
    return g != nullptr && g->lag == 0;
  }));
  MESSAGE("outage " << outage.count() << " ms: " << during << " local publishes meanwhile, max bridge lag " << max_lag
                    << ", SLA at risk or breached: " << breached);
  CHECK(failed.load() == 0);
  CHECK(during > 0);        // the store absorbed the outage
  CHECK(max_lag > 0);       // the bridge's group lag showed it
  CHECK(breached);          // and the SLA projection flagged it
  CHECK((*b)->stats().state == BridgeState::Connected);
  CHECK(stream_messages(server.url(), "ORDERS") == static_cast<std::int64_t>(published.load()));
}

namespace {

/// A bridge process that dies with a batch in hand: a raw pull subscription
/// to the durable consumer fetches up to `n` messages and never acks them.
/// The connection stays open until the returned guard is destroyed (like a
/// process that is killed later), so the deliveries stay unacked.
struct DeadFetcher {
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  natsSubscription* sub = nullptr;
  int fetched = 0;
  DeadFetcher(const std::string& url, const std::string& stream, const std::string& consumer, int n) {
    if (natsConnection_ConnectTo(&nc, url.c_str()) != NATS_OK) return;
    if (natsConnection_JetStream(&js, nc, nullptr) != NATS_OK) return;
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream.c_str();
    so.Consumer = consumer.c_str();
    if (js_PullSubscribe(&sub, js, "", consumer.c_str(), nullptr, &so, nullptr) != NATS_OK) return;
    natsMsgList list{nullptr, 0};
    if (natsSubscription_Fetch(&list, sub, n, 5000, nullptr) == NATS_OK) fetched = list.Count;
    natsMsgList_Destroy(&list);  // not acked
  }
  ~DeadFetcher() {
    if (sub != nullptr) natsSubscription_Destroy(sub);
    if (js != nullptr) jsCtx_Destroy(js);
    if (nc != nullptr) natsConnection_Destroy(nc);
  }
};

}  // namespace

TEST_CASE("in-direction: deliveries a dead bridge left unacked are not overtaken: the consumer is rewound, order holds") {
  if (!have_server()) return;
  TempDir tmp;
  NatsServer server(tmp.file("nats"));
  REQUIRE(server.start());
  constexpr std::uint64_t kKeys = 8, kFirst = 400, kSecond = 400;
  // Source: a store whose topic goes out to the stream ORDERS.
  auto src = open_bus(tmp.file("src"));
  Topic orders = durable_topic(*src, "orders", 4);
  auto out = Bridge::open(*src, bridge_options(server.url()));
  REQUIRE(out.ok());
  REQUIRE((*out)->mirror_out(orders, "orders.{key}", "ORDERS").ok());
  publish_many(orders, kFirst, kKeys);
  REQUIRE(wait_until([&] { return stream_messages(server.url(), "ORDERS") == static_cast<std::int64_t>(kFirst); },
                     std::chrono::seconds(60)));

  // Destination store; its consumer "back" (ack wait 30 s: a redelivery would
  // come far too late) is created by a first bridge that then goes away.
  const std::string dst_dir = tmp.file("dst");
  BridgeOptions bo = bridge_options(server.url());
  bo.fetch_batch = 64;
  auto in_stats = [](Bridge& b) {
    for (const auto& m : b.stats().mirrors)
      if (m.direction == "in") return m;
    return BridgeMirrorStats{};
  };
  {
    auto dst = open_bus(dst_dir);
    Topic back = durable_topic(*dst, "orders-back", 4);
    auto in = Bridge::open(*dst, bo);
    REQUIRE(in.ok());
    REQUIRE((*in)->mirror_in("ORDERS", "back", back).ok());
    REQUIRE(wait_until([&] { return in_stats(**in).stored == kFirst; }, std::chrono::seconds(60)));
    REQUIRE((*in)->close().ok());
  }
  // The bridge is gone; a "dead" one holds the next deliveries unacked.
  publish_many(orders, kSecond, kKeys, kFirst);
  REQUIRE(wait_until([&] { return stream_messages(server.url(), "ORDERS") == static_cast<std::int64_t>(kFirst + kSecond); },
                     std::chrono::seconds(60)));
  DeadFetcher dead(server.url(), "ORDERS", "back", 40);
  REQUIRE(dead.fetched > 0);

  // A new bridge on the destination store: it must not store the messages
  // after the dead one's batch before that batch. Its log hook hears the rewind.
  LogLines log;
  auto dst = open_bus(dst_dir, 8, log.hook());
  Topic back = durable_topic(*dst, "orders-back", 4);
  auto in = Bridge::open(*dst, bo);
  REQUIRE(in.ok());
  REQUIRE((*in)->mirror_in("ORDERS", "back", back).ok());
  REQUIRE(wait_until([&] { return in_stats(**in).stored == kSecond; }, std::chrono::seconds(20)));
  CHECK(in_stats(**in).rewinds >= 1);
  CHECK_MESSAGE(log.seen("warn: bus \"bus\": bridge: rewound consumer \"back\" of stream \"ORDERS\" to sequence "),
                log.dump());
  OrderCheck check;
  auto sub = dst->subscribe(back, "verify", [&](const MessageView& v) { return check.on(v); });
  REQUIRE(sub.ok());
  REQUIRE(wait_until([&] {
    std::lock_guard<std::mutex> l(check.mu);
    return check.received >= kFirst + kSecond;
  }, std::chrono::seconds(60)));
  std::lock_guard<std::mutex> l(check.mu);
  CHECK(check.received == kFirst + kSecond);
  CHECK(check.out_of_order == 0);
  CHECK(check.duplicates == 0);
  MESSAGE("dead fetcher held " << dead.fetched << " deliveries; the new bridge rewound " << in_stats(**in).rewinds
                               << " time(s)");
}

