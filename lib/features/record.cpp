// lanebus — MIT License.
// The record encoding (doc/schemas.md): RecordBuilder, RecordView, ListView.
#include "lanebus/record.hpp"

#include <bit>
#include <cstring>

#include "lanebus/schema.hpp"
#include "record_codec.hpp"
#include "schema_usage.hpp"

namespace lanebus {

const char* to_string(FieldType type) noexcept {
  switch (type) {
    case FieldType::Bool: return "bool";
    case FieldType::Int64: return "int64";
    case FieldType::Uint64: return "uint64";
    case FieldType::Double: return "double";
    case FieldType::String: return "string";
    case FieldType::Bytes: return "bytes";
    case FieldType::Timestamp: return "timestamp";
    case FieldType::Record: return "record";
    case FieldType::List: return "list";
  }
  return "unknown";
}

bool valid_field_type(std::uint8_t tag) noexcept { return tag >= 1 && tag <= 9; }

// ---------------------------------------------------------------- builder

RecordBuilder::RecordBuilder(char* buffer, std::size_t capacity) noexcept : buf_(buffer), cap_(capacity) { reset(); }

void RecordBuilder::reset() noexcept {
  pos_ = 0;
  depth_ = 0;
  error_ = Code::Ok;
  why_ = nullptr;
  if (cap_ >= 1) {
    buf_[0] = static_cast<char>(kRecordMagic);
    pos_ = 1;
  } else {
    fail(Code::PayloadTooLarge, "record: the buffer is too small for the record");
  }
}

void RecordBuilder::fail(Code code, const char* why) noexcept {
  if (error_ == Code::Ok) {
    error_ = code;
    why_ = why;
  }
}

// The builder writes small pieces (a tag, a 1-3 byte varint, 8 bytes of a
// double): put() copies short ones byte by byte instead of calling memcpy,
// and put_varint() encodes straight into the buffer when 10 bytes are free.
bool RecordBuilder::put(const void* p, std::size_t n) noexcept {
  if (error_ != Code::Ok) return false;
  if (cap_ - pos_ < n || pos_ > cap_) {
    fail(Code::PayloadTooLarge, "record: the buffer is too small for the record");
    return false;
  }
  char* out = buf_ + pos_;
  const char* in = static_cast<const char*>(p);
  if (n == 8) {
    std::memcpy(out, in, 8);
  } else if (n <= 16) {
    for (std::size_t i = 0; i < n; ++i) out[i] = in[i];
  } else {
    std::memcpy(out, in, n);
  }
  pos_ += n;
  return true;
}

bool RecordBuilder::put_varint(std::uint64_t v) noexcept {
  if (error_ == Code::Ok && pos_ <= cap_ && cap_ - pos_ >= 10) {
    char* out = buf_ + pos_;
    std::size_t n = 0;
    while (v >= 0x80) {
      out[n++] = static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    out[n++] = static_cast<char>(v);
    pos_ += n;
    return true;
  }
  char tmp[10];
  std::size_t n = 0;
  do {
    std::uint8_t b = v & 0x7f;
    v >>= 7;
    if (v != 0) b |= 0x80;
    tmp[n++] = static_cast<char>(b);
  } while (v != 0);
  return put(tmp, n);
}

// Field head: in a record, varint id + type tag; in a list, nothing (the
// element type is the list's), after checking the element type.
bool RecordBuilder::head(std::uint32_t id, FieldType type) noexcept {
  if (error_ != Code::Ok) return false;
  // Common case: a field of a record (not a list element), id < 128, room.
  if ((depth_ == 0 || !frames_[depth_ - 1].is_list) && id != 0 && id < 0x80 && pos_ <= cap_ && cap_ - pos_ >= 2) {
    buf_[pos_] = static_cast<char>(id);
    buf_[pos_ + 1] = static_cast<char>(type);
    pos_ += 2;
    return true;
  }
  if (depth_ > 0 && frames_[depth_ - 1].is_list) {
    Frame& f = frames_[depth_ - 1];
    if (id != 0) {
      fail(Code::InvalidArgument, "record: list elements are added with id 0");
      return false;
    }
    if (type != f.element) {
      fail(Code::InvalidArgument, "record: a list element has another type than the list's element type");
      return false;
    }
    ++f.count;
    return true;
  }
  if (id == 0 || id > kMaxFieldId) {
    fail(Code::InvalidArgument, "record: field ids are 1..65535");
    return false;
  }
  if (!put_varint(id)) return false;
  const std::uint8_t t = static_cast<std::uint8_t>(type);
  return put(&t, 1);
}

RecordBuilder& RecordBuilder::add_bool(std::uint32_t id, bool value) noexcept {
  if (head(id, FieldType::Bool)) {
    const std::uint8_t b = value ? 1 : 0;
    put(&b, 1);
  }
  return *this;
}

RecordBuilder& RecordBuilder::add_int64(std::uint32_t id, std::int64_t value) noexcept {
  if (head(id, FieldType::Int64)) put_varint(detail::zigzag(value));
  return *this;
}

RecordBuilder& RecordBuilder::add_uint64(std::uint32_t id, std::uint64_t value) noexcept {
  if (head(id, FieldType::Uint64)) put_varint(value);
  return *this;
}

RecordBuilder& RecordBuilder::add_double(std::uint32_t id, double value) noexcept {
  if (head(id, FieldType::Double)) {
    std::uint64_t bits;
    std::memcpy(&bits, &value, 8);
    char le[8];
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(le, &bits, 8);
    } else {
      for (int i = 0; i < 8; ++i) le[i] = static_cast<char>(bits >> (8 * i));
    }
    put(le, 8);
  }
  return *this;
}

RecordBuilder& RecordBuilder::add_string(std::uint32_t id, std::string_view value) noexcept {
  if (head(id, FieldType::String) && put_varint(value.size())) put(value.data(), value.size());
  return *this;
}

RecordBuilder& RecordBuilder::add_bytes(std::uint32_t id, std::string_view value) noexcept {
  if (head(id, FieldType::Bytes) && put_varint(value.size())) put(value.data(), value.size());
  return *this;
}

RecordBuilder& RecordBuilder::add_timestamp(std::uint32_t id, std::int64_t ns) noexcept {
  if (head(id, FieldType::Timestamp)) put_varint(detail::zigzag(ns));
  return *this;
}

RecordBuilder& RecordBuilder::begin_record(std::uint32_t id) noexcept {
  if (depth_ >= kMaxRecordDepth) {
    fail(Code::InvalidArgument, "record: nested deeper than kMaxRecordDepth");
    return *this;
  }
  if (!head(id, FieldType::Record)) return *this;
  Frame& f = frames_[depth_];
  f.len_at = static_cast<std::uint32_t>(pos_);
  f.is_list = false;
  f.count = 0;
  const char zero[4] = {};
  if (put(zero, 4)) ++depth_;
  return *this;
}

RecordBuilder& RecordBuilder::end_record() noexcept {
  if (error_ != Code::Ok) return *this;
  if (depth_ == 0 || frames_[depth_ - 1].is_list) {
    fail(Code::InvalidArgument, "record: end_record without begin_record");
    return *this;
  }
  Frame& f = frames_[--depth_];
  detail::put_le32(buf_ + f.len_at, static_cast<std::uint32_t>(pos_ - f.len_at - 4));
  return *this;
}

RecordBuilder& RecordBuilder::begin_list(std::uint32_t id, FieldType element) noexcept {
  if (depth_ >= kMaxRecordDepth) {
    fail(Code::InvalidArgument, "record: nested deeper than kMaxRecordDepth");
    return *this;
  }
  if (!valid_field_type(static_cast<std::uint8_t>(element)) || element == FieldType::List) {
    fail(Code::InvalidArgument, "record: a list's element type must be a scalar or record type");
    return *this;
  }
  if (!head(id, FieldType::List)) return *this;
  const std::uint8_t et = static_cast<std::uint8_t>(element);
  if (!put(&et, 1)) return *this;
  Frame& f = frames_[depth_];
  f.len_at = static_cast<std::uint32_t>(pos_);
  f.count_at = static_cast<std::uint32_t>(pos_ + 4);
  f.count = 0;
  f.element = element;
  f.is_list = true;
  const char zero[8] = {};
  if (put(zero, 8)) ++depth_;
  return *this;
}

RecordBuilder& RecordBuilder::end_list() noexcept {
  if (error_ != Code::Ok) return *this;
  if (depth_ == 0 || !frames_[depth_ - 1].is_list) {
    fail(Code::InvalidArgument, "record: end_list without begin_list");
    return *this;
  }
  Frame& f = frames_[--depth_];
  detail::put_le32(buf_ + f.len_at, static_cast<std::uint32_t>(pos_ - f.len_at - 8));
  detail::put_le32(buf_ + f.count_at, f.count);
  return *this;
}

Result<std::string_view> RecordBuilder::finish() noexcept {
  if (error_ == Code::Ok && depth_ != 0) fail(Code::InvalidArgument, "record: a nested record or list is not ended");
  if (error_ != Code::Ok) return Status::from_literal(error_, why_);
  return std::string_view(buf_, pos_);
}

// ---------------------------------------------------------------- decoding

namespace detail {

bool get_varint(std::string_view in, std::size_t* pos, std::uint64_t* out) noexcept {
  const char* const p = in.data();
  const std::size_t n = in.size();
  std::size_t i = *pos;
  std::uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (i >= n) return false;
    const std::uint8_t b = static_cast<std::uint8_t>(p[i++]);
    if (shift == 63 && b > 1) return false;  // more than 64 bits
    v |= std::uint64_t(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *pos = i;
      *out = v;
      return true;
    }
  }
  return false;
}

// One value of type `t` at in[*pos]: its extent (for records: the body, for
// lists: element tag + count + body). No checks of nested content.
bool value_extent(std::string_view in, std::size_t* pos, FieldType t, std::string_view* value,
                         const char** why) noexcept {
  const std::size_t start = *pos;
  std::uint64_t u;
  switch (t) {
    case FieldType::Bool:
      if (*pos >= in.size()) break;
      if (static_cast<std::uint8_t>(in[*pos]) > 1) {
        *why = "a bool is neither 0 nor 1";
        return false;
      }
      ++*pos;
      *value = in.substr(start, 1);
      return true;
    case FieldType::Int64:
    case FieldType::Uint64:
    case FieldType::Timestamp:
      if (!get_varint(in, pos, &u)) {
        *why = "a varint is truncated or longer than 64 bits";
        return false;
      }
      *value = in.substr(start, *pos - start);
      return true;
    case FieldType::Double:
      if (in.size() - *pos < 8) break;
      *pos += 8;
      *value = in.substr(start, 8);
      return true;
    case FieldType::String:
    case FieldType::Bytes:
      if (!get_varint(in, pos, &u)) break;
      if (u > in.size() - *pos) break;
      *value = in.substr(*pos, u);
      *pos += u;
      return true;
    case FieldType::Record: {
      if (in.size() - *pos < 4) break;
      const std::uint32_t n = get_le32(in.data() + *pos);
      *pos += 4;
      if (n > in.size() - *pos) break;
      *value = in.substr(*pos, n);
      *pos += n;
      return true;
    }
    case FieldType::List: {
      if (in.size() - *pos < 9) break;
      const std::uint32_t n = get_le32(in.data() + *pos + 1);
      if (n > in.size() - *pos - 9) break;
      *value = in.substr(*pos, 9 + std::size_t(n));
      *pos += 9 + std::size_t(n);
      return true;
    }
  }
  *why = "the record is truncated";
  return false;
}

static bool check_value(std::string_view v, FieldType t, int depth, const char** why) noexcept;

// Every field of a record body.
static bool check_body(std::string_view body, int depth, const char** why) noexcept {
  if (depth > kMaxRecordDepth) {
    *why = "records are nested deeper than 8 levels";
    return false;
  }
  std::size_t pos = 0;
  while (pos < body.size()) {
    std::uint64_t id;
    if (!get_varint(body, &pos, &id)) {
      *why = "a field id is truncated";
      return false;
    }
    if (id == 0 || id > kMaxFieldId) {
      *why = "a field id is outside 1..65535";
      return false;
    }
    if (pos >= body.size()) {
      *why = "the record is truncated after a field id";
      return false;
    }
    const std::uint8_t tag = static_cast<std::uint8_t>(body[pos++]);
    if (!valid_field_type(tag)) {
      *why = "unknown type tag";
      return false;
    }
    std::string_view v;
    if (!value_extent(body, &pos, static_cast<FieldType>(tag), &v, why)) return false;
    if (!check_value(v, static_cast<FieldType>(tag), depth, why)) return false;
  }
  return true;
}

static bool check_value(std::string_view v, FieldType t, int depth, const char** why) noexcept {
  if (t == FieldType::Record) return check_body(v, depth + 1, why);
  if (t != FieldType::List) return true;
  if (depth + 1 > kMaxRecordDepth) {
    *why = "records are nested deeper than 8 levels";
    return false;
  }
  const std::uint8_t et = static_cast<std::uint8_t>(v[0]);
  if (!valid_field_type(et) || et == static_cast<std::uint8_t>(FieldType::List)) {
    *why = "a list has an unknown element type";
    return false;
  }
  const std::uint32_t count = get_le32(v.data() + 5);
  std::string_view body = v.substr(9);
  std::size_t pos = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::string_view e;
    if (!value_extent(body, &pos, static_cast<FieldType>(et), &e, why)) return false;
    if (!check_value(e, static_cast<FieldType>(et), depth + 1, why)) return false;
  }
  if (pos != body.size()) {
    *why = "a list's length does not match its elements";
    return false;
  }
  return true;
}

