// lanebus — MIT License.
// SchemaRegistry: the schema registry behind Bus::schemas() (doc/schemas.md).
//
// Design notes
// - Everything lives in the store's `schema` table (doc/storage-format.md),
//   read and written in one LMDB transaction per call, so every process sees a
//   registration, contract or deprecation as soon as it commits, and two
//   processes registering at once are serialised by LMDB's writer lock. An
//   in-memory bus keeps the same keys in a std::map.
// - Publish path: each TopicImpl holds an atomic pointer to its latest
//   SchemaVersion (nullptr = untyped: one load and a branch). Versions are
//   never freed while the bus lives, so the pointer needs no reference count.
//   A refused record makes the registry re-read the topic's latest version
//   from the store once (another process may have registered a newer one).
// - Usage audit: reads through Schemas::view inside a handler count into the
//   running lane's UsageTap (schema_usage.hpp); flush() adds the deltas to
//   day buckets in the store (maintenance tick, shutdown, or on demand).
//
// Lock order: flush_mu_ → BusCore::mu_ → mu_ (mu_ is a leaf; no store call
// is made while holding it). The registry never calls into the BusCore while
// holding mu_.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lanebus/schema.hpp"
#include "lanebus/stats.hpp"
#include "sync.hpp"

namespace lanebus::detail {

class BusCore;
class DurableStore;
class TopicImpl;
struct UsageTap;

/// Key/value access to the `schema` table inside one transaction.
class SchemaKv {
 public:
  virtual ~SchemaKv() = default;
  virtual Result<std::string> get(std::string_view key) = 0;
  virtual Status put(std::string_view key, std::string_view value) = 0;
  virtual Status del(std::string_view key) = 0;
  /// Keys starting with `prefix`, from `from` on, in key order, until visit returns false.
  virtual Status scan(std::string_view prefix, std::string_view from,
                      const std::function<bool(std::string_view, std::string_view)>& visit) = 0;
};

class SchemaRegistry {
 public:
  /// `core` may be nullptr (the lanebus tool): no publish path, no counters.
  SchemaRegistry(BusCore* core, DurableStore* store);

  // ---- Schemas API (schema.hpp documents each)
  Result<std::uint16_t> register_schema(std::string_view topic, const SchemaVersion& schema, const ChangeInfo& who);
  Status check(std::string_view topic, const SchemaVersion& schema);
  Status set_compatibility(std::string_view topic, Compatibility mode, const ChangeInfo& who);
  Result<Compatibility> compatibility(std::string_view topic);
  Result<SchemaVersion> get(std::string_view topic, std::uint16_t version);  // 0 = latest
  Result<std::vector<SchemaVersion>> history(std::string_view topic);
  Result<std::vector<std::string>> topics();
  Status deprecate(std::string_view topic, std::string_view field, std::int64_t window_ns,
                   std::string_view replacement, const ChangeInfo& who);
  Result<std::vector<Deprecation>> deprecations(std::string_view topic);
  Result<std::uint16_t> remove(std::string_view topic, std::string_view field, const ChangeInfo& who);
  Result<std::vector<FieldUsage>> usage(std::string_view topic, std::string_view field, std::int64_t since_ns);
  Result<std::vector<Contract>> contracts(std::string_view topic);
  Status set_contract(std::string_view topic, std::string_view group, const std::vector<std::string>& fields);
  Status drop_contract(std::string_view topic, std::string_view group, const ChangeInfo& who);
  Result<std::vector<SchemaAuditEntry>> audit_log();
  Result<RecordView> view(std::string_view topic, const MessageView& message) noexcept;
  /// Every deprecated field of every topic with its readers since the
  /// deprecation and the groups whose contract declares it (BusStats).
  /// Flushed counts only: call flush_usage() first for this process's.
  Result<std::vector<DeprecatedField>> deprecated_fields();
  Status flush_usage();

  // ---- bus hooks
  /// Point `t` at its topic's latest version (topic creation).
  void bind(TopicImpl* t);
  /// The publish check of a typed topic: OK and *version = the version the
  /// record matches, or SchemaViolation. Allocation-free when OK.
  Status check_publish(TopicImpl* t, const SchemaVersion* latest, std::string_view payload,
                       std::uint16_t requested, std::uint16_t* version) noexcept;
  /// Re-read the latest version of every bound topic (maintenance tick).
  void refresh_all() noexcept;

  /// ns since the epoch: the wall clock, or the test clock
  /// (Access::set_schema_clock_for_testing).
  std::int64_t now() const;
  void set_clock(std::function<std::int64_t()> clock);

  /// Removal needs no audited read in the last kQuietNs (Schemas::kRemovalAuditWindow).
  static constexpr std::int64_t kDayNs = 86'400'000'000'000;
  static constexpr std::int64_t kQuietNs =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Schemas::kRemovalAuditWindow).count();

 private:
  Status write(const std::function<Status(SchemaKv&)>& fn);
  Status read(const std::function<Status(SchemaKv&)>& fn);
  /// The topic's versions (oldest first) and mode, read inside a transaction.
  Status load(SchemaKv& kv, std::string_view topic, std::vector<SchemaVersion>* versions, Compatibility* mode);
  /// Compatibility and contract checks of `candidate` after `versions`.
  Status check_in(SchemaKv& kv, std::string_view topic, const std::vector<SchemaVersion>& versions,
                  Compatibility mode, const SchemaVersion& candidate);
  Status audit(SchemaKv& kv, std::string_view topic, std::string_view action, std::string_view detail,
               const ChangeInfo& who);
  /// Keep `v` for the bus's lifetime and make it the topic's latest in this process.
  const SchemaVersion* publish_latest(std::string_view topic, const SchemaVersion& v);
  Status refresh(std::string_view topic);

  BusCore* const core_;
  DurableStore* const store_;

  mutable Mutex mu_;
  std::function<std::int64_t()> clock_ GUARDED_BY(mu_);
  std::deque<std::unique_ptr<SchemaVersion>> kept_ GUARDED_BY(mu_);  // never freed while the bus lives
  std::map<std::string, const SchemaVersion*, std::less<>> latest_ GUARDED_BY(mu_);
  std::map<std::string, std::string, std::less<>> mem_ GUARDED_BY(mu_);  // in-memory bus: the table
  Mutex mem_write_mu_;  // in-memory bus: one writer at a time (LMDB's writer lock for the store)

  Mutex flush_mu_;  // one flush at a time; guards flushed_
  std::map<const void*, std::uint64_t> flushed_ GUARDED_BY(flush_mu_);  // tap slot -> count already flushed
};

}  // namespace lanebus::detail
