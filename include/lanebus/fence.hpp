// lanebus — MIT License.
// FencedResource: the fenced-sink check-and-advance for a user's own state kept
// in the bus's LMDB store, in the same transaction as the user's writes.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "lanebus/export.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

class Bus;
class LeaseTable;
class Transaction;

namespace detail {
struct Access;
}  // namespace detail

// ============================================================================
// Fenced resources
// ============================================================================
//
// A lease holder passes its fencing token with every write. The resource keeps
// a high-water mark (HWM), durably, in the `fence` table of the bus's store,
// and decides in the same LMDB write transaction as the caller's own writes:
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
// The first successful write binds the resource to its lease name: a later
// write naming another lease is FenceViolation (a token of another lease must
// never move this fence).
//
// Two ways to use it, both through a Transaction (transaction.hpp), so the
// fence, your table writes and your outbox publishes commit together or not
// at all:
//
//   - Inside a transactional handler (Bus::subscribe_tx / consume_tx): call
//     Transaction::fence(resource_fence, resource, lease, token) before your
//     writes, and return its error as the handler's outcome.
//   - Anywhere else: FencedResource::write(bus, resource, lease, token, fn)
//     runs fence + fn in one transaction of the bus's store.
//
// How the decision stays exact: a Transaction buffers its reads and writes on
// the caller's thread and commits them in one write transaction of the store's
// writer, validating every value it read (optimistic concurrency). fence()
// decides against the stored HWM when it is called (confirming a barrier
// there, never inside the writer's transaction) and the commit treats the
// fence record like a value read: if another writer moved it meanwhile, the
// commit writes nothing (Conflict) and the work runs again, now refused.
//
// Resource names follow the topic naming rule (segments of [a-z0-9_-]
// separated by '.', at most 200 bytes); lease names follow LeaseTable's rule.

/// Confirms that the lease table granted `token` for `lease_name`. OK means
/// confirmed; any other status refuses the barrier (Busy, IOError and ShutDown
/// are passed through as "could not confirm now", every other code becomes
/// FenceViolation). Called without any lanebus lock held, on the thread that
/// calls Transaction::fence or FencedResource::write; must be thread-safe.
using FenceConfirm = std::function<Status(std::string_view lease_name, std::uint64_t token)>;

/// The fence of user state in a durable Bus's store: how barriers are
/// confirmed. The object holds no state of its own (the HWMs live in the
/// store), so one object may fence any number of resources of any bus.
///
/// Blocking: a barrier (token above the HWM) calls the confirm function (for
/// a LeaseTable, up to its lock_timeout); write() also blocks for one group
/// commit of the store (Sync: fsynced).
///
/// Lifetime: a LeaseTable given to the constructor must outlive the object.
///
/// Thread safety: const methods are thread-safe (the confirm function must be).
class LANEBUS_API FencedResource {
 public:
  /// A resource fence that confirms barriers with `confirm` (an empty function
  /// refuses every barrier: FenceViolation "no lease confirmation hook").
  explicit FencedResource(FenceConfirm confirm);
  /// A resource fence that confirms barriers with table.confirm_grant.
  explicit FencedResource(LeaseTable& table);

  /// Outside a handler: run `fn` in a new Transaction of `bus`'s store after
  /// Transaction::fence(*this, resource, lease, token) passed, and commit the
  /// fence, fn's writes and its outbox publishes in one LMDB write transaction
  /// (Sync: fsynced) before returning.
  ///
  /// - The fence is checked first, on the calling thread; if it refuses, `fn`
  ///   does not run and nothing is written.
  /// - `fn` runs on the calling thread with no lanebus lock held. Its
  ///   Transaction reads committed state plus its own writes; nothing is
  ///   written until it returns OK. If it returns an error, nothing is written
  ///   and the HWM does not move; the error is returned.
  /// - The commit validates everything read (the fence record included). If
  ///   another writer changed any of it meanwhile, the whole call (fence and
  ///   `fn`) runs again, up to 16 times in all, then Conflict. So `fn` may run
  ///   more than once: keep side effects outside the store out of it.
  ///
  /// REQUIRES: `bus` has a store (BusOptions::store.directory set).
  /// Errors:
  /// - InvalidArgument: token 0, an empty `fn`, a bus without a store.
  /// - InvalidName: bad resource or lease name.
  /// - StaleToken: token below the HWM ("is below the high-water").
  /// - FenceViolation: a barrier the lease table did not confirm ("not
  ///   confirmed"), no confirm function, or another lease than the one the
  ///   resource is bound to ("is bound to lease").
  /// - Busy / IOError / ShutDown: the confirm function could not answer now;
  ///   nothing changed, retry later.
  /// - Conflict: still changing under it after 16 runs.
  /// - fn's own error; ShutDown (the bus is shut down); Corruption (a
  ///   malformed fence record); storage codes.
  [[nodiscard]] Status write(Bus& bus, std::string_view resource, std::string_view lease, std::uint64_t token,
                             const std::function<Status(Transaction&)>& fn) const;

  /// The resource's HWM in `bus`'s store (0 when never written). One read
  /// transaction. Errors: InvalidArgument (a bus without a store),
  /// InvalidName, Corruption, ShutDown, storage codes.
  [[nodiscard]] static Result<std::uint64_t> high_water(const Bus& bus, std::string_view resource);

 private:
  friend struct detail::Access;
  FenceConfirm confirm_;
  bool check_enabled_ = true;  // negative-control hook for tests (detail::Access)
};

}  // namespace lanebus
