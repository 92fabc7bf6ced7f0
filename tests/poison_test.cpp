// lanebus — MIT License.
// Poison messages (doc/dlq.md): a handler that abort()s on one payload crashes
// its process; after poison_after_crashes restarts the message is in the DLQ
// classified poison, and the rest of its lane was processed.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

TEST_CASE("a message that crashes its consumer N times goes to the DLQ as poison; its lane moves on") {
  const char* child = std::getenv("LANEBUS_POISON_CHILD");
  REQUIRE_MESSAGE(child != nullptr, "LANEBUS_POISON_CHILD is not set (run through meson test)");
  char tmpl[] = "/tmp/lanebus-poison-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const fs::path dir = tmpl;
  const std::string store = (dir / "store").string();
  constexpr int kJobs = 10;
  {
    BusOptions o;
    o.workers = 1;
    o.store.directory = store;
    auto bus = Bus::open(o).value();
    auto queue = bus->create_queue("work.jobs", {.lanes = 1, .durable = true}).value();
    for (int i = 0; i < kJobs; ++i) {
      std::string p = i == 3 ? "poison" : "job-" + std::to_string(i);
      REQUIRE(queue.publish({.key = "same-lane", .payload = p}).ok());
    }
  }
  int crashes = 0, runs = 0;
  bool finished = false;
  while (!finished && runs < 20) {
    ++runs;
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::execl(child, child, store.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status)) {
      CHECK(WTERMSIG(status) == SIGABRT);
      ++crashes;
      ::usleep(150'000);  // let the dead consumer's claim expire (visibility 100 ms)
    } else {
      REQUIRE(WIFEXITED(status));
      REQUIRE(WEXITSTATUS(status) == 0);
      finished = true;
    }
  }
  MESSAGE("consumer crashes: " << crashes << " in " << runs << " runs");
  REQUIRE(finished);
  CHECK(crashes == 3);
  BusOptions o;
  o.workers = 1;
  o.store.directory = store;
  auto bus = Bus::open(o).value();
  auto dlq = bus->dead_letters().value();
  auto entries = dlq->list().value();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].error_class == ErrorClass::Poison);
  CHECK(entries[0].payload == "poison");
  CHECK(entries[0].topic == "work.jobs");
  CHECK(entries[0].attempts == 3);
  for (int i = 0; i < kJobs; ++i) {
    if (i == 3) continue;
    CHECK_MESSAGE(bus->table_get("done", "job-" + std::to_string(i)).ok(), "job " << i);
  }
  CHECK(bus->stats().dlq.arrivals[static_cast<int>(ErrorClass::Poison)] == 1);
  (void)bus->shutdown(ShutdownMode::Drain);
  fs::remove_all(dir);
}

