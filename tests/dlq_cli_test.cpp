// lanebus — MIT License.
// `lanebus dlq ...` end to end: the built tool (LANEBUS_TOOL) against a store
// this process keeps open read-write (a live store), checked through DlqStore
// and the topic log; usage errors and a non-store directory.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "dlq.hpp"
#include "durable_store.hpp"
#include "process.hpp"
#include "shell.hpp"
#include "temp_dir.hpp"

using namespace lanebus;

namespace {

using lanebus::test::run_shell;
using lanebus::test::contains;



/// Store with topic "payments" (2 lanes) and three DLQ entries:
/// 1 permanent (lane 0), 2 permanent (lane 1), 3 transient (group "audit").
struct Fixture {
  lanebus::test::TempDir dir;
  std::string store_dir = dir.file("store");
  std::unique_ptr<detail::DurableStore> store;
  std::unique_ptr<detail::DlqStore> dlq;
  detail::TopicRef topic;
  std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");

  Fixture() {
    REQUIRE_FALSE(tool.empty());
    StoreOptions o;
    o.directory = store_dir;
    store = detail::DurableStore::open(o).value();
    detail::TopicSpec spec;
    spec.lanes = 2;
    spec.is_queue = true;
    topic = store->open_topic("payments", spec).value();
    dlq = std::make_unique<detail::DlqStore>(*store);
    for (int i = 1; i <= 3; ++i) {
      DlqEntry e;
      e.topic = "payments";
      e.topic_id = topic.id;
      e.lane = static_cast<std::uint32_t>(i - 1) % 2;
      e.offset = 10 + i;
      e.group = i == 3 ? "audit" : "billing";
      e.key = "acct-" + std::to_string(i);
      e.idempotency_key = "pay-" + std::to_string(i);
      e.payload = "{\"amount\":" + std::to_string(i) + "}";
      e.error_class = i == 3 ? ErrorClass::Transient : ErrorClass::Permanent;
      e.reason = i == 3 ? "timeout" : "deserialize";
      e.error_text = "field amount_cents missing";
      e.attempts = 5;
      REQUIRE(dlq->add(e).ok());
    }
  }
  int dlq_cmd(const std::string& args, std::string* out) { return run_shell(tool + " dlq " + args, out); }
};

}  // namespace

TEST_CASE("lanebus dlq list and show print entries, with filters") {
  Fixture f;
  std::string out;
  REQUIRE(f.dlq_cmd("list " + f.store_dir, &out) == 0);
  CHECK(contains(out, "3 entries"));
  CHECK(contains(out, "deserialize"));
  CHECK(contains(out, "transient"));
  REQUIRE(f.dlq_cmd("list " + f.store_dir + " --class permanent --group billing", &out) == 0);
  CHECK(contains(out, "2 entries"));
  CHECK_FALSE(contains(out, "timeout"));
  REQUIRE(f.dlq_cmd("list " + f.store_dir + " --newer-than 1h --state pending --topic payments", &out) == 0);
  CHECK(contains(out, "3 entries"));
  REQUIRE(f.dlq_cmd("list " + f.store_dir + " --older-than 1h", &out) == 0);
  CHECK(contains(out, "0 entries"));
  REQUIRE(f.dlq_cmd("show " + f.store_dir + " 2", &out) == 0);
  CHECK(contains(out, "entry 2"));
  CHECK(contains(out, "idempotency key  \"pay-2\""));
  CHECK(contains(out, "payload          12 bytes \"{\\\"amount\\\":2}\""));
  CHECK(contains(out, "group billing"));
  REQUIRE(f.dlq_cmd("stats " + f.store_dir, &out) == 0);
  CHECK(contains(out, "pending=3"));
  CHECK(contains(out, "arrivals transient=1 permanent=2 poison=0"));
  CHECK(f.dlq_cmd("show " + f.store_dir + " 42", &out) == 1);
  CHECK(contains(out, "NotFound"));
  CHECK(contains(out, "42"));
}

