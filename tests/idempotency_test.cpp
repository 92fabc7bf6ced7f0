// lanebus — MIT License.
// Idempotency tables (SPEC §4): the contract of claim / complete / status /
// release, races between threads and between processes, the two tiers across
// a restart, retention, and consumer groups that skip done keys.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "scratch_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::wait_until;
using TempDir = lanebus::test::ScratchDir;
namespace fs = std::filesystem;

namespace {

}  // namespace

TEST_CASE("claim, complete, status and release follow the contract") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  IdempotencyTable* t = bus->idempotency("mail.welcome", {.max_key_bytes = 32}).value();
  CHECK(t->scope() == "mail.welcome");
  CHECK(bus->idempotency("mail.welcome").value() == t);  // same scope, same table

  auto first = t->claim("welcome-e100").value();
  CHECK(first.state == ClaimState::Claimed);
  CHECK(t->claim("welcome-e100").value().state == ClaimState::InProgress);
  auto st = t->status("welcome-e100").value();
  CHECK(st.state == ClaimState::InProgress);
  REQUIRE(t->complete("welcome-e100", "msg-id-1").ok());
  CHECK(t->complete("welcome-e100", "again").ok());  // completing a done key is OK
  auto done = t->claim("welcome-e100", true).value();
  CHECK(done.state == ClaimState::Done);
  CHECK(done.result == "msg-id-1");
  CHECK(t->status("welcome-e100").value().result == "msg-id-1");

  // A failed attempt releases its claim; the key can be claimed again.
  REQUIRE(t->claim("welcome-e101").value().state == ClaimState::Claimed);
  REQUIRE(t->release("welcome-e101").ok());
  CHECK(t->claim("welcome-e101").value().state == ClaimState::Claimed);

  SUBCASE("bad input is a clear error and changes nothing") {
    auto s = t->status("never-seen");
    CHECK(s.code() == Code::NotFound);
    CHECK(s.status().message().find("never-seen") != std::string_view::npos);
    CHECK(t->complete("never-claimed").code() == Code::NotFound);
    Status rel = t->release("welcome-e100");  // done keys are never released
    CHECK(rel.code() == Code::NotFound);
    CHECK(rel.message().find("done") != std::string_view::npos);
    CHECK(t->claim("welcome-e100").value().state == ClaimState::Done);
    CHECK(t->claim("").code() == Code::InvalidArgument);
    auto big = t->claim(std::string(33, 'k'));
    CHECK(big.code() == Code::PayloadTooLarge);
    CHECK(big.status().message().find("max_key_bytes") != std::string_view::npos);
    CHECK(bus->idempotency("Bad Scope").code() == Code::InvalidName);
    CHECK(bus->idempotency("x", {.hot_capacity = 0}).code() == Code::InvalidArgument);
    auto mem = Bus::open({.workers = 1}).value();
    auto r = mem->idempotency("x");
    CHECK(r.code() == Code::InvalidArgument);
    CHECK(r.status().message().find("store.directory") != std::string_view::npos);
  }
}

TEST_CASE("of concurrent claimers in threads exactly one wins") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  IdempotencyTable* t = bus->idempotency("race").value();
  for (int round = 0; round < 20; ++round) {
    std::string key = "payment-" + std::to_string(round);
    std::atomic<int> claimed{0}, other{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < 6; ++i)
      threads.emplace_back([&] {
        while (!go) std::this_thread::yield();
        auto r = t->claim(key);
        REQUIRE(r.ok());
        (r->state == ClaimState::Claimed ? claimed : other)++;
      });
    go = true;
    for (auto& th : threads) th.join();
    CHECK(claimed == 1);
    CHECK(other == 5);
  }
}

