// lanebus — MIT License.
// Namespaces, credentials, access control and quotas (manual: doc/tenancy.md).
//
// Every topic, queue, idempotency scope and user table name lives in a
// namespace: the longest declared namespace that is a segment prefix of the
// name ("acme.billing" holds "acme.billing.invoices"), else the name's first
// segment ("tenant-42" holds "tenant-42.orders"). Namespaces nobody declared
// exist implicitly, with the default policy (no quota, weight 1).
//
// What this is not: OS-level isolation. The store files are guarded by their
// file permissions (0600 / 0700 directory); whoever can read them reads every
// namespace, and the `lanebus` CLI acts as that OS user, with no credential.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lanebus/export.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

namespace detail {
struct Access;
class BusCore;
class TenancyImpl;
struct CredentialState;
struct NamespaceState;
}  // namespace detail

/// A token bucket: a sustained rate with a burst. Zero rates = unlimited.
struct Quota {
  /// Messages per second. 0 = no limit. Default 0.
  double msgs_per_s = 0;
  /// Payload bytes (key + idempotency key + payload) per second. 0 = no limit. Default 0.
  double bytes_per_s = 0;
  /// The burst a full bucket allows, in seconds of the rate (0.01..60).
  /// Default 0.1 s (a 500 msg/s quota lets 50 messages through at once).
  double burst_s = 0.1;
};

/// A namespace's policy. Durable in the bus's store (in memory for a bus
/// without one); changeable at run time with Namespaces::set_policy.
struct NamespacePolicy {
  /// Publishes into the namespace. Over quota a publish waits (topic
  /// Backpressure::Block, up to its block_timeout) or fails at once
  /// (FailFast, DropOldest, try_publish) with QuotaExceeded.
  Quota publish{};
  /// Deliveries out of the namespace (all groups together). Over quota the
  /// namespace's lanes are run later: consumers are slowed, never failed.
  Quota consume{};
  /// Fair-share weight (1..1000). Default 1. While the workers are
  /// saturated, a namespace with work gets at least weight / (sum of the
  /// weights of the namespaces with work) of the handler time; capacity an
  /// idle namespace leaves goes to the others (doc/tenancy.md, "Fair
  /// sharing"). A change takes effect with the next lane run.
  std::uint32_t weight = 1;
  /// Informational: recorded and shown, not acted on. The store a namespace
  /// lives in is chosen by BusOptions::namespace_stores, after
  /// `lanebus namespace move` (doc/tenancy.md "Moving a namespace").
  std::string store_dir{};
};

/// Usage of one namespace. Totals include what was persisted by earlier runs
/// of a bus with a store (by minute; `lanebus usage`).
struct NamespaceUsage {
  std::uint64_t msgs_in = 0;    ///< Publishes accepted.
  std::uint64_t bytes_in = 0;   ///< Their key + idempotency key + payload bytes.
  std::uint64_t msgs_out = 0;   ///< Handler calls (every group, every attempt).
  std::uint64_t bytes_out = 0;  ///< Their payload bytes.
  std::uint64_t throttled = 0;  ///< Publishes that waited for the quota, plus consumer slow-downs.
  std::uint64_t refused = 0;    ///< Publishes refused with QuotaExceeded.
  std::uint64_t seconds_at_ceiling = 0;  ///< Seconds in which the publish quota throttled or refused.
  double peak_in_per_s = 0;     ///< Highest accepted publishes in one second (this run).
  double avg_in_per_s = 0;      ///< Accepted publishes / seconds since the bus opened (this run).
  /// Retained log bytes of the namespace's durable topics opened by this bus
  /// (Bus::stats() and the exports only; 0 in Namespaces::describe/list).
  std::uint64_t stored_bytes = 0;
};

/// What Namespaces::describe and list return.
struct NamespaceInfo {
  std::string name{};
  bool declared = false;  ///< false: implicit (a first segment nobody declared).
  NamespacePolicy policy{};
  NamespaceUsage usage{};
};

/// One grant of a credential: the actions it allows on every name inside
/// `prefix` (the prefix itself and the names below it, segment-wise:
/// "tenant-4" does not cover "tenant-42").
struct Grant {
  std::string prefix{};  ///< A valid name (doc/tenancy.md).
  bool publish = false;  ///< Topic publish calls.
  bool consume = false;  ///< subscribe, consume, table_get, idempotency.
  bool admin = false;    ///< create topics/queues, seek, DLQ review and replay.
};

/// Who a Client acts as.
struct Credential {
  std::string id{};      ///< A valid name, e.g. "tenant-42.billing-service".
  std::string secret{};  ///< Never stored, logged or echoed; 1..1024 bytes.
};

/// Namespace and credential administration of a bus (Bus::namespaces()).
/// Every change is written to the bus's store (one commit) before it returns
/// and takes effect for every Client at once. Valid while its Bus lives.
///
/// Thread safety: thread-safe. Calls block for one commit of the store.
class LANEBUS_API Namespaces {
 public:
  /// Declare namespace `name` (a valid name) with `policy`. Declaring one
  /// that exists with the same policy is OK. Errors: InvalidName,
  /// InvalidArgument (bad policy), Conflict (declared with another policy),
  /// storage codes.
  Status create(std::string_view name, const NamespacePolicy& policy = {});
  /// Replace a declared namespace's policy. Errors: NotFound, InvalidArgument.
  Status set_policy(std::string_view name, const NamespacePolicy& policy);
  /// A namespace (declared or implicit). Errors: InvalidName, NotFound.
  Result<NamespaceInfo> describe(std::string_view name) const;
  /// Every namespace, declared and implicit, by name.
  std::vector<NamespaceInfo> list() const;
  /// The namespace that holds `name` (a topic, queue, table or scope name).
  Result<std::string> namespace_of(std::string_view name) const;

  /// Add a credential (stores a salted PBKDF2-HMAC-SHA256 hash of the
  /// secret, never the secret). Errors: InvalidName (id, a grant prefix),
  /// InvalidArgument (empty or too long secret), Conflict (the id exists).
  Status add_credential(const Credential& credential, const std::vector<Grant>& grants);
  /// Replace a credential's grants. Errors: NotFound, InvalidName.
  Status set_grants(std::string_view id, const std::vector<Grant>& grants);
  /// Remove a credential; its Clients are denied everything from now on.
  /// Errors: NotFound.
  Status remove_credential(std::string_view id);
  /// A credential's grants. Errors: NotFound.
  Result<std::vector<Grant>> grants(std::string_view id) const;

 private:
  friend struct detail::Access;
  explicit Namespaces(detail::BusCore* core) noexcept : core_(core) {}
  detail::BusCore* core_;
};

/// Move namespace `name` from the store in `src_dir` to the store in
/// `dst_dir` (created if needed), verify the copy, then remove it from the
/// source: what `lanebus namespace move` does (doc/tenancy.md "Moving a
/// namespace"). Both stores must be closed (no Bus or tool may have them
/// open). Calling it again after an interruption finishes the move; after a
/// finished move it is OK and changes nothing. Then open the bus with
/// BusOptions::namespace_stores mapping `name` to `dst_dir`.
/// Errors: InvalidName, InvalidArgument (same store, not a store), NotFound
/// (no store, or nothing of the namespace), Busy (a store is open elsewhere),
/// Conflict (DST holds the namespace already, another move is under way, the
/// verify found a difference), storage codes.
LANEBUS_API Status move_namespace(const std::string& src_dir, const std::string& dst_dir, std::string_view name);

}  // namespace lanebus
