// lanebus — MIT License.
// The compatibility rules (doc/schemas.md) against a table of schema pairs and
// transitive chains, each expected to be accepted or refused.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "lanebus/schema.hpp"

using namespace lanebus;

namespace {

SchemaVersion S(const char* fields, int version = 0) {
  std::string j = std::string("{\"version\": ") + std::to_string(version) + ", \"fields\": [" + fields + "]}";
  auto r = SchemaVersion::from_json(j);
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  return *r;
}

#define ID R"({"id": 1, "name": "id", "type": "string"})"
#define N_INT R"({"id": 2, "name": "n", "type": "int64"})"
#define N_INT_D R"({"id": 2, "name": "n", "type": "int64", "default": 0})"
#define N_DBL R"({"id": 2, "name": "n", "type": "double"})"
#define N_DBL_D R"({"id": 2, "name": "n", "type": "double", "default": 0})"
#define N_STR R"({"id": 2, "name": "n", "type": "string"})"
#define N_STR_D R"({"id": 2, "name": "n", "type": "string", "default": ""})"
#define NOTE R"({"id": 3, "name": "note", "type": "string"})"
#define NOTE_D R"({"id": 3, "name": "note", "type": "string", "default": ""})"
#define N_RENAMED R"({"id": 2, "name": "count", "type": "int64"})"
#define N_MOVED R"({"id": 4, "name": "n", "type": "int64", "default": 0})"
#define SUB_A R"({"id": 5, "name": "sub", "type": "record", "default": {}, "fields": [{"id": 1, "name": "x", "type": "int64"}]})"
#define SUB_B R"({"id": 5, "name": "sub", "type": "record", "default": {}, "fields": [{"id": 1, "name": "x", "type": "int64"}, {"id": 2, "name": "y", "type": "bool"}]})"
#define SUB_C R"({"id": 5, "name": "sub", "type": "record", "default": {}, "fields": [{"id": 1, "name": "x", "type": "int64"}, {"id": 2, "name": "y", "type": "bool", "default": false}]})"
#define LIST_I R"({"id": 6, "name": "l", "type": "list", "items": "int64", "default": []})"
#define LIST_D R"({"id": 6, "name": "l", "type": "list", "items": "double", "default": []})"
#define LIST_S R"({"id": 6, "name": "l", "type": "list", "items": "string", "default": []})"

struct Row {
  const char* what;
  std::string old_fields, new_fields;
  // expected acceptance per mode: backward, forward, full, none
  bool backward, forward, full, none;
};

}  // namespace

TEST_CASE("compatibility table: every mode against each schema pair") {
  const std::vector<Row> rows = {
      {"identical", ID "," N_INT, ID "," N_INT, true, true, true, true},
      {"add a field with a default", ID "," N_INT, ID "," N_INT "," NOTE_D, true, true, true, true},
      {"add a field without a default", ID "," N_INT, ID "," N_INT "," NOTE, false, true, false, true},
      {"remove a field without a default", ID "," N_INT, ID, true, false, false, true},
      {"remove a field with a default", ID "," N_INT_D, ID, true, true, true, true},
      {"widen int64 to double", ID "," N_INT, ID "," N_DBL, true, false, false, true},
      {"narrow double to int64", ID "," N_DBL, ID "," N_INT, false, true, false, true},
      {"retype int64 to string", ID "," N_INT, ID "," N_STR, false, false, false, true},
      {"string to bytes", ID, R"({"id": 1, "name": "id", "type": "bytes"})", true, true, true, true},
      {"add a default to an existing field", ID "," N_INT, ID "," N_INT_D, true, true, true, true},
      {"nested: add a field without a default", ID "," SUB_A, ID "," SUB_B, false, true, false, true},
      {"nested: add a field with a default", ID "," SUB_A, ID "," SUB_C, true, true, true, true},
      {"list elements widen int64 to double", ID "," LIST_I, ID "," LIST_D, true, false, false, true},
      {"list elements retype to string", ID "," LIST_I, ID "," LIST_S, false, false, false, true},
      // Ids and names are fixed in every mode, none included.
      {"rename a field (same id)", ID "," N_INT, ID "," N_RENAMED, false, false, false, false},
      {"move a name to another id", ID "," N_INT_D, ID "," N_MOVED, false, false, false, false},
  };
  const Compatibility modes[] = {Compatibility::Backward, Compatibility::Forward, Compatibility::Full,
                                 Compatibility::None};
  for (const Row& r : rows) {
    const bool expect[] = {r.backward, r.forward, r.full, r.none};
    for (int m = 0; m < 4; ++m) {
      // One-step history: the transitive mode gives the same answer.
      for (Compatibility mode : {modes[m], m == 3 ? modes[m] : static_cast<Compatibility>(static_cast<int>(modes[m]) + 1)}) {
        Status s = check_compatibility(mode, {S(r.old_fields.c_str(), 1)}, S(r.new_fields.c_str()));
        CAPTURE(r.what);
        CAPTURE(to_string(mode));
        CAPTURE(s.to_string());
        CHECK(s.ok() == expect[m]);
        if (!s.ok()) {
          CHECK(s.code() == Code::Incompatible);
          CHECK(std::string(s.message()).find("\"") != std::string::npos);  // names the field
          CHECK(std::string(s.message()).find("rule") != std::string::npos);
        }
      }
    }
  }
}

