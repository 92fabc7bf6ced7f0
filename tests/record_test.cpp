// lanebus — MIT License.
// Records (RecordBuilder / RecordView), schema files and record validation,
// bad input included (doc/schemas.md).
#include <doctest/doctest.h>

#include <cstring>
#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/record.hpp"
#include "lanebus/schema.hpp"
#include "seed.hpp"

using namespace lanebus;
using lanebus::test::test_seed;

namespace {

constexpr const char* kShipment = R"({
  "fields": [
    {"id": 1, "name": "shipment_id", "type": "string", "doc": "the business key"},
    {"id": 2, "name": "weight_kg", "type": "double", "default": 0},
    {"id": 3, "name": "pieces", "type": "int64", "default": 1},
    {"id": 4, "name": "express", "type": "bool", "default": false},
    {"id": 5, "name": "created", "type": "timestamp"},
    {"id": 6, "name": "tags", "type": "list", "items": "string", "default": []},
    {"id": 7, "name": "dest", "type": "record", "default": {}, "fields": [
      {"id": 1, "name": "city", "type": "string", "default": "?"},
      {"id": 2, "name": "zip", "type": "uint64", "default": 0}
    ]},
    {"id": 8, "name": "blob", "type": "bytes", "default": ""}
  ]
})";

SchemaVersion shipment() {
  auto s = SchemaVersion::from_json(kShipment);
  REQUIRE_MESSAGE(s.ok(), s.status().to_string());
  return *s;
}

std::string build_full(char* buf, std::size_t cap) {
  RecordBuilder b(buf, cap);
  b.add_string(1, "S-1").add_double(2, 12.5).add_int64(3, -3).add_bool(4, true).add_timestamp(5, 1700000000123456789);
  b.begin_list(6, FieldType::String).add_string(0, "fragile").add_string(0, "cold").end_list();
  b.begin_record(7).add_string(1, "Lyon").add_uint64(2, 69001).end_record();
  b.add_bytes(8, std::string_view("\0\1\2", 3));
  auto r = b.finish();
  REQUIRE(r.ok());
  return std::string(*r);
}

}  // namespace

TEST_CASE("a built record reads back every type by id") {
  char buf[256];
  const std::string rec = build_full(buf, sizeof(buf));
  auto v = RecordView::parse(rec);
  REQUIRE(v.ok());
  CHECK(*v->get_string(1) == "S-1");
  CHECK(*v->get_double(2) == 12.5);
  CHECK(*v->get_int64(3) == -3);
  CHECK(*v->get_bool(4) == true);
  CHECK(*v->get_timestamp(5) == 1700000000123456789);
  auto tags = v->get_list(6);
  REQUIRE(tags.ok());
  CHECK(tags->size() == 2);
  CHECK(*tags->get_string(1) == "cold");
  CHECK(tags->get_string(2).code() == Code::NotFound);
  CHECK(tags->get_int64(0).code() == Code::InvalidArgument);
  auto dest = v->get_record(7);
  REQUIRE(dest.ok());
  CHECK(*dest->get_string(1) == "Lyon");
  CHECK(*dest->get_uint64(2) == 69001);
  CHECK(*v->get_bytes(8) == std::string_view("\0\1\2", 3));
  // The views point into the buffer: zero copy.
  CHECK(v->get_string(1)->data() >= rec.data());
  CHECK(v->get_string(1)->data() < rec.data() + rec.size());
}

TEST_CASE("type mismatch and missing fields are errors, not crashes") {
  char buf[256];
  const std::string rec = build_full(buf, sizeof(buf));
  auto v = RecordView::parse(rec);
  REQUIRE(v.ok());
  CHECK(v->get_int64(1).code() == Code::InvalidArgument);
  CHECK(std::string(v->get_int64(1).status().message()).find("type mismatch") != std::string::npos);
  CHECK(v->get_string(99).code() == Code::NotFound);
  CHECK(v->get_list(7).code() == Code::InvalidArgument);
  CHECK(v->get_record(6).code() == Code::InvalidArgument);
  CHECK(v->get_string("shipment_id").code() == Code::NotFound);  // no reader schema
  CHECK(v->has(8));
  CHECK(!v->has(9));
  CHECK(*v->type_of(7) == FieldType::Record);
}

