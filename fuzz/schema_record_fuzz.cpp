// lanebus — MIT License.
// libFuzzer target: the typed-record decoder (include/lanebus/record.hpp,
// doc/schemas.md) and the schema check run at publish.
// Property: no crash or over-read; a record that parses can be read by every
// id with every accessor, and validate() gives OK or SchemaViolation only.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lanebus/record.hpp"
#include "lanebus/schema.hpp"

namespace {
const lanebus::SchemaVersion& schema() {
  static const lanebus::SchemaVersion s = lanebus::SchemaVersion::from_json(R"({"fields": [
    {"id": 1, "name": "id", "type": "string"},
    {"id": 2, "name": "n", "type": "int64", "default": 0},
    {"id": 3, "name": "tags", "type": "list", "items": "string", "default": []},
    {"id": 4, "name": "sub", "type": "record", "default": {}, "fields": [
      {"id": 1, "name": "x", "type": "double", "default": 0}]},
    {"id": 5, "name": "rows", "type": "list", "items": "record", "default": [], "fields": [
      {"id": 1, "name": "y", "type": "uint64", "default": 0}]}
  ]})").value();
  return s;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace lanebus;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const Status st = schema().validate(in);
  if (!st.ok() && st.code() != Code::SchemaViolation) __builtin_trap();
  auto v = RecordView::parse(in);
  if (!v.ok()) {
    if (v.code() != Code::Corruption) __builtin_trap();
    return 0;
  }
  auto reader = schema().view(in);
  if (!reader.ok()) __builtin_trap();  // parse and view check the same bytes
  v->for_each([&](std::uint32_t id, FieldType, std::string_view) {
    (void)v->get_bool(id);
    (void)v->get_int64(id);
    (void)v->get_uint64(id);
    (void)v->get_double(id);
    (void)v->get_string(id);
    (void)v->get_timestamp(id);
    if (auto l = v->get_list(id); l.ok()) {
      for (std::uint32_t i = 0; i < l->size() && i < 64; ++i) {
        (void)l->get_string(i);
        if (auto r = l->get_record(i); r.ok()) (void)r->get_uint64(1);
      }
    }
    if (auto r = v->get_record(id); r.ok()) (void)r->get_double(1);
    return true;
  });
  (void)reader->get_string("id");
  (void)reader->get_int64("n");
  if (auto l = reader->get_list("rows"); l.ok() && l->size() > 0) (void)l->get_record(0);
  return 0;
}
