// lanebus — MIT License.
// IdempotencyImpl: the two tiers behind IdempotencyTable (doc/idempotency.md) — the
// in-memory HotTier with a TTL in front of durable records in the store's
// `idem` table, decided inside the store's write transactions.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "log.hpp"
#include "process_identity.hpp"
#include "durable_store.hpp"
#include "hot_tier.hpp"
#include "lanebus/idempotency.hpp"

namespace lanebus::detail {

class IdempotencyImpl {
 public:
  IdempotencyImpl(DurableStore* store, std::string scope, const IdempotencyOptions& options);

  Result<ClaimResult> claim(std::string_view key, bool want_result);
  Status complete(std::string_view key, std::string_view result);
  Result<KeyStatus> status(std::string_view key);
  Status release(std::string_view key);
  /// Retention of done records (durable_retention; 0 = keep, returns 0).
  /// In one write transaction, consumes up to `max_records` entries of this
  /// scope's age index that are older than durable_retention, oldest first,
  /// deleting the done record each describes (and dropping it from the hot
  /// tier). Returns the number of entries consumed: `max_records` means more
  /// may be due, so call again; less means the scope is up to date. Bounded:
  /// touches at most 2 × max_records keys. Blocks for one commit.
  /// Errors: ShutDown, storage codes.
  Result<std::uint64_t> expire(std::uint32_t max_records);

  // Inside a transaction the caller already runs (transactional consume, DLQ
  // replay): the same decisions, committed with the caller's other writes.
  Result<ClaimResult> claim_in(StoreTxn& txn, std::string_view key, bool want_result);
  /// Log a claim of dead `owner` taken over (BusOptions::log, rate-limited).
  void log_takeover(std::string_view key, const ProcessIdentity& owner) noexcept;
  /// As status(), inside the caller's transaction (read or write).
  Result<KeyStatus> status_in(StoreTxn& txn, std::string_view key);
  /// With must_be_claimed = false a key that is not claimed is simply marked
  /// done (never a logic error: for transactions that already wrote).
  Status complete_in(StoreTxn& txn, std::string_view key, std::string_view result, bool must_be_claimed = true);
  /// After the caller's transaction committed: teach the hot tier.
  void remember_done(std::string_view key, std::int64_t written_at);

  /// Whether `key` is done (hot tier first, then the durable tier). No claim
  /// is taken; false for unknown keys, in-progress keys and errors.
  bool is_done(std::string_view key);

  /// Bytes the hot tier holds now (nodes, key bytes, buckets).
  std::size_t hot_footprint_bytes() const { return hot_.footprint_bytes(); }
  const std::string& scope() const noexcept { return scope_; }
  const IdempotencyOptions& options() const noexcept { return options_; }

 private:
  Status check_key(std::string_view key) const;
  std::string record_key(std::string_view key) const;
  std::string age_key(std::int64_t written_at, std::string_view key) const;

  DurableStore* store_;
  const std::string scope_;
  LogLimiter takeover_log_;  // "taken over from a dead process" lines, one a second
  const IdempotencyOptions options_;
  HotTier hot_;
};

}  // namespace lanebus::detail