TEST_CASE("the builder reports a full buffer and misuse with a clear error") {
  char small[8];
  RecordBuilder b(small, sizeof(small));
  b.add_string(1, "far too long for eight bytes");
  CHECK(b.finish().code() == Code::PayloadTooLarge);

  char buf[64];
  RecordBuilder c(buf, sizeof(buf));
  c.begin_record(1).add_int64(1, 1);
  CHECK(c.finish().code() == Code::InvalidArgument);
  c.reset();
  c.add_int64(0, 1);
  CHECK(c.finish().code() == Code::InvalidArgument);
  c.reset();
  c.begin_list(2, FieldType::Int64).add_string(0, "x").end_list();
  CHECK(c.finish().code() == Code::InvalidArgument);
  c.reset();
  c.end_record();
  CHECK(c.finish().code() == Code::InvalidArgument);
  c.reset();
  for (int i = 0; i < kMaxRecordDepth + 1; ++i) c.begin_record(1);
  CHECK(c.finish().code() == Code::InvalidArgument);
  c.reset();
  c.add_int64(70000, 1);
  CHECK(c.finish().code() == Code::InvalidArgument);
  c.reset();
  c.add_int64(1, 5);
  CHECK(c.finish().ok());
}

TEST_CASE("a list of records and an empty list") {
  char buf[256];
  RecordBuilder b(buf, sizeof(buf));
  b.begin_list(1, FieldType::Record);
  for (int i = 0; i < 3; ++i) b.begin_record(0).add_int64(1, i * 10).end_record();
  b.end_list();
  b.begin_list(2, FieldType::Double).end_list();
  auto r = b.finish();
  REQUIRE(r.ok());
  auto v = RecordView::parse(*r);
  REQUIRE(v.ok());
  auto l = v->get_list(1);
  REQUIRE(l.ok());
  CHECK(l->size() == 3);
  CHECK(*l->get_record(2)->get_int64(1) == 20);
  CHECK(v->get_list(2)->size() == 0);
}

TEST_CASE("every truncation of a record is refused as Corruption") {
  char buf[256];
  const std::string rec = build_full(buf, sizeof(buf));
  for (std::size_t n = 0; n < rec.size(); ++n) {
    auto v = RecordView::parse(std::string_view(rec.data(), n));
    // A prefix that ends exactly at a field boundary is a valid shorter record.
    if (v.ok()) continue;
    CHECK(v.code() == Code::Corruption);
    CHECK(!v.status().message().empty());
  }
  CHECK(RecordView::parse("").code() == Code::Corruption);
  CHECK(RecordView::parse("garbage").code() == Code::Corruption);  // bad magic
}

TEST_CASE("specific malformed records name their problem") {
  auto msg = [](std::string bytes) { return std::string(RecordView::parse(bytes).status().message()); };
  const std::string m(1, static_cast<char>(kRecordMagic));
  CHECK(msg(m + "\x01\x0c") .find("unknown type tag") != std::string::npos);
  CHECK(msg(m + "\x01\x01\x02").find("bool") != std::string::npos);
  CHECK(msg(m + std::string("\x00\x01\x01", 3)).find("outside 1..65535") != std::string::npos);
  CHECK(msg(m + "\x01\x05\x7f" "ab").find("truncated") != std::string::npos);
  CHECK(msg(m + "\x01\x02\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01").find("varint") != std::string::npos);
  // Nesting deeper than allowed (built by hand).
  std::string deep;
  for (int i = 0; i < kMaxRecordDepth + 2; ++i) {
    std::string outer("\x01\x08", 2);
    char len[4];
    const auto n = static_cast<std::uint32_t>(deep.size());
    std::memcpy(len, &n, 4);
    outer.append(len, 4);
    deep = outer + deep;
  }
  CHECK(msg(m + deep).find("nested deeper") != std::string::npos);
}

TEST_CASE("random garbage never crashes the decoder") {
  std::mt19937_64 rng(test_seed("record_garbage"));
  char buf[256];
  const std::string good = build_full(buf, sizeof(buf));
  int ok = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) s[rng() % s.size()] = static_cast<char>(rng());
    auto v = RecordView::parse(s);
    if (!v.ok()) {
      CHECK(v.code() == Code::Corruption);
      continue;
    }
    ++ok;
    // A record that parses may be read any way without crashing.
    v->for_each([&](std::uint32_t id, FieldType, std::string_view) {
      (void)v->get_string(id);
      (void)v->get_double(id);
      auto l = v->get_list(id);
      if (l.ok() && l->size() > 0) (void)l->get_string(0);
      auto r = v->get_record(id);
      if (r.ok()) (void)r->get_int64(1);
      return true;
    });
  }
  MESSAGE("garbage variants that still parse: " << ok);
}

