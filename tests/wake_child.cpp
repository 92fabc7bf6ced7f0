// lanebus — MIT License.
// Helper process for wake_multiprocess_test: a consumer or a publisher of one
// durable queue through the Bus. Every line goes out with one write(2), so a
// SIGKILL never leaves a torn line.
//
//   wake_child consume DIR QUEUE POLL_MS STOP_FILE
//       Consumes QUEUE with BusOptions::durable_poll = POLL_MS. The handler
//       prints "got PAYLOAD LATENCY_US" (publish stamp to handler, one
//       CLOCK_MONOTONIC for all processes) and acks. Prints "ready" once
//       consuming; when STOP_FILE exists prints "wakes N" (its poller's
//       wake-ups by other processes' commits), shuts down (Drain) and prints
//       "closed".
//   wake_child publish DIR QUEUE NAME COUNT FREEZE STOP_FILE
//       Publishes COUNT messages (Durability::Sync, one at a time: one commit
//       each), payload "NAME:SEQ:STAMP_NS", printing "ack NAME SEQ" after each.
//       FREEZE = 1: the first commit that bumps another process's wake word
//       stops this whole process (raise(SIGSTOP) on the writer thread, after
//       the bumps and before the FUTEX_WAKEs: CommitWake's test hook); the
//       message of that commit is committed but its publish has not returned.
//       Prints "sent" after the last publish, then waits for STOP_FILE.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "access.hpp"
#include "bus_impl.hpp"
#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;

namespace {

void say(const std::string& line) {
  std::string l = line + "\n";
  ssize_t n = ::write(1, l.data(), l.size());
  (void)n;
}

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

std::unique_ptr<Bus> open_or_exit(const char* dir, std::chrono::milliseconds poll) {
  BusOptions o;
  o.name = "wake";
  o.workers = 2;
  o.store.directory = dir;
  o.store.durability = Durability::Sync;
  o.store.map_size_initial = 8ull << 20;
  o.durable_poll = poll;
  o.dlq.poison_after_crashes = 0;  // a SIGKILL from the test is not the message's fault
  auto bus = Bus::open(o);
  if (!bus.ok()) {
    say("fail open " + bus.status().to_string());
    std::exit(3);
  }
  return std::move(*bus);
}

Topic queue_or_exit(Bus& bus, const char* name) {
  auto q = bus.create_queue(name, {.lanes = 4, .durable = true});
  if (!q.ok()) {
    say("fail queue " + q.status().to_string());
    std::exit(3);
  }
  return *q;
}

detail::DurableStore* store_of(Bus& bus) { return detail::Access::core(bus)->store(); }

void wait_for_file(const char* path) {
  while (!std::filesystem::exists(path)) std::this_thread::sleep_for(5ms);
}

int consume(char** argv) {
  auto bus = open_or_exit(argv[2], std::chrono::milliseconds(std::atoi(argv[4])));
  const Topic q = queue_or_exit(*bus, argv[3]);
  if (!store_of(*bus)->has_commit_wake()) {
    say("fail no wake word: " + store_of(*bus)->commit_wake_status().to_string());
    return 3;
  }
  auto sub = bus->consume(q, [](const MessageView& m) {
    const std::string p(m.payload());
    const std::uint64_t stamp = std::stoull(p.substr(p.rfind(':') + 1));
    const std::uint64_t now = now_ns();
    say("got " + p.substr(0, p.rfind(':')) + " " + std::to_string(now > stamp ? (now - stamp) / 1000 : 0));
    return Outcome::ack();
  });
  if (!sub.ok()) {
    say("fail consume " + sub.status().to_string());
    return 3;
  }
  say("ready");
  wait_for_file(argv[5]);
  say("wakes " + std::to_string(store_of(*bus)->counters().commit_wakes_received));
  Status s = bus->shutdown(ShutdownMode::Drain, 10s);
  if (!s.ok()) {
    say("fail shutdown " + s.to_string());
    return 5;
  }
  say("closed");
  return 0;
}

int publish(char** argv) {
  auto bus = open_or_exit(argv[2], 50ms);
  const Topic q = queue_or_exit(*bus, argv[3]);
  const std::string name = argv[4];
  const int count = std::atoi(argv[5]);
  if (std::string(argv[6]) == "1") {
    detail::CommitWake* w = store_of(*bus)->commit_wake_for_testing();
    if (w == nullptr) {
      say("fail no wake table: " + store_of(*bus)->commit_wake_status().to_string());
      return 3;
    }
    // Once: the writer thread stops the process between bump and wake.
    w->set_between_bump_and_wake_for_testing([frozen = false]() mutable {
      if (frozen) return;
      frozen = true;
      ::raise(SIGSTOP);
    });
  }
  say("ready");
  for (int i = 0; i < count; ++i) {
    const std::string payload = name + ":" + std::to_string(i) + ":" + std::to_string(now_ns());
    Status s = q.publish({.key = name + "-" + std::to_string(i % 8), .payload = payload});
    if (!s.ok()) {
      say("fail publish " + s.to_string());
      return 4;
    }
    say("ack " + name + " " + std::to_string(i));
  }
  say("sent");
  wait_for_file(argv[7]);
  Status s = bus->shutdown(ShutdownMode::Drain, 10s);
  if (!s.ok()) {
    say("fail shutdown " + s.to_string());
    return 5;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 6 && std::string(argv[1]) == "consume") return consume(argv);
  if (argc >= 8 && std::string(argv[1]) == "publish") return publish(argv);
  return 2;
}
