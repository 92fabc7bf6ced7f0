// lanebus — MIT License.
// The log hook (BusOptions::log): what the library tells an operator, and how.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "lanebus/export.hpp"

namespace lanebus {

/// Severity of a log message. The library logs only rare events (doc/observability.md
/// "Log hook"): Info for a normal change of state (a bridge connected),
/// Warn for a condition an operator should look at that the library copes
/// with (a stuck handler, a claim taken over from a dead process, a quota
/// ceiling, a DLQ refusal, a bridge disconnect or rewind), Error for a
/// failure that loses service (a store that cannot commit or sync). Debug is
/// reserved; the library emits none today.
enum class LogLevel : std::uint8_t {
  Debug,
  Info,
  Warn,
  Error,
};

/// "debug", "info", "warn" or "error" (spdlog's and syslog's usual names).
LANEBUS_API const char* to_string(LogLevel level) noexcept;

/// The log hook: called with the level and one line of text (no trailing
/// newline) naming the bus, what happened and to what, e.g.
/// `bus "orders": handler of group "billing" on "orders.created" lane 3 still running after 251 ms, past attempt_timeout (250 ms)`.
///
/// Contract (BusOptions::log):
/// - Threads: called on the thread that notices the event — a lanebus thread
///   (the store's writer thread, the watchdog, the tenancy ticker, the
///   durable poller, nats.c's and the bridge's threads) or the thread in
///   Bridge::open / Bridge::mirror_in (a connect, a rewind at bind) —
///   never inside publish, and never for a message that is merely published
///   or handled (not on the hot path). Calls may come from several threads
///   at once: the hook must be thread-safe.
/// - No lanebus mutex is held (a claim taken over is logged inside the
///   store's write transaction that takes it), but the calling thread may be
///   one the bus needs (a slow hook on the writer thread delays commits):
///   return quickly; hand the line to an asynchronous logger if writing it
///   may block.
/// - The hook must not call into the Bus, its Topics, Publishers, Clients or
///   a Bridge (it may run on the thread those calls wait for).
/// - `message` is valid only during the call: copy it to keep it.
/// - An exception thrown by the hook is caught and dropped.
/// - Repeats are rate-limited at the source: a condition that can recur many
///   times a second (quota refusals, DLQ refusals, store failures, stuck
///   handlers) is reported at most once per second per source, with the
///   number of suppressed repeats in the next line.
/// - The hook is called until Bus's destructor returns; it must stay
///   callable that long.
using LogHook = std::function<void(LogLevel level, std::string_view message)>;

}  // namespace lanebus
