// lanebus — MIT License.
// Outcome (ack / retry / reject) and the handler signature.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string_view>

#include "lanebus/message.hpp"

namespace lanebus {

/// What a handler tells the bus about one message.
///
/// - ack: done; the group moves past the message.
/// - retry(reason): a transient failure; the same message is delivered again
///   (before any later message of its lane) until the group's max_attempts,
///   then it counts as failed and goes to the DLQ (with a store; doc/dlq.md).
/// - reject(reason): a permanent failure; never retried.
///
/// The reason is copied (truncated to kMaxReason bytes), so building an
/// Outcome never allocates.
class Outcome {
 public:
  enum class Kind : std::uint8_t { Ack, Retry, Reject };
  static constexpr std::size_t kMaxReason = 95;

  static Outcome ack() noexcept { return Outcome(Kind::Ack, {}); }
  static Outcome retry(std::string_view reason) noexcept { return Outcome(Kind::Retry, reason); }
  static Outcome reject(std::string_view reason) noexcept { return Outcome(Kind::Reject, reason); }

  Kind kind() const noexcept { return kind_; }
  std::string_view reason() const noexcept { return std::string_view(reason_, len_); }

 private:
  Outcome(Kind kind, std::string_view reason) noexcept : kind_(kind) {
    len_ = static_cast<std::uint8_t>(reason.size() < kMaxReason ? reason.size() : kMaxReason);
    if (len_) std::memcpy(reason_, reason.data(), len_);
  }
  Kind kind_;
  std::uint8_t len_ = 0;
  char reason_[kMaxReason];
};

/// A message handler. Runs on a bus worker thread with no lanebus lock held;
/// at most one call at a time per (group, lane). It may publish, subscribe and
/// read stats; it must not shut the bus down or wait for its own subscription
/// to close. An exception escaping it is caught and counted as a failure of
/// that message (treated like retry("exception: ...")).
using Handler = std::function<Outcome(const MessageView&)>;

/// What a batch handler tells the bus about the messages of one call.
///
/// - all_acked(): every message of the span is done.
/// - stop_at(i, outcome): messages [0, i) are acked; message i gets
///   `outcome` (retry or reject, with the rules of Outcome; an ack counts as
///   an ack of message i); messages after i were not handled: they come
///   again, in order and at the same attempt, in a later call. A handler
///   should stop at the first message it cannot finish, so per-key order
///   holds exactly as for a one-message handler.
class BatchOutcome {
 public:
  static BatchOutcome all_acked() noexcept { return BatchOutcome(~std::size_t{0}, Outcome::ack()); }
  static BatchOutcome stop_at(std::size_t index, Outcome outcome) noexcept { return BatchOutcome(index, outcome); }

  /// Messages acked before the stop (all_acked(): the largest size_t).
  std::size_t acked() const noexcept { return acked_; }
  /// The outcome of message acked() when it is inside the span.
  const Outcome& next() const noexcept { return next_; }

 private:
  BatchOutcome(std::size_t acked, Outcome next) noexcept : acked_(acked), next_(next) {}
  std::size_t acked_;
  Outcome next_;
};

/// A batch handler (Bus::subscribe_batch, Bus::consume_batch): receives up
/// to GroupOptions::batch_max messages of one lane, oldest first. The views
/// and their bytes are valid for the call only: copy what must outlive it.
/// On a durable topic they point into the store's mapped file (read in
/// place, no copy; doc/durable.md "Reading in place") and a read transaction
/// is held until the call returns, so keep the call short. Same threading and
/// exception rules as Handler; an exception counts as stop_at(0, retry).
using BatchHandler = std::function<BatchOutcome(std::span<const MessageView>)>;

}  // namespace lanebus
