// lanebus — MIT License.
// DurableStore contract tests: restart, replay, seek by time, retention, queues,
// group commit, map growth and the bad-input / fault cases of doc/durable.md.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <sys/stat.h>
#include <future>
#include <thread>
#include <unistd.h>
#include <vector>

#include "claim_ahead.hpp"
#include "delayed_index.hpp"
#include "durable_store.hpp"
#include "lanebus/lanebus.hpp"
#include "fsync_counter.hpp"
#include "lmdb_store.hpp"
#include "seed.hpp"
#include "store_fixture.hpp"
#include "temp_dir.hpp"
#include "unprivileged.hpp"
#include "wait.hpp"

using lanebus::Code;
using lanebus::Durability;
using lanebus::MessageHeader;
using lanebus::StartPosition;
using lanebus::StoreOptions;
using lanebus::detail::AppendRequest;
using lanebus::detail::ClaimOptions;
using lanebus::detail::DurableStore;
using lanebus::detail::GroupRef;
using lanebus::detail::TopicRef;
using lanebus::detail::TopicSpec;
using lanebus::test::TempDir;
using lanebus::test::wait_until;

namespace {

StoreOptions options_for(const std::string& dir) { return lanebus::test::store_options_for(dir); }

std::unique_ptr<DurableStore> must_open(const StoreOptions& o) { return lanebus::test::must_open_store(o); }

AppendRequest request(const TopicRef& t, std::string key, std::string payload) {
  AppendRequest r;
  r.topic_id = t.id;
  r.lane = lanebus::lane_for_key(key, t.lanes);
  r.key = std::move(key);
  r.payload = std::move(payload);
  return r;
}

// Every message of every lane, from the earliest retained offset.
// The queue "jobs" of `lanes` lanes and its group "workers", both opened.
std::pair<lanebus::Result<TopicRef>, lanebus::Result<GroupRef>> open_jobs(DurableStore& s, std::uint32_t lanes) {
  auto q = s.open_topic("jobs", TopicSpec{lanes, true, {}});
  REQUIRE(q.ok());
  auto g = s.open_group(*q, "workers");
  REQUIRE(g.ok());
  return {std::move(q), std::move(g)};
}

std::vector<lanebus::detail::StoredMessage> read_all(DurableStore& s, const TopicRef& t, std::uint32_t lane) {
  std::vector<lanebus::detail::StoredMessage> out;
  std::uint64_t from = 0;
  for (;;) {
    auto b = s.read(t, lane, from);
    REQUIRE(b.ok());
    if (b->messages.empty()) break;
    for (auto& m : b->messages) out.push_back(std::move(m));
    from = b->next_offset;
  }
  return out;
}

bool contains(std::string_view hay, std::string_view needle) { return hay.find(needle) != std::string_view::npos; }

struct Done {
  lanebus::Status status;
  lanebus::detail::AppendResult result;
};

// Append many requests through the completion form (one shared fsync per
// batch instead of one per message) and wait for all; results in order.
std::vector<Done> append_all(DurableStore& s, std::vector<AppendRequest> reqs) {
  std::vector<Done> out(reqs.size());
  std::atomic<std::size_t> left{reqs.size()};
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto st = s.append_async(std::move(reqs[i]), [&out, &left, i](const lanebus::Status& st,
                                                                  const lanebus::detail::AppendResult& r) {
      out[i] = Done{st, r};
      left.fetch_sub(1);
    });
    if (!st.ok()) {
      out[i].status = st;
      left.fetch_sub(1);
    }
  }
  REQUIRE(wait_until([&] { return left.load() == 0; }, std::chrono::seconds(60)));
  return out;
}

}  // namespace

TEST_CASE("appended messages read back in lane order with their header unchanged") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  auto t = store->open_topic("orders", TopicSpec{4, false, {}});
  REQUIRE(t.ok());
  AppendRequest r = request(*t, "customer-1", "hello");
  r.header.correlation_id = 77;
  r.header.fencing_token = 5;
  r.header.content_type = 3;
  r.header.schema_version = 2;
  r.header.created_at_ns = 123456789;
  r.idempotency_key = "order-1";
  auto a = store->append(r);
  REQUIRE(a.ok());
  CHECK(a->offset == 0);
  CHECK(a->id > 0);
  auto b = store->append(request(*t, "customer-1", "world"));
  REQUIRE(b.ok());
  CHECK(b->offset == 1);
  CHECK(b->id != a->id);

  auto batch = store->read(*t, r.lane, 0);
  REQUIRE(batch.ok());
  REQUIRE(batch->messages.size() == 2);
  const auto& m = batch->messages[0];
  CHECK(m.header.id == a->id);
  CHECK(m.header.correlation_id == 77);
  CHECK(m.header.fencing_token == 5);
  CHECK(m.header.content_type == 3);
  CHECK(m.header.schema_version == 2);
  CHECK(m.header.created_at_ns == 123456789);
  CHECK(m.key == "customer-1");
  CHECK(m.idempotency_key == "order-1");
  CHECK(m.payload == "hello");
  CHECK(batch->messages[1].payload == "world");
  CHECK(batch->messages[1].header.created_at_ns > 0);  // 0 = stamped at append
  CHECK(batch->next_offset == 2);
  CHECK(batch->end_offset == 2);
  auto end = store->end_offset(*t, r.lane);
  REQUIRE(end.ok());
  CHECK(*end == 2);

  // Refused up front, with a named cause.
  auto empty = store->append(request(*t, "k", ""));
  CHECK(empty.code() == Code::InvalidArgument);
  AppendRequest bad_lane = request(*t, "k", "x");
  bad_lane.lane = 4;
  auto bl = store->append(bad_lane);
  CHECK(bl.code() == Code::InvalidArgument);
  CHECK(contains(bl.status().message(), "lane 4 out of range"));
  AppendRequest big_key = request(*t, std::string(70000, 'k'), "x");
  big_key.lane = 0;
  CHECK(store->append(big_key).code() == Code::PayloadTooLarge);
  CHECK(store->read(*t, 9, 0).code() == Code::InvalidArgument);
}

TEST_CASE("restart: a group resumes from its committed offset, per-key order and id uniqueness survive") {
  TempDir dir;
  const std::uint64_t seed = lanebus::test::test_seed("restart");
  std::mt19937_64 rng(seed);
  constexpr int kMessages = 2000, kKeys = 37;
  std::map<std::string, int> next_seq;
  std::set<std::uint64_t> ids;
  {
    auto store = must_open(options_for(dir.path()));
    auto t = store->open_topic("shop.orders", TopicSpec{4, false, {}});
    REQUIRE(t.ok());
    std::vector<AppendRequest> reqs;
    for (int i = 0; i < kMessages; ++i) {
      std::string key = "c" + std::to_string(rng() % kKeys);
      reqs.push_back(request(*t, key, std::to_string(next_seq[key]++)));
    }
    for (const Done& d : append_all(*store, std::move(reqs))) {
      REQUIRE(d.status.ok());
      CHECK(ids.insert(d.result.id).second);
    }
    auto g = store->open_group(*t, "billing");
    REQUIRE(g.ok());
    // Consume half of every lane and commit.
    for (std::uint32_t lane = 0; lane < 4; ++lane) {
      auto end = store->end_offset(*t, lane);
      REQUIRE(end.ok());
      REQUIRE(store->commit_offset(*g, lane, *end / 2).ok());
    }
    REQUIRE(store->close().ok());
  }
  auto store = must_open(options_for(dir.path()));
  auto t = store->open_topic("shop.orders", TopicSpec{4, false, {}});
  REQUIRE(t.ok());
  auto g = store->open_group(*t, "billing", StartPosition::latest());  // existing: start ignored
  REQUIRE(g.ok());
  auto info = store->group_info(*g);
  REQUIRE(info.ok());
  std::map<std::string, int> seen_seq;
  std::size_t total_after = 0;
  for (std::uint32_t lane = 0; lane < 4; ++lane) {
    auto end = store->end_offset(*t, lane);
    REQUIRE(end.ok());
    CHECK((*info)[lane].committed == *end / 2);
    // Per-key order over the whole lane.
    std::map<std::string, int> last;
    for (const auto& m : read_all(*store, *t, lane)) {
      int seq = std::stoi(m.payload);
      auto it = last.find(m.key);
      if (it != last.end()) CHECK(seq == it->second + 1);
      if (it == last.end()) CHECK(seq == 0);
      last[m.key] = seq;
      CHECK(lanebus::lane_for_key(m.key, 4) == lane);
    }
    auto rest = store->read(*t, lane, (*info)[lane].committed, {100000, 1ull << 30});
    REQUIRE(rest.ok());
    total_after += rest->messages.size();
    for (auto& [k, v] : last) seen_seq[k] = v;
  }
  std::size_t expected_rest = 0;
  for (std::uint32_t lane = 0; lane < 4; ++lane) {
    auto end = store->end_offset(*t, lane);
    expected_rest += *end - *end / 2;
  }
  CHECK(total_after == expected_rest);
  for (auto& [k, v] : next_seq) CHECK(seen_seq[k] == v - 1);
  // Ids stay unique after the restart.
  for (const Done& d : append_all(*store, std::vector<AppendRequest>(100, request(*t, "late", "x")))) {
    REQUIRE(d.status.ok());
    CHECK(ids.insert(d.result.id).second);
  }
  auto first = store->reserve_ids(10);
  REQUIRE(first.ok());
  for (std::uint64_t id = *first; id < *first + 10; ++id) CHECK(ids.insert(id).second);
}