bool check_record(std::string_view bytes, const char** why) noexcept {
  if (bytes.empty()) {
    *why = "the record is empty";
    return false;
  }
  if (static_cast<std::uint8_t>(bytes[0]) != kRecordMagic) {
    *why = "not a lanebus record (bad magic byte)";
    return false;
  }
  return check_body(bytes.substr(1), 1, why);
}

}  // namespace detail

Result<RecordView> RecordView::parse(std::string_view bytes) noexcept {
  const char* why = nullptr;
  if (!detail::check_record(bytes, &why)) return Status::from_literal(Code::Corruption, why);
  RecordView v;
  v.body_ = bytes.substr(1);
  return v;
}

bool RecordView::next(Cursor& c, std::uint32_t* id, FieldType* type, std::string_view* value) noexcept {
  if (c.pos >= c.body.size()) return false;
  std::uint64_t i;
  const char* why;
  if (!detail::get_varint(c.body, &c.pos, &i) || c.pos >= c.body.size()) return false;
  *id = static_cast<std::uint32_t>(i);
  *type = static_cast<FieldType>(c.body[c.pos++]);
  return detail::value_extent(c.body, &c.pos, *type, value, &why);
}

// The read path's field search: a bounds-checked walk that skips values
// without decoding them (one-byte ids and lengths take the short path). The
// record may be unchecked (a view of a message validated at publish), so
// every step is bounds-checked; a malformed field ends the search.
namespace {

inline bool varint_at(const char* base, std::size_t size, std::size_t* pos, std::uint64_t* out) noexcept {
  if (*pos < size && static_cast<std::uint8_t>(base[*pos]) < 0x80) {
    *out = static_cast<std::uint8_t>(base[(*pos)++]);
    return true;
  }
  return detail::get_varint(std::string_view(base, size), pos, out);
}

// Search [from, to) of base[0, size) (both field boundaries) for `id`; on a
// hit *next is the boundary after the field.
[[gnu::always_inline]] inline bool scan(const char* base, std::size_t size, std::size_t from, std::size_t to,
                                        std::uint32_t id, FieldType* type, std::string_view* value,
                                        std::size_t* next) noexcept {
  std::size_t pos = from;
  while (pos < to) {
    std::uint64_t fid;
    if (!varint_at(base, size, &pos, &fid) || pos >= size) return false;
    const auto t = static_cast<FieldType>(base[pos++]);
    std::size_t start = pos;
    std::size_t len;
    switch (t) {
      case FieldType::Bool:
        len = 1;
        break;
      case FieldType::Int64:
      case FieldType::Uint64:
      case FieldType::Timestamp: {
        std::size_t e = pos;
        while (e < size && e - pos < 9 && (static_cast<std::uint8_t>(base[e]) & 0x80) != 0) ++e;
        len = e - pos + 1;
        break;
      }
      case FieldType::Double:
        len = 8;
        break;
      case FieldType::String:
      case FieldType::Bytes: {
        std::uint64_t n;
        if (!varint_at(base, size, &pos, &n) || n > size - pos) return false;
        start = pos;
        len = static_cast<std::size_t>(n);
        break;
      }
      case FieldType::Record:
        if (size - pos < 4) return false;
        start = pos + 4;
        len = detail::get_le32(base + pos);
        break;
      case FieldType::List:
        if (size - pos < 9) return false;
        len = 9 + std::size_t(detail::get_le32(base + pos + 1));
        break;
      default:
        return false;
    }
    if (start > size || len > size - start) return false;
    pos = start + len;
    if (fid == id) {
      *type = t;
      *value = std::string_view(base + start, len);
      *next = pos;
      return true;
    }
  }
  return false;
}

}  // namespace

