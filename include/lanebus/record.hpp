// lanebus — MIT License.
// Typed payloads: RecordBuilder writes a compact self-describing record into a
// caller buffer; RecordView reads it zero-copy. The encoding, the types and
// the schema rules are in doc/schemas.md.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "lanebus/export.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

class SchemaVersion;
namespace detail {
struct Access;
struct UsageTap;
}  // namespace detail

/// The value types of a record field. The numbers are the type tags of the
/// encoding (doc/schemas.md) and never change.
enum class FieldType : std::uint8_t {
  Bool = 1,
  Int64 = 2,
  Uint64 = 3,
  Double = 4,
  String = 5,     ///< UTF-8 text (not checked)
  Bytes = 6,      ///< opaque bytes
  Timestamp = 7,  ///< ns since the Unix epoch, signed
  Record = 8,     ///< a nested record
  List = 9,       ///< a list of values of one element type
};

/// "bool", "int64", ... "list"; "unknown" for anything else. Never null.
LANEBUS_API const char* to_string(FieldType type) noexcept;
/// True for the nine tags above.
LANEBUS_API bool valid_field_type(std::uint8_t tag) noexcept;

/// The first byte of every top-level record (format 1).
inline constexpr std::uint8_t kRecordMagic = 0xA1;
/// Deepest nesting of records and lists the encoder and decoder accept.
inline constexpr int kMaxRecordDepth = 8;
/// Field ids are 1..kMaxFieldId (0 marks list elements in the builder).
inline constexpr std::uint32_t kMaxFieldId = 65535;

/// Writes one record into a buffer the caller owns. Never allocates.
///
/// Fields are appended in call order (any id order; ids must not repeat —
/// the schema check at publish refuses duplicates). Nested records:
/// begin_record(id) ... end_record(). Lists: begin_list(id, element type), then
/// add the elements with the same add_* calls and id 0, then end_list().
/// A list of records: begin_record(0) ... end_record() per element.
///
/// Errors are sticky: the first one (buffer too small, a bad id, unbalanced
/// begin/end, an element of the wrong type) is kept and returned by finish();
/// later calls do nothing.
///
/// Thread safety: one thread at a time.
class LANEBUS_API RecordBuilder {
 public:
  /// Writes into [buffer, buffer + capacity). The buffer must outlive finish()'s view.
  RecordBuilder(char* buffer, std::size_t capacity) noexcept;

  RecordBuilder& add_bool(std::uint32_t id, bool value) noexcept;
  RecordBuilder& add_int64(std::uint32_t id, std::int64_t value) noexcept;
  RecordBuilder& add_uint64(std::uint32_t id, std::uint64_t value) noexcept;
  RecordBuilder& add_double(std::uint32_t id, double value) noexcept;
  RecordBuilder& add_string(std::uint32_t id, std::string_view value) noexcept;
  RecordBuilder& add_bytes(std::uint32_t id, std::string_view value) noexcept;
  RecordBuilder& add_timestamp(std::uint32_t id, std::int64_t ns_since_epoch) noexcept;
  RecordBuilder& begin_record(std::uint32_t id) noexcept;
  RecordBuilder& end_record() noexcept;
  RecordBuilder& begin_list(std::uint32_t id, FieldType element) noexcept;
  RecordBuilder& end_list() noexcept;

  /// The encoded record (a view into the buffer), or the first error:
  /// PayloadTooLarge (the buffer is too small), InvalidArgument (bad id,
  /// unbalanced nesting, too deep, element type mismatch).
  Result<std::string_view> finish() noexcept;
  /// Bytes written so far.
  std::size_t size() const noexcept { return pos_; }
  /// Start over in the same buffer.
  void reset() noexcept;

 private:
  bool head(std::uint32_t id, FieldType type) noexcept;
  bool put(const void* p, std::size_t n) noexcept;
  bool put_varint(std::uint64_t v) noexcept;
  void fail(Code code, const char* why) noexcept;
  struct Frame {
    std::uint32_t len_at;    // offset of the u32 byte length
    std::uint32_t count_at;  // lists: offset of the u32 element count
    std::uint32_t count;
    FieldType element;       // lists: the element type
    bool is_list;
  };
  char* buf_;
  std::size_t cap_;
  std::size_t pos_ = 0;
  int depth_ = 0;
  Frame frames_[kMaxRecordDepth];
  Code error_ = Code::Ok;
  const char* why_ = nullptr;
};

class RecordView;

