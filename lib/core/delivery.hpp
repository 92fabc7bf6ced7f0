// lanebus — MIT License.
// The delivery core: the per-message state machine that every lane runner
// (ephemeral, durable topic, durable queue) drives. Runners only fetch
// messages and commit what the core decided.
//
//   admit   idempotency before the handler: Proceed, Skip (key done) or Later
//           (another consumer holds the key; try again after a hold).
//   invoke  the handler call: deadline, watchdog registration (attempt_timeout,
//           stuck handlers), exceptions caught and turned into retries.
//   settle  the outcome → what happens next: Done (acked, or failed/rejected
//           with no DLQ), Retry after a backoff (an attempt used), or
//           DeadLetter with its error class. Settle owns the failure counters,
//           the retry plan, DLQ classification and releasing a claimed key.
//
// Invariants
// 1. A message is settled exactly once per invocation; `acked` is counted
//    by settle for ephemeral lanes and by the runner's commit completion for
//    durable lanes (after the commit — Sync: fsync — that makes it true).
// 2. Only the lane's owner (the worker running it) calls admit/invoke/settle
//    for that lane, so per-lane state needs no lock.
// 3. A Later or a Retry keeps the message ahead of every later message of its
//    key (the runner keeps it at the head, or parks it with key_parallel_retry).
#pragma once

#include <cstdint>
#include <string_view>

#include "lanebus/dlq.hpp"
#include "lanebus/handler.hpp"
#include "lanebus/message.hpp"

namespace lanebus::detail {

/// One message as the core sees it: borrowed from a slot or a StoredMessage
/// for the duration of the call.
struct Parcel {
  const MessageHeader* header = nullptr;
  std::string_view key;
  std::string_view idempotency_key;
  std::string_view payload;
  std::uint32_t lane = 0;
  std::uint64_t offset = 0;   ///< durable: log offset (ephemeral: 0)
  std::uint32_t attempt = 0;  ///< this delivery, 1-based
  std::string_view headers{};  ///< the stored header block (doc/tracing.md), or empty
};

/// Idempotency before a handler call.
enum class Admission : std::uint8_t {
  Proceed,  ///< claimed (or no key / no scope): call the handler
  Skip,     ///< the key is done: ack without calling the handler
  Later,    ///< another consumer holds the key, or a store error: hold and try again
  Expired,  ///< its TTL ended (doc/delays.md): never delivered; counted, dead-lettered if the group asks
};

/// How admit treats a key: Claim takes an in-progress claim recorded with
/// this process as owner (plain handlers); Check only asks whether the key is
/// done (transactional handlers: the check, the effects and the ack are then
/// decided again inside one transaction).
enum class AdmitMode : std::uint8_t { Claim, Check };

/// What a handler call returned, and whether it overran its budget.
struct Invocation {
  Outcome outcome = Outcome::ack();
  bool late = false;  ///< finished after attempt_timeout
};

/// What the runner does with the message after settle.
struct Settlement {
  enum class Next : std::uint8_t {
    Done,        ///< acked, or failed with no DLQ: move past it
    Retry,       ///< deliver again after delay_ns (an attempt was used)
    DeadLetter,  ///< dead-letter it (durable: with the ack / offset commit), then move past it
  };
  Next next = Next::Done;
  bool acked = false;
  std::int64_t delay_ns = 0;
  /// Retry while the group is paused (GroupOptions::outage): this attempt is
  /// not counted (the runner gives it back) and delay_ns is the wait for the
  /// next probe.
  bool uncounted = false;
  ErrorClass error_class = ErrorClass::Transient;
};

/// How long a lane holds a message whose idempotency key is busy elsewhere.
inline constexpr std::int64_t kHoldBusyKeyNs = 50'000'000;
/// How long a lane holds a message the DLQ refused (quota) before trying again.
inline constexpr std::int64_t kHoldDlqFullNs = 1'000'000'000;

}  // namespace lanebus::detail