bool RecordView::find(std::uint32_t id, FieldType* type, std::string_view* value) const noexcept {
  // From the field after the last one found to the end, then from the start
  // (ids are unique in a record: the publish check refuses repeats; a
  // record parsed with a repeated id may read either copy).
  const char* const base = body_.data();
  const std::size_t size = body_.size();
  std::size_t from = hint_.at.load(std::memory_order_relaxed);
  if (from > size) from = 0;
  std::size_t next = 0;
  if (scan(base, size, from, size, id, type, value, &next) || (from != 0 && scan(base, size, 0, from, id, type, value, &next))) {
    hint_.at.store(next <= UINT32_MAX ? static_cast<std::uint32_t>(next) : 0, std::memory_order_relaxed);
    return true;
  }
  return false;
}

bool RecordView::has(std::uint32_t id) const noexcept {
  FieldType t;
  std::string_view v;
  return find(id, &t, &v);
}

Result<FieldType> RecordView::type_of(std::uint32_t id) const noexcept {
  FieldType t;
  std::string_view v;
  if (!find(id, &t, &v)) return Status::from_literal(Code::NotFound, "record: no such field");
  return t;
}

namespace {

using detail::FieldList;

template <typename T>
struct Decode;

// Decode a raw value of type `have` as `want`, widening where the schema
// rules allow (doc/schemas.md): int64/uint64 -> double, string <-> bytes.
bool decode_scalar(FieldType have, FieldType want, std::string_view v, bool* b, std::int64_t* i, std::uint64_t* u,
                   double* d, std::string_view* s) noexcept {
  std::size_t pos = 0;
  std::uint64_t raw = 0;
  switch (have) {
    case FieldType::Bool:
      if (want != FieldType::Bool) return false;
      *b = v[0] != 0;
      return true;
    case FieldType::Int64:
    case FieldType::Timestamp:
      detail::get_varint(v, &pos, &raw);
      if (want == have) {
        *i = detail::unzigzag(raw);
        return true;
      }
      if (want == FieldType::Double && have == FieldType::Int64) {
        *d = static_cast<double>(detail::unzigzag(raw));
        return true;
      }
      return false;
    case FieldType::Uint64:
      detail::get_varint(v, &pos, &raw);
      if (want == FieldType::Uint64) {
        *u = raw;
        return true;
      }
      if (want == FieldType::Double) {
        *d = static_cast<double>(raw);
        return true;
      }
      return false;
    case FieldType::Double:
      if (want != FieldType::Double) return false;
      raw = detail::get_le64(v.data());
      std::memcpy(d, &raw, 8);
      return true;
    case FieldType::String:
    case FieldType::Bytes:
      if (want != FieldType::String && want != FieldType::Bytes) return false;
      *s = v;
      return true;
    default:
      return false;
  }
}

const Status& mismatch() {
  static const Status s = Status::from_literal(Code::InvalidArgument, "record: type mismatch");
  return s;
}

// A scalar stored with exactly the type asked for (read_def's fast path):
// decoded here, without the widening switch.
template <typename T>
T decode_exact(std::string_view v) noexcept {
  if constexpr (std::is_same_v<T, bool>) {
    return v[0] != 0;
  } else if constexpr (std::is_same_v<T, double>) {
    std::uint64_t bits;
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(&bits, v.data(), 8);
    } else {
      bits = detail::get_le64(v.data());
    }
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
  } else if constexpr (std::is_same_v<T, std::string_view>) {
    return v;
  } else {
    std::uint64_t raw = 0;
    int shift = 0;
    for (const char c : v) {
      raw |= std::uint64_t(static_cast<std::uint8_t>(c) & 0x7f) << shift;
      shift += 7;
      if (shift >= 64) break;
    }
    if constexpr (std::is_same_v<T, std::uint64_t>) {
      return raw;
    } else {
      return detail::unzigzag(raw);
    }
  }
}

