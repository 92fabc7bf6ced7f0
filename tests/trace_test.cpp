// lanebus — MIT License.
// Message headers and W3C trace context (doc/tracing.md): headers from publish to
// handler (in memory, durable, delayed, batch, across a reopen), the stored
// forms (record format 3, delayed entry format 2), bad inputs, and one trace id
// from a publish through two handlers and an outbox publish, seen by a
// recording Tracer.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "store_codec.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using lanebus::test::TempDir;
using lanebus::test::wait_until;

namespace {

constexpr std::string_view kParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Every span a bus reported, in end order. start() makes a child span of
/// info.parent (a new trace when it has none) with a counter for span ids.
struct RecordingTracer : Tracer {
  struct Span {
    SpanInfo info;  // views copied below
    std::string topic, group, tracestate;
    TraceContext span;
    SpanEnd end;
  };
  std::mutex mu;
  std::vector<Span> spans;
  std::atomic<std::uint64_t> next{1};

  TraceContext start(const SpanInfo& info) noexcept override {
    TraceContext c;
    if (info.parent.valid()) {
      c.trace_id = info.parent.trace_id;
    } else {
      c.trace_id.fill(0x7a);  // a new trace
    }
    const std::uint64_t id = next.fetch_add(1);
    for (int i = 0; i < 8; ++i) c.span_id[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(id >> (8 * (7 - i)));
    c.flags = 1;
    return c;
  }
  void end(const SpanInfo& info, const TraceContext& span, const SpanEnd& e) noexcept override {
    std::lock_guard<std::mutex> l(mu);
    spans.push_back(Span{info, std::string(info.topic), std::string(info.group), std::string(info.tracestate), span, e});
  }
  std::vector<Span> snapshot() {
    std::lock_guard<std::mutex> l(mu);
    return spans;
  }
  std::size_t count() {
    std::lock_guard<std::mutex> l(mu);
    return spans.size();
  }
};

std::string headers_text(const MessageView& v) {
  std::string s;
  for (Header h : v.headers()) s += std::string(h.name) + "=" + std::string(h.value) + ";";
  return s;
}

std::unique_ptr<Bus> open_store(const std::string& dir, Tracer* tracer = nullptr) {
  BusOptions o;
  o.workers = 2;
  o.store.directory = dir;
  o.durable_poll = std::chrono::milliseconds(10);
  o.tracer = tracer;
  auto b = Bus::open(o);
  REQUIRE_MESSAGE(b.ok(), b.status().to_string());
  return std::move(*b);
}

}  // namespace

TEST_CASE("TraceContext parses and formats a W3C traceparent; malformed ones are refused") {
  TraceContext c;
  REQUIRE(TraceContext::parse(kParent, &c));
  CHECK(c.valid());
  CHECK(c.trace_id_hex() == "4bf92f3577b34da6a3ce929d0e0e4736");
  CHECK(c.span_id_hex() == "00f067aa0ba902b7");
  CHECK(c.flags == 1);
  char buf[TraceContext::kTraceparentBytes];
  CHECK(c.format(buf) == kParent);
  // A later version is read by its first 55 bytes (W3C forward compatibility).
  CHECK(TraceContext::parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds", &c));
  TraceContext bad;
  CHECK_FALSE(TraceContext::parse("", &bad));
  CHECK_FALSE(TraceContext::parse("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", &bad));   // uppercase
  CHECK_FALSE(TraceContext::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01", &bad));   // zero trace id
  CHECK_FALSE(TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", &bad));   // zero span id
  CHECK_FALSE(TraceContext::parse("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", &bad));   // version ff
  CHECK_FALSE(TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", &bad));  // v00 + extra
  CHECK_FALSE(TraceContext::parse("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", &bad));
  CHECK_FALSE(current_trace_context().valid());  // not in a handler call
}

TEST_CASE("headers travel from publish to handler on in-memory topics, one by one and in a batch") {
  auto bus = Bus::open({.workers = 2}).value();
  auto topic = bus->create_topic("trace.mem", {.lanes = 4}).value();
  std::mutex mu;
  std::vector<std::string> seen;
  std::vector<std::string> contexts;
  auto sub = bus->subscribe(topic, "g", [&](const MessageView& v) {
                  std::lock_guard<std::mutex> l(mu);
                  seen.push_back(std::string(v.payload()) + "|" + headers_text(v));
                  contexts.push_back(current_trace_context().valid() ? current_trace_context().span_id_hex() : "-");
                  return Outcome::ack();
                }).value();
  const Header hs[] = {{"tenant", "acme"}, {"traceparent", kParent}, {"empty", ""}};
  REQUIRE(topic.publish({.key = "k", .payload = "one", .headers = hs}).ok());
  REQUIRE(topic.publish({.key = "k", .payload = "two"}).ok());
  Publisher pub = bus->publisher();
  REQUIRE(pub.publish(topic, {.key = "k", .payload = "three", .headers = std::span(hs, 1)}).ok());
  const OutgoingMessage batch[] = {{.key = "k", .payload = "four", .headers = std::span(hs, 1)},
                                   {.key = "k", .payload = "five"}};
  REQUIRE(topic.publish_batch(batch).status.ok());
  // A delayed message with headers: the extension block holds both.
  REQUIRE(topic.publish({.key = "k", .payload = "six", .headers = std::span(hs, 1),
                         .delay = std::chrono::milliseconds(20)}).ok());
  REQUIRE(wait_until([&] {
    std::lock_guard<std::mutex> l(mu);
    return seen.size() == 6;
  }));
  std::lock_guard<std::mutex> l(mu);
  CHECK(seen[0] == "one|tenant=acme;traceparent=" + std::string(kParent) + ";empty=;");
  CHECK(seen[1] == "two|");
  CHECK(seen[2] == "three|tenant=acme;");
  CHECK(seen[3] == "four|tenant=acme;");
  CHECK(seen[4] == "five|");
  CHECK(seen[5] == "six|tenant=acme;");
  CHECK(contexts[0] == "00f067aa0ba902b7");  // the handler runs in the message's context
  CHECK(contexts[1] == "-");
}

TEST_CASE("a handler's trace context becomes the parent of what it publishes, without a tracer") {
  auto bus = Bus::open({.workers = 2}).value();
  auto first = bus->create_topic("trace.first").value();
  auto second = bus->create_topic("trace.second").value();
  std::atomic<int> done{0};
  std::string got;
  auto s1 = bus->subscribe(first, "relay", [&](const MessageView& v) {
                 // No headers of its own: it gets the handler's traceparent and tracestate.
                 const Header own[] = {{"step", "2"}};
                 Status s = second.publish({.key = v.key(), .payload = v.payload(), .headers = own});
                 return s.ok() ? Outcome::ack() : Outcome::reject(s.to_string());
               }).value();
  auto s2 = bus->subscribe(second, "end", [&](const MessageView& v) {
                 got = headers_text(v);
                 done.store(1);
                 return Outcome::ack();
               }).value();
  const Header hs[] = {{"traceparent", kParent}, {"tracestate", "vendor=abc"}};
  REQUIRE(first.publish({.key = "k", .payload = "x", .headers = hs}).ok());
  REQUIRE(wait_until([&] { return done.load() == 1; }));
  CHECK(got == "step=2;traceparent=" + std::string(kParent) + ";tracestate=vendor=abc;");
}

TEST_CASE("bad headers are refused with a code and a message naming the cause") {
  TempDir tmp;
  auto bus = open_store(tmp.file("store"));
  auto mem = bus->create_topic("bad.mem", {.slot_bytes = 256}).value();
  auto dur = bus->create_topic("bad.dur", {.durable = true}).value();
  std::vector<Header> many(kMaxHeaders + 1);
  std::vector<std::string> names;
  for (std::size_t i = 0; i < many.size(); ++i) names.push_back("h" + std::to_string(i));
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = Header{names[i], "v"};
  const std::string long_value(kMaxHeaderBytes, 'v');
  const Header too_long[] = {{"big", long_value}};
  const Header bad_name[] = {{"a:b", "v"}};
  const Header empty_name[] = {{"", "v"}};
  const Header newline[] = {{"a", "x\r\ny"}};
  const Header twice[] = {{"a", "1"}, {"a", "2"}};
  const Header upper[] = {{"traceparent", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"}};
  const Header short_tp[] = {{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-01"}};
  const std::string big_slot(200, 'v');
  const Header fills_slot[] = {{"big", big_slot}};
  for (Topic* t : {&mem, &dur}) {
    CAPTURE(t->name());
    Status s = t->publish({.key = "k", .payload = "p", .headers = many});
    CHECK(s.code() == Code::PayloadTooLarge);
    CHECK(s.message().find("more than 16 headers") != std::string_view::npos);
    s = t->publish({.key = "k", .payload = "p", .headers = too_long});
    CHECK(s.code() == Code::PayloadTooLarge);
    CHECK(s.message().find("exceed 1024 bytes") != std::string_view::npos);
    s = t->publish({.key = "k", .payload = "p", .headers = bad_name});
    CHECK(s.code() == Code::InvalidArgument);
    CHECK(s.message().find("header name") != std::string_view::npos);
    CHECK(t->publish({.key = "k", .payload = "p", .headers = empty_name}).code() == Code::InvalidArgument);
    s = t->publish({.key = "k", .payload = "p", .headers = newline});
    CHECK(s.code() == Code::InvalidArgument);
    CHECK(s.message().find("CR, LF or NUL") != std::string_view::npos);
    s = t->publish({.key = "k", .payload = "p", .headers = twice});
    CHECK(s.code() == Code::InvalidArgument);
    CHECK(s.message().find("appears twice") != std::string_view::npos);
    for (auto* tp : {&upper, &short_tp}) {
      s = t->publish({.key = "k", .payload = "p", .headers = *tp});
      CHECK(s.code() == Code::InvalidArgument);
      CHECK(s.message().find("traceparent header is not a W3C trace context") != std::string_view::npos);
    }
  }
  // Headers that do not fit the in-memory slot (its whole 256 bytes).
  const std::string payload(100, 'p');
  Status s = mem.publish({.key = "k", .payload = payload, .headers = fills_slot});
  CHECK(s.ok());  // the payload moves to a block; the headers stay in the slot
  const std::string big_key(60, 'k');
  s = mem.publish({.key = big_key, .payload = payload, .headers = fills_slot});
  CHECK(s.code() == Code::PayloadTooLarge);
  CHECK(s.message().find("slot_bytes") != std::string_view::npos);
  CHECK(dur.publish({.key = big_key, .payload = payload, .headers = fills_slot}).ok());  // no slot on a durable topic
}

TEST_CASE("headers are stored with durable and delayed durable messages and read back after a reopen") {
  TempDir tmp;
  const Header hs[] = {{"traceparent", kParent}, {"tenant", "acme"}};
  {
    auto bus = open_store(tmp.file("store"));
    auto t = bus->create_topic("dur.events", {.durable = true}).value();
    REQUIRE(t.publish({.key = "a", .payload = "plain"}).ok());
    REQUIRE(t.publish({.key = "a", .payload = "headers", .headers = hs}).ok());
    REQUIRE(t.publish({.key = "a", .payload = "delayed", .headers = std::span(hs + 1, 1),
                       .delay = std::chrono::milliseconds(30)}).ok());
  }
  auto bus = open_store(tmp.file("store"));
  auto t = bus->create_topic("dur.events", {.durable = true}).value();
  std::mutex mu;
  std::vector<std::string> seen;
  auto sub = bus->subscribe(t, "reader", [&](const MessageView& v) {
                  std::lock_guard<std::mutex> l(mu);
                  seen.push_back(std::string(v.payload()) + "|" + headers_text(v));
                  return Outcome::ack();
                }, {.start = StartPosition::earliest()}).value();
  REQUIRE(wait_until([&] {
    std::lock_guard<std::mutex> l(mu);
    return seen.size() == 3;
  }));
  std::lock_guard<std::mutex> l(mu);
  CHECK(seen[0] == "plain|");
  CHECK(seen[1] == "headers|traceparent=" + std::string(kParent) + ";tenant=acme;");
  CHECK(seen[2] == "delayed|tenant=acme;");
}

TEST_CASE("record format 3 round-trips; formats 1 and 2 still read; a damaged header block is Corruption") {
  detail::AppendRequest r;
  r.key = "k";
  r.payload = "payload";
  r.header.id = 7;
  detail::StoredMessage m;
  // Format 1: no extension.
  std::string v = detail::encode_log_record(r, 1);
  CHECK(v[0] == 1);
  REQUIRE(detail::decode_log_record(v, "t", 0, 0, &m).ok());
  CHECK(m.headers.empty());
  // Format 2: an expiry, no headers.
  r.expires_ns = 123;
  v = detail::encode_log_record(r, 1);
  CHECK(v[0] == 2);
  REQUIRE(detail::decode_log_record(v, "t", 0, 0, &m).ok());
  CHECK(m.expires_ns == 123);
  CHECK(m.headers.empty());
  // Format 3: headers (and the expiry).
  const std::string block = std::string("\x02\x00\x0d\x00", 4) + std::string("\x01\x01\x00" "ab", 5) +
                            std::string("\x02\x03\x00" "xyabc", 8);
  r.headers = block;
  v = detail::encode_log_record(r, 1);
  CHECK(v[0] == 3);
  REQUIRE(detail::decode_log_record(v, "t", 0, 0, &m).ok());
  CHECK(m.expires_ns == 123);
  CHECK(m.headers == block);
  CHECK(m.payload == "payload");
  std::string text;
  for (Header h : HeadersView(m.headers)) text += std::string(h.name) + "=" + std::string(h.value) + ";";
  CHECK(text == "a=b;xy=abc;");
  CHECK(HeadersView(m.headers).find("xy") == std::optional<std::string_view>("abc"));
  CHECK_FALSE(HeadersView(m.headers).find("zz").has_value());
  // A header block whose count lies: Corruption, even with a valid checksum.
  r.headers[0] = 3;
  v = detail::encode_log_record(r, 1);
  Status s = detail::decode_log_record(v, "t", 0, 0, &m);
  CHECK(s.code() == Code::Corruption);
  CHECK(s.message().find("record headers are malformed") != std::string_view::npos);
}

TEST_CASE("one trace id from a publish through two handlers and an outbox publish (recording tracer)") {
  TempDir tmp;
  RecordingTracer tracer;
  auto bus = open_store(tmp.file("store"), &tracer);
  auto orders = bus->create_topic("shop.orders", {.lanes = 4}).value();                 // in memory
  auto billing = bus->create_topic("shop.billing", {.lanes = 2, .durable = true}).value();  // durable
  auto receipts = bus->create_topic("shop.receipts", {.durable = true}).value();           // outbox target
  std::atomic<int> first_calls{0}, receipts_seen{0};
  std::string receipt_traceparent;
  auto s1 = bus->subscribe(orders, "billing-relay", [&](const MessageView& v) {
                 if (first_calls.fetch_add(1) == 0) return Outcome::retry("first attempt fails");  // a second Handle span
                 Status s = billing.publish({.key = v.key(), .payload = v.payload()});
                 return s.ok() ? Outcome::ack() : Outcome::reject(s.to_string());
               }, {.backoff_initial = std::chrono::milliseconds(1)}).value();
  auto s2 = bus->subscribe_tx(billing, "charger", [&](const MessageView& v, Transaction& tx) {
                 Status s = tx.publish(receipts, {.key = v.key(), .payload = "receipt"});
                 return s.ok() ? Outcome::ack() : Outcome::reject(s.to_string());
               }).value();
  auto s3 = bus->subscribe(receipts, "mailer", [&](const MessageView& v) {
                 receipt_traceparent = std::string(v.headers().find("traceparent").value_or(""));
                 receipts_seen.store(1);
                 return Outcome::ack();
               }).value();
  REQUIRE(orders.publish({.key = "customer-42", .payload = "lamp"}).ok());
  REQUIRE(wait_until([&] { return receipts_seen.load() == 1; }));
  // publish, handle (retry), handle, publish, handle (tx), outbox publish, handle.
  REQUIRE(wait_until([&] { return tracer.count() == 7; }));
  const auto spans = tracer.snapshot();
  const TraceContext root = [&] {
    for (const auto& s : spans)
      if (s.info.kind == SpanKind::Publish && s.topic == "shop.orders") return s.span;
    return TraceContext{};
  }();
  REQUIRE(root.valid());
  CHECK_FALSE(std::any_of(spans.begin(), spans.end(), [&](const auto& s) { return s.span.trace_id != root.trace_id; }));
  auto find = [&](SpanKind kind, std::string_view topic, std::uint32_t attempt) -> const RecordingTracer::Span* {
    for (const auto& s : spans)
      if (s.info.kind == kind && s.topic == topic && s.info.attempt == attempt) return &s;
    return nullptr;
  };
  const auto* p1 = find(SpanKind::Publish, "shop.orders", 0);
  const auto* h1a = find(SpanKind::Handle, "shop.orders", 1);
  const auto* h1b = find(SpanKind::Handle, "shop.orders", 2);
  const auto* p2 = find(SpanKind::Publish, "shop.billing", 0);
  const auto* h2 = find(SpanKind::Handle, "shop.billing", 1);
  const auto* p3 = find(SpanKind::Publish, "shop.receipts", 0);
  const auto* h3 = find(SpanKind::Handle, "shop.receipts", 1);
  REQUIRE((p1 && h1a && h1b && p2 && h2 && p3 && h3));
  CHECK_FALSE(p1->info.parent.valid());  // the root
  CHECK(p1->end.outcome == SpanOutcome::Ok);
  CHECK(p1->info.lane == lane_for_key("customer-42", 4));
  CHECK(h1a->info.parent.span_id == p1->span.span_id);
  CHECK(h1a->end.outcome == SpanOutcome::Retry);
  CHECK(h1a->group == "billing-relay");
  CHECK(h1a->info.lane == p1->info.lane);
  CHECK(h1b->info.parent.span_id == p1->span.span_id);
  CHECK(h1b->end.outcome == SpanOutcome::Ack);
  CHECK(p2->info.parent.span_id == h1b->span.span_id);  // published inside the handler call
  CHECK(h2->info.parent.span_id == p2->span.span_id);
  CHECK(h2->group == "charger");
  CHECK(p3->info.parent.span_id == h2->span.span_id);  // the outbox publish
  CHECK(h3->info.parent.span_id == p3->span.span_id);
  CHECK(h3->end.outcome == SpanOutcome::Ack);
  char buf[TraceContext::kTraceparentBytes];
  CHECK(receipt_traceparent == p3->span.format(buf));
}

TEST_CASE("a refused publish ends its span as Failed with the status") {
  RecordingTracer tracer;
  BusOptions o;
  o.workers = 1;
  o.tracer = &tracer;
  auto bus = Bus::open(o).value();
  auto t = bus->create_topic("trace.refused").value();
  Status s = t.publish({.key = "k", .payload = ""});
  CHECK(s.code() == Code::InvalidArgument);
  REQUIRE(tracer.count() == 1);
  const auto spans = tracer.snapshot();
  CHECK(spans[0].end.outcome == SpanOutcome::Failed);
  CHECK(spans[0].end.status.code() == Code::InvalidArgument);
}

TEST_CASE("a dead-lettered message keeps its headers; a replay delivers them again, trace context included") {
  TempDir tmp;
  auto bus = open_store(tmp.file("store"));
  DeadLetters* dlq = bus->dead_letters().value();
  const Header hs[] = {{"traceparent", kParent}, {"tenant", "acme"}};
  TraceContext parent;
  REQUIRE(TraceContext::parse(kParent, &parent));

  // Three origins: in memory, a durable topic, a durable queue. Each handler
  // rejects a message the first time it sees it and acks it after a replay.
  auto mem = bus->create_topic("dlqh.mem").value();
  auto dur = bus->create_topic("dlqh.dur", {.durable = true}).value();
  auto queue = bus->create_queue("dlqh.queue").value();
  std::mutex mu;
  std::vector<std::string> replayed;  // "<topic>|<headers>|<trace id matches>"
  std::vector<std::string> rejected;  // the topics whose handler rejected its first message
  auto handler = [&](std::string topic) {
    return [&, topic](const MessageView& v) {
      std::lock_guard<std::mutex> l(mu);
      if (std::find(rejected.begin(), rejected.end(), topic) == rejected.end()) {
        rejected.push_back(topic);
        return Outcome::reject("first sight");
      }
      replayed.push_back(topic + "|" + headers_text(v) + "|" +
                         (current_trace_context().trace_id == parent.trace_id ? "same trace" : "other trace"));
      return Outcome::ack();
    };
  };
  auto s1 = bus->subscribe(mem, "g", handler("mem")).value();
  auto s2 = bus->subscribe(dur, "g", handler("dur")).value();
  auto s3 = bus->consume(queue, handler("queue")).value();
  for (Topic* t : {&mem, &dur, &queue}) REQUIRE(t->publish({.key = "k", .payload = "order", .headers = hs}).ok());
  REQUIRE(wait_until([&] { return dlq->list().value().size() == 3; }));

  std::vector<std::uint64_t> ids;
  const std::vector<DlqEntry> entries = dlq->list().value();
  for (const DlqEntry& e : entries) {
    CHECK_MESSAGE(HeadersView(e.headers).find("tenant") == std::optional<std::string_view>("acme"), e.topic);
    CHECK_MESSAGE(HeadersView(e.headers).find("traceparent") == std::optional<std::string_view>(kParent), e.topic);
    ids.push_back(e.id);
  }
  REQUIRE(dlq->replay(ids, "tester").value() == 3);
  REQUIRE(wait_until([&] {
    std::lock_guard<std::mutex> l(mu);
    return replayed.size() == 3;
  }));
  std::lock_guard<std::mutex> l(mu);
  std::sort(replayed.begin(), replayed.end());
  const std::string expect = "|traceparent=" + std::string(kParent) + ";tenant=acme;|same trace";
  std::string all;
  for (const std::string& r : replayed) all += r + "\n";
  INFO(all);
  CHECK(replayed == std::vector<std::string>{"dur" + expect, "mem" + expect, "queue" + expect});
}

TEST_CASE("a replay keeps the trace pair the library added beyond the 16 headers of the message's own") {
  TempDir tmp;
  auto bus = open_store(tmp.file("store"));
  DeadLetters* dlq = bus->dead_letters().value();
  auto in = bus->create_topic("relay.in").value();
  auto out = bus->create_topic("relay.out").value();
  std::string names[kMaxHeaders];
  Header sixteen[kMaxHeaders];
  for (std::size_t i = 0; i < kMaxHeaders; ++i) {
    names[i] = "h" + std::to_string(i);
    sixteen[i] = Header{names[i], "v"};
  }
  // A handler of `in` publishes to `out` with 16 headers of its own: the
  // library adds traceparent and tracestate (18 stored).
  auto relay = bus->subscribe(in, "relay", [&](const MessageView&) {
                     return out.publish({.key = "k", .payload = "relayed", .headers = sixteen}).ok()
                                ? Outcome::ack()
                                : Outcome::reject("relay failed");
                   }).value();
  std::atomic<int> calls{0};
  std::mutex mu;
  std::string seen;
  auto sink = bus->subscribe(out, "sink", [&](const MessageView& v) {
                    if (calls.fetch_add(1) == 0) return Outcome::reject("first sight");
                    std::lock_guard<std::mutex> l(mu);
                    seen = headers_text(v);
                    return Outcome::ack();
                  }).value();
  const Header parent[] = {{"traceparent", kParent}, {"tracestate", "vendor=1"}};
  REQUIRE(in.publish({.key = "k", .payload = "go", .headers = parent}).ok());
  REQUIRE(wait_until([&] { return dlq->list().value().size() == 1; }));
  const std::vector<DlqEntry> entries = dlq->list().value();
  const DlqEntry& e = entries.at(0);
  CHECK(HeadersView(e.headers).size() == kMaxHeaders + 2);
  REQUIRE(dlq->replay({e.id}, "tester").value() == 1);
  REQUIRE(wait_until([&] { return calls.load() == 2; }));
  std::lock_guard<std::mutex> l(mu);
  std::string expect;
  for (std::size_t i = 0; i < kMaxHeaders; ++i) expect += names[i] + "=v;";
  expect += "traceparent=" + std::string(kParent) + ";tracestate=vendor=1;";
  CHECK(seen == expect);
}
