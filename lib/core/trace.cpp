// lanebus — MIT License.
// Headers and trace context on the publish and delivery paths (trace.hpp,
// doc/tracing.md).
#include "trace.hpp"

#include <iterator>

namespace lanebus::detail {

thread_local constinit const TraceScope* tl_trace __attribute__((tls_model("initial-exec"))) = nullptr;

Status stored_headers(const OutgoingMessage& m, HeaderBlock* out) noexcept {
  if (Status st = check_headers(m.headers); !st.ok()) return st;
  bool has_parent = false, has_state = false;
  for (const Header& h : m.headers) {
    out->add(h.name, h.value);
    has_parent |= h.name == kTraceparent;
    has_state |= h.name == kTracestate;
  }
  const TraceScope* scope = tl_trace;
  if (scope != nullptr && !has_parent && scope->ctx.valid()) {
    char tp[TraceContext::kTraceparentBytes];
    out->add(kTraceparent, scope->ctx.format(tp));
    if (!has_state && !scope->tracestate.empty() && scope->tracestate.size() <= kMaxTracestateBytes)
      out->add(kTracestate, scope->tracestate);
  }
  return Status();
}

RestoredHeaders::RestoredHeaders(std::string_view block) noexcept {
  const HeadersView hs(block);
  for (Header h : hs)
    if (n_ < std::size(rest_)) rest_[n_++] = h;
  if (check_headers(headers()).ok()) return;  // all of them, in their order
  // Over the limits: the library added the trace pair, last (stored_headers);
  // it goes back through the scope, which adds it last again.
  n_ = 0;
  if (auto tp = hs.find(kTraceparent)) (void)TraceContext::parse(*tp, &scope_.ctx);
  for (Header h : hs) {
    if (scope_.ctx.valid() && h.name == kTraceparent) continue;
    if (scope_.ctx.valid() && h.name == kTracestate && h.value.size() <= kMaxTracestateBytes) {
      scope_.tracestate = h.value;
      continue;
    }
    if (n_ < std::size(rest_)) rest_[n_++] = h;
  }
}

void RestoredHeaders::enter() noexcept {
  if (!scope_.ctx.valid()) return;
  prev_ = tl_trace;
  tl_trace = &scope_;
  set_ = true;
}

bool PublishSpan::start(Tracer* tracer, std::string_view topic, std::uint32_t lane, const OutgoingMessage& m,
                        Status* status) noexcept {
  if (Status st = check_headers(m.headers); !st.ok()) {
    *status = st;
    return false;
  }
  info.kind = SpanKind::Publish;
  info.topic = topic;
  info.lane = lane;
  bool own = false;
  std::string_view own_state;
  bool has_state = false;
  for (const Header& h : m.headers) {
    if (h.name == kTraceparent) {
      own = TraceContext::parse(h.value, &info.parent);  // checked above
    } else {
      if (h.name == kTracestate) {
        own_state = h.value;
        has_state = true;
      }
      rest[nrest++] = h;  // the inner publish keeps the message's own tracestate
    }
  }
  if (own) {
    info.tracestate = own_state;
  } else if (const TraceScope* s = tl_trace; s != nullptr && s->ctx.valid()) {
    info.parent = s->ctx;
    info.tracestate = has_state ? own_state : s->tracestate;
  } else {
    info.tracestate = own_state;
  }
  span = tracer->start(info);
  if (!span.valid()) return true;
  scope.ctx = span;
  // The inner publish adds traceparent (the span), and the caller's tracestate
  // when the message has none of its own.
  scope.tracestate = has_state ? std::string_view() : info.tracestate;
  return true;
}

void HandlerTrace::begin(Tracer* tracer, std::string_view topic, std::string_view group,
                         const MessageView& view) noexcept {
  const HeadersView hs = view.headers();
  if (auto tp = hs.find(kTraceparent)) (void)TraceContext::parse(*tp, &info_.parent);
  if (auto ts = hs.find(kTracestate)) info_.tracestate = *ts;
  TraceContext ctx = info_.parent;
  if (tracer != nullptr) {
    info_.kind = SpanKind::Handle;
    info_.topic = topic;
    info_.group = group;
    info_.lane = view.lane();
    info_.attempt = view.attempt();
    span_ = tracer->start(info_);
    tracer_ = tracer;
    if (span_.valid()) ctx = span_;
  }
  if (!ctx.valid()) return;
  scope_.ctx = ctx;
  scope_.tracestate = info_.tracestate;
  prev_ = tl_trace;
  tl_trace = &scope_;
  set_ = true;
}

void HandlerTrace::end_span(Outcome::Kind kind) noexcept {
  SpanEnd e;
  e.outcome = kind == Outcome::Kind::Ack ? SpanOutcome::Ack
              : kind == Outcome::Kind::Reject ? SpanOutcome::Reject
                                              : SpanOutcome::Retry;
  tracer_->end(info_, span_, e);
  tracer_ = nullptr;
}

}  // namespace lanebus::detail

namespace lanebus {

TraceContext current_trace_context() noexcept {
  const detail::TraceScope* s = detail::tl_trace;
  return s != nullptr ? s->ctx : TraceContext{};
}

}  // namespace lanebus
