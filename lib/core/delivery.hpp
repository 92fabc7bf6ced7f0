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
#include <exception>
#include <span>
#include <string_view>

#include "lanebus/bus.hpp"
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

class BusCore;
class DlqStore;
class DurableStore;
class OutageGate;
struct Consumer;
struct GroupLane;
struct Slot;
struct StoredMessage;
struct TxnState;

/// A batch handler's call: an exception is stop_at(0, retry) (doc/retries.md).
inline BatchOutcome call_batch_handler(const BatchHandler& handler, std::span<const MessageView> views) noexcept {
  try {
    return handler(views);
  } catch (const std::exception&) {
    return BatchOutcome::stop_at(0, Outcome::retry("handler threw an exception"));
  } catch (...) {
    return BatchOutcome::stop_at(0, Outcome::retry("handler threw a non-standard exception"));
  }
}

/// The delivery core of one bus (delivery.cpp): the three steps above and
/// the dead letters that follow a settle. Holds no per-message state; per
/// lane state lives in the GroupLane its owner passes in (invariant 2).
class DeliveryCore {
 public:
  DeliveryCore(BusCore& bus, const BusOptions& options, OutageGate& outages) noexcept
      : bus_(bus), options_(options), outages_(outages) {}
  DeliveryCore(const DeliveryCore&) = delete;
  DeliveryCore& operator=(const DeliveryCore&) = delete;
  /// The store and its DLQ (BusCore::start; both stay nullptr on an in-memory bus).
  void set_store(DurableStore* store, DlqStore* dlq) noexcept {
    store_ = store;
    dlq_ = dlq;
  }

  Admission admit(GroupLane* gl, const Parcel& p, AdmitMode mode) noexcept;
  Invocation invoke(Consumer* c, GroupLane* gl, const Parcel& p, TxnState* tx) noexcept;
  /// A batch handler's call on a span of one lane's messages (durable
  /// topics and queues; the views' attempts and headers set by the caller):
  /// invoke's marks, an exception turned into stop_at(0, retry). No
  /// attempt_timeout, tracer or idempotency scope: the runners take this
  /// path only without them. Counts nothing per message; the caller settles
  /// what the outcome says and counts the settled messages (span_settled).
  BatchOutcome invoke_span(Consumer* c, GroupLane* gl, std::span<const MessageView> views) noexcept;
  /// After invoke_span: how many messages of the span the outcome settled
  /// (the acked prefix, *acked, and the message it stopped at), counted as
  /// delivered and in the tenancy usage, as the in-memory batch runner
  /// counts them; the messages after the stop count when they come again.
  /// With metrics on, the acked prefix's latencies (one clock read).
  std::size_t span_settled(GroupLane* gl, const BatchOutcome& out, std::span<const MessageView> views,
                           std::size_t* acked) noexcept;
  /// `durable`: the ack is counted (and a claimed key completed) by the
  /// runner's commit. `outcomes`: attempts of this message that came back
  /// with an outcome, this one included (poison classification).
  Settlement settle(GroupLane* gl, const Parcel& p, const Invocation& inv, AdmitMode mode, bool durable,
                    std::uint32_t outcomes, std::int64_t* first_failure_ns) noexcept;
  /// After a plain handler: an ack completes a claimed key, anything else releases it.
  void finish_key(GroupLane* gl, std::string_view key, bool acked) noexcept;
  /// A retry outcome for attempt `attempt`: true (and the backoff in
  /// *delay_ns) if the message should be delivered again.
  bool plan_retry(GroupLane* gl, std::uint32_t attempt, std::int64_t* delay_ns) noexcept;
  /// Before a handler call of an ephemeral message with an extension block:
  /// true when its TTL has ended (counted, dead-lettered if the group asks;
  /// the caller releases the slot; doc/delays.md).
  bool expire_if_due(GroupLane* gl, Slot* s, std::uint32_t attempts, std::int64_t first_failure_ns) noexcept;
  /// The lane's latency histogram: now minus `created_at_ns`.
  static void record_latency(GroupLane* gl, std::int64_t created_at_ns) noexcept;

  /// A DLQ entry for a message of `gl` that failed with `out`.
  /// `headers`: the message's stored header block (kept, so a replay keeps them).
  static DlqEntry dlq_entry(GroupLane* gl, const MessageHeader& h, std::string_view key, std::string_view idem,
                            std::string_view payload, std::string_view headers, std::uint64_t offset,
                            const Outcome& out, std::uint32_t attempts, ErrorClass cls,
                            std::int64_t first_failure_ns);
  /// As above, for a durable message read back from its lane.
  static DlqEntry dlq_entry(GroupLane* gl, const StoredMessage& m, const Outcome& out, std::uint32_t attempts,
                            ErrorClass cls, std::int64_t first_failure_ns);
  /// Ephemeral: dead-letter in a transaction of its own (no ack to join).
  void dead_letter_ephemeral(GroupLane* gl, const Slot* s, const Outcome& out, std::uint32_t attempts,
                             ErrorClass cls, std::int64_t first_failure_ns) noexcept;
  /// Durable topic: dead-letter and commit the offset past it in one
  /// transaction. False if the DLQ refused it (the message must stay).
  bool dead_letter_topic(GroupLane* gl, const StoredMessage& m, const Outcome& out, std::uint32_t attempts,
                         ErrorClass cls, std::int64_t first_failure_ns, std::uint64_t commit_to);

 private:
  BusCore& bus_;  // the running bus a handler sees (tl_running_bus)
  const BusOptions& options_;
  OutageGate& outages_;
  DurableStore* store_ = nullptr;
  DlqStore* dlq_ = nullptr;
};

}  // namespace lanebus::detail