TEST_CASE("replay: a later group reads from offset 0; seek by timestamp lands on the right message") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  auto t = store->open_topic("telemetry", TopicSpec{1, false, {}});
  REQUIRE(t.ok());
  const std::int64_t base = 1'700'000'000'000'000'000;
  std::vector<AppendRequest> reqs;
  for (int i = 0; i < 1000; ++i) {
    reqs.push_back(request(*t, "k", "m" + std::to_string(i)));
    reqs.back().header.created_at_ns = base + i * 1000;
  }
  for (const Done& d : append_all(*store, std::move(reqs))) REQUIRE(d.status.ok());
  auto late = store->open_group(*t, "analytics", StartPosition::earliest());
  REQUIRE(late.ok());
  auto info = store->group_info(*late);
  REQUIRE(info.ok());
  CHECK((*info)[0].committed == 0);
  auto all = read_all(*store, *t, 0);
  REQUIRE(all.size() == 1000);
  for (int i = 0; i < 1000; ++i) CHECK(all[i].payload == "m" + std::to_string(i));

  // Exactly at a message, between two messages, before all, after all.
  auto at = store->offset_for_time(*t, 0, base + 500 * 1000);
  REQUIRE(at.ok());
  CHECK(*at == 500);
  auto between = store->offset_for_time(*t, 0, base + 500 * 1000 + 1);
  CHECK(*between == 501);
  CHECK(*store->offset_for_time(*t, 0, 0) == 0);
  CHECK(*store->offset_for_time(*t, 0, base + 10'000'000) == 1000);

  auto timed = store->open_group(*t, "audit", StartPosition::at_time(base + 250 * 1000));
  REQUIRE(timed.ok());
  CHECK((*store->group_info(*timed))[0].committed == 250);
  auto batch = store->read(*t, 0, 250, {1, 1 << 20});
  REQUIRE(batch.ok());
  CHECK(batch->messages.at(0).payload == "m250");

  // Seek at run time.
  REQUIRE(store->seek(*late, StartPosition::at_time(base + 999 * 1000)).ok());
  CHECK((*store->group_info(*late))[0].committed == 999);
  REQUIRE(store->seek(*late, StartPosition::latest()).ok());
  CHECK((*store->group_info(*late))[0].committed == 1000);
  REQUIRE(store->seek(*late, StartPosition::at_offset(42)).ok());
  CHECK((*store->group_info(*late))[0].committed == 42);
  auto newest = store->open_group(*t, "newest", StartPosition::latest());
  CHECK((*store->group_info(*newest))[0].committed == 1000);
  CHECK(store->commit_offset(*late, 0, 5000).code() == Code::InvalidArgument);
}

TEST_CASE("retention by count, bytes and age; a group behind continues from the earliest and the skip is counted") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  lanebus::RetentionOptions by_count;
  by_count.max_count = 100;
  auto t = store->open_topic("r.count", TopicSpec{1, false, by_count});
  REQUIRE(t.ok());
  auto g = store->open_group(*t, "slow");
  REQUIRE(g.ok());
  std::vector<AppendRequest> reqs;
  for (int i = 0; i < 350; ++i) reqs.push_back(request(*t, "k", "m" + std::to_string(i)));
  for (const Done& d : append_all(*store, std::move(reqs))) REQUIRE(d.status.ok());
  REQUIRE(store->run_retention().ok());
  auto li = store->lane_info(*t, 0);
  REQUIRE(li.ok());
  CHECK(li->count == 100);
  CHECK(li->first_offset == 250);
  CHECK(li->end_offset == 350);
  // The group never consumed: it continues from the earliest retained offset.
  auto committed = (*store->group_info(*g))[0].committed;
  CHECK(committed == 0);
  auto before = store->counters().skipped_by_retention;
  auto b = store->read(*t, 0, committed);
  REQUIRE(b.ok());
  CHECK(b->skipped == 250);
  CHECK(b->first_offset == 250);
  CHECK(b->messages.front().payload == "m250");
  CHECK(store->counters().skipped_by_retention == before + 250);
  CHECK(store->counters().retention_deleted >= 250);

  // By bytes: each record is 68 bytes of framing + key + payload.
  lanebus::RetentionOptions by_bytes;
  by_bytes.max_bytes = 10 * (68 + 1 + 100);
  auto tb = store->open_topic("r.bytes", TopicSpec{1, false, by_bytes});
  REQUIRE(tb.ok());
  for (const Done& d : append_all(*store, std::vector<AppendRequest>(50, request(*tb, "k", std::string(100, 'x'))))) {
    REQUIRE(d.status.ok());
  }
  REQUIRE(store->run_retention().ok());
  li = store->lane_info(*tb, 0);
  CHECK(li->count == 10);
  CHECK(li->bytes <= by_bytes.max_bytes);

  // By age: timestamps far in the past go, recent ones stay. The writer's
  // background pass (maintenance_interval 50 ms) does it without run_retention.
  lanebus::RetentionOptions by_age;
  by_age.max_age = std::chrono::hours(1);
  auto ta = store->open_topic("r.age", TopicSpec{1, false, by_age});
  REQUIRE(ta.ok());
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  reqs.clear();
  for (int i = 0; i < 30; ++i) {
    reqs.push_back(request(*ta, "k", "old"));
    reqs.back().header.created_at_ns = now - std::chrono::nanoseconds(std::chrono::hours(2)).count() + i;
  }
  for (int i = 0; i < 5; ++i) reqs.push_back(request(*ta, "k", "new"));
  for (const Done& d : append_all(*store, std::move(reqs))) REQUIRE(d.status.ok());
  CHECK(wait_until([&] { return store->lane_info(*ta, 0)->count == 5; }));
  auto rest = read_all(*store, *ta, 0);
  REQUIRE(rest.size() == 5);
  for (auto& m : rest) CHECK(m.payload == "new");
  // Retention survives a reopen of the topic with other limits (updated, not a conflict).
  CHECK(store->open_topic("r.age", TopicSpec{1, false, {}}).ok());
}

TEST_CASE("retention deletes in bounded batches while publishers keep appending") {
  TempDir dir;
  auto o = options_for(dir.path());
  o.retention_batch = 64;
  auto store = must_open(o);
  lanebus::RetentionOptions ret;
  ret.max_count = 10;
  auto t = store->open_topic("bounded", TopicSpec{2, false, ret});
  REQUIRE(t.ok());
  for (int i = 0; i < 2000; ++i) REQUIRE(store->append_async(request(*t, std::to_string(i), "p"), nullptr).ok());
  REQUIRE(store->run_retention().ok());
  for (std::uint32_t lane = 0; lane < 2; ++lane) CHECK(store->lane_info(*t, lane)->count <= 10);
  CHECK(store->counters().max_batch <= o.max_batch);
}

TEST_CASE("counters: each commit's time, begin to return, is summed in commit_ns, and LMDB's commit call in commit_call_ns") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  auto t = store->open_topic("timed", TopicSpec{1, false, {}});
  REQUIRE(t.ok());
  const auto before = store->counters();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) REQUIRE(store->append(request(*t, "k", "p")).ok());  // one commit each
  const auto elapsed = std::chrono::steady_clock::now() - start;
  const auto after = store->counters();
  CHECK(after.commits >= before.commits + 3);
  CHECK(after.commit_ns > before.commit_ns);
  // The writer commits one transaction at a time, and each append waited for
  // its own: their sum cannot exceed the time around them (1 s for a commit
  // of the writer's own that began before).
  CHECK(after.commit_ns - before.commit_ns <
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count()) + 1'000'000'000);
  // The commit call is a part of each commit's time (Sync: it holds the
  // fsyncs), in every snapshot. (Not compared between two snapshots: the
  // writer's maintenance may commit while one is read.)
  CHECK(after.commit_call_ns > before.commit_call_ns);
  CHECK(after.commit_call_ns <= after.commit_ns);
}

