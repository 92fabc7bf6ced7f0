// lanebus — MIT License.
// W3C trace context (TraceContext) and the Tracer hook of BusOptions: how a
// trace travels from a publish to its handlers, into the messages a handler
// publishes, and across the NATS bridge (doc/tracing.md).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "lanebus/export.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

/// A W3C trace context (https://www.w3.org/TR/trace-context/): the ids of a
/// `traceparent` header. lanebus carries it in the `traceparent` and
/// `tracestate` message headers (OutgoingMessage::headers).
///
/// Thread safety: a value; const methods are safe.
struct TraceContext {
  /// Length of a version-00 `traceparent` value: `00-` 32 hex `-` 16 hex `-` 2 hex.
  static constexpr std::size_t kTraceparentBytes = 55;

  std::array<std::uint8_t, 16> trace_id{};
  std::array<std::uint8_t, 8> span_id{};  ///< W3C "parent-id": the span that sent the message
  std::uint8_t flags = 0;                 ///< trace-flags; bit 0 = sampled

  /// Both ids non-zero (W3C: an all-zero id is invalid).
  LANEBUS_API bool valid() const noexcept;
  /// Parse a `traceparent` value. Version 00 exactly as the W3C text writes it
  /// (55 bytes, lowercase hex); a higher version is read by its first 55
  /// bytes when the next byte is '-' (the W3C forward-compatibility rule).
  /// false for anything else (version ff, uppercase hex, zero ids, wrong length).
  LANEBUS_API static bool parse(std::string_view traceparent, TraceContext* out) noexcept;
  /// The `traceparent` value (version 00) into `out`, which must hold
  /// kTraceparentBytes bytes; returns the written view of `out`.
  LANEBUS_API std::string_view format(char* out) const noexcept;
  /// The trace id as 32 lowercase hex digits.
  LANEBUS_API std::string trace_id_hex() const;
  /// The span id as 16 lowercase hex digits.
  LANEBUS_API std::string span_id_hex() const;
};

/// What a span stands for.
enum class SpanKind : std::uint8_t {
  Publish,  ///< one publish call (in memory or durable, typed or bytes, an outbox publish)
  Handle,   ///< one handler call (one delivery attempt of one message to one group)
};

/// How a span ended.
enum class SpanOutcome : std::uint8_t {
  Ok,      ///< Publish: accepted (SpanEnd::status is OK)
  Failed,  ///< Publish: refused (SpanEnd::status says why)
  Ack,     ///< Handle: the handler acked
  Retry,   ///< Handle: retry, or the handler threw
  Reject,  ///< Handle: rejected
};

/// What the bus tells a Tracer about a span. Views are valid during the call only.
struct SpanInfo {
  SpanKind kind = SpanKind::Publish;
  std::string_view topic{};
  /// Handle: the consumer group (a queue's consumers: "queue"). Publish: empty.
  std::string_view group{};
  std::uint32_t lane = 0;
  /// Handle: the delivery attempt, 1-based. Publish: 0.
  std::uint32_t attempt = 0;
  /// The context this span continues: Publish — the message's own
  /// `traceparent`, else the calling handler's context; Handle — the
  /// message's `traceparent`. Invalid (all zero) when there is none: a root.
  TraceContext parent{};
  /// The `tracestate` value that travels with `parent` (may be empty).
  std::string_view tracestate{};
};

/// How a span ended: SpanOutcome, and for a Publish span its Status.
struct SpanEnd {
  SpanOutcome outcome = SpanOutcome::Ok;
  Status status{};  ///< Publish only: the publish's result
};

/// The tracing hook (BusOptions::tracer): lanebus has no tracing dependency;
/// a program plugs OpenTelemetry or anything else in here (doc/tracing.md
/// has an OpenTelemetry sketch).
///
/// - `start` is called at the start of each publish and each handler call.
///   It returns the context of the span it started: a Publish span's context
///   becomes the message's `traceparent` (so handlers become its children);
///   a Handle span's context is the handler's current context (the parent of
///   what the handler publishes). Returning an invalid context starts no span:
///   the message keeps `info.parent` (or none), the handler's context is
///   `info.parent`.
/// - `end` is called once per `start`, with the same `info` and the context
///   `start` returned, after the publish returned or the handler call ended.
/// - Threads: the publishing thread for Publish spans; the worker running the
///   handler for Handle spans; many at once (the tracer must be thread-safe).
///   No lanebus lock is held. The tracer must not publish or subscribe from
///   inside these calls.
/// - The bus allocates nothing for a span; what the tracer does is its own
///   cost (doc/tracing.md "Cost").
/// - Exceptions: the calls are noexcept; a tracer that throws terminates.
///
/// Thread safety: implementations must be thread-safe.
class LANEBUS_API Tracer {
 public:
  virtual ~Tracer();
  virtual TraceContext start(const SpanInfo& info) noexcept = 0;
  virtual void end(const SpanInfo& info, const TraceContext& span, const SpanEnd& result) noexcept = 0;
};

/// The trace context of the handler call running on this thread (a
/// Tracer's span, else the message's `traceparent`); invalid outside a
/// handler call or when the message carries none. Messages published on
/// this thread meanwhile without a `traceparent` of their own get it as
/// their parent. Thread safety: reads the calling thread's state only.
LANEBUS_API TraceContext current_trace_context() noexcept;

}  // namespace lanebus
