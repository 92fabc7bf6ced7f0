// lanebus — MIT License.
// The schema registry across processes (real fork/exec, doc/schemas.md): a
// second process sees registrations and contracts as soon as they commit,
// publishes records of a version registered by another process, and its
// reads are counted by the usage audit in the shared store.
#include <doctest/doctest.h>

#include <string>

#include "lanebus/lanebus.hpp"
#include "process.hpp"
#include "scratch_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::Child;
using lanebus::test::helper_path;
using lanebus::test::wait_until;
using TempDir = lanebus::test::ScratchDir;

namespace {
SchemaVersion schema(const char* fields) {
  return SchemaVersion::from_json(std::string("{\"fields\": [") + fields + "]}").value();
}
#define F_ID R"({"id": 1, "name": "id", "type": "string"})"
#define F_ZONE R"({"id": 2, "name": "zone", "type": "string", "default": ""})"
#define F_NOTE R"({"id": 3, "name": "note", "type": "string", "default": ""})"
}  // namespace

TEST_CASE("a second process sees registrations and contracts at once, and its reads are counted") {
  const std::string child_bin = helper_path("LANEBUS_SCHEMA_CHILD");
  REQUIRE_FALSE(child_bin.empty());
  TempDir dir;
  BusOptions bo;
  bo.name = "schema-parent";
  bo.workers = 1;
  bo.store.directory = (dir.path / "store").string();
  bo.store.durability = Durability::Async;
  bo.durable_poll = 10ms;
  auto bus = Bus::open(bo).value();
  Schemas schemas = bus->schemas();
  REQUIRE(*schemas.register_schema("mp-events", schema(F_ID "," F_ZONE), {"parent", "v1"}) == 1);
  Topic t = bus->create_topic("mp-events", TopicOptions{.lanes = 1, .durable = true}).value();

  Child child({child_bin, bo.store.directory});
  REQUIRE(child.started());
  CHECK(child.read_line() == "latest 1");  // the child sees the parent's registration
  REQUIRE(child.read_line() == "ready");

  // The child's contract is in the shared store: removing `zone` is refused, naming the child's group.
  auto cs = schemas.contracts("mp-events").value();
  REQUIRE(cs.size() == 1);
  CHECK(cs[0].group == "child-g");
  auto refused = schemas.register_schema("mp-events", schema(F_ID));
  CHECK(refused.code() == Code::Incompatible);
  CHECK(std::string(refused.status().message()).find("group \"child-g\"") != std::string::npos);

  // v2 adds `note`; the child bound the topic at v1 and learns v2 when its
  // v2 record is first checked.
  REQUIRE(*schemas.register_schema("mp-events", schema(F_ID "," F_ZONE "," F_NOTE), {"parent", "v2"}) == 2);
  for (const char* id : {"m1", "m2", "go"}) {
    char buf[64];
    RecordBuilder b(buf, sizeof(buf));
    b.add_string(1, id).add_string(2, "Z9");
    REQUIRE(t.publish({.payload = *b.finish()}).ok());
  }
  CHECK(child.read_line() == "publish OK");
  std::string last = child.read_line();
  CHECK(last == "done 4 OK");
  CHECK(child.wait() == 0);

  // The child's reads, in the shared store.
  auto u = schemas.usage("mp-events", "zone", 0).value();
  REQUIRE(u.size() == 1);
  CHECK(u[0].group == "child-g");
  CHECK(u[0].reads == 4);
  CHECK(u[0].in_contract);
  CHECK(!u[0].outside_contract);
  CHECK(u[0].versions == std::vector<std::uint16_t>{2});
  CHECK(bus->shutdown(ShutdownMode::Drain).ok());
}