TEST_CASE("claims in the append's transaction: an armed mailbox gets the claim before the append returns") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  auto q = store->open_topic("jobs", TopicSpec{1, true, {}});
  REQUIRE(q.ok());
  auto g = store->open_group(*q, "workers");
  REQUIRE(g.ok());
  std::mutex mu;
  std::vector<std::uint64_t> woken;  // the append listener's end offsets for lane 0
  store->set_append_listener([&](std::uint32_t, std::uint32_t, std::uint64_t end) {
    std::lock_guard l(mu);
    woken.push_back(end);
  });
  lanebus::detail::ClaimAhead box(*q, *g, 0);
  store->watch_claims(&box);
  std::vector<lanebus::detail::ClaimedMessage> got;

  // Not open: arm() does nothing, the append claims nothing.
  box.arm(8, std::chrono::minutes(5));
  REQUIRE(store->append(request(*q, "k", "job0")).ok());
  CHECK_FALSE(box.take(&got));
  CHECK((*store->group_info(*g))[0].in_flight == 0);

  // Open and armed: the commit of the next append claims job0 and job1
  // (both deliverable) and hands them over before append() returns.
  box.open();
  box.arm(8, std::chrono::minutes(5));
  REQUIRE(store->append(request(*q, "k", "job1")).ok());
  REQUIRE(box.take(&got));
  REQUIRE(got.size() == 2);
  CHECK(got[0].message.payload == "job0");
  CHECK(got[1].message.payload == "job1");
  CHECK(got[0].attempt == 1);
  CHECK(got[1].message.header.attempt == 1);
  CHECK((*store->group_info(*g))[0].in_flight == 2);
  CHECK(store->counters().claims_ahead == 2);
  CHECK(wait_until([&] {  // the listener runs after the append's completion
    std::lock_guard l(mu);
    return !woken.empty() && woken.back() == 2;
  }));
  // Taken: the mailbox is disarmed; the next append claims nothing.
  REQUIRE(store->append(request(*q, "k", "job2")).ok());
  CHECK_FALSE(box.has_ready());

  // Armed while the head is in flight: an ordered claim cannot pass it, the
  // mailbox stays armed, and the commit that acks the head... claims nothing
  // by itself (no append, no request); the next append does.
  box.arm(8, std::chrono::minutes(5));
  REQUIRE(store->append(request(*q, "k", "job3")).ok());
  CHECK_FALSE(box.has_ready());
  REQUIRE(store->ack(*g, 0, 0, 1).ok());
  REQUIRE(store->ack(*g, 0, 1, 1).ok());
  CHECK_FALSE(box.has_ready());
  REQUIRE(store->append(request(*q, "k", "job4")).ok());
  got.clear();
  REQUIRE(box.take(&got));
  REQUIRE(got.size() == 3);
  CHECK(got[0].message.payload == "job2");
  CHECK(got[2].message.payload == "job4");

  // A request claims without an append, and wakes the lane through the
  // listener once the claims are in the mailbox.
  for (const auto& cm : got) REQUIRE(store->ack(*g, 0, cm.message.offset, cm.attempt).ok());
  box.close(&got);  // (empty)
  box.open();
  REQUIRE(store->append(request(*q, "k", "job5")).ok());  // not armed: stays unclaimed
  CHECK((*store->group_info(*g))[0].in_flight == 0);
  {
    std::lock_guard l(mu);
    woken.clear();
  }
  REQUIRE(box.request(4, std::chrono::minutes(5)));
  CHECK_FALSE(box.request(4, std::chrono::minutes(5)));  // one request at a time
  REQUIRE(store->request_claims(&box).ok());
  REQUIRE(wait_until([&] { return box.has_ready(); }));
  got.clear();
  REQUIRE(box.take(&got));
  REQUIRE(got.size() == 1);
  CHECK(got[0].message.payload == "job5");
  REQUIRE(wait_until([&] {
    std::lock_guard l(mu);
    return woken.size() >= 1;  // the hand-over, and the refused second request
  }));
  store->unwatch_claims(&box);
  REQUIRE(store->close().ok());
}

TEST_CASE("claims in the append's transaction: a closed mailbox's claims are given back, uncounted") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  auto q = store->open_topic("jobs", TopicSpec{2, true, {}});
  REQUIRE(q.ok());
  auto g = store->open_group(*q, "workers");
  REQUIRE(g.ok());
  lanebus::detail::ClaimAhead box(*q, *g, 1);
  store->watch_claims(&box);
  box.open();
  box.arm(8, std::chrono::minutes(5));
  AppendRequest r = request(*q, "k", "job0");
  r.lane = 1;
  REQUIRE(store->append(r).ok());
  std::vector<lanebus::detail::ClaimedMessage> back;
  box.close(&back);
  REQUIRE(back.size() == 1);
  CHECK((*store->group_info(*g))[1].in_flight == 1);
  // Closed: arm() does nothing, the next append claims nothing.
  box.arm(8, std::chrono::minutes(5));
  REQUIRE(store->append(r).ok());
  CHECK_FALSE(box.has_ready());
  // Given back: deliverable at once, its attempt not counted.
  REQUIRE(store->give_back_claims(back, *g, 1).ok());
  CHECK((*store->group_info(*g))[1].in_flight == 0);
  ClaimOptions o;
  o.visibility = std::chrono::minutes(5);
  auto c = store->claim_batch(*g, 1, 8, o);
  REQUIRE(c.ok());
  REQUIRE(c->size() == 2);
  CHECK((*c)[0].attempt == 1);
  CHECK((*c)[0].message.offset == 0);
  // Giving back a claim that is gone (acked meanwhile) is not an error, and
  // changes nothing.
  REQUIRE(store->ack(*g, 1, 0, 1).ok());
  REQUIRE(store->give_back_claims(back, *g, 1).ok());
  CHECK((*store->group_info(*g))[1].in_flight == 1);
  CHECK((*store->group_info(*g))[1].committed == 1);
  store->unwatch_claims(&box);
  CHECK(store->request_claims(&box).ok());  // unwatched and closed: the writer skips it
  REQUIRE(store->close().ok());
  CHECK(store->request_claims(&box).code() == Code::ShutDown);
}

TEST_CASE("claims in the append's transaction: a pipelined mailbox claims behind its own claims in flight, in order") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  auto [q, g] = open_jobs(*store, 1);
  using lanebus::detail::ClaimedMessage;
  lanebus::detail::ClaimAhead box(*q, *g, 0);
  store->watch_claims(&box);
  box.open();
  box.arm(2, std::chrono::minutes(5), true);
  auto in_flight = [&] { return (*store->group_info(*g))[0].in_flight; };
  std::vector<ClaimedMessage> head, got;
  REQUIRE(store->append(request(*q, "k", "job0")).ok());
  REQUIRE(box.take(&head));
  REQUIRE(head.size() == 1);

  // job0 is in flight, handed to this mailbox: the commits of the next
  // appends claim behind it, and the mailbox stays armed.
  REQUIRE(store->append(request(*q, "k", "job1")).ok());
  REQUIRE(store->append(request(*q, "k", "job2")).ok());
  REQUIRE(box.take(&got));
  REQUIRE(got.size() == 2);
  CHECK(got[0].message.payload == "job1");
  CHECK(got[1].message.payload == "job2");
  CHECK(got[1].attempt == 1);
  CHECK(store->counters().claims_passed == 2);
  CHECK(in_flight() == 3);

  // At most `max` (2) wait in the mailbox: the third append is not claimed.
  std::vector<ClaimedMessage> waiting;
  for (int i = 3; i <= 5; ++i) REQUIRE(store->append(request(*q, "k", "job" + std::to_string(i))).ok());
  CHECK(in_flight() == 5);

  // The consumer retries job0: it disarms (a new generation) and gives back
  // what waits and what it had taken behind job0.
  box.disarm(&waiting);
  REQUIRE(waiting.size() == 2);
  CHECK(waiting[0].message.payload == "job3");
  REQUIRE(store->give_back_claims(waiting, *g, 0).ok());
  REQUIRE(store->give_back_claims(got, *g, 0).ok());
  REQUIRE(store->release(*g, 0, 0, 1, std::chrono::milliseconds(0)).ok());
  CHECK(in_flight() == 1);  // job0, deliverable again

  // A claim made under the old generation (a commit that was under way) is
  // refused and left for the writer to give back.
  std::uint32_t max = 0;
  ClaimOptions wo;
  std::uint64_t old_gen = 0;
  box.arm(2, std::chrono::minutes(5), true);
  REQUIRE(box.wanted(&max, &wo, &old_gen));
  CHECK(max == 2);
  std::vector<ClaimedMessage> none;
  box.disarm(&none);
  std::vector<ClaimedMessage> late(1);
  late[0].message.offset = 6;
  CHECK_FALSE(box.offer(&late, old_gen));
  CHECK(late.size() == 1);

  // Armed again: job0 comes back alone at attempt 2, and a redelivery is
  // never passed: the next append claims nothing behind it.
  box.arm(2, std::chrono::minutes(5), true);
  REQUIRE(store->append(request(*q, "k", "job6")).ok());
  head.clear();
  REQUIRE(box.take(&head));
  REQUIRE(head.size() == 1);
  CHECK(head[0].message.payload == "job0");
  CHECK(head[0].attempt == 2);
  REQUIRE(store->append(request(*q, "k", "job7")).ok());
  CHECK_FALSE(box.has_ready());

  // job0 acked: the next append claims from job1 on, first attempts.
  REQUIRE(store->ack(*g, 0, 0, 2).ok());
  REQUIRE(store->append(request(*q, "k", "job8")).ok());
  got.clear();
  REQUIRE(box.take(&got));
  REQUIRE(got.size() == 2);
  CHECK(got[0].message.payload == "job1");
  CHECK(got[0].attempt == 1);
  CHECK(got[1].message.payload == "job2");

  // Another consumer's claim is never passed.
  for (const auto& cm : got) REQUIRE(store->ack(*g, 0, cm.message.offset, cm.attempt).ok());
  ClaimOptions other;
  other.visibility = std::chrono::minutes(5);
  auto theirs = store->claim_batch(*g, 0, 1, other);
  REQUIRE(theirs.ok());
  REQUIRE(theirs->size() == 1);
  CHECK((*theirs)[0].message.payload == "job3");
  REQUIRE(store->append(request(*q, "k", "job9")).ok());
  CHECK_FALSE(box.has_ready());

  box.close(&got);
  store->unwatch_claims(&box);
  REQUIRE(store->close().ok());
}

