// lanebus — MIT License.
// Schema versions: the JSON schema file, record validation against a version,
// and the compatibility rules (doc/schemas.md).
#include "lanebus/schema.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "access.hpp"
#include "json.hpp"
#include "record_codec.hpp"

namespace lanebus {

const char* to_string(Compatibility mode) noexcept {
  switch (mode) {
    case Compatibility::Backward: return "backward";
    case Compatibility::BackwardTransitive: return "backward_transitive";
    case Compatibility::Forward: return "forward";
    case Compatibility::ForwardTransitive: return "forward_transitive";
    case Compatibility::Full: return "full";
    case Compatibility::FullTransitive: return "full_transitive";
    case Compatibility::None: return "none";
  }
  return "unknown";
}

Result<Compatibility> compatibility_from_string(std::string_view text) {
  for (int i = 0; i <= static_cast<int>(Compatibility::None); ++i) {
    const auto m = static_cast<Compatibility>(i);
    if (text == to_string(m)) return m;
  }
  return Status(Code::InvalidArgument,
                "unknown compatibility mode \"" + std::string(text) +
                    "\" (backward, backward_transitive, forward, forward_transitive, full, full_transitive, none)");
}

namespace {

using detail::FieldList;
using detail::Json;

constexpr std::size_t kMaxFieldsPerRecord = 256;

bool valid_field_name(std::string_view n) {
  if (n.empty() || n.size() > 128) return false;
  if (!(std::isalpha(static_cast<unsigned char>(n[0])) || n[0] == '_')) return false;
  for (char c : n) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

bool type_from_string(std::string_view s, FieldType* out) {
  for (std::uint8_t t = 1; t <= 9; ++t) {
    if (s == to_string(static_cast<FieldType>(t))) {
      *out = static_cast<FieldType>(t);
      return true;
    }
  }
  return false;
}

Status bad(const std::string& path, const std::string& why) {
  return Status(Code::InvalidArgument, "schema: field " + path + ": " + why);
}

Status parse_fields(const Json& arr, const std::string& prefix, int depth, FieldList* out);

Status parse_default(const Json& d, FieldDef* f, const std::string& path) {
  const std::string wrong = std::string("the default is not a ") + to_string(f->type);
  switch (f->type) {
    case FieldType::Bool:
      if (d.kind != Json::Kind::Bool) return bad(path, wrong);
      f->default_bool = d.b;
      break;
    case FieldType::Int64:
    case FieldType::Timestamp:
      if (!d.as_int64(&f->default_int)) return bad(path, wrong + " (an integer in int64 range)");
      break;
    case FieldType::Uint64:
      if (!d.as_uint64(&f->default_uint)) return bad(path, wrong + " (a non-negative integer)");
      break;
    case FieldType::Double:
      if (!d.as_double(&f->default_double)) return bad(path, wrong + " (a number)");
      break;
    case FieldType::String:
    case FieldType::Bytes:
      if (d.kind != Json::Kind::String) return bad(path, wrong + " (a JSON string)");
      f->default_text = d.text;
      break;
    case FieldType::Record:
      if (d.kind != Json::Kind::Object || !d.keys.empty())
        return bad(path, "a record's default can only be {} (an empty record)");
      break;
    case FieldType::List:
      if (d.kind != Json::Kind::Array || !d.items.empty())
        return bad(path, "a list's default can only be [] (an empty list)");
      break;
  }
  f->has_default = true;
  return Status();
}

Status parse_field(const Json& j, const std::string& prefix, int depth, FieldDef* f) {
  if (j.kind != Json::Kind::Object) return Status(Code::InvalidArgument, "schema: a field is not a JSON object");
  const Json* name = j.get("name");
  if (name == nullptr || name->kind != Json::Kind::String || !valid_field_name(name->text))
    return Status(Code::InvalidArgument, "schema: a field in " + (prefix.empty() ? std::string("the schema") : prefix) +
                                             " has no valid \"name\" (letters, digits, _; not starting with a digit)");
  f->name = name->text;
  const std::string path = "\"" + prefix + f->name + "\"";
  for (const std::string& k : j.keys) {
    if (k != "id" && k != "name" && k != "type" && k != "items" && k != "default" && k != "doc" && k != "fields")
      return bad(path, "unknown member \"" + k + "\"");
  }
  std::uint64_t id = 0;
  const Json* idj = j.get("id");
  if (idj == nullptr || !idj->as_uint64(&id) || id == 0 || id > kMaxFieldId)
    return bad(path, "\"id\" must be an integer 1..65535");
  f->id = static_cast<std::uint32_t>(id);
  const Json* type = j.get("type");
  if (type == nullptr || type->kind != Json::Kind::String) return bad(path, "no \"type\"");
  if (!type_from_string(type->text, &f->type)) return bad(path, "unknown type \"" + type->text + "\"");
  const Json* items = j.get("items");
  if (f->type == FieldType::List) {
    if (items == nullptr || items->kind != Json::Kind::String || !type_from_string(items->text, &f->element) ||
        f->element == FieldType::List)
      return bad(path, "a list needs \"items\": a scalar or record type");
  } else if (items != nullptr) {
    return bad(path, "\"items\" is only for lists");
  }
  const bool nested = f->type == FieldType::Record || (f->type == FieldType::List && f->element == FieldType::Record);
  const Json* fields = j.get("fields");
  if (nested) {
    if (depth + 1 >= kMaxRecordDepth) return bad(path, "records are nested too deep");
    if (fields == nullptr || fields->kind != Json::Kind::Array) return bad(path, "a record needs \"fields\"");
    if (Status s = parse_fields(*fields, prefix + f->name + ".", depth + 1, &f->fields); !s.ok()) return s;
  } else if (fields != nullptr) {
    return bad(path, "\"fields\" is only for records");
  }
  if (const Json* doc = j.get("doc")) {
    if (doc->kind != Json::Kind::String) return bad(path, "\"doc\" is not a string");
    f->doc = doc->text;
  }
  if (const Json* d = j.get("default")) {
    if (Status s = parse_default(*d, f, path); !s.ok()) return s;
  }
  return Status();
}

Status parse_fields(const Json& arr, const std::string& prefix, int depth, FieldList* out) {
  if (arr.kind != Json::Kind::Array) return Status(Code::InvalidArgument, "schema: \"fields\" is not an array");
  if (arr.items.size() > kMaxFieldsPerRecord)
    return Status(Code::InvalidArgument, "schema: more than 256 fields in one record");
  out->clear();
  for (const Json& j : arr.items) {
    FieldDef f;
    if (Status s = parse_field(j, prefix, depth, &f); !s.ok()) return s;
    for (const FieldDef& o : *out) {
      if (o.id == f.id)
        return Status(Code::InvalidArgument, "schema: duplicate field id " + std::to_string(f.id) + " (\"" + prefix +
                                                 o.name + "\" and \"" + prefix + f.name + "\")");
      if (o.name == f.name) return Status(Code::InvalidArgument, "schema: duplicate field name \"" + prefix + f.name + "\"");
    }
    out->push_back(std::move(f));
  }
  std::sort(out->begin(), out->end(), [](const FieldDef& a, const FieldDef& b) { return a.id < b.id; });
  return Status();
}

void field_json(const FieldDef& f, std::string* o, const std::string& indent);

void fields_json(const FieldList& fs, std::string* o, const std::string& indent) {
  *o += "[";
  for (std::size_t i = 0; i < fs.size(); ++i) {
    *o += i ? ",\n" : "\n";
    *o += indent + "  ";
    field_json(fs[i], o, indent + "  ");
  }
  *o += fs.empty() ? "]" : "\n" + indent + "]";
}

std::string number_text(double d) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.17g", d);
  std::string s = b;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // stays a double literal
  return s;
}

void field_json(const FieldDef& f, std::string* o, const std::string& indent) {
  *o += "{\"id\": " + std::to_string(f.id) + ", \"name\": " + detail::json_quote(f.name) + ", \"type\": \"" +
        to_string(f.type) + "\"";
  if (f.type == FieldType::List) *o += std::string(", \"items\": \"") + to_string(f.element) + "\"";
  if (f.has_default) {
    *o += ", \"default\": ";
    switch (f.type) {
      case FieldType::Bool: *o += f.default_bool ? "true" : "false"; break;
      case FieldType::Int64:
      case FieldType::Timestamp: *o += std::to_string(f.default_int); break;
      case FieldType::Uint64: *o += std::to_string(f.default_uint); break;
      case FieldType::Double: *o += number_text(f.default_double); break;
      case FieldType::String:
      case FieldType::Bytes: *o += detail::json_quote(f.default_text); break;
      case FieldType::Record: *o += "{}"; break;
      case FieldType::List: *o += "[]"; break;
    }
  }
  if (!f.doc.empty()) *o += ", \"doc\": " + detail::json_quote(f.doc);
  if (f.type == FieldType::Record || (f.type == FieldType::List && f.element == FieldType::Record)) {
    *o += ", \"fields\": ";
    fields_json(f.fields, o, indent);
  }
  *o += "}";
}

bool same_field(const FieldDef& a, const FieldDef& b);

bool same_fields(const FieldList& a, const FieldList& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!same_field(a[i], b[i])) return false;
  }
  return true;
}