TEST_CASE("refusals name the field and the rule") {
  Status s = check_compatibility(Compatibility::Backward, {S(ID, 1)}, S(ID "," NOTE));
  CHECK(s.code() == Code::Incompatible);
  CHECK(std::string(s.message()).find("\"note\" (id 3) is added without a default") != std::string::npos);
  CHECK(std::string(s.message()).find("backward") != std::string::npos);
  s = check_compatibility(Compatibility::Forward, {S(ID "," N_INT, 4)}, S(ID));
  CHECK(std::string(s.message()).find("\"n\" (id 2) is removed but has no default") != std::string::npos);
  CHECK(std::string(s.message()).find("version 4") != std::string::npos);
  s = check_compatibility(Compatibility::Backward, {S(ID "," N_INT, 1)}, S(ID "," N_STR));
  CHECK(std::string(s.message()).find("changes type from int64 to string") != std::string::npos);
  s = check_compatibility(Compatibility::None, {S(ID "," N_INT, 1)}, S(ID "," N_RENAMED));
  CHECK(std::string(s.message()).find("ids and names are fixed") != std::string::npos);
}

TEST_CASE("transitive chains: accepted against the latest, refused against an earlier version") {
  struct Chain {
    Compatibility plain, transitive;
    std::vector<std::string> history;
    std::string candidate;
  };
  const std::vector<Chain> chains = {
      // v1 has n:int64; v2 drops it; v3 brings n back as a string with a default.
      {Compatibility::Backward, Compatibility::BackwardTransitive, {ID "," N_INT, ID}, ID "," N_STR_D},
      // v1 has n:int64 with a default; v2 drops it; v3 brings n back as a string.
      {Compatibility::Forward, Compatibility::ForwardTransitive, {ID "," N_INT_D, ID}, ID "," N_STR},
      {Compatibility::Full, Compatibility::FullTransitive, {ID "," N_INT_D, ID}, ID "," N_STR_D},
  };
  for (const Chain& c : chains) {
    std::vector<SchemaVersion> h;
    for (std::size_t i = 0; i < c.history.size(); ++i) h.push_back(S(c.history[i].c_str(), static_cast<int>(i + 1)));
    CAPTURE(to_string(c.plain));
    CHECK(check_compatibility(c.plain, h, S(c.candidate.c_str())).ok());
    Status t = check_compatibility(c.transitive, h, S(c.candidate.c_str()));
    CHECK(t.code() == Code::Incompatible);
    CHECK(std::string(t.message()).find("version 1") != std::string::npos);
    CHECK(check_compatibility(Compatibility::None, h, S(c.candidate.c_str())).ok());
  }
  // A compatible chain passes every transitive mode.
  std::vector<SchemaVersion> h = {S(ID, 1), S(ID "," N_INT_D, 2), S(ID "," N_INT_D "," NOTE_D, 3)};
  for (Compatibility m : {Compatibility::BackwardTransitive, Compatibility::ForwardTransitive,
                          Compatibility::FullTransitive}) {
    CHECK(check_compatibility(m, h, S(ID "," N_INT_D "," NOTE_D "," SUB_C)).ok());
  }
}

TEST_CASE("compatibility mode names round-trip") {
  for (int i = 0; i <= static_cast<int>(Compatibility::None); ++i) {
    const auto m = static_cast<Compatibility>(i);
    CHECK(*compatibility_from_string(to_string(m)) == m);
  }
  CHECK(compatibility_from_string("sideways").code() == Code::InvalidArgument);
}