TEST_CASE("queue: the attempt is stored before claim returns; ack advances; expiry redelivers; stale acks are refused") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  auto q = store->open_topic("jobs", TopicSpec{1, true, {}});
  REQUIRE(q.ok());
  auto g = store->open_group(*q, "workers");
  REQUIRE(g.ok());
  for (int i = 0; i < 3; ++i) REQUIRE(store->append(request(*q, "k", "job" + std::to_string(i))).ok());

  ClaimOptions long_claim;
  long_claim.visibility = std::chrono::minutes(5);
  auto c1 = store->claim(*g, 0, long_claim);
  REQUIRE(c1.ok());
  REQUIRE(c1->has_value());
  CHECK((*c1)->attempt == 1);
  CHECK((*c1)->message.payload == "job0");
  CHECK((*c1)->message.header.attempt == 1);
  CHECK((*store->group_info(*g))[0].in_flight == 1);
  // Ordered: the head is in flight, nothing else is deliverable.
  auto none = store->claim(*g, 0, long_claim);
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());
  // Give it back (retry now): redelivered with attempt 2; the old claim is stale.
  REQUIRE(store->release(*g, 0, 0, 1, std::chrono::milliseconds(0)).ok());
  auto c2 = store->claim(*g, 0, long_claim);
  REQUIRE(c2->has_value());
  CHECK((*c2)->attempt == 2);
  CHECK((*c2)->message.offset == 0);
  auto stale = store->ack(*g, 0, 0, 1);
  CHECK(stale.code() == Code::StaleToken);
  CHECK(contains(stale.message(), "redelivered"));
  REQUIRE(store->ack(*g, 0, 0, 2).ok());
  CHECK(store->ack(*g, 0, 0, 2).code() == Code::NotFound);
  CHECK((*store->group_info(*g))[0].committed == 1);

  // A short claim expires and is redelivered with attempt + 1.
  ClaimOptions short_claim;
  short_claim.visibility = std::chrono::milliseconds(30);
  auto c3 = store->claim(*g, 0, short_claim);
  REQUIRE(c3->has_value());
  CHECK((*c3)->message.payload == "job1");
  std::optional<lanebus::detail::ClaimedMessage> again;
  CHECK(wait_until([&] {
    // The redelivery is claimed for long: offset 1 must stay in flight below
    // (a 30 ms claim could expire again on a loaded machine before the next claim).
    auto r = store->claim(*g, 0, long_claim);
    if (r.ok() && r->has_value()) again = **r;
    return again.has_value();
  }));
  REQUIRE(again.has_value());
  CHECK(again->message.offset == 1);
  CHECK(again->attempt == 2);
  CHECK(store->counters().redeliveries >= 2);

  // Unordered claims: competing consumers inside one lane; out-of-order acks advance correctly.
  ClaimOptions unordered = long_claim;
  unordered.ordered = false;
  auto c4 = store->claim(*g, 0, unordered);  // offset 2 (offset 1 is in flight)
  REQUIRE(c4->has_value());
  CHECK((*c4)->message.offset == 2);
  REQUIRE(store->ack(*g, 0, 2, 1).ok());
  CHECK((*store->group_info(*g))[0].committed == 1);
  REQUIRE(store->ack(*g, 0, 1, again->attempt).ok());
  CHECK((*store->group_info(*g))[0].committed == 3);
  CHECK((*store->group_info(*g))[0].in_flight == 0);
  auto empty = store->claim(*g, 0, unordered);
  REQUIRE(empty.ok());
  CHECK_FALSE(empty->has_value());
}

TEST_CASE("claims and attempt counts persist across a restart") {
  TempDir dir;
  {
    auto store = must_open(options_for(dir.path()));
    auto q = store->open_topic("jobs", TopicSpec{1, true, {}});
    auto g = store->open_group(*q, "w");
    REQUIRE(store->append(request(*q, "k", "poison")).ok());
    ClaimOptions c;
    c.visibility = std::chrono::milliseconds(1);
    auto a = store->claim(*g, 0, c);
    REQUIRE(a->has_value());
    CHECK((*a)->attempt == 1);
  }  // "crash" without ack
  auto store = must_open(options_for(dir.path()));
  auto q = store->find_topic("jobs");
  REQUIRE(q.ok());
  auto g = store->find_group(*q, "w");
  REQUIRE(g.ok());
  std::optional<lanebus::detail::ClaimedMessage> m;
  CHECK(wait_until([&] {
    auto r = store->claim(*g, 0);
    if (r.ok() && r->has_value()) m = **r;
    return m.has_value();
  }));
  REQUIRE(m.has_value());
  CHECK(m->attempt == 2);
  CHECK(m->message.payload == "poison");
}

TEST_CASE("topics: another lane count or kind is a Conflict; invalid names are refused") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  REQUIRE(store->open_topic("a.b", TopicSpec{4, false, {}}).ok());
  auto c = store->open_topic("a.b", TopicSpec{8, false, {}});
  CHECK(c.code() == Code::Conflict);
  CHECK(contains(c.status().message(), "4 lanes"));
  CHECK(store->open_topic("a.b", TopicSpec{4, true, {}}).code() == Code::Conflict);
  CHECK(store->open_topic("Bad Name", TopicSpec{}).code() == Code::InvalidName);
  CHECK(store->open_topic("zero", TopicSpec{0, false, {}}).code() == Code::InvalidArgument);
  CHECK(store->find_topic("missing").code() == Code::NotFound);
  auto topics = store->list_topics();
  REQUIRE(topics.ok());
  CHECK(topics->size() == 1);
}

TEST_CASE("opening the same directory twice in one process is Busy") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  auto second = DurableStore::open(options_for(dir.path()));
  CHECK(second.code() == Code::Busy);
  CHECK(contains(second.status().message(), "already open in this process"));
  auto ro = options_for(dir.path());
  ro.read_only = true;
  CHECK(DurableStore::open(ro).code() == Code::Busy);
  REQUIRE(store->close().ok());
  CHECK(DurableStore::open(options_for(dir.path())).ok());
}

TEST_CASE("one batch appending to more lanes than the writer keeps cursors for reads back whole and in order") {
  // The writer appends through a cursor per lane, for the first 16 lanes of
  // a batch (WriteCtx::reserve_log); later lanes use mdb_put. Both kinds,
  // interleaved, in two topics whose lanes sit side by side in the log, with
  // page splits moving every open cursor's entries.
  TempDir dir;
  const std::uint32_t kLanes = 40;
  const int kPerLane = 60;
  {
    auto store = must_open(options_for(dir.path()));
    auto a = store->open_topic("a", TopicSpec{kLanes, false, {}});
    auto b = store->open_topic("b", TopicSpec{3, false, {}});
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    std::vector<AppendRequest> reqs;
    for (int i = 0; i < kPerLane; ++i) {
      for (std::uint32_t lane = 0; lane < kLanes; ++lane) {
        AppendRequest r = request(*a, "k", std::to_string(lane) + "/" + std::to_string(i) + std::string(lane % 7 * 40, 'x'));
        r.lane = (lane * 7 + static_cast<std::uint32_t>(i)) % kLanes;  // every batch visits the lanes in a new order
        r.payload = std::to_string(r.lane) + "/" + std::to_string(i) + std::string(lane % 7 * 40, 'x');
        reqs.push_back(std::move(r));
      }
      AppendRequest r = request(*b, "k", "b" + std::to_string(i));
      r.lane = static_cast<std::uint32_t>(i) % 3;
      reqs.push_back(std::move(r));
    }
    for (const Done& d : append_all(*store, std::move(reqs))) REQUIRE(d.status.ok());
    CHECK(store->counters().commits < static_cast<std::uint64_t>(kPerLane * (kLanes + 1)));  // batched
    REQUIRE(store->close().ok());
  }
  auto store = must_open(options_for(dir.path()));
  auto a = store->find_topic("a");
  auto b = store->find_topic("b");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  for (std::uint32_t lane = 0; lane < kLanes; ++lane) {
    auto got = read_all(*store, *a, lane);
    REQUIRE(got.size() == static_cast<std::size_t>(kPerLane));
    for (int i = 0; i < kPerLane; ++i) {
      const auto& m = got[static_cast<std::size_t>(i)];
      CHECK(m.offset == static_cast<std::uint64_t>(i));
      const std::string head = std::to_string(lane) + "/" + std::to_string(i);
      CHECK_MESSAGE(m.payload.compare(0, head.size(), head) == 0, "lane " << lane << " offset " << i << ": " << m.payload.substr(0, 20));
    }
  }
  for (std::uint32_t lane = 0; lane < 3; ++lane) {
    auto got = read_all(*store, *b, lane);
    REQUIRE(got.size() == static_cast<std::size_t>(kPerLane / 3));
    for (std::size_t j = 0; j < got.size(); ++j) CHECK(got[j].payload == "b" + std::to_string(j * 3 + lane));
  }
}

