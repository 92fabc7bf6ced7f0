// lanebus — MIT License.
// FencedResource: the fenced-sink check-and-advance of SPEC §6 for a user's own
// state kept in the bus's LMDB environment, inside the user's transaction.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "lanebus/export.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

class LeaseTable;

namespace detail {
class StoreTxn;
class DurableStore;
}  // namespace detail

// ============================================================================
// Fenced resources
// ============================================================================
//
// A lease holder passes its fencing token with every write. The resource keeps
// a high-water mark (HWM), durably, in the store's `fence` table, and decides
// inside the same LMDB write transaction as the user's own writes:
//
//   token <  HWM  -> StaleToken: a newer lease generation has written; the
//                    caller's lease was lost (frozen, slow, expired).
//   token == HWM  -> OK: the current generation.
//   token >  HWM  -> a *generation barrier*: OK only if the lease table confirms
//                    it granted `token` for `lease` (LeaseTable::confirm_grant);
//                    the HWM then moves to `token`. Otherwise FenceViolation
//                    (forged, granted for another name, or absurdly large) and
//                    the HWM is unchanged.
//
// The first successful check binds the resource to its lease name: a later
// check naming another lease is FenceViolation (a token of another lease must
// never move this fence).
//
// Resource names follow the naming rule of SPEC §1 (segments of [a-z0-9_-]
// separated by '.', at most 200 bytes); lease names follow LeaseTable's rule.

/// Confirms that the lease table granted `token` for `lease_name`. OK means
/// confirmed; any other status refuses the barrier (Busy, IOError and ShutDown
/// are passed through as "could not confirm now", every other code becomes
/// FenceViolation). Called without any lanebus lock held; must be thread-safe.
using FenceConfirm = std::function<Status(std::string_view lease_name, std::uint64_t token)>;

/// Options for FencedResource.
struct FencedResourceOptions {
  /// TEST ONLY — negative controls. false turns the check off: every token is
  /// accepted and the HWM is neither read nor written. It exists so a test can
  /// show that a stale write gets through without the fence (proof that the
  /// test can fail). Default true. Never set it in production code.
  bool check_enabled = true;
};

/// The fence check for user state in a DurableStore (the Bus will expose it).
///
/// Blocking: check() blocks only when a barrier has to be confirmed (the
/// confirm function: for a LeaseTable, up to its lock_timeout); write() blocks
/// for one group commit of the store, and confirms a barrier before entering
/// the transaction.
///
/// Lifetime: a LeaseTable given to the constructor must outlive the object.
///
/// Thread safety: const methods are thread-safe (the confirm function must be).
class LANEBUS_API FencedResource {
 public:
  /// A resource fence that confirms barriers with `confirm` (an empty function
  /// refuses every barrier: FenceViolation).
  explicit FencedResource(FenceConfirm confirm, FencedResourceOptions options = {});
  /// A resource fence that confirms barriers with table.confirm_grant.
  explicit FencedResource(LeaseTable& table, FencedResourceOptions options = {});

  /// Check `token` against `resource`'s HWM inside a write transaction and
  /// advance the HWM on a confirmed barrier. Call it first in a write function
  /// (DurableStore::write), before your own writes: it writes nothing unless it
  /// returns OK, so returning its error straight away keeps StoreTxn's rule
  /// (logic errors before the first write).
  /// REQUIRES: `txn` is a write transaction.
  /// Errors:
  /// - InvalidArgument: token 0, or a read transaction.
  /// - InvalidName: bad resource or lease name.
  /// - StaleToken: token below the HWM ("below the high-water").
  /// - FenceViolation: a barrier the lease table did not confirm ("not
  ///   confirmed"), no confirm function, or another lease than the one the
  ///   resource is bound to ("is bound to lease").
  /// - Busy / IOError / ShutDown: the confirm function could not answer now;
  ///   nothing changed, retry later.
  /// - Corruption: the stored HWM record is malformed; storage codes.
  [[nodiscard]] Status check(detail::StoreTxn& txn, std::string_view resource, std::string_view lease,
                             std::uint64_t token) const;

  /// check() and then `fn`, in one write transaction of `store`, committed
  /// (Sync: fsynced) before this returns. `fn` runs only if the check passed;
  /// the HWM moves only if `fn` returns OK too, so a failed `fn` leaves the
  /// fence as it was. `fn` follows StoreTxn's rules (it may run more than once;
  /// logic errors only before its first write). Runs `fn` on the store's writer
  /// thread, with no lanebus lock held; `fn` must not call blocking store methods.
  /// Errors: those of check(), then fn's status, ShutDown, storage codes.
  [[nodiscard]] Status write(detail::DurableStore& store, std::string_view resource, std::string_view lease,
                             std::uint64_t token, const std::function<Status(detail::StoreTxn&)>& fn) const;

  /// The resource's HWM (0 when never written). One read transaction.
  /// Errors: InvalidName, Corruption, ShutDown, storage codes.
  [[nodiscard]] static Result<std::uint64_t> high_water(detail::DurableStore& store, std::string_view resource);

 private:
  FenceConfirm confirm_;
  FencedResourceOptions options_;
};

}  // namespace lanebus
