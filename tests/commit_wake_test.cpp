// lanebus — MIT License.
// CommitWake (lib/store/commit_wake.hpp) inside one process: each object is
// its own mapping of wake.shm and its own slot, standing in for a process, so
// TSan sees the shared words (it cannot follow other processes). The real
// processes, kill -9 and SIGSTOP are in wake_multiprocess_test.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "commit_wake.hpp"
#include "durable_store.hpp"
#include "temp_dir.hpp"

using lanebus::Code;
using lanebus::detail::CommitWake;
using lanebus::test::TempDir;
using namespace std::chrono_literals;

extern char** environ;

namespace {

std::unique_ptr<CommitWake> open_wake(const std::string& dir) {
  auto w = CommitWake::open(dir);
  REQUIRE_MESSAGE(w.ok(), w.status().to_string());
  return std::move(*w);
}

// The pid of a process that has exited and been reaped.
pid_t dead_pid() {
  pid_t pid = -1;
  char arg0[] = "/bin/true";
  char* argv[] = {arg0, nullptr};
  REQUIRE(posix_spawn(&pid, "/bin/true", nullptr, nullptr, argv, environ) == 0);
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  return pid;
}

// Write raw bytes at `offset` of wake.shm.
void poke(const std::string& dir, std::size_t offset, std::uint64_t value) {
  int fd = ::open((dir + "/wake.shm").c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  REQUIRE(pwrite(fd, &value, sizeof value, static_cast<off_t>(offset)) == sizeof value);
  ::close(fd);
}

}  // namespace

TEST_CASE("another object's notify wakes a sleeper at once; its own does not; without one the sleeper times out") {
  TempDir dir;
  auto a = open_wake(dir.path());
  auto b = open_wake(dir.path());
  REQUIRE(a->has_slot());
  REQUIRE(b->has_slot());
  CHECK(a->slot_index() != b->slot_index());
  CHECK(a->owned_slots() == 2);

  // Nothing committed: the wait ends by its timeout, false.
  const std::uint32_t b0 = b->seq();
  CHECK_FALSE(b->wait(b0, 20ms));

  // A's own notify bumps only the others.
  const std::uint32_t a0 = a->seq();
  std::atomic<bool> woke{false};
  std::thread sleeper([&] { woke = b->wait(b0, 30s); });
  a->notify_others();
  sleeper.join();
  CHECK(woke.load());
  CHECK(b->seq() == b0 + 1);
  CHECK(a->seq() == a0);
  CHECK(a->bumps() == 1);

  // A notify that comes before the wait is not lost: the word already differs.
  const std::uint32_t b1 = b->seq();
  a->notify_others();
  CHECK(b->wait(b1, 30s));
  CHECK(b->woken() == 2);

  // interrupt() wakes this object's own sleeper (shutdown).
  const std::uint32_t b2 = b->seq();
  std::thread sleeper2([&] { woke = b->wait(b2, 30s); });
  b->interrupt();
  sleeper2.join();
  CHECK(woke.load());

  b.reset();  // frees its slot
  CHECK(a->owned_slots() == 1);
}

TEST_CASE("many notifiers and one sleeper on separate mappings: every bump lands, the sleeper never hangs") {
  TempDir dir;
  auto sleeper_wake = open_wake(dir.path());
  constexpr int kNotifiers = 3, kEach = 2000;
  std::vector<std::unique_ptr<CommitWake>> notifiers;
  for (int i = 0; i < kNotifiers; ++i) notifiers.push_back(open_wake(dir.path()));
  const std::uint32_t start = sleeper_wake->seq();
  std::atomic<bool> done{false};
  std::thread sleeper([&] {
    while (!done.load()) {
      const std::uint32_t seen = sleeper_wake->seq();
      (void)sleeper_wake->wait(seen, 50ms);
    }
  });
  std::vector<std::thread> threads;
  for (int i = 0; i < kNotifiers; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < kEach; ++k) notifiers[static_cast<std::size_t>(i)]->notify_others();
    });
  }
  for (auto& t : threads) t.join();
  done = true;
  sleeper_wake->interrupt();
  sleeper.join();
  // Each notify bumps the sleeper and the other notifiers; the sleeper's word
  // moved once per notify, plus its own interrupt.
  CHECK(sleeper_wake->seq() - start == static_cast<std::uint32_t>(kNotifiers * kEach + 1));
}

