// lanebus — MIT License.
// The dead-letter queue (doc/dlq.md): what a DLQ entry keeps, how failures are
// classified (transient / permanent / poison), the review filters, the audit
// record, DLQ retention and quota, and the DLQ counters.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lanebus/export.hpp"
#include "lanebus/handler.hpp"
#include "lanebus/message.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

/// Why a message is in the DLQ, decided once, when it arrives (doc/dlq.md).
enum class ErrorClass : std::uint8_t {
  /// The retry budget ran out on retry()/timeouts (an unavailable dependency).
  /// Replayed automatically after a cool-down (DlqOptions::transient_cooldown).
  Transient = 0,
  /// The handler rejected the message (validation, business rule): retrying
  /// changes nothing. Waits for review.
  Permanent = 1,
  /// The message was in flight when the consumer process died, at least
  /// DlqOptions::poison_after_crashes times. Waits for review.
  Poison = 2,
  /// The message's TTL (OutgoingMessage::ttl) ended before a handler call
  /// started, in a group with GroupOptions::dead_letter_expired. Never
  /// replayed automatically. Waits for review.
  Expired = 3,
};

/// Review state of an entry. Transitions: Pending → Replayed (replay),
/// Pending → Archived (archive), Replayed → Archived (archive); purge deletes
/// an entry in any state. Nothing goes back to Pending.
enum class DlqState : std::uint8_t {
  Pending = 0,   ///< Waiting for review or for automatic replay; counts in DLQ depth.
  Replayed = 1,  ///< Re-injected into its origin topic; kept for the record.
  Archived = 2,  ///< Reviewed and set aside; never replayed.
};

/// "transient" / "permanent" / "poison" / "expired"; "unknown" for other values. Never null.
LANEBUS_API const char* to_string(ErrorClass c) noexcept;
/// "pending" / "replayed" / "archived"; "unknown" for other values. Never null.
LANEBUS_API const char* to_string(DlqState s) noexcept;
/// The inverse of to_string (exact lower-case names); nullopt for anything else.
LANEBUS_API std::optional<ErrorClass> parse_error_class(std::string_view text) noexcept;
LANEBUS_API std::optional<DlqState> parse_dlq_state(std::string_view text) noexcept;

/// Decide the class of a message that leaves the normal flow (doc/dlq.md).
///
/// - `last`: the kind of the last outcome a handler returned (Retry also stands
///   for a caught exception and for a timed-out attempt). REQUIRES: not Ack.
/// - `attempts`: the persisted attempt count of the message (a durable queue's
///   claim count: it is committed BEFORE each delivery, so an attempt whose
///   process died is counted).
/// - `attempts_with_outcome`: the attempts that came back with an outcome
///   (returned, threw or timed out). attempts − attempts_with_outcome is the
///   number of times the consumer process died with the message in flight.
/// - `timed_out`: the last attempt hit GroupOptions::attempt_timeout.
/// - `poison_after_crashes`: DlqOptions::poison_after_crashes (0 = never poison).
///
/// Rules, first match wins: crashes >= poison_after_crashes → Poison;
/// last == Reject → Permanent; otherwise (retry budget exhausted on retry(),
/// exceptions or timeouts) → Transient. Pure function: no I/O, never blocks,
/// thread-safe.
LANEBUS_API ErrorClass classify_failure(Outcome::Kind last, std::uint32_t attempts,
                                        std::uint32_t attempts_with_outcome, bool timed_out,
                                        std::uint32_t poison_after_crashes = 3) noexcept;

/// One dead-letter entry: the original message plus why and where it failed.
/// A plain value (owns its bytes).
struct DlqEntry {
  // ---- identity and state (assigned by the DLQ; ignored on add) ----
  /// Increasing per store (never reused, also across processes), starting at 1.
  std::uint64_t id = 0;
  DlqState state = DlqState::Pending;
  /// Wall-clock time the entry arrived in the DLQ, ns since the Unix epoch.
  std::int64_t dead_at_ns = 0;
  /// Time of the last state change (replay / archive); 0 while Pending.
  std::int64_t state_changed_at_ns = 0;
  /// Who made the last state change (the operator name; "auto" for automatic
  /// transient replay); empty while Pending.
  std::string state_changed_by{};
  /// After a replay: where the re-injected message landed in the origin topic
  /// (lane = origin_lane). 0 otherwise, and for ephemeral origins.
  std::uint64_t replay_offset = 0;

