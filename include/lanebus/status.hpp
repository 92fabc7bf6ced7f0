// lanebus — MIT License.
// Status, Result<T> and the closed list of error codes: lanebus's only error vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "lanebus/export.hpp"

namespace lanebus {

/// Every way a lanebus call can fail. The list is closed: a new code is a new
/// release. `to_string(Code)` gives the enumerator's name.
enum class Code : std::uint8_t {
  Ok = 0,
  // --- arguments ---
  InvalidArgument,  ///< A parameter is out of range or malformed (empty payload, zero lanes, ...).
  InvalidName,      ///< A topic, queue, group or lease name breaks the naming rule (doc/topics.md).
  PayloadTooLarge,  ///< Key + idempotency key + payload do not fit the topic's slot size.
  Conflict,         ///< The name exists with different settings (e.g. another lane count).
  // --- flow ---
  WouldBlock,     ///< A try_ call found no room (fail-fast backpressure); nothing was published.
  TimedOut,       ///< A blocking call waited its whole timeout; nothing was published.
  QuotaExceeded,  ///< A quota refused the call (the message names it).
  // --- lifecycle ---
  ShutDown,  ///< The Bus (or table) is shut down or shutting down.
  NotFound,  ///< No topic, group, lease or entry by that name or id.
  Busy,      ///< The object is in use (e.g. closing a subscription from its own handler).
  // --- storage ---
  MapFull,           ///< The LMDB map is full and could not grow.
  DiskFull,          ///< The file system is out of space or a file-size limit was hit.
  PermissionDenied,  ///< The OS refused access to a file, directory or segment.
  Corruption,        ///< A file's contents are not what lanebus wrote (garbage, foreign file).
  VersionTooNew,     ///< A file was written by a newer lanebus layout version.
  IOError,           ///< Any other I/O failure; the message names the call and errno text.
  // --- fencing ---
  StaleToken,      ///< A fencing token below the resource's high-water mark.
  FenceViolation,  ///< A token above the high-water that the lease table did not grant.
  // --- schemas (doc/schemas.md) ---
  Incompatible,     ///< A schema change breaks the topic's compatibility mode or a consumer contract.
  SchemaViolation,  ///< A typed topic's record does not match the topic's latest schema; nothing stored.
  // --- other ---
  Internal,  ///< A lanebus bug or an unexpected system state; the message says which.
};

/// The enumerator's name, e.g. "WouldBlock". Never null; unknown values give "Unknown".
LANEBUS_API const char* to_string(Code code) noexcept;

/// The outcome of a fallible call: OK, or a Code plus a message naming the cause.
///
/// An OK status and a status built from a code alone hold no heap memory, so
/// hot-path failures (WouldBlock, ShutDown, PayloadTooLarge, ...) never allocate.
/// Cold paths attach a message that says what failed, on what, and why.
///
/// Thread safety: const methods are safe; others need external synchronization.
class [[nodiscard]] LANEBUS_API Status {
 public:
  /// OK.
  Status() noexcept = default;
  /// A failure with a code and no message (allocation-free).
  explicit Status(Code code) noexcept : code_(code) {}
  /// A failure with a code and a message (allocates the message).
  Status(Code code, std::string_view message);

  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;
  ~Status() = default;

  static Status OK() noexcept { return Status(); }
  /// A failure whose message is a string literal (or any text that outlives
  /// the Status): allocation-free, for hot-path errors.
  static Status from_literal(Code code, const char* text) noexcept {
    Status s(code);
    s.literal_ = text;
    return s;
  }

  bool ok() const noexcept { return code_ == Code::Ok; }
  Code code() const noexcept { return code_; }
  /// The message, or "" when none was attached.
  std::string_view message() const noexcept;
  /// "OK", or "<Code>: <message>" (or just "<Code>").
  std::string to_string() const;

 private:
  Code code_ = Code::Ok;
  const char* literal_ = nullptr;  // set by from_literal; not owned
  std::unique_ptr<std::string> message_;
};

/// A value of type T, or a non-OK Status explaining why there is none.
///
/// Thread safety: const methods are safe; others need external synchronization.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<1>, std::move(value)) {}  // NOLINT: implicit by design
  /// REQUIRES: !status.ok().
  Result(Status status) : v_(std::in_place_index<0>, std::move(status)) {}  // NOLINT
  Result(Code code, std::string_view message) : v_(std::in_place_index<0>, Status(code, message)) {}

  bool ok() const noexcept { return v_.index() == 1; }
  explicit operator bool() const noexcept { return ok(); }
  /// OK when a value is held, else the failure.
  Status status() const { return ok() ? Status() : std::get<0>(v_); }
  Code code() const noexcept { return ok() ? Code::Ok : std::get<0>(v_).code(); }

  /// REQUIRES: ok().
  T& value() & { return std::get<1>(v_); }
  const T& value() const& { return std::get<1>(v_); }
  T&& value() && { return std::get<1>(std::move(v_)); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace lanebus
