// lanebus — MIT License.
// Logger and LogLimiter (log.hpp).
#include "log.hpp"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <ctime>

namespace lanebus {

const char* to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::Debug: return "debug";
    case LogLevel::Info: return "info";
    case LogLevel::Warn: return "warn";
    case LogLevel::Error: return "error";
  }
  return "?";
}

namespace detail {

bool LogLimiter::admit(std::int64_t now_ns, std::uint64_t* suppressed) noexcept {
  // Relaxed: the window only thins out reports; a race at its edge costs at
  // most one extra line, and the suppressed count is a statistic.
  std::int64_t next = next_ns_.load(std::memory_order_relaxed);
  if (now_ns < next || !next_ns_.compare_exchange_strong(next, now_ns + kIntervalNs, std::memory_order_relaxed)) {
    suppressed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
  return true;
}

Logger::Logger(LogHook hook, std::string bus_name)
    : hook_(std::move(hook)), prefix_("bus \"" + bus_name + "\": ") {}

std::int64_t Logger::now_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void Logger::emit(LogLevel level, std::uint64_t suppressed, const char* fmt, va_list ap) const noexcept {
  char line[kMaxLine];
  std::size_t n = prefix_.size() < kMaxLine ? prefix_.size() : kMaxLine - 1;
  prefix_.copy(line, n);
  int w = std::vsnprintf(line + n, kMaxLine - n, fmt, ap);
  if (w > 0) n += std::min<std::size_t>(static_cast<std::size_t>(w), kMaxLine - 1 - n);
  if (suppressed > 0 && n < kMaxLine - 1) {
    w = std::snprintf(line + n, kMaxLine - n, " (%llu more like it suppressed since the last line)",
                      static_cast<unsigned long long>(suppressed));
    if (w > 0) n += std::min<std::size_t>(static_cast<std::size_t>(w), kMaxLine - 1 - n);
  }
  try {
    hook_(level, std::string_view(line, n));
  } catch (...) {
    // The hook's own failure has nowhere to go (lanebus/log.hpp).
  }
}

void Logger::log(LogLevel level, const char* fmt, ...) const noexcept {
  if (!hook_) return;
  va_list ap;
  va_start(ap, fmt);
  emit(level, 0, fmt, ap);
  va_end(ap);
}

void Logger::limited(LogLimiter& limiter, LogLevel level, const char* fmt, ...) const noexcept {
  if (!hook_) return;
  std::uint64_t suppressed = 0;
  if (!limiter.admit(now_ns(), &suppressed)) return;
  va_list ap;
  va_start(ap, fmt);
  emit(level, suppressed, fmt, ap);
  va_end(ap);
}

}  // namespace detail
}  // namespace lanebus