// A scalar stored as `have`, read as `want` (a type it widens to).
template <typename T>
Result<T> decode_widened(FieldType have, FieldType want, std::string_view v) noexcept {
  bool b = false;
  std::int64_t i = 0;
  std::uint64_t u = 0;
  double d = 0;
  std::string_view s;
  if (!decode_scalar(have, want, v, &b, &i, &u, &d, &s)) return mismatch();
  if constexpr (std::is_same_v<T, bool>) {
    return b;
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    return i;
  } else if constexpr (std::is_same_v<T, std::uint64_t>) {
    return u;
  } else if constexpr (std::is_same_v<T, double>) {
    return d;
  } else {
    return s;
  }
}

}  // namespace

template <typename T>
Result<T> RecordView::read(std::uint32_t id, FieldType want) const noexcept {
  const FieldList* fields = static_cast<const FieldList*>(fields_);
  return read_def<T>(fields ? detail::find_field(*fields, id) : nullptr, id, want);
}

template <typename T>
Result<T> RecordView::read_def(const void* def_ptr, std::uint32_t id, FieldType want) const noexcept {
  const FieldList* fields = static_cast<const FieldList*>(fields_);
  const FieldDef* def = static_cast<const FieldDef*>(def_ptr);
  if (tap_ != nullptr && def != nullptr) {
    if (path_ == 0) {
      tap_->count_top(fields, static_cast<std::uint32_t>(def - fields->data()), def->id, version_);
    } else {
      tap_->count(detail::UsageTap::key_of(version_, path_, def->id));
    }
  }
  // Nested views count their reads as "parent.child" while the path has room
  // (3 levels); deeper reads are not counted (doc/schemas.md).
  detail::UsageTap* const child_tap = (path_ >> 16) == 0 ? tap_ : nullptr;
  const std::uint32_t child_path = (path_ << 16) | id;
  FieldType have;
  std::string_view v;
  const bool present = find(id, &have, &v);
  // Fast path: a scalar stored with exactly the type asked for (and the
  // reader schema's type) is decoded here, without the widening switch.
  if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint64_t> ||
                std::is_same_v<T, double> || std::is_same_v<T, std::string_view>) {
    if (present && have == want && (def == nullptr || def->type == want)) return decode_exact<T>(v);
  }
  if (!present) {
    if (def == nullptr || !def->has_default) return Status::from_literal(Code::NotFound, "record: no such field");
    if (def->type != want) return mismatch();
    if constexpr (std::is_same_v<T, bool>) {
      return def->default_bool;
    } else if constexpr (std::is_same_v<T, std::int64_t>) {
      return def->default_int;
    } else if constexpr (std::is_same_v<T, std::uint64_t>) {
      return def->default_uint;
    } else if constexpr (std::is_same_v<T, double>) {
      return def->default_double;
    } else if constexpr (std::is_same_v<T, std::string_view>) {
      return std::string_view(def->default_text);
    } else if constexpr (std::is_same_v<T, RecordView>) {
      RecordView r;
      r.schema_ = schema_;
      r.fields_ = &def->fields;
      r.tap_ = child_tap;
      r.path_ = child_path;
      r.version_ = version_;
      return r;
    } else {
      ListView l;
      l.element_ = def->element;
      l.schema_ = schema_;
      l.nested_fields_ = &def->fields;
      l.tap_ = child_tap;
      l.path_ = child_path;
      l.version_ = version_;
      return l;
    }
  }
  // With a reader schema, the field is read as the reader's type, from any
  // type that widens to it (doc/schemas.md).
  if (def != nullptr && (def->type != want || !detail::readable_as(have, def->type))) return mismatch();
  if constexpr (std::is_same_v<T, RecordView>) {
    if (have != FieldType::Record) return mismatch();
    RecordView r;
    r.body_ = v;
    r.schema_ = schema_;
    r.fields_ = def ? &def->fields : nullptr;
    r.tap_ = child_tap;
    r.path_ = child_path;
    r.version_ = version_;
    return r;
  } else if constexpr (std::is_same_v<T, ListView>) {
    if (have != FieldType::List) return mismatch();
    ListView l;
    l.element_ = static_cast<FieldType>(v[0]);
    l.count_ = detail::get_le32(v.data() + 5);
    l.body_ = v.substr(9);
    l.schema_ = schema_;
    l.nested_fields_ = def ? &def->fields : nullptr;
    l.tap_ = child_tap;
    l.path_ = child_path;
    l.version_ = version_;
    return l;
  } else {
    return decode_widened<T>(have, want, v);
  }
}