bool same_field(const FieldDef& a, const FieldDef& b) {
  return a.id == b.id && a.name == b.name && a.type == b.type && a.element == b.element &&
         a.has_default == b.has_default && a.default_bool == b.default_bool && a.default_int == b.default_int &&
         a.default_uint == b.default_uint &&
         std::memcmp(&a.default_double, &b.default_double, sizeof(double)) == 0 &&
         a.default_text == b.default_text && a.doc == b.doc && same_fields(a.fields, b.fields);
}

// ---- validation of a record against a version (the publish check)

Status violation(const char* what, const FieldDef* f, std::uint32_t id) {
  std::string s = "record does not match the topic's schema: ";
  s += what;
  if (f != nullptr) {
    s += " \"" + f->name + "\" (id " + std::to_string(f->id) + ", " + to_string(f->type) + ")";
  } else {
    s += " " + std::to_string(id);
  }
  return Status(Code::SchemaViolation, s);
}

// One pass over an untrusted record: the structural checks of
// detail::check_record (tags, lengths, bools, varints, nesting) and the
// schema's (known ids, types, no duplicates, required fields present)
// together, so a publish walks the record once. Allocation-free when OK.
Status malformed(const char* why) {
  return Status(Code::SchemaViolation, std::string("record does not match the topic's schema: ") + why);
}