TEST_CASE("schema files: good, and each kind of bad one") {
  const SchemaVersion s = shipment();
  CHECK(s.fields().size() == 8);
  CHECK(s.field("dest")->fields.size() == 2);
  CHECK(s.field(3)->default_int == 1);
  // Canonical JSON round-trips.
  auto again = SchemaVersion::from_json(s.to_json());
  REQUIRE(again.ok());
  CHECK(again->same_as(s));

  auto err = [](const char* json) {
    auto r = SchemaVersion::from_json(json);
    CHECK(r.code() == Code::InvalidArgument);
    return std::string(r.status().message());
  };
  CHECK(err(R"({"fields":[{"id":1,"name":"a","type":"float"}]})").find("unknown type \"float\"") != std::string::npos);
  CHECK(err(R"({"fields":[{"id":1,"name":"a","type":"int64"},{"id":1,"name":"b","type":"int64"}]})")
            .find("duplicate field id 1") != std::string::npos);
  CHECK(err(R"({"fields":[{"id":1,"name":"a","type":"int64"},{"id":2,"name":"a","type":"int64"}]})")
            .find("duplicate field name") != std::string::npos);
  CHECK(err(R"({"fields":[{"id":1,"name":"a","type":"int64","default":"x"}]})").find("default is not a int64") !=
        std::string::npos);
  CHECK(err(R"({"fields":[{"id":1,"name":"a","type":"bool","default":1}]})").find("default is not a bool") !=
        std::string::npos);
  CHECK(err(R"({"fields":[{"id":1,"name":"a","type":"uint64","default":-1}]})").find("non-negative") !=
        std::string::npos);
  CHECK(err(R"({"fields":[{"id":0,"name":"a","type":"int64"}]})").find("1..65535") != std::string::npos);
  CHECK(err(R"({"fields":[{"id":1,"name":"9a","type":"int64"}]})").find("valid \"name\"") != std::string::npos);
  CHECK(err(R"({"fields":[{"id":1,"name":"a","type":"list"}]})").find("items") != std::string::npos);
  CHECK(err(R"({"fields":[{"id":1,"name":"a","type":"int64","colour":1}]})").find("unknown member") !=
        std::string::npos);
  CHECK(err(R"({"fields":[{"id":1,"name":"a","type":"int64"})").find("JSON") != std::string::npos);
  CHECK(err("[1,2]").find("not a JSON object") != std::string::npos);
  CHECK(err(R"({"fields":[{"id":1,"name":"r","type":"record","fields":[{"id":1,"name":"x","type":"oops"}]}]})")
            .find("\"r.x\"") != std::string::npos);
}

TEST_CASE("validate: a record must match the schema exactly") {
  const SchemaVersion s = shipment();
  char buf[256];
  CHECK(s.validate(build_full(buf, sizeof(buf))).ok());

  auto check = [&](auto&& fill, const char* needle) {
    RecordBuilder b(buf, sizeof(buf));
    fill(b);
    auto r = b.finish();
    REQUIRE(r.ok());
    Status st = s.validate(*r);
    CHECK(st.code() == Code::SchemaViolation);
    CHECK_MESSAGE(std::string(st.message()).find(needle) != std::string::npos, st.to_string());
  };
  check([](RecordBuilder& b) { b.add_timestamp(5, 1); }, "missing required field (no default) \"shipment_id\"");
  check([](RecordBuilder& b) { b.add_string(1, "x").add_timestamp(5, 1).add_int64(42, 1); }, "unknown field id 42");
  check([](RecordBuilder& b) { b.add_string(1, "x").add_timestamp(5, 1).add_string(3, "three"); },
        "\"pieces\" (id 3) is string, the schema says int64");
  check([](RecordBuilder& b) { b.add_string(1, "x").add_string(1, "y").add_timestamp(5, 1); }, "duplicate field");
  check([](RecordBuilder& b) { b.add_string(1, "x").add_timestamp(5, 1).begin_list(6, FieldType::Int64).end_list(); },
        "int64 elements");
  check([](RecordBuilder& b) {
    b.add_string(1, "x").add_timestamp(5, 1).begin_record(7).add_string(2, "not a zip").end_record();
  }, "\"zip\"");
  CHECK(s.validate("garbage").code() == Code::SchemaViolation);
}