template <typename T>
Result<T> RecordView::read_named(std::string_view name, FieldType want) const noexcept {
  const FieldList* fields = static_cast<const FieldList*>(fields_);
  if (fields == nullptr) return Status::from_literal(Code::NotFound, "record: a read by name needs a reader schema");
  const FieldDef* def = detail::find_field(*fields, name);
  if (def == nullptr) return Status::from_literal(Code::NotFound, "record: the reader schema has no field by that name");
  return read_def<T>(def, def->id, want);
}

FieldKey::FieldKey(std::string_view name) : name_(name) {}
FieldKey::FieldKey(const FieldKey& other) : name_(other.name_), def_(other.def_.load(std::memory_order_acquire)) {}
FieldKey& FieldKey::operator=(const FieldKey& other) {
  if (this != &other) {
    name_ = other.name_;
    def_.store(other.def_.load(std::memory_order_acquire), std::memory_order_release);
  }
  return *this;
}

template <typename T>
Result<T> RecordView::read_key(const FieldKey& key, FieldType want) const noexcept {
  const FieldList* fields = static_cast<const FieldList*>(fields_);
  if (fields == nullptr) return Status::from_literal(Code::NotFound, "record: a read by name needs a reader schema");
  // The cached definition counts only if it is an element of this view's
  // field list (checked as addresses before it is read) with the key's name.
  const FieldDef* def = static_cast<const FieldDef*>(key.def_.load(std::memory_order_acquire));
  const auto at = reinterpret_cast<std::uintptr_t>(def);
  const auto lo = reinterpret_cast<std::uintptr_t>(fields->data());
  if (def == nullptr || at < lo || at >= lo + fields->size() * sizeof(FieldDef) || (at - lo) % sizeof(FieldDef) != 0 ||
      def->name != key.name_) {
    def = detail::find_field(*fields, std::string_view(key.name_));
    if (def == nullptr)
      return Status::from_literal(Code::NotFound, "record: the reader schema has no field by that name");
    key.def_.store(def, std::memory_order_release);
  }
  return read_def<T>(def, def->id, want);
}