  // ---- the original message ----
  /// The header as delivered (id, created_at, correlation id, fencing token,
  /// attempt, content type, schema version).
  MessageHeader header;
  std::string key{};
  std::string idempotency_key{};
  std::string payload{};  ///< Must not be empty.
  /// The message's headers (OutgoingMessage::headers, with the trace context
  /// the library added; doc/tracing.md) in their stored form: read them with
  /// `HeadersView(entry.headers)`. Empty when it had none. A replay publishes
  /// them again, so a replayed message keeps its trace context. On add: empty
  /// or a well-formed block (else InvalidArgument).
  std::string headers{};

  // ---- the failure ----
  ErrorClass error_class = ErrorClass::Transient;
  /// Short machine-friendly reason, e.g. the Outcome's reason or "timeout".
  std::string reason{};
  /// Longer human text (exception text, validation message). May be empty.
  std::string error_text{};
  /// Delivery attempts made (the persisted count for durable queues).
  std::uint32_t attempts = 0;
  /// Wall-clock times of the first and last failed attempt, ns since the epoch.
  std::int64_t first_failure_ns = 0;
  std::int64_t last_failure_ns = 0;

  // ---- origin ----
  /// Origin topic or queue name (must be a valid name). Replay appends to it.
  std::string topic{};
  /// The durable topic's store id; 0 for an ephemeral topic.
  std::uint32_t topic_id = 0;
  std::uint32_t lane = 0;
  std::uint64_t offset = 0;  ///< Offset in the lane's log (durable); 0 for ephemeral.
  /// The consumer group that failed it (queues: the queue's group name).
  std::string group{};
};

/// Which entries list() / purge(filter) select. Every set field must match.
struct DlqFilter {
  std::optional<std::string> topic{};
  std::optional<std::string> group{};
  std::optional<ErrorClass> error_class{};
  std::optional<DlqState> state{};
  /// Entries that arrived at least this long ago (dead_at <= now − older_than).
  std::optional<std::chrono::milliseconds> older_than{};
  /// Entries that arrived at most this long ago (dead_at >= now − newer_than).
  std::optional<std::chrono::milliseconds> newer_than{};
  /// Only entries with id > after_id (paging: pass the last id seen). Default 0.
  std::uint64_t after_id = 0;
  /// At most this many entries (0 = no limit). list() only.
  std::uint32_t limit = 0;
};

/// What an operator did. Purge and automatic actions are audited too.
enum class DlqAction : std::uint8_t {
  Replay = 0,   ///< replay() by an operator.
  Archive = 1,  ///< archive().
  Purge = 2,    ///< purge() (by ids or by filter).
  AutoReplay = 3,  ///< replay_due_transient() (operator "auto" unless given).
  Expire = 4,      ///< retention (expire()) or quota overflow (operator "retention"/"quota").
};
/// "replay" / "archive" / "purge" / "auto-replay" / "expire". Never null.
LANEBUS_API const char* to_string(DlqAction a) noexcept;

/// One audit record, written in the same transaction as the action it records.
struct DlqAuditRecord {
  std::uint64_t seq = 0;          ///< Increasing per store, from 1.
  std::int64_t at_ns = 0;         ///< When, ns since the Unix epoch.
  DlqAction action = DlqAction::Replay;
  std::string operator_name{};      ///< Who.
  std::vector<std::uint64_t> ids;  ///< Which entries (sorted, unique).
};

/// What to do when an add would exceed the DLQ quota (doc/dlq.md).
enum class DlqOverflow : std::uint8_t {
  /// add fails with QuotaExceeded and nothing changes; the Bus keeps the
  /// message in its queue (backpressure) and counts the refusal.
  RejectNew = 0,
  /// Delete the oldest entries (any state; lowest ids first) until the new one
  /// fits; counted in DlqCounters::dropped and audited as Expire by "quota".
  DropOldest = 1,
};

/// DLQ settings, per store. Plain struct; every field has a default.
struct DlqOptions {
  // ---- retention (its own setting, doc/dlq.md; applied by expire()) ----
  /// Delete entries (any state) that arrived longer ago than this. Default
  /// 14 days (usually longer than a topic's retention); 0 = keep.
  std::chrono::milliseconds retention_max_age{std::chrono::hours(24 * 14)};
  /// Keep at most this many entries (oldest deleted first). Default 0 = no limit.
  std::uint64_t retention_max_count = 0;
  /// Most entries one expire() call deletes (bounds the write transaction).
  /// Default 4096. Must be > 0.
  std::uint32_t expire_batch = 4096;