/// A field name resolved once: a read through a key (RecordView::get_*(const
/// FieldKey&)) skips the search of the reader schema by name, and otherwise
/// behaves exactly like the read by name (defaults, widening, errors, usage
/// counting). The key remembers its field in the last reader schema it met
/// and resolves again when a view has another one. Make one per field and
/// keep it (a static, or a member of the consumer), e.g.
///   static const lanebus::FieldKey kZone("shipping_zone");
///   auto zone = view.get_string(kZone);
/// Thread safety: a key may be shared by threads (its cache is atomic).
class LANEBUS_API FieldKey {
 public:
  explicit FieldKey(std::string_view name);
  FieldKey(const FieldKey& other);
  FieldKey& operator=(const FieldKey& other);
  const std::string& name() const noexcept { return name_; }

 private:
  friend class RecordView;
  std::string name_;
  mutable std::atomic<const void*> def_{nullptr};  // detail::FieldDef of the last reader schema
};

/// A list field: `size()` elements of `element_type()`, read by index.
/// Reading element i walks the list (lists are small; iterate with next()
/// for long ones). Thread safety: const methods are safe.
class LANEBUS_API ListView {
 public:
  ListView() noexcept = default;
  FieldType element_type() const noexcept { return element_; }
  std::uint32_t size() const noexcept { return count_; }

  /// Errors: NotFound (index out of range), InvalidArgument (other element type).
  Result<bool> get_bool(std::uint32_t index) const noexcept;
  Result<std::int64_t> get_int64(std::uint32_t index) const noexcept;
  Result<std::uint64_t> get_uint64(std::uint32_t index) const noexcept;
  Result<double> get_double(std::uint32_t index) const noexcept;
  Result<std::string_view> get_string(std::uint32_t index) const noexcept;
  Result<std::string_view> get_bytes(std::uint32_t index) const noexcept;
  Result<std::int64_t> get_timestamp(std::uint32_t index) const noexcept;
  Result<RecordView> get_record(std::uint32_t index) const noexcept;

 private:
  friend class RecordView;
  /// The encoded element i (bytes of its value), or NotFound / InvalidArgument.
  Result<std::string_view> element(std::uint32_t index, FieldType want) const noexcept;
  std::string_view body_{};
  std::uint32_t count_ = 0;
  FieldType element_ = FieldType::Bool;
  const SchemaVersion* schema_ = nullptr;  // for nested records of the list
  const void* nested_fields_ = nullptr;
  detail::UsageTap* tap_ = nullptr;  // field-usage audit of nested records (see RecordView)
  std::uint32_t path_ = 0;           // the list field's path (RecordView::path_ layout)
  std::uint16_t version_ = 0;
};

/// A zero-copy view of an encoded record. Valid while the bytes it views live
/// (for a delivered message: while the handler runs).
///
/// Fields are read by id, or by name when the view has a reader schema
/// (SchemaVersion; see Schemas::view in schema.hpp). With a reader schema:
/// a field the record lacks gives the schema's default; an int64/uint64
/// value read as double is widened, an int64 read as timestamp kept; fields
/// the reader schema does not know are skipped. Errors (no allocation):
/// NotFound (no such field and no default, or an unknown name),
/// InvalidArgument (the field has another type: "type mismatch").
///
/// Reads through a view made by Schemas::view inside a handler are counted
/// per group, field and writer version (the field-usage audit); reads of a
/// nested record's fields (get_record, or a list's records) as
/// "parent.child", down to 3 levels.
///
/// Thread safety: const methods are safe.
class LANEBUS_API RecordView {
 public:
  RecordView() noexcept = default;

  /// Check `bytes` (magic, every tag, length and nesting level) and view it.
  /// Errors: Corruption naming what is wrong (empty, bad magic, truncated,
  /// unknown type tag, bad bool, too deep, trailing bytes).
  static Result<RecordView> parse(std::string_view bytes) noexcept;

  Result<bool> get_bool(std::uint32_t id) const noexcept;
  Result<std::int64_t> get_int64(std::uint32_t id) const noexcept;
  Result<std::uint64_t> get_uint64(std::uint32_t id) const noexcept;
  Result<double> get_double(std::uint32_t id) const noexcept;
  Result<std::string_view> get_string(std::uint32_t id) const noexcept;
  Result<std::string_view> get_bytes(std::uint32_t id) const noexcept;
  Result<std::int64_t> get_timestamp(std::uint32_t id) const noexcept;
  Result<RecordView> get_record(std::uint32_t id) const noexcept;
  Result<ListView> get_list(std::uint32_t id) const noexcept;