Status validate_value(const FieldDef& def, FieldType have, std::string_view v, int depth);

Status validate_body(const FieldList& fields, std::string_view body, int depth) {
  if (depth > kMaxRecordDepth) return malformed("records are nested deeper than 8 levels");
  std::uint64_t seen[kMaxFieldsPerRecord / 64] = {};
  std::size_t pos = 0;
  while (pos < body.size()) {
    std::uint64_t raw = 0;
    if (!detail::get_varint(body, &pos, &raw)) return malformed("a field id is truncated");
    if (raw == 0 || raw > kMaxFieldId) return malformed("a field id is outside 1..65535");
    if (pos >= body.size()) return malformed("the record is truncated after a field id");
    const auto tag = static_cast<std::uint8_t>(body[pos++]);
    if (!valid_field_type(tag)) return malformed("unknown type tag");
    const auto t = static_cast<FieldType>(tag);
    std::string_view v;
    const char* why = nullptr;
    if (!detail::value_extent(body, &pos, t, &v, &why)) return malformed(why);
    const auto id = static_cast<std::uint32_t>(raw);
    const FieldDef* def = detail::find_field(fields, id);
    if (def == nullptr) return violation("unknown field id", nullptr, id);
    const std::size_t idx = static_cast<std::size_t>(def - fields.data());
    if (seen[idx / 64] & (std::uint64_t(1) << (idx % 64))) return violation("duplicate field", def, id);
    seen[idx / 64] |= std::uint64_t(1) << (idx % 64);
    if (Status st = validate_value(*def, t, v, depth); !st.ok()) return st;
  }
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (!(seen[i / 64] & (std::uint64_t(1) << (i % 64))) && !fields[i].has_default)
      return violation("missing required field (no default)", &fields[i], fields[i].id);
  }
  return Status();
}

