// lanebus — MIT License.
// Schemas of typed topics (doc/schemas.md): field definitions, schema
// versions read from JSON, compatibility modes, and Schemas, the registry
// handle of a Bus (kept in the store's LMDB, shared by processes).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lanebus/export.hpp"
#include "lanebus/message.hpp"
#include "lanebus/record.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

namespace detail {
class SchemaRegistry;
}  // namespace detail

/// Which earlier versions a new version must stay compatible with, and how
/// (doc/schemas.md has the rules as implemented).
enum class Compatibility : std::uint8_t {
  Backward,            ///< new readers read the latest version's records (default)
  BackwardTransitive,  ///< ... and every earlier version's records
  Forward,             ///< readers of the latest version read new records
  ForwardTransitive,   ///< readers of every earlier version read new records
  Full,                ///< Backward and Forward
  FullTransitive,      ///< BackwardTransitive and ForwardTransitive
  None,                ///< no check (ids and names must still agree)
};
/// "backward", "backward_transitive", ..., "none".
LANEBUS_API const char* to_string(Compatibility mode) noexcept;
/// The inverse of to_string. Errors: InvalidArgument naming the text.
LANEBUS_API Result<Compatibility> compatibility_from_string(std::string_view text);

/// One field of a schema. A field is optional when it has a default.
struct FieldDef {
  std::uint32_t id = 0;  ///< 1..65535, unique in its record, stable across versions
  std::string name;      ///< unique in its record, stable across versions
  FieldType type = FieldType::String;
  FieldType element = FieldType::Bool;  ///< lists: the element type
  bool has_default = false;
  bool default_bool = false;
  std::int64_t default_int = 0;  ///< int64 and timestamp
  std::uint64_t default_uint = 0;
  double default_double = 0;
  std::string default_text;       ///< string and bytes
  std::string doc;
  std::vector<FieldDef> fields;   ///< records and lists of records, sorted by id
};

/// One version of a topic's schema. Value type.
///
/// Thread safety: const methods are safe; others need external synchronization.
class LANEBUS_API SchemaVersion {
 public:
  SchemaVersion() = default;

  /// Read a schema file (format in doc/schemas.md). Errors: InvalidArgument
  /// naming the problem (bad JSON, an unknown type, duplicate ids or names,
  /// an id out of range, a default of the wrong type).
  static Result<SchemaVersion> from_json(std::string_view json);
  /// Canonical JSON (fields sorted by id); from_json(to_json()) == *this.
  std::string to_json() const;

  /// The version number in the registry (1, 2, ...); 0 = not registered.
  std::uint16_t version() const noexcept { return version_; }
  const std::vector<FieldDef>& fields() const noexcept { return fields_; }
  const FieldDef* field(std::uint32_t id) const noexcept;
  const FieldDef* field(std::string_view name) const noexcept;
  /// Same fields (ids, names, types, defaults, docs), version ignored.
  bool same_as(const SchemaVersion& other) const;

  /// Does `record` match this version exactly (every field known, of its
  /// declared type, no duplicate ids, every field without a default
  /// present)? OK, or SchemaViolation naming the field. Allocation-free
  /// when OK.
  Status validate(std::string_view record) const;
  /// View `record` through this version as the reader's schema (no usage
  /// counting). Errors: Corruption (a malformed record).
  Result<RecordView> view(std::string_view record) const noexcept;

 private:
  friend class detail::SchemaRegistry;
  std::uint16_t version_ = 0;
  std::vector<FieldDef> fields_;
};

/// Is `candidate` acceptable after `history` (oldest first) under `mode`?
/// OK, or Incompatible with a message naming the field and the rule.
LANEBUS_API Status check_compatibility(Compatibility mode, const std::vector<SchemaVersion>& history,
                                       const SchemaVersion& candidate);

/// Who made a registry change and why (the audit log).
struct ChangeInfo {
  std::string who;
  std::string why;
};

/// A field's deprecation.
struct Deprecation {
  std::string field;
  std::int64_t since_ns = 0;   ///< when deprecate() was called
  std::int64_t window_ns = 0;  ///< removal is refused before since_ns + window_ns
  std::string replacement;     ///< "" = none
  std::string who, why;
};

/// Audited reads of a field by one group.
struct FieldUsage {
  std::string group;
  std::uint64_t reads = 0;
  std::int64_t last_read_ns = 0;   ///< 0 = no read in the queried period
  bool in_contract = false;        ///< the group's contract (GroupOptions::reads) declares the field
  bool outside_contract = false;   ///< read although the group's contract does not declare it (or it has none)
  std::vector<std::uint16_t> versions;  ///< writer schema versions of the records read
};

