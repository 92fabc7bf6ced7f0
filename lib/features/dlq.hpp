// lanebus — MIT License.
// DlqStore: the dead-letter queue (doc/dlq.md) kept in the durable store's `dlq`
// and `dlq_audit` tables — moves that commit with the failed message's ack,
// the review API (list/show/replay/archive/purge/audit), retention, quota,
// automatic transient replay, poison bookkeeping and persisted counters.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "durable_store.hpp"
#include "lanebus/dlq.hpp"
#include "lanebus/status.hpp"

namespace lanebus::detail {

/// Where a replayed entry went.
struct DlqReplayed {
  std::uint64_t id = 0;       ///< The DLQ entry.
  std::string topic;          ///< Its origin topic.
  std::uint32_t lane = 0;
  std::uint64_t offset = 0;   ///< Offset of the re-appended message (durable origin); 0 = republished.
  bool republished = false;   ///< true: ephemeral origin, handed to the republish callback.
  std::uint64_t bytes = 0;    ///< Key + idempotency key + payload bytes of the message.
};

/// For entries whose origin topic is not a durable topic of the store
/// (ephemeral topics, topic_id 0): called after the commit that marked them
/// replayed, once per entry, on the calling thread, with no lanebus lock and
/// no transaction held. Delivery through it is at-most-once (a crash between
/// the commit and the call loses the replay; the entry says Replayed).
using DlqRepublish = std::function<Status(const DlqEntry&)>;

/// The dead-letter queue of one durable store.
///
/// Design notes:
/// - `dlq` table keys: "e"+be64(id) → entry; "p"+be64(id) → "" for each
///   Pending entry (so the oldest pending entry and the pending set are one
///   cursor seek away); "s" → the stats record (next entry id, next audit
///   seq, per-state counts, bytes, arrivals per class, totals); "o"+be32
///   topic+be32 group+be32 lane+be64 offset → u32 outcomes (poison bookkeeping); "m"+be32 topic+be32
///   group+be32 lane → the lane's TopicMark (durable topic poison bookkeeping).
/// - `dlq_audit` keys: be64(seq) → record.
/// - Every change to an entry updates the stats record and, for replay /
///   archive / purge / expire, appends an audit record — all in one write
///   transaction, so counters are exact and the audit is complete.
/// - Every mutation validates everything (ids exist, states allow it, topics
///   resolve) before its first write, following StoreTxn's rule: a refused
///   batch changes nothing.
/// - Entry ids and audit seqs come from the stats record, read and written in
///   the write transaction: LMDB's single writer makes them unique and
///   increasing across processes.
///
/// Thread safety: thread-safe (every method is one DurableStore::read or
/// write). The *_in methods run on the store's writer thread inside the
/// caller's transaction, one thread at a time like the StoreTxn itself.
class DlqStore {
 public:
  /// A DLQ over `store`, which must outlive this object. `clock` (ns since the
  /// epoch) replaces the transaction's wall clock for arrival time, ages,
  /// retention and cool-downs: tests inject it; empty = StoreTxn::now_ns().
  explicit DlqStore(DurableStore& store, DlqOptions options = {}, std::function<std::int64_t()> clock = {});

  const DlqOptions& options() const noexcept { return options_; }

  /// Called after a replay commits, once per message re-appended to a durable
  /// origin topic, with the topic and the message's key + idempotency key +
  /// payload bytes (the Bus charges it to the topic's namespace usage; a
  /// republished ephemeral entry is counted by its publish). Set before use.
  using ReplayListener = std::function<void(std::string_view topic, std::uint64_t bytes)>;
  void set_replay_listener(ReplayListener listener) { replay_listener_ = std::move(listener); }

  /// Checks a new entry without I/O: payload not empty, topic a valid name,
  /// group not empty, strings within limits (key/idempotency key ≤ 65535
  /// bytes, reason/error text ≤ 64 KiB, payload ≤ 1 GiB).
  /// Errors: InvalidArgument, InvalidName, PayloadTooLarge.
  [[nodiscard]] static Status validate(const DlqEntry& entry);

  // ---------------------------------------------------------------- arrivals