TEST_CASE("the map is reserved at map_size_max; at the maximum appends fail with MapFull, nothing acknowledged is lost") {
  TempDir dir;
  auto o = options_for(dir.path());
  o.map_size_initial = 256 << 10;
  o.map_size_max = 2 << 20;
  std::vector<std::string> acked;
  Code failure = Code::Ok;
  std::string failure_message;
  {
    auto store = must_open(o);
    CHECK(store->map_size() == o.map_size_max);  // reserved at open: it never moves under a read
    auto t = store->open_topic("fill", TopicSpec{1, false, {}});
    auto q = store->open_topic("work", TopicSpec{1, true, {}});
    REQUIRE(t.ok());
    REQUIRE(q.ok());
    auto g = store->open_group(*q, "w");
    REQUIRE(store->append(request(*q, "k", "job")).ok());
    auto claimed = store->claim(*g, 0);
    REQUIRE(claimed->has_value());
    // Fill in chunks through the completion form until refused.
    for (int chunk = 0; chunk < 100 && failure == Code::Ok; ++chunk) {
      std::vector<AppendRequest> reqs;
      for (int i = 0; i < 100; ++i) reqs.push_back(request(*t, "k", std::to_string(chunk * 100 + i) + std::string(1000, 'x')));
      std::vector<std::string> payloads;
      for (auto& r : reqs) payloads.push_back(r.payload);
      auto done = append_all(*store, std::move(reqs));
      for (std::size_t i = 0; i < done.size(); ++i) {
        if (done[i].status.ok()) {
          // A later, smaller batch may still fit after a refused one: it is
          // acknowledged and must then be stored like any other.
          acked.push_back(payloads[i]);
        } else if (failure == Code::Ok) {
          failure = done[i].status.code();
          failure_message = std::string(done[i].status.message());
        }
      }
    }
    CHECK(failure == Code::MapFull);
    CHECK(contains(failure_message, "map_size_max"));
    CHECK(store->counters().map_growths == 0);
    CHECK(store->map_size() == o.map_size_max);
    // The store keeps running: reads work; a lone append may still fit in the
    // space a whole refused batch did not (then it is acknowledged and kept),
    // else it fails cleanly with MapFull.
    auto lone = store->append(request(*t, "k", std::string(1000, 'y')));
    CHECK((lone.ok() || lone.code() == Code::MapFull));
    if (lone.ok()) acked.push_back(std::string(1000, 'y'));
    CHECK(store->end_offset(*t, 0).ok());
    // Acks still commit (headroom for small bookkeeping writes).
    auto ack = store->ack(*g, 0, 0, 1);
    INFO(ack.to_string());
    CHECK((ack.ok() || ack.code() == Code::MapFull));
  }
  o.map_size_max = 64 << 20;
  auto store = must_open(o);
  auto t = store->find_topic("fill");
  REQUIRE(t.ok());
  auto all = read_all(*store, *t, 0);
  REQUIRE(all.size() == acked.size());
  for (std::size_t i = 0; i < acked.size(); ++i) CHECK(all[i].payload == acked[i]);
  CHECK(store->append(request(*t, "k", "more room now")).ok());
}

TEST_CASE("without the reservation the map doubles on MDB_MAP_FULL up to map_size_max, then MapFull") {
  // The path a process takes when the OS refuses map_size_max of address space.
  TempDir dir;
  lanebus::detail::LmdbEnv::Config c;
  c.path = dir.path();
  c.reserve_map = false;
  c.map_size_initial = 256 << 10;
  c.map_size_max = 1 << 20;
  auto env = lanebus::detail::LmdbEnv::open(c);
  REQUIRE(env.ok());
  CHECK((*env)->map_size() == c.map_size_initial);
  CHECK_FALSE((*env)->map_at_max());
  lanebus::Status last;
  int written = 0;
  for (int round = 0; round < 64 && last.code() != Code::MapFull; ++round) {
    auto txn = (*env)->begin_write();
    REQUIRE(txn.ok());
    auto dbi = (*env)->open_dbi(*txn, nullptr, false);
    REQUIRE(dbi.ok());
    lanebus::Status s;
    for (int i = 0; i < 16 && s.ok(); ++i) s = txn->put(*dbi, "k" + std::to_string(written + i), std::string(4000, 'x'));
    if (s.ok()) s = txn->commit();
    if (s.ok()) {
      written += 16;
      continue;
    }
    txn->abort();
    REQUIRE(s.code() == Code::MapFull);
    last = (*env)->grow_map();
  }
  CHECK(last.code() == Code::MapFull);
  CHECK(contains(last.message(), "map_size_max"));
  CHECK((*env)->map_growths() == 2);  // 256 KiB -> 512 KiB -> 1 MiB
  CHECK((*env)->map_size() == c.map_size_max);
  CHECK((*env)->map_at_max());
  CHECK(written > 0);
}

TEST_CASE("a file where the store directory should be is a clear error") {
  TempDir dir;
  std::ofstream(dir.file("bus")) << "not a directory";
  auto s = DurableStore::open(options_for(dir.file("bus")));
  CHECK(s.code() == Code::InvalidArgument);
  CHECK(contains(s.status().message(), "a file exists where the store directory should be"));
  CHECK(DurableStore::open(options_for("")).code() == Code::InvalidArgument);
}

TEST_CASE("a garbage data.mdb is Corruption; the file is left untouched") {
  TempDir dir;
  ::mkdir(dir.file("bus").c_str(), 0700);
  std::string garbage(64 << 10, '\0');
  std::mt19937 rng(1234);
  for (char& c : garbage) c = static_cast<char>(rng());
  std::ofstream(dir.file("bus/data.mdb"), std::ios::binary) << garbage;
  auto s = DurableStore::open(options_for(dir.file("bus")));
  CHECK(s.code() == Code::Corruption);
  CHECK(contains(s.status().message(), "MDB_INVALID"));
  std::ifstream in(dir.file("bus/data.mdb"), std::ios::binary);
  std::string back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(back == garbage);
  // A text file of a few bytes, too.
  std::ofstream(dir.file("bus/data.mdb"), std::ios::trunc) << "hello";
  CHECK(DurableStore::open(options_for(dir.file("bus"))).code() == Code::Corruption);
}

TEST_CASE("a foreign LMDB environment and a layout version from the future are refused") {
  TempDir dir;
  {
    lanebus::detail::LmdbEnv::Config c;
    c.path = dir.file("foreign");
    auto env = lanebus::detail::LmdbEnv::open(c);
    REQUIRE(env.ok());
    auto txn = (*env)->begin_write();
    REQUIRE(txn.ok());
    auto main_dbi = (*env)->open_dbi(*txn, nullptr, false);
    REQUIRE(main_dbi.ok());
    REQUIRE(txn->put(*main_dbi, "someone", "else's data").ok());
    REQUIRE(txn->commit().ok());
  }
  auto f = DurableStore::open(options_for(dir.file("foreign")));
  CHECK(f.code() == Code::Corruption);
  CHECK(contains(f.status().message(), "foreign LMDB environment"));

  { auto s = must_open(options_for(dir.file("future"))); }
  {
    lanebus::detail::LmdbEnv::Config c;
    c.path = dir.file("future");
    auto env = lanebus::detail::LmdbEnv::open(c);
    REQUIRE(env.ok());
    auto txn = (*env)->begin_write();
    auto meta = (*env)->open_dbi(*txn, "meta", false);
    REQUIRE(meta.ok());
    REQUIRE(txn->put(*meta, "layout", lanebus::detail::encode_layout_record(lanebus::detail::kLayoutVersion + 1)).ok());
    REQUIRE(txn->commit().ok());
  }
  auto v = DurableStore::open(options_for(dir.file("future")));
  CHECK(v.code() == Code::VersionTooNew);
  CHECK(contains(v.status().message(), "layout version " + std::to_string(lanebus::detail::kLayoutVersion + 1)));
}

TEST_CASE("a record that fails its checksum is Corruption naming topic, lane and offset") {
  TempDir dir;
  {
    auto store = must_open(options_for(dir.path()));
    auto t = store->open_topic("crc", TopicSpec{1, false, {}});
    for (int i = 0; i < 3; ++i) REQUIRE(store->append(request(*t, "k", "payload-" + std::to_string(i))).ok());
  }
  {
    lanebus::detail::LmdbEnv::Config c;
    c.path = dir.path();
    auto env = lanebus::detail::LmdbEnv::open(c);
    REQUIRE(env.ok());
    auto txn = (*env)->begin_write();
    auto log = (*env)->open_dbi(*txn, "log", false);
    REQUIRE(log.ok());
    // Topic id 1, lane 0, offset 1 (big-endian key).
    std::string key(16, '\0');
    key[3] = 1;
    key[15] = 1;
    auto v = txn->get(*log, key);
    REQUIRE(v.ok());
    std::string flipped(*v);
    flipped[flipped.size() - 6] ^= 0x01;  // a payload bit
    REQUIRE(txn->put(*log, key, flipped).ok());
    REQUIRE(txn->commit().ok());
  }
  auto store = must_open(options_for(dir.path()));
  auto t = store->find_topic("crc");
  auto b = store->read(*t, 0, 0);
  CHECK(b.code() == Code::Corruption);
  CHECK(contains(b.status().message(), "\"crc\" lane 0 offset 1: record checksum mismatch"));
  auto first = store->read(*t, 0, 0, {1, 1 << 20});
  REQUIRE(first.ok());  // the intact record before it still reads
  CHECK(first->messages.at(0).payload == "payload-0");
}

namespace {

// "CODE MESSAGE" of the open; the store is closed at once if it did open.
std::string open_status(const StoreOptions& o) {
  auto s = DurableStore::open(o);
  if (!s.ok()) return lanebus::test::status_line(s.status());
  (void)(*s)->close();
  return "OK";
}

}  // namespace