TEST_CASE("a full table only notifies; the slot of a dead process is freed") {
  TempDir dir;
  std::vector<std::unique_ptr<CommitWake>> all;
  for (std::size_t i = 0; i < CommitWake::kSlots; ++i) all.push_back(open_wake(dir.path()));
  auto extra = open_wake(dir.path());
  CHECK_FALSE(extra->has_slot());
  CHECK(extra->slot_index() == -1);
  CHECK(extra->seq() == 0);
  CHECK_FALSE(extra->wait(0, 10s));  // returns at once: the caller sleeps by itself
  const std::uint32_t s0 = all[0]->seq();
  extra->notify_others();  // still wakes the others
  CHECK(all[0]->seq() == s0 + 1);
  CHECK(extra->reclaim_dead() == 0);  // every owner is this (live) process

  // Slot 5's owner "dies": its word now names a reaped pid.
  const int idx = all[5]->slot_index();
  REQUIRE(idx >= 0);
  poke(dir.path(), 64 * (static_cast<std::size_t>(idx) + 1), static_cast<std::uint64_t>(dead_pid()));
  CHECK(extra->reclaim_dead() == 1);
  auto late = open_wake(dir.path());
  CHECK(late->has_slot());
  CHECK(late->slot_index() == idx);
}

TEST_CASE("a foreign, newer or unsafe wake.shm is refused with a clear error, and the store opens without it") {
  TempDir dir;
  const std::string d = dir.path();
  {
    auto w = open_wake(d);
  }
  poke(d, 0, 0x4c4257414b450007ull);  // our magic, layout version 7
  auto newer = CommitWake::open(d);
  REQUIRE_FALSE(newer.ok());
  CHECK(newer.code() == Code::VersionTooNew);
  CHECK(newer.status().message().find("layout version 7") != std::string::npos);

  poke(d, 0, 0x1234567812345678ull);
  auto foreign = CommitWake::open(d);
  REQUIRE_FALSE(foreign.ok());
  CHECK(foreign.code() == Code::Corruption);
  CHECK(foreign.status().message().find("not a lanebus wake table") != std::string::npos);

  // A store on such a directory opens, and says why its consumers poll.
  lanebus::StoreOptions o;
  o.directory = d;
  auto store = lanebus::detail::DurableStore::open(o);
  REQUIRE_MESSAGE(store.ok(), store.status().to_string());
  CHECK_FALSE((*store)->has_commit_wake());
  CHECK((*store)->commit_wake_status().code() == Code::Corruption);
  CHECK_FALSE((*store)->wait_for_commit(0, 10s));  // at once
  REQUIRE((*store)->close().ok());

  TempDir dir2;
  REQUIRE(::chmod(dir2.path().c_str(), 0700) == 0);
  std::filesystem::create_symlink(dir2.file("elsewhere"), dir2.file("wake.shm"));
  auto link = CommitWake::open(dir2.path());
  REQUIRE_FALSE(link.ok());
  CHECK(link.code() == Code::PermissionDenied);
  std::filesystem::remove(dir2.file("wake.shm"));
  {
    auto w = open_wake(dir2.path());
  }
  REQUIRE(::chmod(dir2.file("wake.shm").c_str(), 0666) == 0);
  auto loose = CommitWake::open(dir2.path());
  REQUIRE_FALSE(loose.ok());
  CHECK(loose.code() == Code::PermissionDenied);
  CHECK(loose.status().message().find("world writable") != std::string::npos);

  // Turned off: no file at all.
  TempDir dir3;
  o.directory = dir3.file("store");
  o.wake_on_commit = false;
  auto off = lanebus::detail::DurableStore::open(o);
  REQUIRE_MESSAGE(off.ok(), off.status().to_string());
  CHECK_FALSE((*off)->has_commit_wake());
  CHECK((*off)->commit_wake_status().ok());
  CHECK_FALSE(std::filesystem::exists(dir3.file("store/wake.shm")));
  REQUIRE((*off)->close().ok());
}

TEST_CASE("a durable store wakes another store's waiter on an append, not on other commits") {
  TempDir dir;
  // Two stores on one directory cannot live in one process (Busy), so the
  // second "process" is a bare CommitWake on the same file.
  lanebus::StoreOptions o;
  o.directory = dir.path();
  auto store = lanebus::detail::DurableStore::open(o);
  REQUIRE_MESSAGE(store.ok(), store.status().to_string());
  REQUIRE((*store)->has_commit_wake());
  auto other = open_wake(dir.path());
  lanebus::detail::TopicSpec spec;
  spec.lanes = 1;
  auto topic = (*store)->open_topic("wake.t", spec);
  REQUIRE_MESSAGE(topic.ok(), topic.status().to_string());
  const std::uint32_t s0 = other->seq();
  lanebus::detail::AppendRequest r;
  r.topic_id = topic->id;
  r.lane = 0;
  r.payload = "x";
  auto res = (*store)->append(r);
  REQUIRE_MESSAGE(res.ok(), res.status().to_string());
  CHECK(other->seq() == s0 + 1);  // bumped before append() returned (before the completions)
  // A commit without an append (a consumer group) wakes no one.
  auto group = (*store)->open_group(*topic, "g");
  REQUIRE_MESSAGE(group.ok(), group.status().to_string());
  CHECK(other->seq() == s0 + 1);
  REQUIRE((*store)->close().ok());
}
