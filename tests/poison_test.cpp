// lanebus — MIT License.
// Poison messages (SPEC §5): a handler that abort()s on one payload crashes
// its process; after poison_after_crashes restarts the message is in the DLQ
// classified poison, and the rest of its lane was processed.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

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