Result<bool> RecordView::get_bool(std::uint32_t id) const noexcept { return read<bool>(id, FieldType::Bool); }
Result<std::int64_t> RecordView::get_int64(std::uint32_t id) const noexcept {
  return read<std::int64_t>(id, FieldType::Int64);
}
Result<std::uint64_t> RecordView::get_uint64(std::uint32_t id) const noexcept {
  return read<std::uint64_t>(id, FieldType::Uint64);
}
Result<double> RecordView::get_double(std::uint32_t id) const noexcept { return read<double>(id, FieldType::Double); }
Result<std::string_view> RecordView::get_string(std::uint32_t id) const noexcept {
  return read<std::string_view>(id, FieldType::String);
}
Result<std::string_view> RecordView::get_bytes(std::uint32_t id) const noexcept {
  return read<std::string_view>(id, FieldType::Bytes);
}
Result<std::int64_t> RecordView::get_timestamp(std::uint32_t id) const noexcept {
  return read<std::int64_t>(id, FieldType::Timestamp);
}
Result<RecordView> RecordView::get_record(std::uint32_t id) const noexcept {
  return read<RecordView>(id, FieldType::Record);
}
Result<ListView> RecordView::get_list(std::uint32_t id) const noexcept { return read<ListView>(id, FieldType::List); }