Status validate_value(const FieldDef& def, FieldType have, std::string_view v, int depth) {
  if (have != def.type) {
    return Status(Code::SchemaViolation, std::string("record does not match the topic's schema: field \"") + def.name +
                                             "\" (id " + std::to_string(def.id) + ") is " + to_string(have) +
                                             ", the schema says " + to_string(def.type));
  }
  if (have == FieldType::Record) return validate_body(def.fields, v, depth + 1);
  if (have != FieldType::List) return Status();
  if (depth + 1 > kMaxRecordDepth) return malformed("records are nested deeper than 8 levels");
  const auto tag = static_cast<std::uint8_t>(v[0]);
  if (!valid_field_type(tag) || tag == static_cast<std::uint8_t>(FieldType::List))
    return malformed("a list has an unknown element type");
  const auto et = static_cast<FieldType>(tag);
  if (et != def.element)
    return Status(Code::SchemaViolation, std::string("record does not match the topic's schema: list \"") + def.name +
                                             "\" has " + to_string(et) + " elements, the schema says " +
                                             to_string(def.element));
  const std::uint32_t count = detail::get_le32(v.data() + 5);
  std::string_view body = v.substr(9);
  std::size_t pos = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::string_view e;
    const char* why = nullptr;
    if (!detail::value_extent(body, &pos, et, &e, &why)) return malformed(why);
    if (et == FieldType::Record) {
      if (Status st = validate_body(def.fields, e, depth + 2); !st.ok()) return st;
    }
  }
  if (pos != body.size()) return malformed("a list's length does not match its elements");
  return Status();
}

// ---- compatibility

struct Direction {
  const SchemaVersion* reader;
  const SchemaVersion* writer;
  bool backward;  // reader is the candidate
  Compatibility mode;
};

std::string vname(const SchemaVersion& v) {
  return v.version() == 0 ? std::string("the new version") : "version " + std::to_string(v.version());
}

Status incompatible(const Direction& d, const std::string& what) {
  return Status(Code::Incompatible, what + " [" + to_string(d.mode) + ": " + vname(*d.reader) +
                                        " must read records of " + vname(*d.writer) + "]");
}

Status reader_reads_writer(const Direction& d, const FieldList& r, const FieldList& w, const std::string& prefix) {
  for (const FieldDef& f : r) {
    const std::string path = "\"" + prefix + f.name + "\" (id " + std::to_string(f.id) + ")";
    const FieldDef* o = detail::find_field(w, f.id);
    if (o == nullptr) {
      if (f.has_default) continue;
      if (d.backward) return incompatible(d, "field " + path + " is added without a default: rule: an added field needs a default");
      return incompatible(d, "field " + path + " is removed but has no default: rule: only a field with a default can be removed");
    }
    if (!detail::readable_as(o->type, f.type))
      return incompatible(d, "field " + path + " changes type from " + to_string(d.backward ? o->type : f.type) +
                                 " to " + to_string(d.backward ? f.type : o->type) +
                                 ": rule: a type may only widen int64->double, uint64->double, string<->bytes");
    if (f.type == FieldType::List && !detail::readable_as(o->element, f.element))
      return incompatible(d, "list " + path + " changes its element type: rule: element types follow the widenings");
    if (f.type == FieldType::Record || (f.type == FieldType::List && f.element == FieldType::Record)) {
      if (Status s = reader_reads_writer(d, f.fields, o->fields, prefix + f.name + "."); !s.ok()) return s;
    }
  }
  return Status();
}

Status same_names(const FieldList& a, const FieldList& b, const SchemaVersion& other, const std::string& prefix) {
  for (const FieldDef& f : a) {
    for (const FieldDef& o : b) {
      if ((o.id == f.id) != (o.name == f.name))
        return Status(Code::Incompatible, "field \"" + prefix + f.name + "\" (id " + std::to_string(f.id) + ") and " +
                                              vname(other) + "'s field \"" + prefix + o.name + "\" (id " +
                                              std::to_string(o.id) + ") break the rule: ids and names are fixed "
                                              "across versions (a rename is a new field)");
      if (o.id == f.id && !f.fields.empty()) {
        if (Status s = same_names(f.fields, o.fields, other, prefix + f.name + "."); !s.ok()) return s;
      }
    }
  }
  return Status();
}

}  // namespace

