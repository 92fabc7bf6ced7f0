// lanebus — MIT License.
// Fenced durable lanes (doc/leases.md "Fenced lanes and resources"): the check-and-advance of a
// topic's fence that DurableStore runs inside the write transaction accepting
// an append, and the shared key layout of the `fence` table. Internal.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "lanebus/status.hpp"
#include "sync.hpp"

namespace lanebus::detail {

class StoreTxn;
class DurableStore;
struct TopicRef;
struct AppendRequest;
struct AppendResult;

/// Asks the lease table whether `token` was granted for `lease_name`
/// (LeaseTable::confirm_grant). OK = confirmed; anything else refuses. It is
/// called without any lanebus lock held, on the thread calling
/// DurableStore::append / append_async (or on the writer thread, inside the
/// transaction, for StoreTxn::append); it must be thread-safe and may block
/// (LeaseTable: up to its lock_timeout).
using FenceConfirmFn = std::function<Status(std::string_view lease_name, std::uint64_t token)>;

/// Longest fence (lease) name of a topic, leaving room for "/slot-4095".
inline constexpr std::size_t kMaxFenceNameBytes = 200 - 10;

/// The answer about one append's token, obtained before its transaction
/// (so the writer thread never waits on the lease table while it holds
/// LMDB's writer lock). A grant is a fact about the past: once confirmed, a
/// token stays confirmed, so asking early is exact.
struct FencePreconfirm {
  bool done = false;  ///< false: not asked (the check asks inline if it needs to)
  Status status;      ///< the hook's answer when done
};

/// What the in-transaction check decided for one append.
struct FencePlan {
  bool fenced = false;     ///< the topic is fenced and the check is on
  bool advance = false;    ///< token > high-water, confirmed: this append is the barrier
  bool duplicate = false;  ///< same idempotency key already accepted in this generation
  std::uint64_t token = 0;
  std::string fence_key;   ///< `fence` table key of the high-water record
  std::string dedupe_key;  ///< "" when the append has no idempotency key
  std::uint64_t dup_offset = 0, dup_id = 0;
};

/// The fence state of one DurableStore: the confirm hook, a cache of
/// confirmed tokens, and the test-only switch.
///
/// Thread safety: thread-safe.
class LaneFences {
 public:
  void set_confirm(FenceConfirmFn fn) EXCLUDES(mutex_);
  /// TEST ONLY (negative controls): false skips every fence check and update.
  void set_check_enabled(bool on) noexcept { check_enabled_.store(on, std::memory_order_relaxed); }
  bool check_enabled() const noexcept { return check_enabled_.load(std::memory_order_relaxed); }

  /// The lease that fences `lane` of `topic`: the fence name (per topic) or
  /// "fence/slot-<lane>" (per lane).
  static std::string lease_for(const TopicRef& topic, std::uint32_t lane);

  /// Before enqueueing: confirm the token unless it is the highest token
  /// already confirmed for that lease (the current generation's appends).
  FencePreconfirm preconfirm(const TopicRef& topic, std::uint32_t lane, std::uint64_t token) EXCLUDES(mutex_);

  /// Inside the transaction, before anything of the append is written:
  /// StaleToken, FenceViolation, InvalidArgument, Corruption or a storage
  /// code; OK with `plan` saying whether the append is a duplicate (write
  /// nothing) or a barrier.
  Status check(StoreTxn& txn, const TopicRef& topic, const AppendRequest& request, const FencePreconfirm& pre,
               FencePlan* plan) EXCLUDES(mutex_);
  /// After the append was written: advance the fence (barrier: also drop the
  /// old generation's dedupe records) and record the idempotency key.
  /// Storage errors only.
  Status record(StoreTxn& txn, const FencePlan& plan, const AppendRequest& request, const AppendResult& result);

  /// Ask the hook (or the cache) whether `token` was granted for `lease`.
  Status confirm(std::string_view lease, std::uint64_t token) EXCLUDES(mutex_);

 private:
  Mutex mutex_;
  std::shared_ptr<const FenceConfirmFn> confirm_ GUARDED_BY(mutex_);
  std::unordered_map<std::string, std::uint64_t> confirmed_ GUARDED_BY(mutex_);  // lease -> highest confirmed
  // Relaxed: a test switch read once per append; it publishes no other memory.
  std::atomic<bool> check_enabled_{true};
};

/// OK, or InvalidName / InvalidArgument for a topic's fence setting.
Status validate_topic_fence(std::string_view topic, std::string_view fence, bool per_lane, std::uint32_t lanes);

/// `fence` table keys (see doc/leases.md, "Fenced lanes and resources").
std::string lane_fence_key(std::uint32_t topic_id, std::uint32_t scope);  // 'L' + be32 topic + be32 scope
std::string resource_fence_key(std::string_view resource);                // 'R' + name
/// Scope of a per-topic fence (all lanes share one high-water).
inline constexpr std::uint32_t kTopicScope = 0xFFFFFFFFu;

/// The fence high-water of `lane` of `topic` (0 when nothing was accepted
/// yet or the topic is not fenced). One read transaction.
Result<std::uint64_t> lane_fence_high_water(DurableStore& store, const TopicRef& topic, std::uint32_t lane);

}  // namespace lanebus::detail
