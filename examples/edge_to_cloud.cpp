// lanebus — MIT License.
// edge_to_cloud: an edge device records sensor events durably while it is
// offline (no NATS server yet), the server comes up, the backlog drains to
// JetStream, and a "cloud" process reads it back in order.
//
//   edge_to_cloud                 run the whole story (starts nats-server itself)
//   edge_to_cloud cloud URL DIR   the cloud side alone (used by the story)
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "lanebus/bridge.hpp"
#include "lanebus/lanebus.hpp"
#include "nats_server.hpp"
#include "process.hpp"
#include "temp_dir.hpp"

using namespace lanebus;

namespace {

constexpr int kSensors = 4;
constexpr int kReadings = 250;  // per sensor

template <class Pred>
bool wait_for(Pred p, int seconds) {
  for (int i = 0; i < seconds * 100; ++i) {
    if (p()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return p();
}

/// The cloud: mirrors stream SENSORS into its own store and checks that each
/// sensor's readings arrive complete and in order. Prints "cloud: OK ...".
int cloud(const std::string& url, const std::string& dir) {
  BusOptions o;
  o.name = "cloud";
  o.store.directory = dir;
  o.workers = 2;
  auto bus = Bus::open(o);
  if (!bus.ok()) return 1;
  TopicOptions t;
  t.durable = true;
  t.lanes = 4;
  auto readings = (*bus)->create_topic("readings", t);
  if (!readings.ok()) return 1;
  std::mutex mu;
  std::map<std::string, int> next;
  std::atomic<int> received{0}, disorder{0};
  auto sub = (*bus)->subscribe(*readings, "dashboard", [&](const MessageView& m) {
    const int seq = std::atoi(std::string(m.payload()).c_str());
    std::lock_guard<std::mutex> l(mu);
    int& n = next[std::string(m.key())];
    if (seq != n) disorder.fetch_add(1);
    n = seq + 1;
    received.fetch_add(1);
    return Outcome::ack();
  });
  if (!sub.ok()) return 1;
  BridgeOptions bo;
  bo.urls = {url};
  auto bridge = Bridge::open(**bus, bo);
  if (!bridge.ok() || !(*bridge)->mirror_in("SENSORS", "cloud", *readings).ok()) return 1;
  const bool all = wait_for([&] { return received.load() >= kSensors * kReadings; }, 60);
  std::printf("cloud: %s %d readings from %zu sensors, %d out of order\n", all && disorder == 0 ? "OK" : "FAILED",
              received.load(), next.size(), disorder.load());
  std::fflush(stdout);
  return all && disorder == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "cloud") return cloud(argv[2], argv[3]);
  if (lanebus::test::nats_server_binary().empty()) {
    std::printf("edge_to_cloud: nats-server is not installed (apt-get install nats-server); nothing to show\n");
    return lanebus::test::nats_server_required() ? 1 : 77;
  }
  lanebus::test::TempDir tmp;
  lanebus::test::NatsServer server(tmp.file("nats"));  // not started yet: the edge is offline

  // 1. The edge records readings durably; its bridge is open but cannot connect.
  BusOptions o;
  o.name = "edge";
  o.store.directory = tmp.file("edge");
  o.workers = 4;
  auto edge = Bus::open(o);
  if (!edge.ok()) return 1;
  TopicOptions t;
  t.durable = true;
  t.lanes = 4;
  auto readings = (*edge)->create_topic("readings", t);
  if (!readings.ok()) return 1;
  BridgeOptions bo;
  bo.urls = {server.url()};
  auto bridge = Bridge::open(**edge, bo);
  if (!bridge.ok()) {
    std::printf("edge: %s\n", bridge.status().to_string().c_str());
    return 1;
  }
  if (Status s = (*bridge)->mirror_out(*readings, "sensors.{key}", "SENSORS"); !s.ok()) return 1;
  for (int i = 0; i < kReadings; ++i)
    for (int s = 0; s < kSensors; ++s) {
      const std::string key = "sensor-" + std::to_string(s), value = std::to_string(i);
      OutgoingMessage m;
      m.key = key;
      m.payload = value;
      if (!readings->publish(m).ok()) return 1;
    }
  BridgeStats st = (*bridge)->stats();
  std::printf("edge: offline, %d readings stored locally; bridge %s, lag %llu\n", kSensors * kReadings,
              to_string(st.state), static_cast<unsigned long long>(st.total.lag));

  // 2. The network comes back: the server starts, the backlog drains.
  if (!server.start()) return 1;
  const bool drained = wait_for([&] { return (*bridge)->stats().total.acked >= kSensors * kReadings; }, 60);
  st = (*bridge)->stats();
  std::printf("edge: server up at %s; bridge %s, %llu published to JetStream, lag %llu\n", server.url().c_str(),
              to_string(st.state), static_cast<unsigned long long>(st.total.acked),
              static_cast<unsigned long long>(st.total.lag));
  if (!drained) return 1;

  // 3. The cloud, another process, reads the stream back in order per sensor.
  lanebus::test::Child cloud_proc({argv[0], "cloud", server.url(), tmp.file("cloud")});
  const std::string line = cloud_proc.read_line(std::chrono::seconds(90));
  std::printf("%s\n", line.c_str());
  return cloud_proc.wait() == 0 && line.rfind("cloud: OK", 0) == 0 ? 0 : 1;
}