/// A consumer contract: the fields a group declares it reads.
struct Contract {
  std::string group;
  std::vector<std::string> fields;
  std::int64_t updated_ns = 0;
};

/// One entry of the registry's audit log.
struct SchemaAuditEntry {
  std::int64_t at_ns = 0;
  std::string topic, action, detail, who, why;  ///< action: register, compatibility, deprecate, remove
};

/// The schema registry of a Bus (Bus::schemas()): cheap handle, valid while
/// the Bus lives. On a bus with a store everything is kept in its LMDB and
/// seen by every process at once; an in-memory bus keeps it in memory.
///
/// Thread safety: thread-safe.
class LANEBUS_API Schemas {
 public:
  /// Register `schema` as the topic's next version, after checking it
  /// against the topic's compatibility mode and live consumer contracts.
  /// An identical schema (same as the latest) is a no-op returning its
  /// version. Errors: Incompatible (names field and rule, or the group whose
  /// contract declares a removed or retyped field), InvalidName, storage codes.
  Result<std::uint16_t> register_schema(std::string_view topic, const SchemaVersion& schema,
                                        const ChangeInfo& who = {});
  /// What register_schema would say, without registering (OK or Incompatible).
  Status check(std::string_view topic, const SchemaVersion& schema) const;
  /// Set the topic's mode (default Backward). Errors: InvalidName, storage codes.
  Status set_compatibility(std::string_view topic, Compatibility mode, const ChangeInfo& who = {});
  Result<Compatibility> compatibility(std::string_view topic) const;

  /// Errors: NotFound (no schema / no such version).
  Result<SchemaVersion> latest(std::string_view topic) const;
  Result<SchemaVersion> get(std::string_view topic, std::uint16_t version) const;
  /// Every version, oldest first (empty: no schema).
  Result<std::vector<SchemaVersion>> versions(std::string_view topic) const;
  /// Topics with a schema.
  Result<std::vector<std::string>> topics() const;

  /// Mark `field` of the latest version deprecated for `window`, naming an
  /// optional replacement field (which must exist in the latest version).
  /// Errors: NotFound (no such field / replacement), storage codes.
  Status deprecate(std::string_view topic, std::string_view field, std::chrono::seconds window,
                   std::string_view replacement = {}, const ChangeInfo& who = {});
  Result<std::vector<Deprecation>> deprecations(std::string_view topic) const;
  /// The audit window of remove(): the trailing period in which an audited
  /// read of the field blocks its removal (doc/schemas.md, "Deprecation and
  /// removal"). At the earliest removal moment it is the deprecation window's
  /// last week; it never reaches back before the deprecation.
  static constexpr std::chrono::hours kRemovalAuditWindow{24 * 7};

  /// Register a new version without `field`. Refused (Incompatible) unless,
  /// at the registry clock's now T:
  /// - the field is deprecated and T >= deprecation start + window;
  /// - the audit shows zero reads of the field, by any group, flushed at or
  ///   after max(deprecation start, T - kRemovalAuditWindow);
  /// - no live contract declares the field;
  /// - the new version passes the topic's compatibility mode.
  /// The message names every reason: the window's end, the groups that still
  /// read it and when each last did, the groups whose contract declares it.
  Result<std::uint16_t> remove(std::string_view topic, std::string_view field, const ChangeInfo& who = {});

  /// Who read `field` since `since_ns` (day buckets, so rounded down to the
  /// day), per group, counted reads through views made by view(). Counts of
  /// this process not yet flushed are included.
  Result<std::vector<FieldUsage>> usage(std::string_view topic, std::string_view field, std::int64_t since_ns) const;
  /// Live contracts of the topic's groups.
  Result<std::vector<Contract>> contracts(std::string_view topic) const;
  /// Drop a group's contract (the group is gone for good).
  Status drop_contract(std::string_view topic, std::string_view group, const ChangeInfo& who = {});
  /// The audit log, oldest first.
  Result<std::vector<SchemaAuditEntry>> audit_log() const;

  /// View a delivered message through the topic's latest schema (the
  /// reader's schema). Inside a handler, reads through the view are counted
  /// for the handler's group (field-usage audit). Allocation-free.
  /// Errors: NotFound (the topic has no schema), Corruption (bad record).
  Result<RecordView> view(std::string_view topic, const MessageView& message) const noexcept;

  /// Write this process's usage counts to the store now (the bus also does
  /// it on its maintenance tick and at shutdown).
  Status flush_usage();

 private:
  friend class Bus;
  explicit Schemas(detail::SchemaRegistry* reg) noexcept : reg_(reg) {}
  detail::SchemaRegistry* reg_;
};

}  // namespace lanebus
