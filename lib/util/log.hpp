// lanebus — MIT License.
// Logger: the bus's side of the log hook (BusOptions::log, lanebus/log.hpp),
// and LogLimiter, which keeps a recurring condition to one line per second.
//
// Design notes
// - Only rare events are logged, so a line may cost a clock read and a
//   vsnprintf; it never costs a heap allocation on our side: the line is
//   formatted into a stack buffer (truncated past kMaxLine) and handed to the
//   hook as a string_view. What the hook does with it is the user's.
// - Nothing is formatted, and no clock is read, while no hook is set:
//   enabled() is the first test of every call site.
// - A Logger is immutable once built, so any thread may use it; it must
//   outlive every thread that logs (BusCore declares it before its store,
//   tenancy and workers, so it is destroyed after them).
#pragma once

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <string>

#include "lanebus/log.hpp"

#if defined(__GNUC__)
#define LANEBUS_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define LANEBUS_PRINTF(f, a)
#endif

namespace lanebus::detail {

/// One report per interval of a condition that can recur many times a second
/// (a quota refusal, a store failure). Thread safety: thread-safe.
class LogLimiter {
 public:
  static constexpr std::int64_t kIntervalNs = 1'000'000'000;
  /// true: report now, and *suppressed is the number of repeats dropped since
  /// the last report; false: this repeat is counted and dropped.
  bool admit(std::int64_t now_ns, std::uint64_t* suppressed) noexcept;

 private:
  std::atomic<std::int64_t> next_ns_{INT64_MIN};
  std::atomic<std::uint64_t> suppressed_{0};
};

/// Thread safety: thread-safe (const after construction).
class Logger {
 public:
  static constexpr std::size_t kMaxLine = 1024;

  Logger() = default;
  /// Lines start with `bus "<bus_name>": `.
  Logger(LogHook hook, std::string bus_name);

  bool enabled() const noexcept { return static_cast<bool>(hook_); }
  /// Format (printf) and hand one line to the hook; exceptions from the hook are dropped.
  void log(LogLevel level, const char* fmt, ...) const noexcept LANEBUS_PRINTF(3, 4);
  /// The same through `limiter`: at most one line per LogLimiter::kIntervalNs,
  /// the next one saying how many were suppressed.
  void limited(LogLimiter& limiter, LogLevel level, const char* fmt, ...) const noexcept LANEBUS_PRINTF(4, 5);

  /// CLOCK_MONOTONIC_COARSE in ns (the limiters' clock).
  static std::int64_t now_ns() noexcept;

 private:
  void emit(LogLevel level, std::uint64_t suppressed, const char* fmt, va_list ap) const noexcept;

  LogHook hook_;
  std::string prefix_;
};

}  // namespace lanebus::detail