Result<bool> RecordView::get_bool(std::string_view n) const noexcept { return read_named<bool>(n, FieldType::Bool); }
Result<std::int64_t> RecordView::get_int64(std::string_view n) const noexcept {
  return read_named<std::int64_t>(n, FieldType::Int64);
}
Result<std::uint64_t> RecordView::get_uint64(std::string_view n) const noexcept {
  return read_named<std::uint64_t>(n, FieldType::Uint64);
}
Result<double> RecordView::get_double(std::string_view n) const noexcept {
  return read_named<double>(n, FieldType::Double);
}
Result<std::string_view> RecordView::get_string(std::string_view n) const noexcept {
  return read_named<std::string_view>(n, FieldType::String);
}
Result<std::string_view> RecordView::get_bytes(std::string_view n) const noexcept {
  return read_named<std::string_view>(n, FieldType::Bytes);
}
Result<std::int64_t> RecordView::get_timestamp(std::string_view n) const noexcept {
  return read_named<std::int64_t>(n, FieldType::Timestamp);
}

Result<bool> RecordView::get_bool(const FieldKey& k) const noexcept { return read_key<bool>(k, FieldType::Bool); }
Result<std::int64_t> RecordView::get_int64(const FieldKey& k) const noexcept {
  return read_key<std::int64_t>(k, FieldType::Int64);
}
Result<std::uint64_t> RecordView::get_uint64(const FieldKey& k) const noexcept {
  return read_key<std::uint64_t>(k, FieldType::Uint64);
}
Result<double> RecordView::get_double(const FieldKey& k) const noexcept { return read_key<double>(k, FieldType::Double); }
Result<std::string_view> RecordView::get_string(const FieldKey& k) const noexcept {
  return read_key<std::string_view>(k, FieldType::String);
}
Result<std::string_view> RecordView::get_bytes(const FieldKey& k) const noexcept {
  return read_key<std::string_view>(k, FieldType::Bytes);
}
Result<std::int64_t> RecordView::get_timestamp(const FieldKey& k) const noexcept {
  return read_key<std::int64_t>(k, FieldType::Timestamp);
}
Result<RecordView> RecordView::get_record(const FieldKey& k) const noexcept {
  return read_key<RecordView>(k, FieldType::Record);
}
Result<ListView> RecordView::get_list(const FieldKey& k) const noexcept { return read_key<ListView>(k, FieldType::List); }
Result<RecordView> RecordView::get_record(std::string_view n) const noexcept {
  return read_named<RecordView>(n, FieldType::Record);
}
Result<ListView> RecordView::get_list(std::string_view n) const noexcept {
  return read_named<ListView>(n, FieldType::List);
}

