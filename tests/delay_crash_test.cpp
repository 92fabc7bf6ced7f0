// lanebus — MIT License.
// Durable delayed messages across a real kill -9 (issue 25, doc/delays.md):
// a child process publishes delayed messages (Sync: each publish returns
// after the fsync of its delayed-index entry) and is killed with SIGKILL
// before any is due, then again while half of them have been moved to their
// lanes and consumed. A new process delivers every message, none before its
// due time, none lost; the lateness after the restart is printed.
#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::wait_until;

namespace {

constexpr int kMessages = 60;

std::int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Result<Topic> reminders(Bus& bus) {
  TopicOptions to;
  to.lanes = 4;
  to.durable = true;
  return bus.create_topic("reminders", to);
}

// Publishes kMessages delayed messages due from `first_due` on (10 ms apart),
// consuming with group "g" if `consume`; tells the parent through `fd`, then
// waits for SIGKILL.
[[noreturn]] void child(const std::string& dir, std::int64_t first_due, bool consume, int fd) {
  BusOptions bo;
  bo.workers = 2;
  bo.store.directory = dir;
  bo.log = [](LogLevel, std::string_view line) { std::fprintf(stderr, "child log: %.*s\n", int(line.size()), line.data()); };
  auto bus = Bus::open(bo);
  if (!bus.ok()) ::_exit(3);
  auto topic = reminders(**bus);
  if (!topic.ok()) ::_exit(4);
  Result<Subscription> sub = Status::from_literal(Code::NotFound, "none");
  if (consume) {
    sub = (*bus)->subscribe(*topic, "g", [](const MessageView&) { return Outcome::ack(); });
    if (!sub.ok()) ::_exit(5);
  }
  for (int i = 0; i < kMessages; ++i) {
    const std::int64_t due = first_due + std::int64_t{i} * 10'000'000;
    char payload[sizeof due];
    std::memcpy(payload, &due, sizeof due);
    const std::string key = "user-" + std::to_string(i % 7);  // outlives the message view
    OutgoingMessage m{.key = key, .payload = std::string_view(payload, sizeof payload)};
    m.deliver_at = due;
    if (!topic->publish(m).ok()) ::_exit(6);
  }
  const char ready = 'r';
  if (::write(fd, &ready, 1) != 1) ::_exit(7);
  for (;;) ::pause();
}

void kill_and_restart(bool consume, std::int64_t lead_ns, std::int64_t kill_after_ns) {
  test::TempDir dir;
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const std::int64_t first_due = wall_ns() + lead_ns;
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    child(dir.path(), first_due, consume, fds[1]);
  }
  ::close(fds[1]);
  pollfd p{fds[0], POLLIN, 0};
  const int ready = ::poll(&p, 1, 60'000);
  char c = 0;
  const bool published = ready == 1 && ::read(fds[0], &c, 1) == 1;
  ::close(fds[0]);
  if (kill_after_ns > 0) std::this_thread::sleep_until(std::chrono::system_clock::time_point(
                             std::chrono::nanoseconds(first_due + kill_after_ns)));
  const std::int64_t killed_at = wall_ns();
  ::kill(pid, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(published);
  CHECK(WIFSIGNALED(status));
  MESSAGE("killed " << (killed_at - first_due) / 1'000'000 << " ms after the first due time");

  BusOptions bo;
  bo.workers = 2;
  bo.store.directory = dir.path();
  bo.log = [](LogLevel, std::string_view line) { MESSAGE("log: " << line); };
  auto bus = Bus::open(bo).value();
  auto topic = reminders(*bus).value();
  std::mutex mu;
  std::map<std::int64_t, int> seen;  // due -> deliveries
  std::vector<std::int64_t> lateness;
  std::atomic<int> early{0};
  auto sub = bus->subscribe(topic, "fresh", [&](const MessageView& m) {
                  const std::int64_t now = wall_ns();
                  std::int64_t due;
                  std::memcpy(&due, m.payload().data(), sizeof due);
                  if (now + 1'000'000 < due) early.fetch_add(1);
                  std::lock_guard l(mu);
                  if (++seen[due] == 1) lateness.push_back(now - due);
                  return Outcome::ack();
                }).value();
  const bool all = wait_until([&] {
    std::lock_guard l(mu);
    return seen.size() == static_cast<std::size_t>(kMessages);
  }, 30s);
  if (!all) {
    std::lock_guard l(mu);
    for (const TopicStats& t : bus->stats().topics)
      for (const GroupStats& g : t.groups)
        MESSAGE("group " << g.name << " delivered " << g.total.delivered << " lag " << g.total.in_flight
                         << " published " << t.published);
    MESSAGE("seen " << seen.size() << " of " << kMessages);
    for (int i = 0; i < kMessages; ++i)
      if (seen.count(first_due + std::int64_t{i} * 10'000'000) == 0) MESSAGE("missing: message " << i);

  }
  REQUIRE(all);
  CHECK(early.load() == 0);
  std::lock_guard l(mu);
  std::sort(lateness.begin(), lateness.end());
  // Deliveries after the restart only: those already due when the bus opened
  // are late by the restart itself.
  MESSAGE("after the restart: " << lateness.size() << " first deliveries, lateness p50 "
                                << lateness[lateness.size() / 2] / 1000 << " µs, max " << lateness.back() / 1000
                                << " µs");
  CHECK(lateness.back() < 20'000'000'000);  // loose: nothing waits for a scan or a poll forever
}

}  // namespace

TEST_CASE("durable delayed messages survive kill -9 before they are due, and are delivered on time") {
  kill_and_restart(false, 1'500'000'000, 0);
}

TEST_CASE("kill -9 while due messages are being moved and consumed: none lost, none early") {
  kill_and_restart(true, 1'000'000'000, 300'000'000);
}