  /// By name: needs a reader schema (else NotFound "no schema").
  Result<bool> get_bool(std::string_view name) const noexcept;
  Result<std::int64_t> get_int64(std::string_view name) const noexcept;
  Result<std::uint64_t> get_uint64(std::string_view name) const noexcept;
  Result<double> get_double(std::string_view name) const noexcept;
  Result<std::string_view> get_string(std::string_view name) const noexcept;
  Result<std::string_view> get_bytes(std::string_view name) const noexcept;
  Result<std::int64_t> get_timestamp(std::string_view name) const noexcept;
  Result<RecordView> get_record(std::string_view name) const noexcept;
  Result<ListView> get_list(std::string_view name) const noexcept;

  /// By a resolved name (FieldKey): the same as by name, without the lookup.
  Result<bool> get_bool(const FieldKey& key) const noexcept;
  Result<std::int64_t> get_int64(const FieldKey& key) const noexcept;
  Result<std::uint64_t> get_uint64(const FieldKey& key) const noexcept;
  Result<double> get_double(const FieldKey& key) const noexcept;
  Result<std::string_view> get_string(const FieldKey& key) const noexcept;
  Result<std::string_view> get_bytes(const FieldKey& key) const noexcept;
  Result<std::int64_t> get_timestamp(const FieldKey& key) const noexcept;
  Result<RecordView> get_record(const FieldKey& key) const noexcept;
  Result<ListView> get_list(const FieldKey& key) const noexcept;

  /// True if the record itself carries field `id` (defaults not considered).
  bool has(std::uint32_t id) const noexcept;
  /// The type the record carries for `id`, or NotFound.
  Result<FieldType> type_of(std::uint32_t id) const noexcept;
  /// The encoded bytes (for a nested record: its body, without the magic).
  std::string_view bytes() const noexcept { return body_; }
  /// The reader schema, or nullptr.
  const SchemaVersion* schema() const noexcept { return schema_; }

  /// Visit every field the record carries, in encoded order, until `visit`
  /// returns false: visit(id, type, encoded value bytes).
  template <typename F>
  void for_each(F&& visit) const noexcept {
    Cursor c{body_, 0};
    std::uint32_t id;
    FieldType t;
    std::string_view v;
    while (next(c, &id, &t, &v)) {
      if (!visit(id, t, v)) return;
    }
  }

 private:
  friend struct detail::Access;
  friend class ListView;
  struct Cursor {
    std::string_view body;
    std::size_t pos;
  };
  /// The next field of a checked body (no validation: parse did it).
  static bool next(Cursor& c, std::uint32_t* id, FieldType* type, std::string_view* value) noexcept;
  /// The field's raw value and type; NotFound when absent.
  bool find(std::uint32_t id, FieldType* type, std::string_view* value) const noexcept;
  /// Resolve a read: the value, or the reader schema's default (*dflt set).
  template <typename T>
  Result<T> read(std::uint32_t id, FieldType want) const noexcept;
  /// The same with the reader schema's definition of `id` looked up (a
  /// detail::FieldDef, or nullptr).
  template <typename T>
  Result<T> read_def(const void* def, std::uint32_t id, FieldType want) const noexcept;
  template <typename T>
  Result<T> read_named(std::string_view name, FieldType want) const noexcept;
  template <typename T>
  Result<T> read_key(const FieldKey& key, FieldType want) const noexcept;

  std::string_view body_{};
  const SchemaVersion* schema_ = nullptr;
  const void* fields_ = nullptr;  // the reader schema's field list of this level (detail::FieldList)
  detail::UsageTap* tap_ = nullptr;  // field-usage audit (nullptr: not counted)
  // The ids of the enclosing record fields, outermost in the high 16 bits
  // (0 at the top level): reads are counted as "parent.child" down to 3
  // levels (doc/schemas.md).
  std::uint32_t path_ = 0;
  std::uint16_t version_ = 0;        // the writer's schema version (audit)
  // Where the field search starts: the boundary after the last field found
  // (always a field boundary of body_), so fields read in record order are
  // found in one step. Atomic: views are read from several threads; copied
  // with the view.
  struct SearchHint {
    std::atomic<std::uint32_t> at{0};
    SearchHint() noexcept = default;
    SearchHint(const SearchHint& o) noexcept : at(o.at.load(std::memory_order_relaxed)) {}
    SearchHint& operator=(const SearchHint& o) noexcept {
      at.store(o.at.load(std::memory_order_relaxed), std::memory_order_relaxed);
      return *this;
    }
  };
  mutable SearchHint hint_;
};

}  // namespace lanebus
