// lanebus — MIT License.
// Helper process for bus_multiprocess_test: a producer or a consumer of one
// durable topic, through the public Bus only. Every line goes out with one
// write(2), so a SIGKILL never leaves a torn line.
//
//   bus_mp_child produce DIR TOPIC NAME THREADS STOP_FILE
//       THREADS threads publish (Durability::Sync, Topic::publish) until
//       STOP_FILE exists. Thread t owns keys "key-t" and "key-(t+THREADS)" and
//       alternates between them; a publish returns before the next one of its
//       key starts (the per-key order contract of Topic). Payload
//       "NAME:KEY:SEQ", SEQ counting from 0 per key. Prints "ready", then
//       "ack NAME KEY SEQ" after each publish that returned OK, "fail STATUS"
//       on an error (and exits 4), "done" after a clean shutdown.
//   bus_mp_child consume DIR TOPIC GROUP STOP_FILE
//       Subscribes consumer group GROUP; the handler prints
//       "got LANE OFFSET PAYLOAD KEY" and acks. Prints "ready" once
//       subscribed; when STOP_FILE exists, shuts down (Drain) and prints
//       "closed".
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;

namespace {

void say(const std::string& line) {
  std::string l = line + "\n";
  ssize_t n = ::write(1, l.data(), l.size());
  (void)n;
}

BusOptions options_for(const char* dir) {
  BusOptions o;
  o.name = "mp";
  o.workers = 2;
  o.store.directory = dir;
  o.store.durability = Durability::Sync;
  o.store.map_size_initial = 8ull << 20;
  o.store.map_size_max = 1ull << 30;
  o.durable_poll = 10ms;  // messages come from other processes: look often
  // A SIGKILL from the test is not the message's fault: never call it poison.
  o.dlq.poison_after_crashes = 0;
  return o;
}

std::unique_ptr<Bus> open_or_exit(const char* dir) {
  auto bus = Bus::open(options_for(dir));
  if (!bus.ok()) {
    say("fail open " + bus.status().to_string());
    std::exit(3);
  }
  return std::move(*bus);
}

Topic topic_or_exit(Bus& bus, const char* name) {
  auto t = bus.create_topic(name, {.lanes = 4, .durable = true});
  if (!t.ok()) {
    say("fail topic " + t.status().to_string());
    std::exit(3);
  }
  return *t;
}

void wait_for_file(const char* path) {
  while (!std::filesystem::exists(path)) std::this_thread::sleep_for(5ms);
}

int produce(char** argv) {
  auto bus = open_or_exit(argv[2]);
  const Topic topic = topic_or_exit(*bus, argv[3]);
  const std::string name = argv[4];
  const int threads = std::atoi(argv[5]);
  const char* stop_file = argv[6];
  std::atomic<bool> stop{false}, failed{false};
  say("ready");
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const std::string keys[2] = {"key-" + std::to_string(t), "key-" + std::to_string(t + threads)};
      std::uint64_t seq[2] = {0, 0};
      for (int i = 0; !stop.load(std::memory_order_relaxed); i ^= 1) {
        const std::string payload = name + ":" + keys[i] + ":" + std::to_string(seq[i]);
        Status s = topic.publish({.key = keys[i], .payload = payload});
        if (!s.ok()) {
          say("fail " + s.to_string());
          failed = true;
          stop = true;
          return;
        }
        say("ack " + name + " " + keys[i] + " " + std::to_string(seq[i]));
        ++seq[i];
      }
    });
  }
  while (!stop.load() && !std::filesystem::exists(stop_file)) std::this_thread::sleep_for(5ms);
  stop = true;
  for (auto& th : pool) th.join();
  if (failed) return 4;
  Status s = bus->shutdown(ShutdownMode::Drain, 10s);
  if (!s.ok()) {
    say("fail shutdown " + s.to_string());
    return 5;
  }
  say("done");
  return 0;
}

int consume(char** argv) {
  auto bus = open_or_exit(argv[2]);
  const Topic topic = topic_or_exit(*bus, argv[3]);
  auto sub = bus->subscribe(topic, argv[4], [](const MessageView& m) {
    say("got " + std::to_string(m.lane()) + " " + std::to_string(m.offset()) + " " + std::string(m.payload()) + " " +
        std::string(m.key()));
    return Outcome::ack();
  });
  if (!sub.ok()) {
    say("fail subscribe " + sub.status().to_string());
    return 3;
  }
  say("ready");
  wait_for_file(argv[5]);
  Status s = bus->shutdown(ShutdownMode::Drain, 10s);
  if (!s.ok()) {
    say("fail shutdown " + s.to_string());
    return 5;
  }
  say("closed");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 7 && std::string(argv[1]) == "produce") return produce(argv);
  if (argc >= 6 && std::string(argv[1]) == "consume") return consume(argv);
  return 2;
}
