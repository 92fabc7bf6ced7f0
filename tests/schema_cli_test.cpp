// lanebus — MIT License.
// `lanebus schema ...` end to end: the built tool (LANEBUS_TOOL) against a
// store whose registry a Bus filled (doc/schemas.md).
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "lanebus/lanebus.hpp"
#include "process.hpp"
#include "scratch_dir.hpp"
#include "shell.hpp"

using namespace lanebus;
using TempDir = lanebus::test::ScratchDir;

namespace {

using lanebus::test::run_shell;
using lanebus::test::contains;



void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

const char* kV1 = R"({"fields": [{"id": 1, "name": "id", "type": "string"},
  {"id": 2, "name": "zone", "type": "string", "default": ""}]})";
const char* kV2 = R"({"fields": [{"id": 1, "name": "id", "type": "string"},
  {"id": 2, "name": "zone", "type": "string", "default": ""},
  {"id": 3, "name": "zone_v2", "type": "int64", "default": 0}]})";
const char* kBad = R"({"fields": [{"id": 1, "name": "id", "type": "string"},
  {"id": 2, "name": "zone", "type": "string", "default": ""},
  {"id": 3, "name": "required_new", "type": "bool"}]})";

}  // namespace

TEST_CASE("lanebus schema: list, show, check, register, diff, deprecate, usage, remove, audit") {
  const std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");
  REQUIRE_FALSE(tool.empty());
  TempDir dir;
  const std::string store = (dir.path / "store").string();
  {
    BusOptions bo;
    bo.workers = 1;
    bo.store.directory = store;
    auto bus = Bus::open(bo).value();
    REQUIRE(bus->schemas().register_schema("events", SchemaVersion::from_json(kV1).value(), {"ci", "v1"}).ok());
    Topic t = bus->create_topic("events").value();
    GroupOptions go;
    go.reads = {"id", "zone"};
    std::atomic<int> n{0};
    Schemas s = bus->schemas();
    auto sub = bus->subscribe(t, "dash", [&](const MessageView& m) {
                     (void)s.view("events", m)->get_string("zone");
                     ++n;
                     return Outcome::ack();
                   }, go).value();
    char buf[64];
    RecordBuilder b(buf, sizeof(buf));
    b.add_string(1, "e-1").add_string(2, "Z");
    REQUIRE(t.publish({.payload = *b.finish()}).ok());
    while (n.load() < 1) std::this_thread::yield();
    CHECK(bus->shutdown(ShutdownMode::Drain).ok());  // flushes the usage counts
  }
  const std::string v2 = (dir.path / "v2.json").string(), bad = (dir.path / "bad.json").string(),
                    garbage = (dir.path / "garbage.json").string();
  write_file(v2, kV2);
  write_file(bad, kBad);
  write_file(garbage, "{\"fields\": [");
  std::string out;
  CHECK(run_shell(tool + " schema list " + store, &out) == 0);
  CHECK(contains(out, "events"));
  CHECK(contains(out, "backward"));
  CHECK(run_shell(tool + " schema show " + store + " events", &out) == 0);
  CHECK(contains(out, "\"zone\""));
  CHECK(contains(out, "contract dash reads id,zone"));
  CHECK(run_shell(tool + " schema check " + store + " events " + v2, &out) == 0);
  CHECK(contains(out, "compatible"));
  CHECK(run_shell(tool + " schema check " + store + " events " + bad, &out) == 1);
  CHECK(contains(out, "Incompatible"));
  CHECK(contains(out, "\"required_new\" (id 3) is added without a default"));
  CHECK(run_shell(tool + " schema check " + store + " events " + garbage, &out) == 1);
  CHECK(contains(out, "JSON"));
  CHECK(run_shell(tool + " schema register " + store + " events " + v2, &out) == 2);  // --operator missing
  CHECK(run_shell(tool + " schema register " + store + " events " + v2 + " --operator ci --why zone_v2", &out) == 0);
  CHECK(contains(out, "version 2"));
  CHECK(run_shell(tool + " schema diff " + store + " events 1 2", &out) == 0);
  CHECK(contains(out, "+ zone_v2 (id 3, int64, default)"));
  CHECK(run_shell(tool + " schema deprecate " + store + " events zone --days 30 --replacement zone_v2 --operator ana",
            &out) == 0);
  CHECK(run_shell(tool + " schema usage " + store + " events zone --days 7", &out) == 0);
  CHECK(contains(out, "dash"));
  CHECK(contains(out, "declared"));
  CHECK(run_shell(tool + " schema remove " + store + " events zone --operator ana --why cleanup", &out) == 1);
  CHECK(contains(out, "window is open"));
  CHECK(contains(out, "group \"dash\""));
  CHECK(run_shell(tool + " schema audit " + store, &out) == 0);
  CHECK(contains(out, "deprecate"));
  CHECK(contains(out, "by ana"));
  CHECK(run_shell(tool + " schema show " + store + " nope", &out) == 1);
  CHECK(run_shell(tool + " schema frobnicate " + store, &out) == 2);
}