TEST_CASE("lanebus dlq replay re-appends the messages, refuses a second replay, and is audited") {
  Fixture f;
  std::string out;
  const std::uint64_t end0 = f.store->end_offset(f.topic, 0).value();
  CHECK(f.dlq_cmd("replay " + f.store_dir + " 1", &out) == 2);  // no --operator
  CHECK(contains(out, "--operator"));
  REQUIRE(f.dlq_cmd("replay " + f.store_dir + " --operator alice 1", &out) == 0);
  CHECK(contains(out, "replayed entry 1 -> topic payments lane 0 offset " + std::to_string(end0)));
  auto batch = f.store->read(f.topic, 0, end0).value();
  REQUIRE(batch.messages.size() == 1);
  CHECK(batch.messages[0].idempotency_key == "pay-1");
  CHECK(batch.messages[0].payload == "{\"amount\":1}");
  DlqEntry e = f.dlq->show(1).value();
  CHECK(e.state == DlqState::Replayed);
  CHECK(e.state_changed_by == "alice");

  CHECK(f.dlq_cmd("replay " + f.store_dir + " --operator alice 1", &out) == 1);
  CHECK(contains(out, "Conflict"));
  CHECK(contains(out, "already replayed"));
  CHECK(f.store->end_offset(f.topic, 0).value() == end0 + 1);

  REQUIRE(f.dlq_cmd("archive " + f.store_dir + " --operator bob --class transient", &out) == 0);
  CHECK(f.dlq->show(3).value().state == DlqState::Archived);
  CHECK(f.dlq_cmd("purge " + f.store_dir + " --operator carol 2 999", &out) == 1);
  CHECK(contains(out, "NotFound"));
  CHECK(contains(out, "999"));
  CHECK(f.dlq->show(2).ok());
  REQUIRE(f.dlq_cmd("purge " + f.store_dir + " --operator carol 2", &out) == 0);
  CHECK(f.dlq->show(2).code() == Code::NotFound);

  REQUIRE(f.dlq_cmd("audit " + f.store_dir, &out) == 0);
  CHECK(contains(out, "3 records"));
  CHECK(contains(out, "replay"));
  CHECK(contains(out, "alice"));
  CHECK(contains(out, "archive"));
  CHECK(contains(out, "bob"));
  CHECK(contains(out, "purge"));
  CHECK(contains(out, "carol"));
  auto audit = f.dlq->audit().value();
  REQUIRE(audit.size() == 3);
  CHECK(audit[1].ids == std::vector<std::uint64_t>{3});
}

TEST_CASE("lanebus dlq show and lanebus tail print message headers; a replay keeps them") {
  Fixture f;
  DlqEntry e = f.dlq->show(1).value();
  // tenant="acme", note="a\"b" (a quote, escaped in the output).
  e.headers = std::string("\x02\x00\x17\x00", 4) + std::string("\x06\x04\x00" "tenantacme", 13) +
              std::string("\x04\x03\x00" "notea\"b", 10);
  const std::uint64_t id = f.dlq->add(e).value();
  std::string out;
  REQUIRE(f.dlq_cmd("show " + f.store_dir + " " + std::to_string(id), &out) == 0);
  CHECK(contains(out, "headers          tenant=\"acme\" note=\"a\\\"b\""));
  REQUIRE(f.dlq_cmd("show " + f.store_dir + " 1", &out) == 0);
  CHECK(contains(out, "headers          none"));
  // Replayed by the tool: the appended record carries them, and tail prints them.
  REQUIRE(f.dlq_cmd("replay " + f.store_dir + " --operator alice 1 " + std::to_string(id), &out) == 0);
  const std::uint64_t end = f.store->end_offset(f.topic, 0).value();
  auto batch = f.store->read(f.topic, 0, end - 2).value();
  REQUIRE(batch.messages.size() == 2);
  CHECK(batch.messages[0].headers.empty());
  CHECK(batch.messages[1].headers == e.headers);
  REQUIRE(run_shell(f.tool + " tail " + f.store_dir + " payments --lane 0 --from earliest", &out) == 0);
  CHECK(contains(out, "payload=\"{\\\"amount\\\":1}\" headers={tenant=\"acme\" note=\"a\\\"b\"}\n"));
  CHECK(contains(out, "payload=\"{\\\"amount\\\":1}\"\n"));  // the one without headers: nothing added
}

TEST_CASE("lanebus dlq on a directory that is not a store: exit 1, clear error, nothing created") {
  lanebus::test::TempDir dir;
  std::string tool = lanebus::test::helper_path("LANEBUS_TOOL");
  REQUIRE_FALSE(tool.empty());
  std::string empty = dir.file("empty");
  std::filesystem::create_directory(empty);
  std::string out;
  for (const char* args : {"list", "audit", "replay --operator x 1", "purge --operator x 1"}) {
    std::string a = args;
    std::string sub = a.substr(0, a.find(' '));
    std::string rest = a.find(' ') == std::string::npos ? "" : a.substr(a.find(' '));
    CAPTURE(a);
    CHECK(run_shell(tool + " dlq " + sub + " " + empty + rest, &out) == 1);
    CHECK(contains(out, "not a lanebus store"));
    CHECK(std::filesystem::is_empty(empty));
  }
  CHECK(run_shell(tool + " dlq list " + dir.file("missing"), &out) == 1);
  CHECK_FALSE(std::filesystem::exists(dir.file("missing")));
  CHECK(run_shell(tool + " dlq frobnicate " + empty, &out) == 2);
  CHECK(run_shell(tool + " dlq list " + empty + " --class fatal", &out) == 2);
  CHECK(contains(out, "--class"));
  CHECK(run_shell(tool + " dlq list " + empty + " --older-than soon", &out) == 2);
}
