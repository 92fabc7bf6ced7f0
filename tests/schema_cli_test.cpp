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

using namespace lanebus;
using TempDir = lanebus::test::ScratchDir;

namespace {

bool contains(const std::string& hay, std::string_view needle) { return hay.find(needle) != std::string::npos; }

int run(const std::string& cmd, std::string* out) {
  out->clear();
  std::FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  int st = ::pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

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
  CHECK(run(tool + " schema list " + store, &out) == 0);
  CHECK(contains(out, "events"));
  CHECK(contains(out, "backward"));
  CHECK(run(tool + " schema show " + store + " events", &out) == 0);
  CHECK(contains(out, "\"zone\""));
  CHECK(contains(out, "contract dash reads id,zone"));
  CHECK(run(tool + " schema check " + store + " events " + v2, &out) == 0);
  CHECK(contains(out, "compatible"));
  CHECK(run(tool + " schema check " + store + " events " + bad, &out) == 1);
  CHECK(contains(out, "Incompatible"));
  CHECK(contains(out, "\"required_new\" (id 3) is added without a default"));
  CHECK(run(tool + " schema check " + store + " events " + garbage, &out) == 1);
  CHECK(contains(out, "JSON"));
  CHECK(run(tool + " schema register " + store + " events " + v2, &out) == 2);  // --operator missing
  CHECK(run(tool + " schema register " + store + " events " + v2 + " --operator ci --why zone_v2", &out) == 0);
  CHECK(contains(out, "version 2"));
  CHECK(run(tool + " schema diff " + store + " events 1 2", &out) == 0);
  CHECK(contains(out, "+ zone_v2 (id 3, int64, default)"));
  CHECK(run(tool + " schema deprecate " + store + " events zone --days 30 --replacement zone_v2 --operator ana",
            &out) == 0);
  CHECK(run(tool + " schema usage " + store + " events zone --days 7", &out) == 0);
  CHECK(contains(out, "dash"));
  CHECK(contains(out, "declared"));
  CHECK(run(tool + " schema remove " + store + " events zone --operator ana --why cleanup", &out) == 1);
  CHECK(contains(out, "window is open"));
  CHECK(contains(out, "group \"dash\""));
  CHECK(run(tool + " schema audit " + store, &out) == 0);
  CHECK(contains(out, "deprecate"));
  CHECK(contains(out, "by ana"));
  CHECK(run(tool + " schema show " + store + " nope", &out) == 1);
  CHECK(run(tool + " schema frobnicate " + store, &out) == 2);
}