TEST_CASE("reading through a reader schema: names, defaults, widening, unknown fields skipped") {
  const SchemaVersion s = shipment();
  char buf[256];
  RecordBuilder b(buf, sizeof(buf));
  // An older writer: pieces as int64, no express/tags/dest, and a field the reader does not know.
  b.add_string(1, "S-9").add_int64(2, 40).add_timestamp(5, 7).add_int64(99, 1);
  auto r = b.finish();
  REQUIRE(r.ok());
  auto v = s.view(*r);
  REQUIRE(v.ok());
  CHECK(*v->get_string("shipment_id") == "S-9");
  CHECK(*v->get_double("weight_kg") == 40.0);  // int64 widened to double
  CHECK(*v->get_int64("pieces") == 1);          // default
  CHECK(*v->get_bool("express") == false);
  CHECK(v->get_list("tags")->size() == 0);
  CHECK(*v->get_record("dest")->get_string("city") == "?");
  CHECK(*v->get_bytes("blob") == "");
  CHECK(v->get_int64("weight_kg").code() == Code::InvalidArgument);  // the reader says double
  CHECK(v->get_int64("no_such_field").code() == Code::NotFound);
  CHECK(*v->get_int64(99) == 1);  // by id, unknown to the reader: raw read
}

// The field search starts after the last field found (RecordView::hint_):
// any read order must find every field, absent ids stay absent.
TEST_CASE("fields read in any order are found; the search wraps around") {
  std::mt19937_64 rng(test_seed("record_read_order"));
  char buf[256];
  const std::string rec = build_full(buf, sizeof(buf));
  auto v = RecordView::parse(rec);
  REQUIRE(v.ok());
  std::vector<std::uint32_t> ids{1, 2, 3, 4, 5, 6, 7, 8, 9, 42};
  std::vector<std::string> expected;
  for (std::uint32_t id : ids) {
    RecordView fresh = *RecordView::parse(rec);
    expected.push_back(fresh.has(id) ? std::string(to_string(*fresh.type_of(id))) : "absent");
  }
  CHECK(expected[8] == "absent");
  CHECK(expected[9] == "absent");
  for (int round = 0; round < 2000; ++round) {
    std::shuffle(ids.begin(), ids.end(), rng);
    for (std::uint32_t id : ids) {
      const std::size_t k = id == 42 ? 9 : id - 1;
      const std::string got = v->has(id) ? std::string(to_string(*v->type_of(id))) : "absent";
      REQUIRE(got == expected[k]);
    }
    RecordView copy = *v;  // a copy keeps a valid start
    CHECK(*copy.get_string(1) == "S-1");
    CHECK(*copy.get_double(2) == 12.5);
  }
}