namespace detail {

// One value of type `t` at body[*pos] (the record was checked).
bool value_at(std::string_view body, std::size_t* pos, FieldType t, std::string_view* v) noexcept {
  const std::size_t start = *pos;
  std::uint64_t u;
  switch (t) {
    case FieldType::Bool:
      if (*pos >= body.size()) return false;
      *v = body.substr((*pos)++, 1);
      return true;
    case FieldType::Int64:
    case FieldType::Uint64:
    case FieldType::Timestamp:
      if (!get_varint(body, pos, &u)) return false;
      *v = body.substr(start, *pos - start);
      return true;
    case FieldType::Double:
      if (body.size() - *pos < 8) return false;
      *v = body.substr(*pos, 8);
      *pos += 8;
      return true;
    case FieldType::String:
    case FieldType::Bytes:
      if (!get_varint(body, pos, &u) || u > body.size() - *pos) return false;
      *v = body.substr(*pos, u);
      *pos += u;
      return true;
    case FieldType::Record: {
      if (body.size() - *pos < 4) return false;
      const std::uint32_t n = get_le32(body.data() + *pos);
      if (n > body.size() - *pos - 4) return false;
      *v = body.substr(*pos + 4, n);
      *pos += 4 + std::size_t(n);
      return true;
    }
    case FieldType::List: {
      if (body.size() - *pos < 9) return false;
      const std::uint32_t n = get_le32(body.data() + *pos + 1);
      if (n > body.size() - *pos - 9) return false;
      *v = body.substr(*pos, 9 + std::size_t(n));
      *pos += 9 + std::size_t(n);
      return true;
    }
  }
  return false;
}

}  // namespace detail

Result<SchemaVersion> SchemaVersion::from_json(std::string_view json) {
  auto j = detail::parse_json(json);
  if (!j.ok()) return Status(Code::InvalidArgument, "schema: " + std::string(j.status().message()));
  if (j->kind != Json::Kind::Object) return Status(Code::InvalidArgument, "schema: the file is not a JSON object");
  for (const std::string& k : j->keys) {
    if (k != "fields" && k != "topic" && k != "compatibility" && k != "doc" && k != "version")
      return Status(Code::InvalidArgument, "schema: unknown top-level member \"" + k + "\"");
  }
  const Json* fields = j->get("fields");
  if (fields == nullptr) return Status(Code::InvalidArgument, "schema: no \"fields\" array");
  SchemaVersion v;
  if (Status s = parse_fields(*fields, "", 0, &v.fields_); !s.ok()) return s;
  if (const Json* ver = j->get("version")) {
    std::uint64_t n = 0;
    if (!ver->as_uint64(&n) || n > 65535) return Status(Code::InvalidArgument, "schema: bad \"version\"");
    v.version_ = static_cast<std::uint16_t>(n);
  }
  return v;
}

std::string SchemaVersion::to_json() const {
  std::string o = "{\"version\": " + std::to_string(version_) + ", \"fields\": ";
  fields_json(fields_, &o, "");
  o += "}\n";
  return o;
}

const FieldDef* SchemaVersion::field(std::uint32_t id) const noexcept { return detail::find_field(fields_, id); }
const FieldDef* SchemaVersion::field(std::string_view name) const noexcept {
  return detail::find_field(fields_, name);
}
bool SchemaVersion::same_as(const SchemaVersion& other) const { return same_fields(fields_, other.fields_); }