TEST_CASE("permission denied is a clear error (as root, checked as nobody in a child)") {
  TempDir dir;
  // The test directory (mode 0700, ours) must be searchable by nobody.
  REQUIRE(::chmod(dir.path().c_str(), 0711) == 0);
  const std::string locked = dir.file("locked");
  REQUIRE(::mkdir(locked.c_str(), 0500) == 0);  // no write permission for its owner
  if (::geteuid() == 0) REQUIRE(::chown(locked.c_str(), lanebus::test::kNobody, lanebus::test::kNobody) == 0);
  SUBCASE("DurableStore::open") {
    const std::string r = lanebus::test::as_unprivileged([&] { return open_status(options_for(locked)); });
    INFO(r);
    CHECK(r.rfind("PermissionDenied ", 0) == 0);
    CHECK(contains(r, "EACCES"));
    CHECK(contains(r, "locked"));
    CHECK(contains(r, "check the owner and mode"));
  }
  SUBCASE("Bus::open with the store in that directory") {
    const std::string r = lanebus::test::as_unprivileged([&] {
      lanebus::BusOptions o;
      o.workers = 1;
      o.store = options_for(locked);
      auto bus = lanebus::Bus::open(o);
      return bus.ok() ? std::string("OK") : lanebus::test::status_line(bus.status());
    });
    INFO(r);
    CHECK(r.rfind("PermissionDenied ", 0) == 0);
    CHECK(contains(r, "EACCES"));
  }
  CHECK(::access(dir.file("locked/data.mdb").c_str(), F_OK) != 0);  // nothing was created
}

TEST_CASE("a store whose data file the user may not read or write is a clear error, also read-only") {
  TempDir dir;
  REQUIRE(::chmod(dir.path().c_str(), 0711) == 0);
  const std::string store_dir = dir.file("bus");
  {
    auto store = must_open(options_for(store_dir));
    auto t = store->open_topic("kept", TopicSpec{1, false, {}});
    REQUIRE(t.ok());
    AppendRequest r;
    r.topic_id = t->id;
    r.payload = "acknowledged";
    REQUIRE(store->append(std::move(r)).ok());
    REQUIRE(store->close().ok());
  }
  // The directory is open to all; data.mdb is open to nobody but root.
  REQUIRE(::chmod(store_dir.c_str(), 0755) == 0);
  REQUIRE(::chmod((store_dir + "/data.mdb").c_str(), 0000) == 0);
  const std::string rw = lanebus::test::as_unprivileged([&] { return open_status(options_for(store_dir)); });
  CHECK_MESSAGE(rw.rfind("PermissionDenied ", 0) == 0, rw);
  CHECK_MESSAGE(contains(rw, "EACCES"), rw);
  StoreOptions ro = options_for(store_dir);
  ro.read_only = true;
  const std::string ro_r = lanebus::test::as_unprivileged([&] { return open_status(ro); });
  CHECK_MESSAGE(ro_r.rfind("PermissionDenied ", 0) == 0, ro_r);
  // The refused opens changed nothing: with the mode restored the store opens
  // and the acknowledged message is there.
  REQUIRE(::chmod((store_dir + "/data.mdb").c_str(), 0600) == 0);
  auto store = must_open(options_for(store_dir));
  auto t = store->find_topic("kept");
  REQUIRE(t.ok());
  auto b = store->read(*t, 0, 0);
  REQUIRE(b.ok());
  REQUIRE(b->messages.size() == 1);
  CHECK(b->messages[0].payload == "acknowledged");
}

TEST_CASE("read-only open works on a live store, refuses writes, and refuses a non-store directory") {
  TempDir dir;
  auto ro = options_for(dir.file("nothing"));
  ro.read_only = true;
  auto missing = DurableStore::open(ro);
  CHECK(missing.code() == Code::NotFound);
  ::mkdir(dir.file("empty").c_str(), 0700);
  ro.directory = dir.file("empty");
  auto empty = DurableStore::open(ro);
  CHECK(empty.code() == Code::NotFound);
  CHECK(contains(empty.status().message(), "not a lanebus store"));
  struct stat st {};
  CHECK(::stat(dir.file("empty/lock.mdb").c_str(), &st) != 0);  // nothing created

  // Live store: written here, read through a read-only handle in a child-like
  // second open is not allowed in one process, so close the writer first.
  {
    auto store = must_open(options_for(dir.file("live")));
    auto t = store->open_topic("x", TopicSpec{2, false, {}});
    REQUIRE(store->append(request(*t, "a", "1")).ok());
  }
  ro.directory = dir.file("live");
  auto r = DurableStore::open(ro);
  REQUIRE(r.ok());
  auto t = (*r)->find_topic("x");
  REQUIRE(t.ok());
  CHECK((*r)->open_topic("y", TopicSpec{}).code() == Code::InvalidArgument);
  CHECK((*r)->append(request(*t, "a", "2")).code() == Code::InvalidArgument);
  auto topics = (*r)->list_topics();
  REQUIRE(topics.ok());
  CHECK(topics->size() == 1);
}

TEST_CASE("group commit: concurrent appends share transactions and every completion runs once") {
  TempDir dir;
  // No maintenance step inside the measured burst: its transaction commits
  // (counted in `commits`) but usually changes nothing, and LMDB neither writes
  // nor syncs an empty transaction, so real >= commits failed whenever the
  // burst outlasted options_for's 50 ms interval (every run under TSan).
  StoreOptions o = options_for(dir.path());
  o.maintenance_interval = std::chrono::hours(1);
  auto store = must_open(o);
  auto t = store->open_topic("gc", TopicSpec{4, false, {}});
  REQUIRE(t.ok());
  constexpr int kThreads = 4, kPer = 500;
  std::atomic<int> completions{0}, failures{0};
  const auto before = store->counters();
  const unsigned long long real_before = lanebus::test::real_sync_count();
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int i = 0; i < kPer; ++i) {
        auto s = store->append_async(request(*t, "t" + std::to_string(th), std::to_string(i)),
                                     [&](const lanebus::Status& st, const lanebus::detail::AppendResult&) {
                                       completions.fetch_add(1);
                                       if (!st.ok()) failures.fetch_add(1);
                                     });
        if (!s.ok()) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wait_until([&] { return completions.load() == kThreads * kPer; }));
  CHECK(failures.load() == 0);
  auto c = store->counters();
  CHECK(c.appends == kThreads * kPer);
  CHECK(c.max_batch > 1);  // 2000 queued appends cannot each get their own fsync'd txn
  CHECK(c.commits < c.appends);
  // Sync mode: one real fdatasync per commit (LMDB's mdb_env_sync; the meta page
  // goes through an O_DSYNC descriptor), shared by the batch. Counted by the
  // LD_PRELOAD shim (tests/support/fsync_counter.cpp), not by the store.
  const unsigned long long real = lanebus::test::real_sync_count() - real_before;
  const std::uint64_t commits = c.commits - before.commits;
  MESSAGE("appends=" << kThreads * kPer << " commits=" << commits << " real_syncs=" << real);
  CHECK(real >= 1);
  CHECK(real < static_cast<unsigned long long>(kThreads * kPer));
  // Every Sync commit that wrote reached the disk; LMDB skips the fsync of a
  // commit that changed nothing (a maintenance step with no work: slack 2).
  CHECK(real + 2 >= commits);
  CHECK(real <= commits + 2);  // and little else synced (slack: a maintenance flush)
  // Per-thread order within its key.
  for (int th = 0; th < kThreads; ++th) {
    std::string key = "t" + std::to_string(th);
    int expect = 0;
    for (const auto& m : read_all(*store, *t, lanebus::lane_for_key(key, 4))) {
      if (m.key == key) CHECK(std::stoi(m.payload) == expect++);
    }
    CHECK(expect == kPer);
  }
}

