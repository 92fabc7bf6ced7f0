// lanebus — MIT License.
// Headers and trace context on the publish and delivery paths (doc/tracing.md):
// the calling thread's trace context, the headers a message is stored with,
// the Tracer's publish span and handler span.
//
// Design notes
// - A handler call whose message carries a `traceparent`, or any handler call
//   with a tracer, sets the worker's thread-local `tl_trace` (a TraceScope on
//   the worker's stack) for the call's duration; a publish on that thread
//   without its own `traceparent` is stored with the scope's context
//   (stored_headers). A publish reads `tl_trace` inside has_times (delayed.hpp):
//   the one branch a message without headers pays. `tl_trace` is initial-exec
//   TLS, one load from the thread pointer (no __tls_get_addr call).
// - The tracer's publish span wraps the whole publish (traced_publish): its
//   context becomes the message's `traceparent` by a scope set for the inner
//   publish, so the inner path has one way of adding trace context.
// - Nothing here allocates: header blocks are built on the stack
//   (HeaderBlock), scopes live on the stack, Status messages are literals.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "header_block.hpp"
#include "lanebus/handler.hpp"
#include "lanebus/message.hpp"
#include "lanebus/trace.hpp"

namespace lanebus::detail {

/// A thread's current trace context (a handler call's, or a publish span's
/// for the inner publish).
struct TraceScope {
  TraceContext ctx;
  std::string_view tracestate;
};

/// The calling thread's scope, nullptr outside one (defined in trace.cpp).
extern thread_local constinit const TraceScope* tl_trace __attribute__((tls_model("initial-exec")));

/// The stored headers of `m`: its own (checked: check_headers), plus
/// `traceparent` (and `tracestate`, if it has none) from the thread's scope
/// when it has no `traceparent`. Allocation-free.
Status stored_headers(const OutgoingMessage& m, HeaderBlock* out) noexcept;

/// A stored header block made publishable again (a DLQ replay through the
/// Bus, doc/tracing.md): its headers as OutgoingMessage::headers, in their
/// order. A block over the publish limits holds the trace pair the library
/// added (last): that pair goes through a scope for the publish instead, so
/// it is added last again without counting against the limits.
class RestoredHeaders {
 public:
  explicit RestoredHeaders(std::string_view block) noexcept;
  RestoredHeaders(const RestoredHeaders&) = delete;
  RestoredHeaders& operator=(const RestoredHeaders&) = delete;
  ~RestoredHeaders() {
    if (set_) tl_trace = prev_;
  }
  std::span<const Header> headers() const noexcept { return {rest_, n_}; }
  /// Sets the thread's scope to the block's trace context (if any) until destruction.
  void enter() noexcept;

 private:
  Header rest_[kMaxHeaders + 2];
  std::size_t n_ = 0;
  TraceScope scope_;
  bool set_ = false;
  const TraceScope* prev_ = nullptr;
};

/// The Tracer's span around one publish of `m` to `topic` (lane `lane`):
/// `publish(const OutgoingMessage&)` does the publish. Without a valid span
/// context from the tracer, `m` is published as it is.
template <class Publish>
Status traced_publish(Tracer* tracer, std::string_view topic, std::uint32_t lane, const OutgoingMessage& m,
                      Publish&& publish);

/// A handler call's trace: sets the thread's scope (the tracer's span, else
/// the message's `traceparent`) from begin to destruction. Inactive (no
/// cost but its stack) until begin.
class HandlerTrace {
 public:
  HandlerTrace() noexcept = default;
  HandlerTrace(const HandlerTrace&) = delete;
  HandlerTrace& operator=(const HandlerTrace&) = delete;
  ~HandlerTrace() {
    if (set_) tl_trace = prev_;
  }
  /// `tracer` may be nullptr (context only).
  void begin(Tracer* tracer, std::string_view topic, std::string_view group, const MessageView& view) noexcept;
  /// The tracer's end of the span (no-op without one); the scope stays until destruction.
  void end(Outcome::Kind kind) noexcept {
    if (tracer_ != nullptr) end_span(kind);
  }

 private:
  void end_span(Outcome::Kind kind) noexcept;
  Tracer* tracer_ = nullptr;
  bool set_ = false;
  const TraceScope* prev_ = nullptr;
  TraceScope scope_;
  TraceContext span_;  // what the tracer's start returned
  SpanInfo info_;
};

/// The plain runner's call of a message with headers (ephemeral_lane.cpp):
/// the handler inside the message's trace context.
template <class Handler>
Outcome handle_in_context(const Handler& handler, const MessageView& view) {
  HandlerTrace trace;
  trace.begin(nullptr, {}, {}, view);
  return handler(view);
}

// ---------------------------------------------------------------- traced_publish

/// traced_publish's steps, out of line: the span's start, and the headers
/// of the inner publish (without the message's own trace pair).
struct PublishSpan {
  SpanInfo info;
  TraceContext span;
  TraceScope scope;
  Header rest[kMaxHeaders];
  std::size_t nrest = 0;
  /// False when the headers are refused (*status says why; no span).
  bool start(Tracer* tracer, std::string_view topic, std::uint32_t lane, const OutgoingMessage& m,
             Status* status) noexcept;
};

template <class Publish>
Status traced_publish(Tracer* tracer, std::string_view topic, std::uint32_t lane, const OutgoingMessage& m,
                      Publish&& publish) {
  PublishSpan ps;
  Status st;
  if (!ps.start(tracer, topic, lane, m, &st)) return st;
  if (!ps.span.valid()) {
    st = publish(m);
  } else {
    OutgoingMessage inner = m;
    inner.headers = std::span<const Header>(ps.rest, ps.nrest);
    const TraceScope* prev = tl_trace;
    tl_trace = &ps.scope;
    st = publish(inner);
    tl_trace = prev;
  }
  tracer->end(ps.info, ps.span, SpanEnd{st.ok() ? SpanOutcome::Ok : SpanOutcome::Failed, st});
  return st;
}

}  // namespace lanebus::detail