TEST_CASE("deprecated-field reads in lanebus stats and the exports; contracts that declare it are flagged") {
  const std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");
  REQUIRE_FALSE(tool.empty());
  TempDir dir;
  const std::string store = (dir.path / "store").string();
  {
    BusOptions bo;
    bo.workers = 1;
    bo.store.directory = store;
    auto bus = Bus::open(bo).value();
    Schemas s = bus->schemas();
    REQUIRE(s.register_schema("ship", SchemaVersion::from_json(kV2).value()).ok());
    REQUIRE(s.deprecate("ship", "zone", std::chrono::hours(24 * 30), "zone_v2", {"ops", "zone_v2 replaces it"}).ok());
    Topic t = bus->create_topic("ship", {.lanes = 2, .durable = true}).value();
    std::atomic<int> n{0};
    GroupOptions declared;
    declared.reads = {"id", "zone"};  // the contract still declares the deprecated field
    auto legacy = bus->subscribe(t, "legacy", [&](const MessageView& m) {
                         (void)s.view("ship", m)->get_string("zone");
                         ++n;
                         return Outcome::ack();
                       }, declared).value();
    GroupOptions moved;
    moved.reads = {"id", "zone_v2"};
    auto modern = bus->subscribe(t, "modern", [&](const MessageView& m) {
                         (void)s.view("ship", m)->get_int64("zone_v2");
                         ++n;
                         return Outcome::ack();
                       }, moved).value();
    for (int i = 0; i < 3; ++i) {
      char buf[64];
      RecordBuilder b(buf, sizeof(buf));
      b.add_string(1, "S-" + std::to_string(i)).add_string(2, "Z7").add_int64(3, 7);
      REQUIRE(t.publish({.payload = *b.finish()}).ok());
    }
    for (int i = 0; i < 2000 && n.load() < 6; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    REQUIRE(n.load() == 6);
    REQUIRE(s.flush_usage().ok());
    BusStats st = bus->stats();
    REQUIRE(st.deprecated_fields.size() == 1);
    const DeprecatedField& f = st.deprecated_fields[0];
    CHECK(f.topic == "ship");
    CHECK(f.field == "zone");
    CHECK(f.replacement == "zone_v2");
    CHECK(f.window_ends_ns - f.since_ns == std::int64_t{30} * 86'400'000'000'000);
    REQUIRE(f.readers.size() == 1);  // "modern" never read it and does not declare it
    CHECK(f.readers[0].group == "legacy");
    CHECK(f.readers[0].reads == 3);
    CHECK(f.readers[0].last_read_ns > 0);
    CHECK(f.readers[0].contract_declares);
    auto mon = Monitor::create(*bus).value();
    REQUIRE(mon->sample().ok());
    const std::string prom = mon->prometheus();
    CHECK(contains(prom, "lanebus_deprecated_field_reads_total{topic=\"ship\",field=\"zone\",group=\"legacy\"} 3\n"));
    CHECK(contains(prom, "lanebus_deprecated_field_in_contract{topic=\"ship\",field=\"zone\",group=\"legacy\"} 1\n"));
    CHECK(contains(prom, "lanebus_deprecated_field_window_end_seconds{topic=\"ship\",field=\"zone\",replacement=\"zone_v2\"}"));
    CHECK_FALSE(contains(prom, "field=\"zone\",group=\"modern\""));
    const std::string json = mon->json();
    CHECK(contains(json, "\"deprecated_fields\""));
    CHECK(contains(json, "\"group\":\"legacy\",\"reads\":3"));
    CHECK(contains(json, "\"contract_declares\":true"));
    CHECK(bus->shutdown(ShutdownMode::Drain).ok());
  }
  std::string out;
  REQUIRE(run_shell(tool + " stats " + store + " --json", &out) == 0);
  CHECK(contains(out, "\"deprecated_fields\""));
  CHECK(contains(out, "\"field\":\"zone\""));
  CHECK(contains(out, "\"group\":\"legacy\",\"reads\":3"));
  REQUIRE(run_shell(tool + " stats " + store + " --prom", &out) == 0);
  CHECK(contains(out, "lanebus_deprecated_field_reads_total{topic=\"ship\",field=\"zone\",group=\"legacy\"} 3\n"));
  REQUIRE(run_shell(tool + " stats " + store, &out) == 0);
  CHECK(contains(out, "deprecated field ship.zone"));
  CHECK(contains(out, "replacement zone_v2"));
  CHECK(contains(out, "legacy"));
  CHECK(contains(out, "reads=3"));
  CHECK(contains(out, "CONTRACT DECLARES IT (flagged)"));
}