namespace {

// Runs poison_child with `args` (no core dump for its abort()) and returns its
// wait status.
int run_child(const char* child, const std::vector<std::string>& args) {
  pid_t pid = ::fork();
  if (pid == 0) {
    struct rlimit no_core {0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);
    std::vector<char*> argv{const_cast<char*>(child)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(child, argv.data());
    ::_exit(127);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

}  // namespace

// The durable topic scenario: three keys over 2 lanes, the poison message in
// the middle of k0's sequence; poison_child in `mode` ("topic": a
// transactional handler; "topic-batch": a batch handler) restarted until it
// finishes. Checks the crash count and the DLQ entry; returns the store
// directory's parent (to remove) with the store still there for the caller's
// checks, and fills *expected with each key's messages in publish order.
struct TopicPoisonRun {
  fs::path dir;
  std::string store;
  std::map<std::string, std::vector<std::string>> expected;
  const std::vector<std::string> keys = {"k0", "k1", "k2"};
};

void run_topic_poison(const std::string& mode, TopicPoisonRun* run) {
  const char* child = std::getenv("LANEBUS_POISON_CHILD");
  REQUIRE_MESSAGE(child != nullptr, "LANEBUS_POISON_CHILD is not set (run through meson test)");
  char tmpl[] = "/tmp/lanebus-poison-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  run->dir = tmpl;
  run->store = (run->dir / "store").string();
  const std::uint32_t poison_after = DlqOptions{}.poison_after_crashes;  // the child keeps the default
  REQUIRE(poison_after > 0);
  // Three keys (2 lanes, so at least two share one); the poison message sits in
  // the middle of k0's sequence, so finishing k0 means getting past it.
  constexpr int kPerKey = 6, kPoisonAt = 3;
  {
    BusOptions o;
    o.workers = 1;
    o.store.directory = run->store;
    auto bus = Bus::open(o).value();
    auto topic = bus->create_topic("work.events", {.lanes = 2, .durable = true}).value();
    for (int i = 0; i < kPerKey; ++i)
      for (const std::string& k : run->keys) {
        const bool poison = k == "k0" && i == kPoisonAt;
        const std::string p = poison ? "poison" : k + "-" + std::to_string(i);
        if (!poison) run->expected[k].push_back(p);
        REQUIRE(topic.publish({.key = k, .payload = p}).ok());
      }
    REQUIRE(bus->shutdown(ShutdownMode::Drain).ok());
  }
  const int want = static_cast<int>(run->keys.size()) * kPerKey - 1;
  // Bounded restarts: poison_after crashes, one clean run, and some slack.
  const int max_runs = static_cast<int>(poison_after) * 3 + 3;
  int crashes = 0, runs = 0;
  bool finished = false;
  while (!finished && runs < max_runs) {
    ++runs;
    const int status = run_child(child, {run->store, mode, std::to_string(want)});
    if (WIFSIGNALED(status)) {
      CHECK(WTERMSIG(status) == SIGABRT);
      ++crashes;
    } else {
      REQUIRE(WIFEXITED(status));
      REQUIRE_MESSAGE(WEXITSTATUS(status) == 0, "poison_child " << mode << " exited with " << WEXITSTATUS(status));
      finished = true;
    }
  }
  MESSAGE("durable topic (" << mode << "): consumer crashes: " << crashes << " in " << runs << " runs (max "
                            << max_runs << ", poison_after_crashes " << poison_after << ")");
  REQUIRE_MESSAGE(finished, "the group never got past the poison message in " << runs << " runs");
  CHECK(crashes == static_cast<int>(poison_after));
  BusOptions o;
  o.workers = 1;
  o.store.directory = run->store;
  auto bus = Bus::open(o).value();
  auto entries = bus->dead_letters().value()->list({.topic = "work.events"}).value();
  MESSAGE("DLQ entries for work.events: " << entries.size());
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].error_class == ErrorClass::Poison);
  CHECK(entries[0].payload == "poison");
  CHECK(entries[0].key == "k0");
  CHECK(entries[0].topic == "work.events");
  CHECK(entries[0].group == "audit");
  CHECK(entries[0].attempts == poison_after);
  CHECK(bus->stats().dlq.arrivals[static_cast<int>(ErrorClass::Poison)] == 1);
  (void)bus->shutdown(ShutdownMode::Drain);
}

TEST_CASE("durable topic: a message that crashes its group's consumer N times goes to the DLQ as poison; the group moves on in order") {
  TopicPoisonRun run;
  run_topic_poison("topic", &run);
  BusOptions o;
  o.workers = 1;
  o.store.directory = run.store;
  auto bus = Bus::open(o).value();
  for (const std::string& k : run.keys) {
    auto seen = bus->table_get("seen", k);
    MESSAGE(k << ": " << (seen.ok() ? *seen : std::string("0")) << " of " << run.expected[k].size() << " handled");
  }
  // Every other message exactly once, in publish order per key.
  for (const std::string& k : run.keys) {
    CHECK(bus->table_get("seen", k).value() == std::to_string(run.expected[k].size()));
    for (std::size_t i = 0; i < run.expected[k].size(); ++i) {
      char index[24];
      std::snprintf(index, sizeof index, "%04zu", i);
      auto v = bus->table_get("log", k + "#" + index);
      CHECK_MESSAGE((v.ok() && *v == run.expected[k][i]), k << " #" << i << ": expected " << run.expected[k][i]);
    }
    char past[24];
    std::snprintf(past, sizeof past, "%04zu", run.expected[k].size());
    CHECK(bus->table_get("log", k + "#" + past).code() == Code::NotFound);
  }
  (void)bus->shutdown(ShutdownMode::Drain);
  fs::remove_all(run.dir);
}

TEST_CASE("durable topic, batch handler: a message that crashes its spans N times goes to the DLQ as poison; every other message is handled, in order per key") {
  // The spans path (durable_lane.cpp, topic_deliver_span) under poison
  // detection: a crash inside a span is charged to the read's delivery mark,
  // the restart searches the mark one message at a time, and what follows the
  // poison message goes in spans again. The child appends every payload it
  // handles to STORE/handled.log (at-least-once: a span cut short by the
  // crash comes again).
  TopicPoisonRun run;
  run_topic_poison("topic-batch", &run);
  std::ifstream in(run.store + "/handled.log");
  std::map<std::string, std::vector<std::string>> firsts;  // each key's payloads, first handling only
  std::set<std::string> seen;
  for (std::string line; std::getline(in, line);) {
    CHECK(line != "poison");  // never handled: it crashed every call it was in
    if (seen.insert(line).second) firsts[line.substr(0, line.find('-'))].push_back(line);
  }
  for (const std::string& k : run.keys) CHECK(firsts[k] == run.expected[k]);
  fs::remove_all(run.dir);
}
