// lanebus — MIT License.
// MetricsServer over real sockets: /metrics checked by the independent
// exposition checker, /stats.json by the strict JSON parser, /healthz verdicts,
// bad requests, idle and excess clients, shutdown; read_store_stats and
// `lanebus serve` on a live store.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "durable_store.hpp"
#include "exposition_check.hpp"
#include "lanebus/lanebus.hpp"
#include "process.hpp"
#include "store_stats.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::Json;
using lanebus::test::wait_until;

namespace {

std::int64_t wall_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A blocking TCP client socket to 127.0.0.1:port; reads give up after 30 s
// (a hang guard, never a timing assertion). -1 when connect fails.
int connect_to(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const std::string& data) {
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

std::string read_all(int fd) {
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

// True when the server has closed `fd` (recv returns 0 or a reset).
bool closed_by_server(int fd) {
  char c;
  ssize_t n = ::recv(fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

struct Reply {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string raw;
};

Reply parse_reply(const std::string& raw) {
  Reply r;
  r.raw = raw;
  const auto end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || end == std::string::npos) return r;
  r.status = std::atoi(raw.c_str() + 9);
  std::size_t pos = raw.find("\r\n") + 2;
  while (pos < end) {
    const auto eol = raw.find("\r\n", pos);
    const std::string line = raw.substr(pos, eol - pos);
    const auto colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      std::string value = line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') value.erase(0, 1);
      r.headers[name] = value;
    }
    pos = eol + 2;
  }
  r.body = raw.substr(end + 4);
  return r;
}

// One request on a fresh connection ("Connection: close"), the whole reply.
Reply roundtrip(std::uint16_t port, const std::string& request) {
  int fd = connect_to(port);
  if (fd < 0) return {};
  Reply r;
  if (send_all(fd, request)) r = parse_reply(read_all(fd));
  ::close(fd);
  return r;
}

Reply get(std::uint16_t port, const std::string& path, const char* method = "GET") {
  return roundtrip(port, std::string(method) + " " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
}

MetricsServerOptions fast_options() {
  MetricsServerOptions o;
  o.listen = "127.0.0.1:0";
  o.sample_interval = 20ms;
  return o;
}

const Json* find_topic(const Json& metrics, const std::string& name) {
  for (const Json& t : std::get<Json::Array>(metrics["topics"].v))
    if (t["name"].str() == name) return &t;
  return nullptr;
}

// A bus with topic "orders" (4 lanes) and group "billing" that acks everything.
struct BusFixture {
  std::unique_ptr<Bus> bus;
  Topic orders;
  Subscription sub;
  std::atomic<int> handled{0};
  BusFixture() {
    BusOptions o;
    o.name = "server-test";
    o.workers = 2;
    bus = Bus::open(o).value();
    TopicOptions t;
    t.lanes = 4;
    orders = bus->create_topic("orders", t).value();
    sub = bus->subscribe(orders, "billing", [this](const MessageView&) {
                handled.fetch_add(1);
                return Outcome::ack();
              }).value();
  }
  void publish(int n) {
    for (int i = 0; i < n; ++i) {
      const std::string key = "k" + std::to_string(i % 16);
      OutgoingMessage m;
      m.key = key;
      m.payload = "x";
      REQUIRE(orders.publish(m).ok());
    }
  }
};

}  // namespace

TEST_CASE("/metrics over a real socket passes the exposition checker and counts the bus's traffic") {
  BusFixture f;
  f.publish(100);
  REQUIRE(wait_until([&] { return f.handled.load() == 100; }));
  auto server = MetricsServer::start(*f.bus, fast_options());
  REQUIRE_MESSAGE(server.ok(), server.status().to_string());
  const std::uint16_t port = (*server)->port();
  CHECK(port != 0);
  CHECK((*server)->url() == "http://127.0.0.1:" + std::to_string(port) + "/");

  // Samples are taken every 20 ms: wait for one that saw all 100 acks.
  Reply r;
  lanebus::test::PromDoc doc;
  REQUIRE(wait_until([&] {
    r = get(port, "/metrics");
    doc = lanebus::test::parse_prometheus(r.body);
    auto acked = doc.find("lanebus_acked_total", {{"topic", "orders"}, {"group", "billing"}});
    double sum = 0;
    for (auto* s : acked) sum += s->value;
    return r.status == 200 && sum == 100;
  }));
  CHECK(r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8");
  CHECK_MESSAGE(doc.errors.empty(), (doc.errors.empty() ? std::string() : doc.errors.front()));
  auto published = doc.find("lanebus_published_total", {{"topic", "orders"}});
  REQUIRE(published.size() == 1);
  CHECK(published[0]->value == 100);
  CHECK(doc.find("lanebus_consumer_lag_messages", {{"topic", "orders"}, {"group", "billing"}}).size() == 4);
  CHECK(doc.type.at("lanebus_e2e_latency_seconds") == "histogram");

  // /stats.json: strict JSON with the server, health, leases and metrics parts.
  r = get(port, "/stats.json");
  REQUIRE(r.status == 200);
  CHECK(r.headers["content-type"] == "application/json");
  std::string error;
  auto j = lanebus::test::parse_json(r.body, &error);
  REQUIRE_MESSAGE(j, error);
  CHECK((*j)["metrics"]["bus"].str() == "server-test");
  const Json* t = find_topic((*j)["metrics"], "orders");
  REQUIRE(t);
  CHECK((*t)["published"].num() == 100);
  CHECK((*t)["groups"][0]["name"].str() == "billing");
  CHECK((*j)["health"]["ok"].boolean());
  CHECK((*j)["server"]["requests"].num() >= 2);
  CHECK_FALSE((*j)["leases"]["available"].boolean());
  CHECK((*j)["metrics"]["dlq"]["available"].boolean() == false);

  r = get(port, "/healthz");
  CHECK(r.status == 200);
  CHECK(r.body == "ok\n");

  // The dashboard: HTML, self-contained (no external script, style or font).
  r = get(port, "/");
  CHECK(r.status == 200);
  CHECK(r.headers["content-type"] == "text/html; charset=utf-8");
  CHECK(r.body.find("<title>lanebus</title>") != std::string::npos);
  CHECK(r.body.find("stats.json") != std::string::npos);
  CHECK(r.body.find("src=\"http") == std::string::npos);
  CHECK(r.body.find("href=\"http") == std::string::npos);
  CHECK(r.body.find("@import") == std::string::npos);
  CHECK(r.headers["content-security-policy"].find("default-src 'none'") != std::string::npos);
  CHECK(get(port, "/index.html").status == 200);
  CHECK(get(port, "/stats.json?t=123").status == 200);  // a query string is ignored

  // HEAD: the headers of GET, no body.
  r = get(port, "/metrics", "HEAD");
  CHECK(r.status == 200);
  CHECK(std::stoul(r.headers["content-length"]) > 1000);
  CHECK(r.body.empty());

  // Keep-alive: two requests on one connection.
  int fd = connect_to(port);
  REQUIRE(fd >= 0);
  REQUIRE(send_all(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string both = read_all(fd);
  ::close(fd);
  std::size_t oks = 0;
  for (auto p = both.find("HTTP/1.1 200"); p != std::string::npos; p = both.find("HTTP/1.1 200", p + 1)) ++oks;
  CHECK(oks == 2);
}

TEST_CASE("bad requests get 4xx, unknown paths 404, and the server keeps serving") {
  BusFixture f;
  MetricsServerOptions o = fast_options();
  o.max_request_bytes = 1024;
  auto server = MetricsServer::start(*f.bus, o);
  REQUIRE(server.ok());
  const std::uint16_t port = (*server)->port();

  Reply r = get(port, "/nope");
  CHECK(r.status == 404);
  CHECK(r.body.find("/metrics") != std::string::npos);

  r = get(port, "/metrics", "POST");
  CHECK(r.status == 405);
  CHECK(r.headers["allow"] == "GET, HEAD");
  CHECK(get(port, "/metrics", "DELETE").status == 405);

  r = roundtrip(port, "this is not http\r\n\r\n");
  CHECK(r.status == 400);
  r = roundtrip(port, "GET metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(r.status == 400);
  CHECK(r.body.find("absolute path") != std::string::npos);

  // Headers beyond max_request_bytes: 431, then the connection is closed.
  r = roundtrip(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(4000, 'a') + "\r\n\r\n");
  CHECK(r.status == 431);
  CHECK(r.headers["connection"] == "close");
  // A body beyond it: 413.
  r = roundtrip(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + std::string(2000, 'b'));
  CHECK(r.status == 413);

  r = get(port, "/metrics");
  CHECK(r.status == 200);
  auto j = lanebus::test::parse_json(get(port, "/stats.json").body, nullptr);
  REQUIRE(j);
  CHECK((*j)["server"]["bad_requests"].num() >= 6);
}

TEST_CASE("a client that sends nothing blocks neither the bus nor other clients, and times out") {
  BusFixture f;
  MetricsServerOptions o = fast_options();
  o.request_timeout = 1500ms;
  auto server = MetricsServer::start(*f.bus, o);
  REQUIRE(server.ok());
  const std::uint16_t port = (*server)->port();

  // Three silent clients and one that stops halfway through its request line.
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(connect_to(port));
  idle.push_back(connect_to(port));
  for (int fd : idle) REQUIRE(fd >= 0);
  REQUIRE(send_all(idle.back(), "GET /metr"));

  // Others are served, and the bus keeps delivering, while they sit there.
  for (int i = 0; i < 5; ++i) CHECK(get(port, "/healthz").status == 200);
  f.publish(2000);
  REQUIRE(wait_until([&] { return f.handled.load() == 2000; }));
  CHECK(get(port, "/metrics").status == 200);

  // Each silent client is closed by the server once request_timeout passes.
  for (int fd : idle) {
    CHECK(closed_by_server(fd));
    ::close(fd);
  }
  auto j = lanebus::test::parse_json(get(port, "/stats.json").body, nullptr);
  REQUIRE(j);
  CHECK((*j)["server"]["timeouts"].num() >= 4);
}

TEST_CASE("connections beyond max_connections are closed at once; freed slots serve again") {
  BusFixture f;
  MetricsServerOptions o = fast_options();
  o.max_connections = 2;
  o.request_timeout = 10s;  // the two idle clients keep their slots throughout
  auto server = MetricsServer::start(*f.bus, o);
  REQUIRE(server.ok());
  const std::uint16_t port = (*server)->port();

  int a = connect_to(port), b = connect_to(port);
  REQUIRE(a >= 0);
  REQUIRE(b >= 0);
  // One thread accepts in order: a and b take the slots, so a third client
  // is accepted and closed at once instead of waiting in the backlog.
  Reply r = get(port, "/healthz");
  CHECK(r.status == 0);
  CHECK(r.raw.empty());
  ::close(a);
  ::close(b);
  // With the slots free again, requests are served.
  REQUIRE(wait_until([&] { return get(port, "/healthz").status == 200; }));
  auto j = lanebus::test::parse_json(get(port, "/stats.json").body, nullptr);
  REQUIRE(j);
  CHECK((*j)["server"]["refused"].num() >= 1);
}

TEST_CASE("/healthz is 503 when an SLA is breached, the store failed or the source cannot be read") {
  // A hand-made source: group g of topic t waits on a message 10 s old.
  std::atomic<int> mode{0};
  auto source = [&]() -> Result<BusStats> {
    if (mode.load() == 2) return Status(Code::IOError, "disk on fire");
    BusStats s;
    s.name = "hand";
    TopicStats t;
    t.name = "t";
    t.lanes = 1;
    t.lane_published = {5};
    t.published = 5;
    GroupStats g;
    g.name = "g";
    g.lanes.resize(1);
    g.lanes[0].in_flight = 5;
    g.total.in_flight = 5;
    g.oldest_unprocessed_ns = mode.load() == 0 ? 0 : wall_now() - 10'000'000'000;
    t.groups.push_back(g);
    s.topics.push_back(t);
    if (mode.load() == 3) s.store_error = "IOError: store \"x\" is unusable";
    return s;
  };
  MetricsServerOptions o = fast_options();
  o.slas.push_back(GroupSla{"t", "g", SlaPolicy{1s, 0.75, 0ns}});
  auto server = MetricsServer::start(source, o);
  REQUIRE_MESSAGE(server.ok(), server.status().to_string());
  const std::uint16_t port = (*server)->port();
  CHECK(get(port, "/healthz").status == 200);

  mode = 1;
  Reply r;
  REQUIRE(wait_until([&] { return (r = get(port, "/healthz")).status == 503; }));
  CHECK(r.body.find("SLA breached: t/g") != std::string::npos);
  auto j = lanebus::test::parse_json(get(port, "/stats.json").body, nullptr);
  REQUIRE(j);
  CHECK_FALSE((*j)["health"]["ok"].boolean());
  CHECK((*j)["metrics"]["topics"][0]["groups"][0]["sla"]["state"].str() == "breached");

  mode = 3;
  REQUIRE(wait_until([&] { return (r = get(port, "/healthz")).body.find("store failed") != std::string::npos; }));
  CHECK(r.status == 503);

  mode = 2;
  REQUIRE(wait_until([&] { return (r = get(port, "/healthz")).body.find("disk on fire") != std::string::npos; }));
  CHECK(r.status == 503);
  CHECK(r.body.find("stats source failed") != std::string::npos);
  CHECK(get(port, "/metrics").status == 200);  // the previous snapshot is still served
}

TEST_CASE("stop closes every connection, frees the port and is idempotent") {
  BusFixture f;
  auto server = MetricsServer::start(*f.bus, fast_options());
  REQUIRE(server.ok());
  const std::uint16_t port = (*server)->port();
  int idle = connect_to(port);
  REQUIRE(idle >= 0);
  int half = connect_to(port);
  REQUIRE(half >= 0);
  REQUIRE(send_all(half, "GET /metrics HTTP/1.1\r\n"));
  REQUIRE(get(port, "/healthz").status == 200);  // both are accepted by now (one thread, in order)

  (*server)->stop();
  CHECK(closed_by_server(idle));
  CHECK(closed_by_server(half));
  ::close(idle);
  ::close(half);
  CHECK(connect_to(port) == -1);  // nothing listens any more
  (*server)->stop();
  server->reset();  // the destructor after stop is fine too

  // The bus is untouched and a new server can take the same port.
  f.publish(10);
  REQUIRE(wait_until([&] { return f.handled.load() == 10; }));
  MetricsServerOptions o = fast_options();
  o.listen = "127.0.0.1:" + std::to_string(port);
  auto again = MetricsServer::start(*f.bus, o);
  REQUIRE_MESSAGE(again.ok(), again.status().to_string());
  CHECK(get(port, "/healthz").status == 200);
}

TEST_CASE("bad options and a taken port are refused with a named cause") {
  BusFixture f;
  auto bad = [&](MetricsServerOptions o, Code code, const char* text) {
    auto s = MetricsServer::start(*f.bus, o);
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == code);
    CHECK_MESSAGE(s.status().message().find(text) != std::string::npos, s.status().to_string());
  };
  MetricsServerOptions o = fast_options();
  o.listen = "localhost";
  bad(o, Code::InvalidArgument, "HOST:PORT");
  o.listen = "127.0.0.1:99999";
  bad(o, Code::InvalidArgument, "0..65535");
  o.listen = "example.com:80";
  bad(o, Code::InvalidArgument, "IP address");
  o = fast_options();
  o.max_connections = 0;
  bad(o, Code::InvalidArgument, "max_connections");
  o = fast_options();
  o.request_timeout = 0ms;
  bad(o, Code::InvalidArgument, "request_timeout");
  o = fast_options();
  o.slas.push_back(GroupSla{"t", "g", SlaPolicy{0s, 0.75, 0ns}});
  bad(o, Code::InvalidArgument, "slas[t/g]");

  auto first = MetricsServer::start(*f.bus, fast_options());
  REQUIRE(first.ok());
  o = fast_options();
  o.listen = "127.0.0.1:" + std::to_string((*first)->port());
  bad(o, Code::Busy, "in use");

  auto empty = MetricsServer::start(std::function<Result<BusStats>()>{}, fast_options());
  CHECK(empty.status().code() == Code::InvalidArgument);
}

TEST_CASE("read_store_stats turns a live store's offsets into lag, oldest age and DLQ counters") {
  lanebus::test::TempDir dir;
  StoreOptions so;
  so.directory = dir.file("store");
  so.durability = Durability::Async;
  auto store = detail::DurableStore::open(so).value();
  auto topic = store->open_topic("orders", detail::TopicSpec{2, false, {}}).value();
  const std::int64_t old = wall_now() - 30'000'000'000;
  for (int i = 0; i < 10; ++i) {
    detail::AppendRequest r;
    r.topic_id = topic.id;
    r.lane = static_cast<std::uint32_t>(i % 2);
    r.header.created_at_ns = old;
    r.payload = "m";
    REQUIRE(store->append(std::move(r)).ok());
  }
  auto billing = store->open_group(topic, "billing").value();
  REQUIRE(store->commit_offset(billing, 0, 5).ok());  // lane 0 done, lane 1 waits (5)

  auto s = detail::read_store_stats(*store);
  REQUIRE_MESSAGE(s.ok(), s.status().to_string());
  REQUIRE(s->topics.size() == 1);
  const TopicStats& t = s->topics[0];
  CHECK(t.durable);
  CHECK(t.published == 10);
  CHECK(t.lane_published == std::vector<std::uint64_t>{5, 5});
  REQUIRE(t.groups.size() == 1);
  CHECK(t.groups[0].total.in_flight == 5);
  CHECK(t.groups[0].lanes[0].in_flight == 0);
  CHECK(t.groups[0].total.acked == 5);
  CHECK(t.groups[0].oldest_unprocessed_ns == old);
  CHECK(s->dlq_available);
  CHECK(s->store_error.empty());

  // Fed to a window with an SLA, the 30 s old message is a breach.
  MetricsOptions mo;
  mo.default_sla = SlaPolicy{10s, 0.75, 0ns};
  auto w = MetricsWindow::create(mo).value();
  REQUIRE(w.add(*s, 1, wall_now()).ok());
  CHECK(w.snapshot().find_group("orders", "billing")->sla->state == SlaState::Breached);
}

TEST_CASE("lanebus serve DIR serves a store that another process has open") {
  const std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");
  if (tool.empty()) {
    MESSAGE("LANEBUS_TOOL not set (built without tools): skipped");
    return;
  }
  lanebus::test::TempDir dir;
  StoreOptions so;
  so.directory = dir.file("store");
  auto store = detail::DurableStore::open(so).value();
  auto topic = store->open_topic("payments", detail::TopicSpec{1, false, {}}).value();
  for (int i = 0; i < 3; ++i) {
    detail::AppendRequest r;
    r.topic_id = topic.id;
    r.header.created_at_ns = wall_now();
    r.payload = "p";
    REQUIRE(store->append(std::move(r)).ok());
  }
  (void)store->open_group(topic, "ledger").value();

  lanebus::test::Child serve({tool, "serve", so.directory, "--listen", "127.0.0.1:0", "--sla", "3600"});
  REQUIRE(serve.started());
  const std::string line = serve.read_line();
  const auto at = line.find("http://127.0.0.1:");
  REQUIRE_MESSAGE(at != std::string::npos, line);
  const auto port = static_cast<std::uint16_t>(std::stoi(line.substr(at + 17)));

  Reply r = get(port, "/metrics");
  REQUIRE(r.status == 200);
  auto doc = lanebus::test::parse_prometheus(r.body);
  CHECK(doc.errors.empty());
  auto lag = doc.find("lanebus_consumer_lag_messages", {{"topic", "payments"}, {"group", "ledger"}});
  REQUIRE(lag.size() == 1);
  CHECK(lag[0]->value == 3);
  CHECK(doc.find("lanebus_sla_seconds", {{"topic", "payments"}}).size() == 1);
  CHECK(get(port, "/healthz").status == 200);
  CHECK(get(port, "/").status == 200);

  serve.signal(SIGTERM);
  CHECK(serve.wait() == 0);

  // Usage errors.
  lanebus::test::Child bad({tool, "serve", so.directory, "--listen", "nowhere"});
  CHECK(bad.wait() == 2);
  lanebus::test::Child missing({tool, "serve", dir.file("absent")});
  CHECK(missing.wait() == 1);
}
