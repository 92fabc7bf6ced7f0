// lanebus — MIT License.
// Trace context across the NATS bridge (doc/tracing.md): a message's headers go
// out as NATS headers and come back in as message headers, so one trace id runs
// from a publish on one bus through JetStream to a handler on another, seen by a
// recording Tracer on both buses. Needs nats-server (exit 77 without one; CI=true
// makes that a failure).
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

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

struct RecordingTracer : Tracer {
  struct Span {
    SpanKind kind;
    std::string topic, group, tracestate;
    TraceContext parent, span;
    SpanOutcome outcome;
  };
  std::mutex mu;
  std::vector<Span> spans;
  std::atomic<std::uint64_t> next{1};
  TraceContext start(const SpanInfo& info) noexcept override {
    TraceContext c;
    if (info.parent.valid()) {
      c.trace_id = info.parent.trace_id;
    } else {
      c.trace_id.fill(0x5e);
    }
    const std::uint64_t id = next.fetch_add(1);
    for (int i = 0; i < 8; ++i) c.span_id[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(id >> (8 * (7 - i)));
    c.flags = 1;
    return c;
  }
  void end(const SpanInfo& info, const TraceContext& span, const SpanEnd& e) noexcept override {
    std::lock_guard<std::mutex> l(mu);
    spans.push_back(Span{info.kind, std::string(info.topic), std::string(info.group), std::string(info.tracestate),
                         info.parent, span, e.outcome});
  }
  std::vector<Span> snapshot() {
    std::lock_guard<std::mutex> l(mu);
    return spans;
  }
};

std::unique_ptr<Bus> open_bus(const std::string& dir, Tracer* tracer) {
  BusOptions o;
  o.store.directory = dir;
  o.workers = 2;
  o.durable_poll = std::chrono::milliseconds(10);
  o.tracer = tracer;
  auto b = Bus::open(o);
  REQUIRE_MESSAGE(b.ok(), b.status().to_string());
  return std::move(*b);
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

}  // namespace

TEST_CASE("one trace id from a publish through the bridge out, JetStream and the bridge in to a handler") {
  if (lanebus::test::nats_server_binary().empty()) {
    if (lanebus::test::nats_server_required()) FAIL("nats-server is not installed; CI=true makes this a failure");
    MESSAGE("nats-server not found: skipping");
    std::exit(77);
  }
  TempDir tmp;
  NatsServer server(tmp.file("nats"));
  REQUIRE(server.start());

  RecordingTracer edge_tracer;
  auto edge = open_bus(tmp.file("edge"), &edge_tracer);
  Topic orders = edge->create_topic("orders", {.lanes = 2, .durable = true}).value();
  auto out = Bridge::open(*edge, bridge_options(server.url()));
  REQUIRE_MESSAGE(out.ok(), out.status().to_string());
  REQUIRE((*out)->mirror_out(orders, "orders.{key}", "ORDERS").ok());

  // Three messages: a root (the tracer starts the trace), one with a caller's
  // traceparent and tracestate, one with a plain header only.
  const Header caller[] = {{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
                           {"tracestate", "vendor=abc"},
                           {"tenant", "acme"}};
  REQUIRE(orders.publish({.key = "a", .payload = "root"}).ok());
  REQUIRE(orders.publish({.key = "a", .payload = "caller", .headers = caller}).ok());
  REQUIRE(wait_until([&] { return (*out)->stats().total.acked >= 2; }, std::chrono::seconds(60)));

  RecordingTracer cloud_tracer;
  auto cloud = open_bus(tmp.file("cloud"), &cloud_tracer);
  Topic in = cloud->create_topic("orders-in", {.lanes = 2, .durable = true}).value();
  std::mutex mu;
  std::vector<std::string> got;  // payload|traceparent|tracestate|tenant
  auto sub = cloud->subscribe(in, "audit", [&](const MessageView& v) {
                    const HeadersView h = v.headers();
                    std::lock_guard<std::mutex> l(mu);
                    got.push_back(std::string(v.payload()) + "|" + std::string(h.find("traceparent").value_or("")) + "|" +
                                  std::string(h.find("tracestate").value_or("")) + "|" +
                                  std::string(h.find("tenant").value_or("")));
                    return Outcome::ack();
                  }).value();
  auto back = Bridge::open(*cloud, bridge_options(server.url()));
  REQUIRE(back.ok());
  REQUIRE((*back)->mirror_in("ORDERS", "cloud", in).ok());
  REQUIRE(wait_until([&] {
    std::lock_guard<std::mutex> l(mu);
    return got.size() >= 2;
  }, std::chrono::seconds(60)));

  // The edge's publish spans are the parents the messages carried.
  const auto edge_spans = edge_tracer.snapshot();
  TraceContext root_publish, caller_publish;
  for (const auto& s : edge_spans) {
    if (s.kind != SpanKind::Publish) continue;
    if (!s.parent.valid()) root_publish = s.span;
    if (s.parent.valid() && s.parent.trace_id_hex() == "4bf92f3577b34da6a3ce929d0e0e4736") caller_publish = s.span;
  }
  REQUIRE(root_publish.valid());
  REQUIRE(caller_publish.valid());
  // The cloud's mirror-in stored each message in a Publish span of its own,
  // a child of the edge's publish span; the stored traceparent is that span.
  REQUIRE(wait_until([&] { return cloud_tracer.snapshot().size() >= 4; }));
  TraceContext root_in, caller_in;
  std::string caller_in_state;
  for (const auto& s : cloud_tracer.snapshot()) {
    if (s.kind != SpanKind::Publish) continue;
    CHECK(s.topic == "orders-in");
    CHECK(s.outcome == SpanOutcome::Ok);
    if (s.parent.span_id == root_publish.span_id) root_in = s.span;
    if (s.parent.span_id == caller_publish.span_id) {
      caller_in = s.span;
      caller_in_state = s.tracestate;
    }
  }
  REQUIRE(root_in.valid());
  REQUIRE(caller_in.valid());
  CHECK(root_in.trace_id == root_publish.trace_id);
  CHECK(caller_in.trace_id == caller_publish.trace_id);
  CHECK(caller_in_state == "vendor=abc");
  char buf1[TraceContext::kTraceparentBytes], buf2[TraceContext::kTraceparentBytes];
  {
    std::lock_guard<std::mutex> l(mu);
    REQUIRE(got.size() == 2);
    CHECK(got[0] == "root|" + std::string(root_in.format(buf1)) + "||");
    CHECK(got[1] == "caller|" + std::string(caller_in.format(buf2)) + "|vendor=abc|acme");
  }
  // The bridge's own handler calls on the edge (group of the mirror) are in the same traces.
  std::size_t bridge_handles = 0;
  for (const auto& s : edge_spans)
    if (s.kind == SpanKind::Handle && s.topic == "orders" && s.span.trace_id == root_publish.trace_id) ++bridge_handles;
  CHECK(bridge_handles >= 1);
  // The cloud's handler spans are children of its mirror-in publish spans: one trace id end to end.
  const auto cloud_spans = cloud_tracer.snapshot();
  std::size_t children = 0;
  for (const auto& s : cloud_spans) {
    if (s.kind != SpanKind::Handle || s.group != "audit") continue;
    if (s.parent.span_id == root_in.span_id && s.span.trace_id == root_publish.trace_id) ++children;
    if (s.parent.span_id == caller_in.span_id && s.span.trace_id == caller_publish.trace_id) ++children;
  }
  CHECK(children == 2);
  (void)(*back)->close();
  (void)(*out)->close();
}