TEST_CASE("append_batch: one request to the writer, one commit; a refused request ends the batch; bigger than max_pending") {
  TempDir dir;
  StoreOptions o = options_for(dir.path());
  o.maintenance_interval = std::chrono::hours(1);  // no maintenance transaction inside the counts
  o.max_pending = 64;                              // the 300-request batch below is queued in chunks
  auto store = must_open(o);
  auto t = store->open_topic("batch", TopicSpec{4, false, {}});
  REQUIRE(t.ok());
  // 50 requests: queued together, committed in one transaction (max_batch 4096).
  std::vector<AppendRequest> batch;
  for (int i = 0; i < 50; ++i) batch.push_back(request(*t, "k" + std::to_string(i % 5), std::to_string(i)));
  auto before = store->counters();
  auto r = store->append_batch(batch);
  CHECK(r.status.ok());
  CHECK(r.appended == 50);
  auto after = store->counters();
  CHECK(after.appends - before.appends == 50);
  CHECK(after.commits - before.commits == 1);  // 50 appends, one commit (sequential appends: 50)
  // A request refused up front (lane out of range) ends the batch: the 7 before it are appended, none after.
  batch.clear();
  for (int i = 0; i < 10; ++i) batch.push_back(request(*t, "r", "refused-batch-" + std::to_string(i)));
  batch[7].lane = 99;
  r = store->append_batch(batch);
  CHECK(r.appended == 7);
  CHECK(r.status.code() == Code::InvalidArgument);
  CHECK(r.status.message().find("lane 99 out of range") != std::string::npos);
  // An empty payload is refused the same way, at index 0: nothing appended.
  batch.clear();
  batch.push_back(request(*t, "e", ""));
  batch.push_back(request(*t, "e", "after-the-empty-one"));
  r = store->append_batch(batch);
  CHECK(r.appended == 0);
  CHECK(r.status.code() == Code::InvalidArgument);
  // 300 requests with max_pending 64: queued in chunks as the writer drains, all appended.
  batch.clear();
  for (int i = 0; i < 300; ++i) batch.push_back(request(*t, "big", std::to_string(i)));
  r = store->append_batch(batch);
  CHECK(r.status.ok());
  CHECK(r.appended == 300);
  // What is stored: 50 + 7 + 300 messages, per lane in order, nothing of the refused tails.
  std::size_t stored = 0;
  std::vector<int> big;
  for (std::uint32_t lane = 0; lane < t->lanes; ++lane) {
    for (auto& m : read_all(*store, *t, lane)) {
      ++stored;
      CHECK(m.payload != "after-the-empty-one");
      for (int i = 7; i < 10; ++i) CHECK(m.payload != "refused-batch-" + std::to_string(i));
      if (m.key == "big") big.push_back(std::stoi(m.payload));
    }
  }
  CHECK(stored == 50 + 7 + 300);
  REQUIRE(big.size() == 300);
  for (int i = 0; i < 300; ++i) CHECK(big[static_cast<std::size_t>(i)] == i);
  // An empty batch is a no-op; a closed store refuses with ShutDown and appends nothing.
  std::vector<AppendRequest> none;
  CHECK(store->append_batch(none).appended == 0);
  REQUIRE(store->close().ok());
  batch.clear();
  batch.push_back(request(*t, "late", "x"));
  r = store->append_batch(batch);
  CHECK(r.appended == 0);
  CHECK_FALSE(r.status.ok());
}

TEST_CASE("async durability commits without per-commit fsync and flushes on the interval") {
  TempDir dir;
  auto o = options_for(dir.path());
  o.durability = Durability::Async;
  o.async_flush_interval = std::chrono::milliseconds(20);
  {
    auto store = must_open(o);
    auto t = store->open_topic("fast", TopicSpec{1, false, {}});
    for (int i = 0; i < 200; ++i) REQUIRE(store->append(request(*t, "k", std::to_string(i))).ok());
    CHECK(wait_until([&] { return store->counters().fsyncs >= 1; }));
    CHECK(store->counters().fsyncs < store->counters().commits);
    REQUIRE(store->sync().ok());
  }
  auto store = must_open(o);
  auto t = store->find_topic("fast");
  CHECK(read_all(*store, *t, 0).size() == 200);
}

TEST_CASE("closing with appends in flight: every accepted append completes, completed ones survive") {
  TempDir dir;
  std::mutex mu;
  std::set<std::string> ok_payloads;
  std::atomic<int> accepted{0}, completed{0}, shut_down{0};
  {
    auto store = must_open(options_for(dir.path()));
    auto t = store->open_topic("closing", TopicSpec{2, false, {}});
    REQUIRE(t.ok());
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int th = 0; th < 3; ++th) {
      threads.emplace_back([&, th] {
        for (int i = 0; !stop.load(); ++i) {
          std::string p = std::to_string(th) + ":" + std::to_string(i);
          auto s = store->append_async(request(*t, "k" + std::to_string(th), p),
                                       [&, p](const lanebus::Status& st, const lanebus::detail::AppendResult&) {
                                         if (st.ok()) {
                                           std::lock_guard<std::mutex> l(mu);
                                           ok_payloads.insert(p);
                                         }
                                         completed.fetch_add(1);
                                       });
          if (s.ok()) {
            accepted.fetch_add(1);
          } else {
            CHECK(s.code() == Code::ShutDown);
            shut_down.fetch_add(1);
            return;
          }
        }
      });
    }
    CHECK(wait_until([&] { return accepted.load() > 300; }));
    REQUIRE(store->close().ok());
    stop.store(true);
    for (auto& th : threads) th.join();
    CHECK(completed.load() == accepted.load());  // close drained the queue
    CHECK(store->append(request(*t, "k", "late")).code() == Code::ShutDown);
    CHECK(store->read(*t, 0, 0).code() == Code::ShutDown);
  }
  auto store = must_open(options_for(dir.path()));
  auto t = store->find_topic("closing");
  std::set<std::string> stored;
  for (std::uint32_t lane = 0; lane < 2; ++lane) {
    for (auto& m : read_all(*store, *t, lane)) CHECK(stored.insert(m.payload).second);
  }
  for (const auto& p : ok_payloads) CHECK(stored.count(p) == 1);
  CHECK(stored.size() == ok_payloads.size());
}

TEST_CASE("blocking calls from a completion callback return Busy instead of deadlocking") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  auto t = store->open_topic("cb", TopicSpec{1, false, {}});
  std::atomic<int> code{-1};
  REQUIRE(store->append_async(request(*t, "k", "x"), [&](const lanebus::Status&, const lanebus::detail::AppendResult&) {
    code.store(static_cast<int>(store->append(request(*t, "k", "y")).code()));
  }).ok());
  CHECK(wait_until([&] { return code.load() != -1; }));
  CHECK(code.load() == static_cast<int>(Code::Busy));
}

TEST_CASE("the append listener reports new end offsets after commit") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  auto t = store->open_topic("notify", TopicSpec{2, false, {}});
  std::atomic<std::uint64_t> seen_end{0};
  store->set_append_listener([&](std::uint32_t tid, std::uint32_t lane, std::uint64_t end) {
    if (tid == t->id && lane == 0) seen_end.store(end);
  });
  AppendRequest r = request(*t, "k", "x");
  r.lane = 0;
  for (int i = 0; i < 5; ++i) REQUIRE(store->append(r).ok());
  CHECK(wait_until([&] { return seen_end.load() == 5; }));
}

namespace {

// An LmdbEnv on `path` with the default configuration.
std::unique_ptr<lanebus::detail::LmdbEnv> open_env(const std::string& path) {
  lanebus::detail::LmdbEnv::Config cfg;
  cfg.path = path;
  auto env = lanebus::detail::LmdbEnv::open(cfg);
  REQUIRE_MESSAGE(env.ok(), env.status().to_string());
  return std::move(*env);
}

// The value of `key` in the main database, read in a fresh read transaction.
std::string read_main(lanebus::detail::LmdbEnv& env, const char* key) {
  auto r = env.begin_read();
  REQUIRE(r.ok());
  auto dbi = env.open_dbi(*r, nullptr, false);
  REQUIRE(dbi.ok());
  auto v = r->get(*dbi, key);
  REQUIRE_MESSAGE(v.ok(), v.status().to_string());
  return std::string(*v);
}

// Put `key` = `value` in the main database in one write transaction; the dbi.
lanebus::detail::LmdbDbi write_main(lanebus::detail::LmdbEnv& env, const char* key, const char* value) {
  auto w = env.begin_write();
  REQUIRE(w.ok());
  auto dbi = env.open_dbi(*w, nullptr, false);
  REQUIRE(dbi.ok());
  REQUIRE(w->put(*dbi, key, value).ok());
  REQUIRE(w->commit().ok());
  return *dbi;
}

}  // namespace