  /// Add `entry` inside the caller's write transaction (the Bus calls it in
  /// the transaction that acks the failed message). Order inside: validate,
  /// quota (RejectNew → QuotaExceeded), then `before_write` (pass the ack /
  /// commit_offset of the failed message here: if it fails, its status is
  /// returned and nothing was written), then the writes. So a logic error can
  /// only come before the first write, as StoreTxn requires. The id, state,
  /// dead_at and state fields of `entry` are ignored (assigned here).
  /// Returns the new entry id. Errors: validate's, QuotaExceeded,
  /// InvalidArgument (read transaction), before_write's, storage codes.
  /// Re-runnable (a MapFull batch is retried): it keeps no state between runs.
  [[nodiscard]] Result<std::uint64_t> add_in(StoreTxn& txn, const DlqEntry& entry,
                                             const std::function<Status()>& before_write = {});
  /// add_in in a transaction of its own (ephemeral topics: no ack to join).
  /// Blocks for one group commit. Errors: as add_in, ShutDown, Busy (writer thread).
  [[nodiscard]] Result<std::uint64_t> add(const DlqEntry& entry);

  // ---------------------------------------------------------------- review

  /// Entries matching `filter`, by increasing id, in one read transaction.
  /// Errors: Corruption (an entry does not decode), ShutDown, storage codes.
  [[nodiscard]] Result<std::vector<DlqEntry>> list(const DlqFilter& filter = {});
  /// One entry. Errors: NotFound ("dlq entry 7 not found"), Corruption, ShutDown.
  [[nodiscard]] Result<DlqEntry> show(std::uint64_t id);

  /// Re-inject each entry into the main flow: append the original message
  /// (same key, idempotency key, payload and header fields except attempt = 0
  /// and created_at = the replay time, so topic retention keeps it) to its
  /// origin topic and lane, mark the entry Replayed and append one audit
  /// record — one transaction for the whole batch. The replayed message is
  /// delivered like any other, so a group with an idempotency scope skips it
  /// if its key is already done (no bypass). On a fan-out topic every group
  /// sees it again. Entries of ephemeral origins (topic_id 0) need
  /// `republish` (called after the commit).
  /// Errors (nothing changed): InvalidArgument (no ids, empty operator,
  /// ephemeral origin without republish), NotFound (an id, or the origin
  /// topic, does not exist: the message names it), Conflict (an entry is
  /// already Replayed or Archived), storage codes; after the commit:
  /// republish's first failure (the entries are marked Replayed).
  [[nodiscard]] Result<std::vector<DlqReplayed>> replay(std::span<const std::uint64_t> ids,
                                                        std::string_view operator_name,
                                                        const DlqRepublish& republish = {});
  /// Mark entries Archived (from Pending or Replayed) and audit it, in one
  /// transaction. Errors (nothing changed): InvalidArgument, NotFound,
  /// Conflict (already Archived), storage codes.
  [[nodiscard]] Status archive(std::span<const std::uint64_t> ids, std::string_view operator_name);
  /// Delete entries (any state) and audit it, in one transaction. Returns the
  /// number deleted. Errors (nothing changed): InvalidArgument, NotFound, storage codes.
  [[nodiscard]] Result<std::uint64_t> purge(std::span<const std::uint64_t> ids, std::string_view operator_name);
  /// Delete every entry matching `filter` (its limit is ignored) and audit
  /// the ids, in one transaction. Matching nothing is OK (returns 0, no audit).
  [[nodiscard]] Result<std::uint64_t> purge(const DlqFilter& filter, std::string_view operator_name);
  /// Audit records with seq > after_seq, oldest first, at most `limit` (0 = all).
  [[nodiscard]] Result<std::vector<DlqAuditRecord>> audit(std::uint64_t after_seq = 0, std::uint32_t limit = 0);

  // ---------------------------------------------------------------- periodic

  /// Apply DlqOptions retention (age, count): delete up to expire_batch
  /// entries, oldest first, audited as Expire by "retention". Returns how many
  /// were deleted (call again while it returns expire_batch). Blocks for one commit.
  [[nodiscard]] Result<std::uint64_t> expire();
  /// Replay Pending Transient entries that arrived at least `cooldown` ago
  /// (up to expire_batch per call), audited as AutoReplay. Entries whose
  /// origin topic no longer resolves are skipped (left Pending). Permanent
  /// and Poison entries are never touched. Returns how many were replayed.
  [[nodiscard]] Result<std::uint64_t> replay_due_transient(std::chrono::milliseconds cooldown,
                                                           std::string_view operator_name = "auto",
                                                           const DlqRepublish& republish = {});

