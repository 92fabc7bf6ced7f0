// lanebus — MIT License.
// `lanebus stats` on a live store (held open read-write by this process): lag,
// committed offsets and oldest unprocessed age in every output format, rates
// from --watch readings, a clean exit on SIGINT, and clear errors.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "durable_store.hpp"
#include "exposition_check.hpp"
#include "process.hpp"
#include "temp_dir.hpp"

using namespace lanebus;
using lanebus::test::Json;

namespace {

constexpr std::int64_t kSec = 1'000'000'000;

std::int64_t wall_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Runs a shell command; returns its exit code and combined output.
int run(const std::string& cmd, std::string* out) {
  out->clear();
  std::FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  int st = ::pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/// A store with topic "orders" (2 lanes): 10 messages in lane 0 created 30 s
/// ago, 4 in lane 1; group "billing" committed 6 of lane 0 and all of lane 1;
/// group "audit" committed nothing. Stays open read-write (a live store).
struct Fixture {
  lanebus::test::TempDir dir;
  std::string store_dir = dir.file("store");
  std::unique_ptr<detail::DurableStore> store;
  detail::TopicRef topic;
  detail::GroupRef billing;
  std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");

  Fixture() {
    StoreOptions o;
    o.directory = store_dir;
    o.durability = Durability::Async;
    store = detail::DurableStore::open(o).value();
    topic = store->open_topic("orders", detail::TopicSpec{2, false, {}}).value();
    append(0, 10, wall_now() - 30 * kSec);
    append(1, 4, 0);
    billing = store->open_group(topic, "billing").value();
    (void)store->open_group(topic, "audit").value();
    REQUIRE(store->commit_offset(billing, 0, 6).ok());
    REQUIRE(store->commit_offset(billing, 1, 4).ok());
  }
  void append(std::uint32_t lane, int n, std::int64_t created_at) {
    for (int i = 0; i < n; ++i) {
      detail::AppendRequest r;
      r.topic_id = topic.id;
      r.lane = lane;
      r.header.created_at_ns = created_at;
      r.payload = "m";
      REQUIRE(store->append(std::move(r)).ok());
    }
  }
};

const Json* group(const Json& topic, const std::string& name) {
  for (const Json& g : std::get<Json::Array>(topic["groups"].v))
    if (g["name"].str() == name) return &g;
  return nullptr;
}

}  // namespace

TEST_CASE("lanebus stats --json reads lag, committed offsets and the oldest unprocessed age of a live store") {
  Fixture f;
  if (f.tool.empty()) {
    MESSAGE("LANEBUS_TOOL not set (built without tools): skipped");
    return;
  }
  std::string out, error;
  REQUIRE(run(f.tool + " stats " + f.store_dir + " --json", &out) == 0);
  auto j = lanebus::test::parse_json(out, &error);
  REQUIRE_MESSAGE(j, error << "\n" << out);
  const Json& t = (*j)["topics"][0];
  CHECK(t["name"].str() == "orders");
  CHECK(t["published"].num() == 14);
  CHECK(t["publish_rate"].is_null());  // one reading: no rate
  CHECK(t["lanes"][0]["end_offset"].num() == 10);
  const Json* b = group(t, "billing");
  REQUIRE(b);
  CHECK((*b)["lag"].num() == 4);
  CHECK((*b)["lanes"][0]["committed"].num() == 6);
  CHECK((*b)["lanes"][1]["lag"].num() == 0);
  CHECK((*b)["oldest_age_seconds"].num() >= 30.0);
  CHECK((*b)["oldest_age_seconds"].num() < 3600.0);
  CHECK((*b)["consume_rate"].is_null());
  CHECK((*b)["drain_seconds"].is_null());
  const Json* a = group(t, "audit");
  REQUIRE(a);
  CHECK((*a)["lag"].num() == 14);

  // The table names the same numbers.
  REQUIRE(run(f.tool + " stats " + f.store_dir, &out) == 0);
  CHECK(out.find("billing") != std::string::npos);
  CHECK(out.find("no rates") != std::string::npos);
}

TEST_CASE("lanebus stats --prom passes the exposition checker and carries per-lane lag") {
  Fixture f;
  if (f.tool.empty()) return;
  std::string out;
  REQUIRE(run(f.tool + " stats " + f.store_dir + " --prom --sla 60", &out) == 0);
  const auto d = lanebus::test::parse_prometheus(out);
  for (const auto& e : d.errors) FAIL_CHECK(e);
  auto lag = d.find("lanebus_consumer_lag_messages", {{"topic", "orders"}, {"group", "billing"}, {"lane", "0"}});
  REQUIRE(lag.size() == 1);
  CHECK(lag[0]->value == 4);
  auto age = d.find("lanebus_oldest_unprocessed_age_seconds", {{"group", "billing"}});
  REQUIRE(age.size() == 1);
  CHECK(age[0]->value >= 30.0);
  // One reading: no rate, so the SLA state is unknown (not a guessed ok).
  auto unknown = d.find("lanebus_sla_state", {{"group", "billing"}, {"state", "unknown"}});
  REQUIRE(unknown.size() == 1);
  CHECK(unknown[0]->value == 1);
  CHECK(d.find("lanebus_consume_rate_per_second").empty());
}

TEST_CASE("lanebus stats --watch derives rates from consecutive readings and exits 0 on SIGINT") {
  Fixture f;
  if (f.tool.empty()) return;
  lanebus::test::Child c({f.tool, "stats", f.store_dir, "--json", "--watch", "0.2"});
  REQUIRE(c.started());
  std::string error;
  auto first = lanebus::test::parse_json(c.read_line(), &error);
  REQUIRE_MESSAGE(first, error);
  CHECK((*first)["interval_seconds"].is_null());
  // Between readings: 50 new messages in lane 1, billing consumes 20 of them.
  f.append(1, 50, 0);
  REQUIRE(f.store->commit_offset(f.billing, 1, 24).ok());
  // The change may straddle readings; the commit comes last, so the first
  // reading with a consume rate shows the final lag.
  bool saw_publish_rate = false, saw_consume_rate = false;
  for (int i = 0; i < 50 && !saw_consume_rate; ++i) {
    auto j = lanebus::test::parse_json(c.read_line(), &error);
    REQUIRE_MESSAGE(j, error);
    const Json& t = (*j)["topics"][0];
    CHECK((*j)["interval_seconds"].num() > 0);
    if (!t["publish_rate"].is_null() && t["publish_rate"].num() > 0) saw_publish_rate = true;
    const Json* b = group(t, "billing");
    REQUIRE(b);
    if ((*b)["consume_rate"].is_null() || (*b)["consume_rate"].num() == 0) continue;
    saw_consume_rate = true;
    CHECK((*b)["lag"].num() == 4 + 30);
    CHECK((*b)["drain_seconds"].num() > 0);
  }
  CHECK(saw_publish_rate);
  CHECK(saw_consume_rate);
  c.signal(SIGINT);
  CHECK(c.wait() == 0);
}

TEST_CASE("lanebus stats on something that is not a store fails with a clear message; bad usage exits 2") {
  lanebus::test::TempDir dir;
  const std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");
  if (tool.empty()) return;
  std::string out;
  CHECK(run(tool + " stats " + dir.path(), &out) == 1);
  CHECK(out.find("cannot read") != std::string::npos);
  CHECK(out.find("not a lanebus store") != std::string::npos);
  CHECK(run(tool + " stats " + dir.path() + "/missing", &out) == 1);
  CHECK(out.find("not a lanebus store") != std::string::npos);
  CHECK(run(tool + " stats", &out) == 2);
  CHECK(run(tool + " stats " + dir.path() + " --watch 0", &out) == 2);
  CHECK(out.find("--watch") != std::string::npos);
  CHECK(run(tool + " stats " + dir.path() + " --json --prom", &out) == 2);
  CHECK(run(tool + " stats --help", &out) == 0);
  CHECK(out.find("usage: lanebus stats") != std::string::npos);
}
