// lanebus — MIT License.
// Schema evolution without breaking consumers (doc/schemas.md), on the real
// clock: topic `shipment-events` with 8 consumer groups. A and B read
// `legacy_shipping_zone`, C says it does not. The producer wants the field
// gone. Instead of a meeting:
//   1. the registry refuses an incompatible change and a removal that breaks
//      a declared contract;
//   2. the field is deprecated with a replacement shipped additively;
//   3. the usage audit shows who really reads it (A and B, never C);
//   4. removal is refused, naming the groups that still read it, until the
//      window has passed and the audit is quiet. (The 60-day story on an
//      injected clock is tests/schema_story_test.cpp.)
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;

namespace {

const char* kV1 = R"({"fields": [
  {"id": 1, "name": "shipment_id", "type": "string"},
  {"id": 2, "name": "legacy_shipping_zone", "type": "string", "default": ""}]})";
const char* kV2 = R"({"fields": [
  {"id": 1, "name": "shipment_id", "type": "string"},
  {"id": 2, "name": "legacy_shipping_zone", "type": "string", "default": ""},
  {"id": 3, "name": "shipping_zone_v2", "type": "record", "default": {}, "fields": [
    {"id": 1, "name": "region", "type": "string", "default": ""},
    {"id": 2, "name": "zone", "type": "int64", "default": 0}]}]})";

void check(const Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
  std::exit(1);
}

}  // namespace

int main() {
  const auto dir = std::filesystem::temp_directory_path() / ("lanebus-schema-example-" + std::to_string(::getpid()));
  BusOptions bo;
  bo.name = "shipments";
  bo.workers = 2;
  bo.store.directory = dir.string();
  bo.store.durability = Durability::Async;
  auto bus = Bus::open(bo).value();
  Schemas schemas = bus->schemas();
  const ChangeInfo producer{"shipping-team", "initial schema"};
  std::printf("1. register v1: version %u\n",
              schemas.register_schema("shipment-events", SchemaVersion::from_json(kV1).value(), producer).value());
  Topic topic = bus->create_topic("shipment-events", TopicOptions{.lanes = 2}).value();

  std::atomic<int> handled{0};
  std::vector<Subscription> subs;
  const char* names[] = {"team-a", "team-b", "team-c", "team-d", "team-e", "team-f", "team-g", "team-h"};
  for (const char* g : names) {
    const std::string name = g;
    const bool legacy = name == "team-a" || name == "team-b";
    GroupOptions go;
    go.reads = legacy ? std::vector<std::string>{"shipment_id", "legacy_shipping_zone"}
                      : std::vector<std::string>{"shipment_id"};  // C: "we don't use it"
    subs.push_back(bus->subscribe(topic, g, [&, legacy](const MessageView& m) {
                          auto v = schemas.view("shipment-events", m);
                          if (v.ok()) {
                            (void)v->get_string("shipment_id");
                            if (legacy) (void)v->get_string("legacy_shipping_zone");
                          }
                          ++handled;
                          return Outcome::ack();
                        }, go).value());
  }

  // The producer's first idea: just drop the field. The registry says no.
  auto drop = schemas.register_schema(
      "shipment-events",
      SchemaVersion::from_json(R"({"fields": [{"id": 1, "name": "shipment_id", "type": "string"}]})").value());
  std::printf("2. drop the field outright: %s\n", drop.status().to_string().c_str());
  if (drop.code() != Code::Incompatible) return 1;

  // Additive replacement, then the deprecation window.
  std::printf("3. register v2 with shipping_zone_v2: version %u\n",
              schemas.register_schema("shipment-events", SchemaVersion::from_json(kV2).value(),
                                      {"shipping-team", "richer zone"})
                  .value());
  check(schemas.deprecate("shipment-events", "legacy_shipping_zone", 24h * 60, "shipping_zone_v2",
                          {"shipping-team", "replaced by shipping_zone_v2"}),
        "deprecate");
  std::printf("   legacy_shipping_zone deprecated for 60 days\n");

  // Traffic.
  for (int i = 0; i < 10; ++i) {
    char buf[128];
    RecordBuilder b(buf, sizeof(buf));
    b.add_string(1, "S-" + std::to_string(i)).add_string(2, "Z7");
    b.begin_record(3).add_string(1, "EU").add_int64(2, 7).end_record();
    check(topic.publish({.key = std::to_string(i), .payload = *b.finish()}), "publish");
  }
  while (handled.load() < 10 * 8) std::this_thread::sleep_for(1ms);

  // The audit, not the self-reports.
  auto usage = schemas.usage("shipment-events", "legacy_shipping_zone", 0).value();
  std::printf("4. who reads legacy_shipping_zone:\n");
  bool c_reads = false;
  for (const FieldUsage& u : usage) {
    std::printf("   group %s: %llu reads%s\n", u.group.c_str(), static_cast<unsigned long long>(u.reads),
                u.in_contract ? " (declared in its contract)" : "");
    c_reads = c_reads || u.group == "team-c";
  }
  if (usage.size() != 2 || c_reads) return 1;

  auto removed = schemas.remove("shipment-events", "legacy_shipping_zone", {"shipping-team", "too early"});
  std::printf("5. remove now: %s\n", removed.status().to_string().c_str());
  if (removed.code() != Code::Incompatible) return 1;

  std::printf("6. audit log:\n");
  const std::vector<SchemaAuditEntry> log = schemas.audit_log().value();
  for (const SchemaAuditEntry& e : log)
    std::printf("   %-10s %s by %s (%s)\n", e.action.c_str(), e.detail.c_str(), e.who.c_str(), e.why.c_str());
  subs.clear();
  check(bus->shutdown(ShutdownMode::Drain), "shutdown");
  bus.reset();
  std::filesystem::remove_all(dir);
  std::printf("done\n");
  return 0;
}