// A FieldKey resolves its name once per reader schema; every read through it
// must be the read by name: values, defaults, widening, errors. One key met
// by views of two reader schemas (the shipment schema, and one where the name
// has another id and type) resolves again, also from several threads at once.
TEST_CASE("reads through a FieldKey are the reads by name, across reader schemas and threads") {
  const SchemaVersion s = shipment();
  auto other = SchemaVersion::from_json(R"({"fields": [
    {"id": 1, "name": "pieces", "type": "string", "default": "n/a"},
    {"id": 2, "name": "weight_kg", "type": "int64", "default": 7},
    {"id": 9, "name": "shipment_id", "type": "string"}]})");
  REQUIRE_MESSAGE(other.ok(), other.status().to_string());
  char buf[256];
  RecordBuilder b(buf, sizeof(buf));
  b.add_string(1, "S-9").add_int64(2, 40).add_timestamp(5, 7).add_int64(99, 1);
  const std::string rec(*b.finish());
  const FieldKey id("shipment_id"), weight("weight_kg"), pieces("pieces"), express("express"), tags("tags"),
      dest("dest"), blob("blob"), created("created"), nope("no_such_field");
  auto check_shipment = [&](const RecordView& v) {
    CHECK(*v.get_string(id) == *v.get_string("shipment_id"));
    CHECK(*v.get_double(weight) == 40.0);  // int64 widened to double
    CHECK(*v.get_int64(pieces) == 1);      // default
    CHECK(*v.get_bool(express) == false);
    CHECK(v.get_list(tags)->size() == 0);
    CHECK(*v.get_record(dest)->get_string("city") == "?");
    CHECK(*v.get_bytes(blob) == "");
    CHECK(*v.get_timestamp(created) == 7);
    CHECK(v.get_int64(weight).code() == Code::InvalidArgument);  // the reader says double
    CHECK(v.get_int64(nope).code() == Code::NotFound);
  };
  auto check_other = [&](const RecordView& v) {
    CHECK(*v.get_int64(weight) == 40);             // id 2 here is an int64
    CHECK(*v.get_string(pieces) == "S-9");         // id 1 here is "pieces"
    CHECK(v.get_string(id).code() == Code::NotFound);  // id 9: absent, no default
    CHECK(v.get_bool(express).code() == Code::NotFound);  // not in this schema
    CHECK(v.get_double(weight).code() == Code::InvalidArgument);
  };
  auto vs = s.view(rec);
  auto vo = other->view(rec);
  REQUIRE(vs.ok());
  REQUIRE(vo.ok());
  check_shipment(*vs);
  check_other(*vo);
  check_shipment(*vs);  // back: the keys resolve again
  // Without a reader schema a key read is NotFound, like a read by name.
  CHECK(RecordView::parse(rec)->get_string(id).code() == Code::NotFound);
  // Copies keep the name (and the resolution).
  FieldKey copy = weight;
  CHECK(copy.name() == "weight_kg");
  CHECK(*vs->get_double(copy) == 40.0);
  // Shared keys, concurrent views of both schemas (TSan checks the cache).
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i) {
        if ((i + t) % 2 == 0) {
          auto w = vs->get_double(weight);
          auto p = vs->get_int64(pieces);
          if (!w.ok() || *w != 40.0 || !p.ok() || *p != 1) ++wrong;
        } else {
          auto w = vo->get_int64(weight);
          auto p = vo->get_string(pieces);
          if (!w.ok() || *w != 40 || !p.ok() || *p != "S-9") ++wrong;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
}

// The publish check (one pass, with a fast path for records without lists)
// must accept only what the decoder accepts and the schema allows, and the
// read path's field search must agree with the full walk.
TEST_CASE("validate accepts only well-formed records that match the schema; searches agree with the walk") {
  std::mt19937_64 rng(test_seed("record_validate_mutations"));
  const SchemaVersion sv = shipment();
  char buf[256];
  const std::string with_list = build_full(buf, sizeof(buf));
  RecordBuilder b(buf, sizeof(buf));
  b.add_string(1, "S-2").add_double(2, 3.5).add_int64(3, 300).add_bool(4, false).add_timestamp(5, -42);
  b.begin_record(7).add_string(1, "Oslo").add_uint64(2, 150).end_record();
  const std::string no_list(*b.finish());
  CHECK(sv.validate(with_list).ok());
  CHECK(sv.validate(no_list).ok());
  int accepted = 0;
  for (int i = 0; i < 40000; ++i) {
    std::string s = (i % 2 == 0) ? no_list : with_list;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) s[1 + rng() % (s.size() - 1)] = static_cast<char>(rng() % 4 == 0 ? rng() : rng() % 10);
    if (rng() % 8 == 0) s.resize(1 + rng() % (s.size() - 1));
    const Status st = sv.validate(s);
    auto v = RecordView::parse(s);
    if (!st.ok()) {
      CHECK(st.code() == Code::SchemaViolation);
      continue;
    }
    ++accepted;
    REQUIRE_MESSAGE(v.ok(), "validate accepted a record the decoder refuses: " << v.status().to_string());
    std::uint64_t seen = 0;
    v->for_each([&](std::uint32_t id, FieldType t, std::string_view value) {
      const FieldDef* def = sv.field(id);
      REQUIRE(def != nullptr);  // only known ids
      CHECK(def->type == t);    // of the declared type
      CHECK((seen & (1ULL << id)) == 0);  // no duplicates
      seen |= 1ULL << id;
      CHECK(*v->type_of(id) == t);  // the search finds the field the walk sees
      CHECK(v->has(id));
      (void)value;
      return true;
    });
    CHECK((seen & (1ULL << 1)) != 0);  // the required fields are present
    CHECK((seen & (1ULL << 5)) != 0);
    auto r = sv.view(s);
    REQUIRE(r.ok());
    CHECK(r->get_string("shipment_id").ok());
    CHECK(r->get_timestamp("created").ok());
    CHECK(r->get_record("dest")->get_string("city").ok());
  }
  MESSAGE("mutated records still accepted: " << accepted);
}