// ---------------------------------------------------------------- lists

Result<std::string_view> ListView::element(std::uint32_t index, FieldType want) const noexcept {
  if (index >= count_) return Status::from_literal(Code::NotFound, "list: index out of range");
  if (element_ != want) return mismatch();
  std::size_t pos = 0;
  std::string_view v;
  const char* why;
  for (std::uint32_t i = 0; i <= index; ++i) {
    if (!detail::value_extent(body_, &pos, element_, &v, &why)) return Status::from_literal(Code::Corruption, why);
  }
  return v;
}

#define LANEBUS_LIST_SCALAR(T, name, TYPE, field)                                        \
  Result<T> ListView::name(std::uint32_t index) const noexcept {                         \
    auto e = element(index, FieldType::TYPE);                                             \
    if (!e.ok()) return e.status();                                                       \
    bool b = false;                                                                       \
    std::int64_t i = 0;                                                                   \
    std::uint64_t u = 0;                                                                  \
    double d = 0;                                                                         \
    std::string_view s;                                                                   \
    decode_scalar(FieldType::TYPE, FieldType::TYPE, *e, &b, &i, &u, &d, &s);              \
    return field;                                                                         \
  }
LANEBUS_LIST_SCALAR(bool, get_bool, Bool, b)
LANEBUS_LIST_SCALAR(std::int64_t, get_int64, Int64, i)
LANEBUS_LIST_SCALAR(std::uint64_t, get_uint64, Uint64, u)
LANEBUS_LIST_SCALAR(double, get_double, Double, d)
LANEBUS_LIST_SCALAR(std::string_view, get_string, String, s)
LANEBUS_LIST_SCALAR(std::string_view, get_bytes, Bytes, s)
LANEBUS_LIST_SCALAR(std::int64_t, get_timestamp, Timestamp, i)
#undef LANEBUS_LIST_SCALAR

Result<RecordView> ListView::get_record(std::uint32_t index) const noexcept {
  auto e = element(index, FieldType::Record);
  if (!e.ok()) return e.status();
  RecordView r;
  r.body_ = *e;
  r.schema_ = schema_;
  r.fields_ = nested_fields_;
  r.tap_ = tap_;  // the elements' fields count as "list.child"
  r.path_ = path_;
  r.version_ = version_;
  return r;
}

}  // namespace lanebus