TEST_CASE("of concurrent claimers in separate processes exactly one wins") {
  const char* child = std::getenv("LANEBUS_IDEMPOTENCY_CHILD");
  REQUIRE_MESSAGE(child != nullptr, "LANEBUS_IDEMPOTENCY_CHILD is not set (run through meson test)");
  TempDir tmp;
  {
    auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();  // create the store first
    REQUIRE(bus->idempotency("race").ok());
  }
  const std::string store = (tmp.path / "store").string();
  for (int round = 0; round < 3; ++round) {
    const std::string key = "order-" + std::to_string(round);
    const std::string barrier = (tmp.path / ("go-" + std::to_string(round))).string();
    std::vector<std::pair<pid_t, int>> kids;
    for (int i = 0; i < 4; ++i) {
      int fds[2];
      REQUIRE(::pipe(fds) == 0);
      pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        ::dup2(fds[1], 1);
        ::close(fds[0]);
        ::execl(child, child, store.c_str(), key.c_str(), barrier.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
      }
      ::close(fds[1]);
      kids.emplace_back(pid, fds[0]);
    }
    std::this_thread::sleep_for(50ms);  // let them open the store; the barrier starts them together
    std::ofstream(barrier) << "go";
    int claimed = 0, other = 0;
    for (auto [pid, fd] : kids) {
      std::string out;
      char buf[64];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
      ::close(fd);
      int status = 0;
      ::waitpid(pid, &status, 0);
      REQUIRE(WIFEXITED(status));
      REQUIRE(WEXITSTATUS(status) == 0);
      if (out.rfind("Claimed", 0) == 0) {
        ++claimed;
      } else {
        ++other;
      }
    }
    CHECK(claimed == 1);
    CHECK(other == 3);
  }
}

TEST_CASE("after the hot tier's TTL and a restart, the durable tier still knows a done key") {
  TempDir tmp;
  {
    auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
    IdempotencyTable* t = bus->idempotency("mail", {.hot_ttl = 1ms}).value();
    REQUIRE(t->claim("welcome-e100").value().state == ClaimState::Claimed);
    REQUIRE(t->complete("welcome-e100", "sent").ok());
  }
  std::this_thread::sleep_for(5ms);
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  IdempotencyTable* t = bus->idempotency("mail", {.hot_ttl = 1ms}).value();
  auto r = t->claim("welcome-e100", true).value();
  CHECK(r.state == ClaimState::Done);
  CHECK(r.result == "sent");
  CHECK(t->claim("welcome-e101").value().state == ClaimState::Claimed);
}

TEST_CASE("an abandoned in-progress claim can be taken over after claim_timeout") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  IdempotencyTable* t = bus->idempotency("jobs", {.claim_timeout = 30ms}).value();
  REQUIRE(t->claim("job-1").value().state == ClaimState::Claimed);
  CHECK(t->claim("job-1").value().state == ClaimState::InProgress);
  std::this_thread::sleep_for(60ms);  // the claim's owner "died"
  CHECK(t->claim("job-1").value().state == ClaimState::Claimed);
}

TEST_CASE("a consumer group with an idempotency scope skips done keys on a durable queue and a topic") {
  TempDir tmp;
  auto bus = Bus::open(lanebus::test::store_bus(tmp.path)).value();
  auto queue = bus->create_queue("mail.outbox", {.lanes = 2, .durable = true}).value();
  auto topic = bus->create_topic("mail.events", {.lanes = 2}).value();  // ephemeral, same scope
  std::atomic<int> sent{0}, seen{0};
  auto q = bus->consume(queue, [&](const MessageView&) {
                 ++sent;
                 return Outcome::ack();
               },
               {.idempotency_scope = "mail.send"})
               .value();
  auto g = bus->subscribe(topic, "mailer", [&](const MessageView&) {
                 ++seen;
                 return Outcome::ack();
               },
               {.idempotency_scope = "mail.send"})
               .value();
  REQUIRE(queue.publish({.key = "u1", .payload = "welcome", .idempotency_key = "welcome-e100"}).ok());
  REQUIRE(wait_until([&] { return sent == 1; }));
  // A producer retry publishes the same business key again: skipped.
  REQUIRE(queue.publish({.key = "u1", .payload = "welcome", .idempotency_key = "welcome-e100"}).ok());
  // Another path (the ephemeral topic, same scope) also sees it as done.
  REQUIRE(topic.publish({.key = "u1", .payload = "welcome", .idempotency_key = "welcome-e100"}).ok());
  REQUIRE(queue.publish({.key = "u2", .payload = "welcome", .idempotency_key = "welcome-e101"}).ok());
  REQUIRE(wait_until([&] { return sent == 2; }));
  REQUIRE(wait_until([&] {
    auto st = bus->stats();
    std::uint64_t skipped = 0;
    for (auto& t : st.topics)
      for (auto& gr : t.groups) skipped += gr.total.duplicates_skipped;
    return skipped == 2;
  }));
  CHECK(sent == 2);
  CHECK(seen == 0);
  auto r = bus->subscribe(topic, "bad", [](const MessageView&) { return Outcome::ack(); },
                          {.idempotency_scope = "Bad Scope"});
  CHECK(r.code() == Code::InvalidName);
}
