// lanebus — MIT License.
// Transactional consume (doc/idempotency.md): a handler's own LMDB writes, its outbox
// publishes, the dedup record and the ack commit in one transaction.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "lanebus/export.hpp"
#include "lanebus/handler.hpp"
#include "lanebus/message.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

class FencedResource;
class Topic;
namespace detail {
struct Access;
struct TxnState;
}  // namespace detail

/// What a transactional handler works with. Reads see the committed state of
/// the bus's store plus this transaction's own writes. Nothing is written
/// until the handler returns ack; then the writes, the outbox publishes, the
/// idempotency record (with an idempotency scope) and the ack (queues) or the
/// offset commit (topics) commit in ONE LMDB transaction: a crash at any
/// instant leaves all of them or none, so effects kept in the store happen
/// exactly once. The commit validates every value the handler read (optimistic
/// concurrency); if another transaction changed one meanwhile, nothing is
/// written and the message is delivered again (counted as retried, without
/// using an attempt).
///
/// Tables are named like topics ([a-z0-9_-.], ≤ 200 bytes); keys and values
/// are bytes (keys ≤ 500 bytes). Valid only during the handler call (or the
/// FencedResource::write call) that received it; only the library creates one.
///
/// Thread safety: one thread (the handler's).
class LANEBUS_API Transaction {
 public:
  /// The value of `key` in `table`. Errors: NotFound, InvalidName (table),
  /// InvalidArgument (empty or oversized key), storage codes.
  Result<std::string> get(std::string_view table, std::string_view key);
  /// Errors: InvalidName, InvalidArgument (empty key, key > 500 bytes).
  Status put(std::string_view table, std::string_view key, std::string_view value);
  /// Errors as put; deleting a missing key is OK.
  Status del(std::string_view table, std::string_view key);
  /// Publish through the outbox: the message is appended to `topic` (a
  /// durable topic or queue of the same bus) in the same transaction.
  /// A topic with a schema checks the record like Topic::publish
  /// (doc/schemas.md): a record that does not match the latest version is
  /// refused with SchemaViolation and is not added to the outbox (the rest of
  /// the transaction is unaffected).
  /// Errors: InvalidArgument (not durable, other bus, empty payload), SchemaViolation.
  Status publish(const Topic& topic, const OutgoingMessage& message);

  /// Fence this transaction with `resource_fence` (fence.hpp): check `token`
  /// against the high-water mark (HWM) of `resource` now, and make the commit
  /// conditional on it. Call it before your writes.
  ///
  /// OK: the token is the current generation (== HWM), or a barrier (> HWM)
  /// that the lease table confirmed; the commit then moves the HWM to `token`.
  /// The commit re-validates the fence record like every value read: if
  /// another writer moved the HWM meanwhile, nothing is written and the
  /// message is delivered again (Conflict), so this call then refuses.
  ///
  /// Refused (any error): the transaction is void. Nothing of it will be
  /// written, whatever the handler returns (an ack then only acknowledges the
  /// message), and later get/put/del/publish/fence calls return the same
  /// error. Return the error as the outcome (e.g. Outcome::reject for
  /// StaleToken: this worker's lease is gone).
  ///
  /// Blocks: one read transaction; a barrier also calls the confirm function
  /// (LeaseTable: up to its lock_timeout), with no lanebus lock held.
  /// Errors:
  /// - InvalidArgument: token 0.
  /// - InvalidName: bad resource or lease name.
  /// - StaleToken: token below the HWM ("is below the high-water").
  /// - FenceViolation: a barrier the lease table did not confirm ("not
  ///   confirmed"), no confirm function, or the resource is bound to another
  ///   lease ("is bound to lease").
  /// - Busy / IOError / ShutDown: the confirm function could not answer now.
  /// - Corruption: the stored fence record is malformed; storage codes.
  Status fence(const FencedResource& resource_fence, std::string_view resource, std::string_view lease,
               std::uint64_t token);

 private:
  friend struct detail::Access;
  explicit Transaction(detail::TxnState* state) noexcept : state_(state) {}
  detail::TxnState* state_;
};

/// A transactional handler: same rules as Handler (see handler.hpp).
using TxHandler = std::function<Outcome(const MessageView&, Transaction&)>;

}  // namespace lanebus