  // ---- quota (applied on every add) ----
  /// Most entries held (0 = no limit). Default 1,000,000.
  std::uint64_t max_entries = 1'000'000;
  /// Most bytes of encoded entries held (0 = no limit). Default 1 GiB.
  std::uint64_t max_bytes = 1ull << 30;
  DlqOverflow overflow = DlqOverflow::RejectNew;

  // ---- classification and automatic replay ----
  /// Crashes with the message in flight that make it poison (see
  /// classify_failure). Default 3; 0 = never poison.
  std::uint32_t poison_after_crashes = 3;
  /// Cool-down before a transient entry is replayed automatically by
  /// replay_due_transient(). Default 5 min.
  std::chrono::milliseconds transient_cooldown{std::chrono::minutes(5)};
};

/// DLQ counters, persisted in the DLQ table and updated in the same
/// transaction as each change, so they are exact, survive restarts and agree
/// across processes. Read in one read transaction (a consistent snapshot).
struct DlqCounters {
  std::uint64_t pending = 0;   ///< DLQ depth: entries waiting (state Pending).
  std::uint64_t replayed = 0;  ///< Entries currently held in state Replayed.
  std::uint64_t archived = 0;  ///< Entries currently held in state Archived.
  std::uint64_t entries = 0;   ///< All entries held (= pending + replayed + archived).
  std::uint64_t bytes = 0;     ///< Encoded bytes of all entries held.
  /// Arrival time of the oldest pending entry (ns since the epoch); 0 = none.
  std::int64_t oldest_pending_at_ns = 0;
  /// now − oldest_pending_at_ns at the time of the read, in ns; 0 = none.
  std::int64_t oldest_pending_age_ns = 0;
  /// Arrivals since the store was created, per class (index = ErrorClass).
  std::uint64_t arrivals[4] = {0, 0, 0, 0};
  std::uint64_t replays = 0;       ///< Entries replayed by operators (total).
  std::uint64_t auto_replays = 0;  ///< Entries replayed by replay_due_transient (total).
  std::uint64_t purged = 0;        ///< Entries deleted by purge (total).
  std::uint64_t expired = 0;       ///< Entries deleted by retention (total).
  std::uint64_t dropped = 0;       ///< Entries deleted by DlqOverflow::DropOldest (total).
  /// Adds refused by DlqOverflow::RejectNew through this DlqStore object since
  /// it was created. Not persisted: a refused add writes nothing.
  std::uint64_t rejected = 0;
};

namespace detail {
struct Access;
class BusCore;
}  // namespace detail

/// The bus's dead-letter queue, for review (doc/dlq.md): list, show, replay,
/// archive, purge, audit, counters — the same operations as `lanebus dlq`.
/// Obtained from Bus::dead_letters(); valid while the Bus lives. Every
/// mutation validates all ids first (nothing changes on any error) and
/// appends an audit record naming `operator_name`, in one transaction.
/// Replay re-publishes the original message (same key and idempotency key)
/// into its origin topic, so it goes through the normal idempotency path.
///
/// Thread safety: thread-safe. Every call blocks for one read transaction or
/// one commit of the bus's store.
class LANEBUS_API DeadLetters {
 public:
  /// Entries matching `filter`, by increasing id.
  Result<std::vector<DlqEntry>> list(const DlqFilter& filter = {});
  /// One entry. Errors: NotFound naming the id.
  Result<DlqEntry> show(std::uint64_t id);
  /// Re-inject entries into their origin topics; returns how many.
  /// Errors (nothing changed): InvalidArgument (no ids, empty operator),
  /// NotFound (an id or origin topic), Conflict (already replayed or archived).
  Result<std::uint64_t> replay(const std::vector<std::uint64_t>& ids, std::string_view operator_name);
  /// Errors (nothing changed): InvalidArgument, NotFound, Conflict (already archived).
  Status archive(const std::vector<std::uint64_t>& ids, std::string_view operator_name);
  /// Delete entries; returns how many. Errors (nothing changed): InvalidArgument, NotFound.
  Result<std::uint64_t> purge(const std::vector<std::uint64_t>& ids, std::string_view operator_name);
  /// Every audit record, oldest first.
  Result<std::vector<DlqAuditRecord>> audit();
  /// Depth, oldest pending age, arrivals per class.
  Result<DlqCounters> counters();

 private:
  friend struct detail::Access;
  explicit DeadLetters(detail::BusCore* core) noexcept : core_(core) {}
  detail::BusCore* core_;
};

}  // namespace lanebus
