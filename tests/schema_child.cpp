// lanebus — MIT License.
// Second process of schema_multiprocess_test: opens the same store, reports
// the registry it sees, subscribes with a contract, reads `zone` of every
// message through Schemas::view (counted by the usage audit) and, on the
// message "go", publishes a record of a version the parent registered after
// this process bound the topic. Exits after 4 messages.
//   schema_child DIR
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  BusOptions bo;
  bo.name = "schema-child";
  bo.workers = 1;
  bo.store.directory = argv[1];
  bo.store.durability = Durability::Async;
  bo.durable_poll = 10ms;
  auto bus = Bus::open(bo);
  if (!bus.ok()) {
    std::printf("error %s\n", bus.status().to_string().c_str());
    return 1;
  }
  Schemas schemas = (*bus)->schemas();
  auto latest = schemas.latest("mp-events");
  std::printf("latest %u\n", latest.ok() ? latest->version() : 0);
  std::fflush(stdout);
  auto topic = (*bus)->create_topic("mp-events", TopicOptions{.lanes = 1, .durable = true});
  if (!topic.ok()) return 1;
  Topic t = *topic;
  std::atomic<int> handled{0};
  GroupOptions go;
  go.reads = {"id", "zone"};
  go.start = StartPosition::earliest();
  auto sub = (*bus)->subscribe(t, "child-g", [&](const MessageView& m) {
    auto v = schemas.view("mp-events", m);
    if (!v.ok()) {
      std::printf("view %s\n", v.status().to_string().c_str());
    } else {
      auto id = v->get_string("id");
      (void)v->get_string("zone");
      if (id.ok() && *id == "go") {
        char buf[128];
        RecordBuilder b(buf, sizeof(buf));
        b.add_string(1, "from-child").add_string(2, "Z1").add_string(3, "a note (v2 only)");
        Status s = t.publish({.payload = *b.finish()});
        std::printf("publish %s\n", s.to_string().c_str());
      }
    }
    std::fflush(stdout);
    ++handled;
    return Outcome::ack();
  }, go);
  if (!sub.ok()) return 1;
  std::printf("ready\n");
  std::fflush(stdout);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (handled.load() < 4 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  (void)sub->close();
  Status s = (*bus)->shutdown(ShutdownMode::Drain);  // flushes the usage counters
  std::printf("done %d %s\n", handled.load(), s.to_string().c_str());
  return handled.load() == 4 && s.ok() ? 0 : 1;
}
