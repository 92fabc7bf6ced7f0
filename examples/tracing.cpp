// lanebus — MIT License.
// Tracing (doc/tracing.md): message headers, W3C trace context from a publish to
// its handler and into what the handler publishes, and a Tracer that prints
// the spans — where a program would plug in OpenTelemetry.
//
// An HTTP request arrives with a traceparent; the order it places is handled
// by "billing", which publishes an invoice; "mailer" handles the invoice. All
// spans share the request's trace id.
#include <lanebus/lanebus.hpp>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>

using namespace lanebus;

namespace {

/// A tracer that starts a child span of the parent (a new trace without one)
/// and prints each span when it ends. An OpenTelemetry tracer would start a
/// span with the parent as its remote context and return its SpanContext.
class PrintingTracer : public Tracer {
 public:
  TraceContext start(const SpanInfo& info) noexcept override {
    TraceContext span;
    std::lock_guard<std::mutex> l(mu_);
    if (info.parent.valid()) {
      span.trace_id = info.parent.trace_id;
    } else {
      for (auto& b : span.trace_id) b = static_cast<std::uint8_t>(rng_());
    }
    for (auto& b : span.span_id) b = static_cast<std::uint8_t>(rng_());
    span.span_id[0] |= 1;  // never all zero
    span.flags = 1;        // sampled
    return span;
  }
  void end(const SpanInfo& info, const TraceContext& span, const SpanEnd& result) noexcept override {
    std::lock_guard<std::mutex> l(mu_);
    std::printf("  span %s trace %s parent %s: %s %.*s%s%.*s lane %u%s -> %s\n", span.span_id_hex().c_str(),
                span.trace_id_hex().c_str(), info.parent.valid() ? info.parent.span_id_hex().c_str() : "(root)",
                info.kind == SpanKind::Publish ? "publish" : "handle", static_cast<int>(info.topic.size()),
                info.topic.data(), info.group.empty() ? "" : " group ", static_cast<int>(info.group.size()),
                info.group.data(), info.lane, info.kind == SpanKind::Handle ? (" attempt " + std::to_string(info.attempt)).c_str() : "",
                outcome(result.outcome));
    ++ended;
  }
  std::atomic<int> ended{0};

 private:
  static const char* outcome(SpanOutcome o) {
    switch (o) {
      case SpanOutcome::Ok: return "ok";
      case SpanOutcome::Failed: return "failed";
      case SpanOutcome::Ack: return "ack";
      case SpanOutcome::Retry: return "retry";
      case SpanOutcome::Reject: return "reject";
    }
    return "?";
  }
  std::mutex mu_;
  std::mt19937_64 rng_{42};
};

}  // namespace

int main() {
  PrintingTracer tracer;
  BusOptions options;
  options.workers = 2;
  options.tracer = &tracer;  // leave it nullptr and trace context still travels in the headers
  auto bus = Bus::open(options).value();
  auto orders = bus->create_topic("shop.orders").value();
  auto invoices = bus->create_topic("shop.invoices").value();

  std::atomic<bool> mailed{false};
  std::string mailer_saw;
  auto billing = bus->subscribe(orders, "billing", [&](const MessageView& m) {
                        // Headers are read like this; the invoice needs none of its own:
                        // published inside this call, it gets this call's trace context.
                        std::printf("billing: order %.*s for tenant %.*s\n", static_cast<int>(m.payload().size()),
                                    m.payload().data(), static_cast<int>(m.headers().find("tenant")->size()),
                                    m.headers().find("tenant")->data());
                        Status s = invoices.publish({.key = m.key(), .payload = "invoice for lamp"});
                        return s.ok() ? Outcome::ack() : Outcome::retry(s.to_string());
                      }).value();
  auto mailer = bus->subscribe(invoices, "mailer", [&](const MessageView& m) {
                       mailer_saw = std::string(m.headers().find("traceparent").value_or("none"));
                       mailed = true;
                       return Outcome::ack();
                     }).value();

  // The request's context, as an HTTP server would have received it.
  const std::string_view request_traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const Header headers[] = {{"traceparent", request_traceparent}, {"tenant", "acme"}};
  std::printf("publishing an order in trace 4bf92f3577b34da6a3ce929d0e0e4736\n");
  Status s = orders.publish({.key = "customer-42", .payload = "lamp", .headers = headers});
  if (!s.ok()) {
    std::printf("publish failed: %s\n", s.to_string().c_str());
    return 1;
  }

  // Bad headers are refused with a code naming the cause.
  const Header bad[] = {{"traceparent", "not-a-trace-context"}};
  Status refused = orders.publish({.key = "customer-42", .payload = "lamp", .headers = bad});
  std::printf("a malformed traceparent: %s\n", refused.to_string().c_str());

  for (int i = 0; i < 5000 && !(mailed && tracer.ended.load() >= 4); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  (void)bus->shutdown(ShutdownMode::Drain);
  std::printf("the mailer's message carried traceparent %s\n", mailer_saw.c_str());
  const bool same_trace = mailer_saw.substr(3, 32) == "4bf92f3577b34da6a3ce929d0e0e4736";
  std::printf("%s\n", same_trace ? "one trace from the request to the mail" : "the trace was lost");
  return same_trace && refused.code() == Code::InvalidArgument ? 0 : 1;
}