// Writers of different processes queue on a record lock on writer.lock
// before LMDB's robust writer mutex (lib/store/lmdb_store.hpp): a process that
// holds it makes this process's begin_write wait, and when it is killed the
// kernel drops its lock and the writer goes on.
TEST_CASE("LmdbEnv: a writer waits for another process's lock on writer.lock and goes on when that process is killed") {
  TempDir dir;
  auto env = open_env(dir.path());
  const std::string lock_file = dir.path() + "/writer.lock";
  struct stat st {};
  REQUIRE(::stat(lock_file.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Only async-signal-safe calls: the parent has threads.
    const int fd = ::open(lock_file.c_str(), O_RDWR | O_CLOEXEC);
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0;
    fl.l_len = 1;
    if (fd < 0 || ::fcntl(fd, F_SETLKW, &fl) != 0) ::_exit(3);
    const char c = 'L';
    if (::write(ready[1], &c, 1) != 1) ::_exit(4);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  ::close(ready[0]);

  std::atomic<int> state{0};  // 1 = began, 2 = committed
  std::thread writer([&] {
    auto txn = env->begin_write();
    if (!txn.ok()) return;
    state.store(1);
    auto dbi = env->open_dbi(*txn, nullptr, false);
    if (dbi.ok() && txn->put(*dbi, "k", "v").ok() && txn->commit().ok()) state.store(2);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(state.load() == 0);  // still queued behind the other process
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(wait_until([&] { return state.load() == 2; }, std::chrono::seconds(30)));
  writer.join();
  CHECK(state.load() == 2);
  CHECK(read_main(*env, "k") == "v");  // a read in this process sees the write
}

// Reader slots are reserved at open and kept (lib/store/lmdb_store.hpp):
// beginning a read renews a kept transaction and takes no lock in lock.mdb
// (LMDB's reader mutex has the writer mutex's lost wake-up), many reads on many
// threads hold no more slots than were reserved, and a finished read keeps its
// slot.
TEST_CASE("LmdbEnv: reader slots are reserved at open and reused, never claimed beyond them") {
  TempDir dir;
  auto env = open_env(dir.path());
  const lanebus::detail::LmdbDbi main_dbi = write_main(*env, "k", "1");
  const std::size_t reserved = env->read_slots_reserved();
  CHECK(reserved == 7);  // min(8, 126 / 16)
  CHECK(env->reader_slots_held() == reserved);
  { auto r = env->begin_read(); REQUIRE(r.ok()); }
  for (int i = 0; i < 100; ++i) {
    auto r = env->begin_read();
    REQUIRE(r.ok());
  }
  CHECK(env->reader_slots_held() == reserved);  // the same slots each time

  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        auto r = env->begin_read();
        if (!r.ok()) { failures.fetch_add(1); continue; }
        auto v = r->get(main_dbi, "k");
        if (!v.ok() || *v != "1") failures.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
  CHECK(env->reader_slots_held() == reserved);

  // A renewed read sees the newest commit, not the snapshot it had before.
  write_main(*env, "k", "2");
  CHECK(read_main(*env, "k") == "2");
}

// More reads than reserved slots: the extra ones wait for a slot to come back
// (no new slot is claimed), while a thread that already holds a read gets a
// new slot for a nested one instead of waiting for itself.
TEST_CASE("LmdbEnv: a read beyond the reserved slots waits for one; a nested read on one thread does not") {
  TempDir dir;
  lanebus::detail::LmdbEnv::Config cfg;
  cfg.path = dir.path();
  cfg.read_slots = 2;
  auto opened = lanebus::detail::LmdbEnv::open(cfg);
  REQUIRE(opened.ok());
  auto& env = *opened;
  write_main(*env, "k", "1");
  CHECK(env->read_slots_reserved() == 2);
  CHECK(env->reader_slots_held() == 2);

  auto a = env->begin_read();
  REQUIRE(a.ok());
  std::atomic<int> state{0};  // 1 = second read began, 2 = third read began
  std::promise<void> release_b;
  std::thread other([&] {
    auto b = env->begin_read();
    if (!b.ok()) return;
    state.store(1);
    release_b.get_future().wait();
  });
  REQUIRE(wait_until([&] { return state.load() == 1; }, std::chrono::seconds(10)));
  std::thread third([&] {
    auto c = env->begin_read();  // both slots are in use on other threads: waits
    if (c.ok()) state.store(2);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(state.load() == 1);
  CHECK(env->reader_slots_held() == 2);
  release_b.set_value();
  other.join();
  third.join();
  CHECK(state.load() == 2);
  CHECK(env->reader_slots_held() == 2);

  // Nested on this thread with both slots busy: a third slot, kept afterwards.
  auto b = env->begin_read();
  REQUIRE(b.ok());
  auto nested = env->begin_read();
  REQUIRE_MESSAGE(nested.ok(), nested.status().to_string());
  CHECK(env->read_slots_reserved() == 3);
  CHECK(env->reader_slots_held() == 3);
}

// ---------------------------------------------------------------- the delayed index

TEST_CASE("delayed index: the mover takes due entries of open topics in due order, in bounded moves, and leaves the rest") {
  // move_due_delayed sweeps the table with one cursor, appending and deleting
  // each due entry under it. Entries of a topic this process does not have
  // open sit between them and must stay; a corrupt entry is dropped; a move
  // stops at `max` and says to move again; entries not yet due stay.
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  auto mine = store->open_topic("mine", TopicSpec{1, false, {}});
  auto theirs = store->open_topic("theirs", TopicSpec{1, false, {}});
  REQUIRE(mine.ok());
  REQUIRE(theirs.ok());
  const std::int64_t past = 1'000'000'000'000'000'000LL;    // 2001: due
  const std::int64_t future = 4'000'000'000'000'000'000LL;  // 2096: not due
  constexpr int kDue = 300;
  REQUIRE(store->write([&](lanebus::detail::StoreTxn& txn) -> lanebus::Status {
    for (int i = 0; i < kDue; ++i) {
      // Every third entry is the other topic's, interleaved in due order.
      const TopicRef& t = i % 3 == 1 ? *theirs : *mine;
      AppendRequest r = request(t, "k", "due-" + std::to_string(i));
      r.due_ns = past + i;
      r.header.created_at_ns = r.due_ns;
      if (auto s = lanebus::detail::put_delayed(txn, r, 1); !s.ok()) return s;
    }
    AppendRequest later = request(*mine, "k", "later");
    later.due_ns = future;
    later.header.created_at_ns = future;
    if (auto s = lanebus::detail::put_delayed(txn, later, 1); !s.ok()) return s;
    // A corrupt entry, due: a value that is not an encoded request.
    char key[lanebus::detail::kDelayedKeyBytes] = {};
    const std::uint64_t due_be = __builtin_bswap64(static_cast<std::uint64_t>(past + kDue));
    std::memcpy(key, &due_be, 8);
    const std::uint32_t topic_be = __builtin_bswap32(mine->id);
    std::memcpy(key + 16, &topic_be, 4);
    return txn.put(lanebus::detail::StoreTable::Delayed, std::string_view(key, sizeof key), "not a delayed entry");
  }).ok());
  const std::uint32_t their_id = theirs->id;
  auto open = [&](std::uint32_t id) { return id != their_id; };
  std::uint32_t moved = 0, dropped = 0, moves = 0;
  for (;;) {
    lanebus::detail::MoveResult result;
    REQUIRE(store->write([&](lanebus::detail::StoreTxn& txn) -> lanebus::Status {
      return lanebus::detail::move_due_delayed(txn, 64, open, &result);
    }).ok());
    ++moves;
    CHECK(result.moved <= 64);
    moved += result.moved;
    dropped += result.dropped;
    if (result.next_due == future) break;  // only the entry not yet due is left of mine
    REQUIRE(moves < 100);
  }
  const int their_count = kDue / 3;
  CHECK(moved == kDue - their_count);
  CHECK(dropped == 1);
  CHECK(moves >= (kDue - their_count) / 64);
  auto left_theirs = lanebus::detail::count_delayed(*store, their_id);
  REQUIRE(left_theirs.ok());
  CHECK(*left_theirs == static_cast<std::uint64_t>(their_count));
  auto left_mine = lanebus::detail::count_delayed(*store, mine->id);
  REQUIRE(left_mine.ok());
  CHECK(*left_mine == 1);  // "later"
  // Mine are in the log in due order, each once.
  const auto log = read_all(*store, *mine, 0);
  REQUIRE(log.size() == static_cast<std::size_t>(kDue - their_count));
  int expect = 0;
  for (const auto& m : log) {
    while (expect % 3 == 1) ++expect;
    CHECK(m.payload == "due-" + std::to_string(expect));
    ++expect;
  }
  CHECK(read_all(*store, *theirs, 0).empty());
}

TEST_CASE("delayed index: entries keep due-time order whether appended, inserted or given a new tie-break") {
  // put_delayed writes in place under a new key: MDB_APPEND when the key sorts
  // last (a steady delay), an insert when it does not, and a bumped tie-break
  // when the key is taken (two publishes of one nanosecond). None may
  // overwrite another entry, and every one decodes back unchanged.
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  auto t = store->open_topic("later", TopicSpec{2, false, {}});
  REQUIRE(t.ok());
  const std::int64_t base = 4'000'000'000'000'000'000LL;  // far in the future: nothing is due
  // due offsets: growing (appends), one earlier (an insert), and three with
  // the same due, created and tie-break (the second and third bump it).
  const std::int64_t dues[] = {10, 20, 30, 15, 40, 40, 40};
  REQUIRE(store->write([&](lanebus::detail::StoreTxn& txn) -> lanebus::Status {
    for (std::size_t i = 0; i < std::size(dues); ++i) {
      AppendRequest r = request(*t, "k", "payload-" + std::to_string(i));
      r.header.id = 100 + i;
      r.due_ns = base + dues[i];
      r.header.created_at_ns = r.due_ns;
      if (auto s = lanebus::detail::put_delayed(txn, r, 7); !s.ok()) return s;
    }
    return lanebus::Status();
  }).ok());
  auto n = lanebus::detail::count_delayed(*store, 0);
  REQUIRE(n.ok());
  CHECK(*n == std::size(dues));
  auto first = lanebus::detail::earliest_delayed(*store);
  REQUIRE(first.ok());
  CHECK(*first == base + 10);
  std::vector<std::pair<std::int64_t, std::string>> seen;  // (due, payload) in key order
  REQUIRE(store->read([&](lanebus::detail::StoreTxn& txn) -> lanebus::Status {
    lanebus::Status bad;
    lanebus::Status s = txn.scan(lanebus::detail::StoreTable::Delayed, {}, {}, [&](std::string_view k, std::string_view v) {
      AppendRequest r;
      bad = lanebus::detail::decode_delayed(k, v, &r);
      if (!bad.ok()) return false;
      seen.emplace_back(r.due_ns - base, r.payload);
      return true;
    });
    return s.ok() ? bad : s;
  }).ok());
  REQUIRE(seen.size() == std::size(dues));
  const std::vector<std::int64_t> order = {10, 15, 20, 30, 40, 40, 40};
  for (std::size_t i = 0; i < seen.size(); ++i) CHECK(seen[i].first == order[i]);
  CHECK(seen[1].second == "payload-3");
  // The three of one key, in tie-break order: the first holds 7, then 8 and 9.
  CHECK(seen[4].second == "payload-4");
  CHECK(seen[5].second == "payload-5");
  CHECK(seen[6].second == "payload-6");
}