  /// Depth, oldest pending age, arrivals per class and totals: one read
  /// transaction, O(1). Errors: Corruption, ShutDown, storage codes.
  [[nodiscard]] Result<DlqCounters> counters();
  /// Entries refused by the quota since open (DlqCounters::rejected), without a read.
  std::uint64_t rejected() const noexcept { return rejected_.load(std::memory_order_relaxed); }

  // ---------------------------------------------------------------- poison bookkeeping

  /// Record, inside the caller's write transaction, that one more attempt of
  /// (topic, group, lane, offset) came back with an outcome; returns the new
  /// count. The Bus calls it BEFORE releasing the claim for a retry (a crash
  /// in between over-counts outcomes: it errs towards "not poison").
  [[nodiscard]] Result<std::uint32_t> note_outcome_in(StoreTxn& txn, const GroupRef& group, std::uint32_t lane,
                                                      std::uint64_t offset);
  /// The count recorded so far (0 if none). Works in read transactions.
  [[nodiscard]] Result<std::uint32_t> outcomes_in(StoreTxn& txn, const GroupRef& group, std::uint32_t lane,
                                                  std::uint64_t offset);
  /// Drop the record (in the transaction that acks or dead-letters the message).
  [[nodiscard]] Status forget_outcomes_in(StoreTxn& txn, const GroupRef& group, std::uint32_t lane,
                                          std::uint64_t offset);

  /// Poison bookkeeping of durable topic groups, whose messages have no
  /// claim: before a group delivers offsets [from, to) of a lane it records
  /// this mark (committed before the first handler call). A restart that
  /// finds the group's committed offset inside [from, to) knows the process
  /// died while delivering: it then delivers one message at a time up to
  /// `careful_to`, each under a mark of its own that counts the crashes of
  /// the message at `from`.
  struct TopicMark {
    std::uint64_t from = 0;
    std::uint64_t to = 0;
    std::uint64_t careful_to = 0;  ///< one-at-a-time delivery up to here
    std::uint32_t crashes = 0;     ///< earlier crashes of the message at `from`
  };
  /// The lane's mark, nullopt when none was written.
  [[nodiscard]] Result<std::optional<TopicMark>> topic_mark_in(StoreTxn& txn, const GroupRef& group,
                                                               std::uint32_t lane);
  [[nodiscard]] Status set_topic_mark_in(StoreTxn& txn, const GroupRef& group, std::uint32_t lane,
                                         const TopicMark& mark);

  // ---------------------------------------------------------------- namespace move

  /// Insert `entry` as it is (state, times, replay offset kept) under the
  /// next entry id, inside the caller's write transaction, and count it in
  /// the stats record (state, entries, bytes, arrivals). Used by the offline
  /// namespace move (lib/features/namespace_move.hpp). Returns the new id.
  [[nodiscard]] static Result<std::uint64_t> import_in(StoreTxn& txn, DlqEntry entry);
  /// Delete entry `id` and its pending index, uncounting it (state, entries,
  /// bytes; arrival totals stay). NotFound when absent. Same user.
  [[nodiscard]] static Status remove_in(StoreTxn& txn, std::uint64_t id);

 private:
  struct Stats;
  std::int64_t now(const StoreTxn& txn) const;
  Result<std::uint64_t> add_impl(StoreTxn& txn, const DlqEntry& entry, const std::function<Status()>& before_write);
  Result<std::vector<DlqReplayed>> replay_impl(std::vector<std::uint64_t> ids, std::string_view operator_name,
                                               DlqAction action, const DlqRepublish& republish);

  DurableStore& store_;
  DlqOptions options_;
  ReplayListener replay_listener_;
  std::function<std::int64_t()> clock_;
  // Relaxed: an independent statistic.
  std::atomic<std::uint64_t> rejected_{0};
};

/// Binary encodings (exposed for tests: a truncated record must decode to Corruption).
std::string encode_dlq_entry(const DlqEntry& e);
Result<DlqEntry> decode_dlq_entry(std::string_view bytes);
/// OK when a `dlq_audit` record (key be64 seq, value) decodes; Corruption otherwise
/// (the verify walk, lib/ops/verify.cpp, and the fuzz targets).
Status check_dlq_audit_record(std::string_view key, std::string_view value);

}  // namespace lanebus::detail
