// lanebus — MIT License.
// Idempotency tables (doc/idempotency.md): claim / complete / status / release of a
// stable business key, atomic across threads and processes sharing a store.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "lanebus/export.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

namespace detail {
struct Access;
class IdempotencyImpl;
class BusCore;
}  // namespace detail

/// Per idempotency scope (one table). Plain struct; every field has a default.
struct IdempotencyOptions {
  // ---- hot tier (in memory, in front of the durable tier) ----
  /// How long the hot tier trusts what it has seen; size it to the
  /// redelivery window. A miss or an expired entry always falls back to the
  /// durable tier, so a short TTL costs lookups, never duplicates. Default 10 min.
  std::chrono::milliseconds hot_ttl{std::chrono::minutes(10)};
  /// The most keys the hot tier holds (least recently written evicted first).
  /// Memory grows with use up to this bound: the tier starts with 1,024
  /// entries and doubles when an insert finds every entry in use and within
  /// hot_ttl, so it follows the keys of one TTL window. Each entry costs
  /// about max_key_bytes + 56 bytes. With the defaults (max_key_bytes 512) a
  /// scope holds 581,632 bytes (568 KiB) at creation and at most 37,224,448
  /// bytes (35.5 MiB) at this bound; lookups never allocate, and neither do
  /// inserts once the bound (or a stable working set) is reached. Default 65536.
  std::uint32_t hot_capacity = 65536;

  // ---- durable tier (LMDB, no TTL) ----
  /// Done records older than this are deleted by the bus's background
  /// maintenance (about once a second, in bounded batches). Applies to
  /// records completed while it was set; records completed with 0 are kept.
  /// 0 = keep for ever (the default): correctness first; set it
  /// explicitly, longer than any redelivery horizon (max attempts × backoff +
  /// topic retention + DLQ retention).
  std::chrono::milliseconds durable_retention{0};
  /// An in-progress claim records its owner (pid, process start time, boot
  /// id). A claim whose owner is certainly dead (killed, exited, from an
  /// earlier boot) is taken over by the next claimer at once. A claim whose
  /// owner is alive, or cannot be checked (another pid namespace, records
  /// written by an older lanebus), is taken over only once it is older than
  /// this. Default 5 min.
  std::chrono::milliseconds claim_timeout{std::chrono::minutes(5)};

  // ---- limits ----
  /// Longest key accepted, in bytes (1..4096). Default 512.
  std::uint32_t max_key_bytes = 512;
  /// Longest result accepted by complete(), in bytes. Default 64 KiB.
  std::uint32_t max_result_bytes = 64 * 1024;
};

/// What claim() found.
enum class ClaimState : std::uint8_t {
  /// The caller now owns the key: do the work, then complete() (or release()
  /// if it failed and may be retried).
  Claimed,
  /// Someone else holds an unexpired claim: do not do the work now.
  InProgress,
  /// The work was already done: skip it (the result is in `result`).
  Done,
};

/// The durable state of one key.
struct KeyStatus {
  ClaimState state = ClaimState::Claimed;  ///< InProgress or Done (Claimed never appears here).
  std::int64_t written_at_ns = 0;          ///< Wall clock of the last claim or completion.
  std::string result{};                      ///< complete()'s result (Done only).
  /// InProgress only: the pid of the claim's owner (0 = not recorded), and
  /// whether that owner is certainly dead (then the next claim() takes the
  /// key over at once).
  std::uint32_t owner_pid = 0;
  bool owner_dead = false;
};

struct ClaimResult {
  ClaimState state = ClaimState::Claimed;
  /// For Done: the stored result (empty if it was found in the hot tier
  /// only and `want_result` was false).
  std::string result{};
  std::int64_t written_at_ns = 0;
};

/// One idempotency scope: maps (scope, key) → {in_progress | done, written_at,
/// result}. Created by Bus::idempotency(); valid while its Bus lives.
///
/// Exactly-once effects = at-least-once delivery + this table: call claim()
/// with the message's stable business key (never a delivery id), do the work
/// only on Claimed, then complete(). Every durable operation commits through
/// the store's group commit (Sync mode: fsynced) before it returns.
///
/// Thread safety: thread-safe; claim() is atomic across threads and across
/// processes that share the store.
class LANEBUS_API IdempotencyTable {
 public:
  ~IdempotencyTable();
  IdempotencyTable(const IdempotencyTable&) = delete;
  IdempotencyTable& operator=(const IdempotencyTable&) = delete;

  /// Atomic check-and-set: exactly one of concurrent claimers of an unknown
  /// (or released, or timed-out in-progress, or held by a dead process) key
  /// gets Claimed. A claim held by a live process (this one included: another
  /// thread) stays InProgress until claim_timeout. A hot-tier hit
  /// for "done" answers without touching LMDB; anything else is decided in an
  /// LMDB write transaction. Blocks for one commit (unless hot "done").
  /// Errors: InvalidArgument (empty key), PayloadTooLarge (key longer than
  /// max_key_bytes), ShutDown, storage codes.
  Result<ClaimResult> claim(std::string_view key, bool want_result = false);
  /// Mark a key the caller claimed as done, with an optional result. Blocks
  /// for one commit. Errors: NotFound (not claimed), PayloadTooLarge (result),
  /// InvalidArgument, ShutDown, storage codes. Completing a done key is OK.
  Status complete(std::string_view key, std::string_view result = {});
  /// The durable state. Errors: NotFound (unknown key), InvalidArgument, ShutDown.
  Result<KeyStatus> status(std::string_view key);
  /// Forget an in-progress claim whose work failed, so the key can be claimed
  /// again. Blocks for one commit. Errors: NotFound (not in progress: unknown
  /// or already done — a done key is never released), InvalidArgument, ShutDown.
  Status release(std::string_view key);

  std::string_view scope() const noexcept;

 private:
  friend struct detail::Access;
  friend class detail::BusCore;
  friend class detail::IdempotencyImpl;
  explicit IdempotencyTable(std::unique_ptr<detail::IdempotencyImpl> impl) noexcept;
  std::unique_ptr<detail::IdempotencyImpl> impl_;
};

}  // namespace lanebus