namespace {

// The publish check's fast path: true only if validate_body would accept the
// body (same structural and schema rules), without building a Status. Lists
// and records of more than 64 fields take the full path.
bool fast_valid(const detail::FieldList& fields, const char* base, std::size_t size, int depth) noexcept {
  if (depth > kMaxRecordDepth || fields.size() > 64) return false;
  const std::string_view body(base, size);
  std::uint64_t seen = 0;
  std::size_t pos = 0;
  while (pos < size) {
    std::uint64_t id = static_cast<std::uint8_t>(base[pos]);
    if (id < 0x80) {
      ++pos;
    } else if (!detail::get_varint(body, &pos, &id)) {
      return false;
    }
    if (id == 0 || id > kMaxFieldId || pos >= size) return false;
    const auto tag = static_cast<std::uint8_t>(base[pos++]);
    const FieldDef* def = detail::find_field(fields, static_cast<std::uint32_t>(id));
    if (def == nullptr || static_cast<std::uint8_t>(def->type) != tag) return false;
    const std::uint64_t bit = std::uint64_t(1) << static_cast<std::size_t>(def - fields.data());
    if ((seen & bit) != 0) return false;
    seen |= bit;
    std::uint64_t u;
    switch (def->type) {
      case FieldType::Bool:
        if (pos >= size || static_cast<std::uint8_t>(base[pos]) > 1) return false;
        ++pos;
        break;
      case FieldType::Int64:
      case FieldType::Uint64:
      case FieldType::Timestamp:
        if (pos < size && static_cast<std::uint8_t>(base[pos]) < 0x80) {
          ++pos;
        } else if (!detail::get_varint(body, &pos, &u)) {
          return false;
        }
        break;
      case FieldType::Double:
        if (size - pos < 8) return false;
        pos += 8;
        break;
      case FieldType::String:
      case FieldType::Bytes:
        if (pos < size && static_cast<std::uint8_t>(base[pos]) < 0x80) {
          u = static_cast<std::uint8_t>(base[pos++]);
        } else if (!detail::get_varint(body, &pos, &u)) {
          return false;
        }
        if (u > size - pos) return false;
        pos += static_cast<std::size_t>(u);
        break;
      case FieldType::Record: {
        if (size - pos < 4) return false;
        const std::uint32_t n = detail::get_le32(base + pos);
        pos += 4;
        if (n > size - pos || !fast_valid(def->fields, base + pos, n, depth + 1)) return false;
        pos += n;
        break;
      }
      default:  // lists: the full path
        return false;
    }
  }
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if ((seen & (std::uint64_t(1) << i)) == 0 && !fields[i].has_default) return false;
  }
  return true;
}

}  // namespace

Status SchemaVersion::validate(std::string_view record) const {
  if (record.empty()) return malformed("the record is empty");
  if (static_cast<std::uint8_t>(record[0]) != kRecordMagic) return malformed("not a lanebus record (bad magic byte)");
  if (fast_valid(fields_, record.data() + 1, record.size() - 1, 1)) return Status();
  return validate_body(fields_, record.substr(1), 1);
}

Result<RecordView> SchemaVersion::view(std::string_view record) const noexcept {
  auto r = RecordView::parse(record);
  if (!r.ok()) return r;
  return detail::Access::with_schema(*r, this, &fields_, nullptr, 0);
}

Status check_compatibility(Compatibility mode, const std::vector<SchemaVersion>& history,
                           const SchemaVersion& candidate) {
  if (history.empty()) return Status();
  for (auto it = history.rbegin(); it != history.rend(); ++it) {
    if (Status s = same_names(candidate.fields(), it->fields(), *it, ""); !s.ok()) return s;
  }
  const bool transitive = mode == Compatibility::BackwardTransitive || mode == Compatibility::ForwardTransitive ||
                          mode == Compatibility::FullTransitive;
  const bool backward = mode == Compatibility::Backward || mode == Compatibility::BackwardTransitive ||
                        mode == Compatibility::Full || mode == Compatibility::FullTransitive;
  const bool forward = mode == Compatibility::Forward || mode == Compatibility::ForwardTransitive ||
                       mode == Compatibility::Full || mode == Compatibility::FullTransitive;
  for (auto it = history.rbegin(); it != history.rend(); ++it) {
    if (backward) {
      Direction d{&candidate, &*it, true, mode};
      if (Status s = reader_reads_writer(d, candidate.fields(), it->fields(), ""); !s.ok()) return s;
    }
    if (forward) {
      Direction d{&*it, &candidate, false, mode};
      if (Status s = reader_reads_writer(d, it->fields(), candidate.fields(), ""); !s.ok()) return s;
    }
    if (!transitive) break;
  }
  return Status();
}

}  // namespace lanebus
