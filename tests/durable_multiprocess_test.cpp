// lanebus — MIT License.
// Multi-process: two producer processes and one consumer process on one store
// directory; every message arrives, per-key order holds per producer.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "process.hpp"
#include "temp_dir.hpp"

using lanebus::test::Child;
using lanebus::test::TempDir;

TEST_CASE("two processes append to one durable topic while a third consumes: all arrive, per-key order per producer") {
  const std::string exe = lanebus::test::helper_path("LANEBUS_DURABLE_CHILD");
  REQUIRE_MESSAGE(!exe.empty(), "LANEBUS_DURABLE_CHILD is not set (run through meson test)");
  TempDir dir;
  const std::string store_dir = dir.file("bus");
  constexpr int kPerProducer = 3000;
  Child consumer({exe, "follow", store_dir, "mp.topic", "reader", std::to_string(2 * kPerProducer)});
  Child a({exe, "produce", store_dir, "mp.topic", "4", "A", "0", std::to_string(kPerProducer)});
  Child b({exe, "produce", store_dir, "mp.topic", "4", "B", "0", std::to_string(kPerProducer)});
  REQUIRE(consumer.started());
  REQUIRE(a.started());
  REQUIRE(b.started());

  std::map<std::string, std::set<std::uint64_t>> acked;
  std::map<std::string, std::uint64_t> last;  // "producer/key" -> last seq seen by the consumer
  std::set<std::string> got;
  bool a_done = false, b_done = false, c_done = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  auto pump_producer = [&](Child& p, bool& done) {
    std::string l = p.read_line(std::chrono::milliseconds(2));
    while (!l.empty()) {
      std::istringstream in(l);
      std::string what, who, seq, id;
      in >> what >> who >> seq >> id;
      if (what == "ack") {
        acked[who].insert(std::stoull(seq));
      } else if (what == "done") {
        done = true;
      } else {
        REQUIRE_MESSAGE(what == "ready", l);
      }
      l = p.read_line(std::chrono::milliseconds(1));
    }
  };
  while (!(a_done && b_done && c_done) && std::chrono::steady_clock::now() < deadline) {
    if (!a_done) pump_producer(a, a_done);
    if (!b_done) pump_producer(b, b_done);
    for (std::string l = consumer.read_line(std::chrono::milliseconds(2)); !l.empty();
         l = consumer.read_line(std::chrono::milliseconds(1))) {
      std::istringstream in(l);
      std::string what, payload, key;
      in >> what >> payload >> key;
      if (what == "done") {
        c_done = true;
        break;
      }
      if (what != "got") {
        REQUIRE_MESSAGE(what == "ready", l);
        continue;
      }
      CHECK(got.insert(payload).second);  // no duplicates
      std::string who = payload.substr(0, payload.find(':'));
      std::uint64_t seq = std::stoull(payload.substr(payload.find(':') + 1));
      auto it = last.find(who + "/" + key);
      if (it != last.end()) CHECK(seq > it->second);  // per-key order per producer
      last[who + "/" + key] = seq;
    }
  }
  CHECK(a_done);
  CHECK(b_done);
  CHECK(c_done);
  CHECK(a.wait() == 0);
  CHECK(b.wait() == 0);
  CHECK(consumer.wait() == 0);
  CHECK(acked["A"].size() == kPerProducer);
  CHECK(acked["B"].size() == kPerProducer);
  CHECK(got.size() == 2 * kPerProducer);
}

TEST_CASE("lanebus stat and tail read a store that another process is writing; a non-store directory is a clear error") {
  const std::string exe = lanebus::test::helper_path("LANEBUS_DURABLE_CHILD");
  const std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");
  if (tool.empty()) {
    MESSAGE("skipped: the lanebus tool is not built (-Dtools=false)");
    return;
  }
  TempDir dir;
  const std::string store_dir = dir.file("bus");
  Child producer({exe, "produce", store_dir, "live.topic", "2", "P", "0", "0"});
  REQUIRE(producer.started());
  REQUIRE(producer.read_line() == "ready");
  REQUIRE(!producer.read_line().empty());  // at least one append committed
  auto run = [](const std::vector<std::string>& argv, std::string* out) {
    Child c(argv);
    for (std::string l; !(l = c.read_line(std::chrono::seconds(30))).empty();) *out += l + "\n";
    return c.wait();
  };
  std::string stat_out, tail_out, bad_out;
  CHECK(run({tool, "stat", store_dir}, &stat_out) == 0);
  CHECK(stat_out.find("topic live.topic lanes=2") != std::string::npos);
  CHECK(run({tool, "tail", store_dir, "live.topic", "--count", "3", "--from", "earliest"}, &tail_out) == 0);
  CHECK(tail_out.find("offset=0 ") != std::string::npos);
  CHECK(tail_out.find("payload=\"P:") != std::string::npos);
  producer.signal(SIGKILL);
  producer.wait();
  CHECK(run({tool, "stat", dir.path()}, &bad_out) == 1);  // error text goes to stderr
  CHECK(run({tool, "tail", store_dir, "no.such.topic"}, &bad_out) == 1);
}
