// lanebus — MIT License.
// Record batches in the durable log (doc/storage-format.md, layout 2): the
// writer packs a lane's appends of one transaction into one `log` value. These
// tests check what every reader of the log must still do with them: read back
// whole and in order, cut by retention in the middle of a batch, seek by time
// and claim inside one, name a damaged record inside one by its own offset,
// and pass verify; and that a layout-1 store is raised to 2 only when opened
// for writing.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "durable_store.hpp"
#include "lmdb_store.hpp"
#include "store_codec.hpp"
#include "store_fixture.hpp"
#include "temp_dir.hpp"
#include "verify.hpp"

using lanebus::Code;
using lanebus::StartPosition;
using lanebus::StoreOptions;
using lanebus::detail::AppendRequest;
using lanebus::detail::DurableStore;
using lanebus::detail::LmdbEnv;
using lanebus::detail::TopicRef;
using lanebus::detail::TopicSpec;
using lanebus::test::TempDir;

namespace {

StoreOptions options_for(const std::string& dir) { return lanebus::test::store_options_for(dir); }

std::unique_ptr<DurableStore> must_open(const StoreOptions& o) { return lanebus::test::must_open_store(o); }

std::string payload_of(std::uint32_t lane, std::uint64_t i) {
  // Sizes vary so that records of a batch differ in length; every 17th is
  // larger than a batch may be (stored alone).
  std::string p = "lane" + std::to_string(lane) + "-msg" + std::to_string(i) + "-";
  p.append(i % 17 == 16 ? 3000 : (i * 7) % 200, static_cast<char>('a' + i % 26));
  return p;
}

// `per_lane` messages in each lane of `t`, all in one append_batch (one request
// to the writer: one transaction), lanes interleaved as publishers would.
void append_in_one_batch(DurableStore& store, const TopicRef& t, std::uint64_t per_lane, std::int64_t created0) {
  std::vector<AppendRequest> reqs;
  for (std::uint64_t i = 0; i < per_lane; ++i) {
    for (std::uint32_t lane = 0; lane < t.lanes; ++lane) {
      AppendRequest r;
      r.topic_id = t.id;
      r.lane = lane;
      r.key = "k" + std::to_string(lane);
      r.payload = payload_of(lane, i);
      r.header.created_at_ns = created0 + static_cast<std::int64_t>(i) * 1000;
      r.header.correlation_id = i + 1;
      reqs.push_back(std::move(r));
    }
  }
  auto res = store.append_batch(reqs);
  INFO(res.status.to_string());
  REQUIRE(res.appended == per_lane * t.lanes);
}

// The store's LMDB environment, opened raw (the store itself is closed).
std::unique_ptr<LmdbEnv> open_raw(const std::string& dir) {
  LmdbEnv::Config c;
  c.path = dir;
  auto env = LmdbEnv::open(c);
  REQUIRE(env.ok());
  return std::move(*env);
}

// The store's raw `log` table: its entries and how many are record batches.
struct LogShape {
  std::uint64_t entries = 0, batches = 0;
};
LogShape log_shape(const std::string& dir) {
  auto env = open_raw(dir);
  auto txn = env->begin_read();
  REQUIRE(txn.ok());
  auto log = env->open_dbi(*txn, "log", false);
  REQUIRE(log.ok());
  auto cur = lanebus::detail::LmdbCursor::open(*txn, *log, dir);
  REQUIRE(cur.ok());
  LogShape s;
  for (auto r = cur->first(); r.ok() && *r; r = cur->next()) {
    ++s.entries;
    if (!cur->value().empty() && cur->value()[0] == 16) ++s.batches;
  }
  return s;
}

// Change the `log` value under (topic 1, lane, offset `key_off`) with `edit`.
template <class Edit>
void edit_log_value(const std::string& dir, std::uint32_t lane, std::uint64_t key_off, Edit edit) {
  auto env = open_raw(dir);
  auto txn = env->begin_write();
  REQUIRE(txn.ok());
  auto log = env->open_dbi(*txn, "log", false);
  REQUIRE(log.ok());
  std::string key(16, '\0');
  key[3] = 1;
  key[7] = static_cast<char>(lane);
  key[15] = static_cast<char>(key_off);
  auto v = txn->get(*log, key);
  REQUIRE(v.ok());
  std::string value(*v);
  edit(value);
  REQUIRE(txn->put(*log, key, value).ok());
  REQUIRE(txn->commit().ok());
}

}  // namespace

TEST_CASE("record batches: one transaction's appends are stored as batches and read back whole; verify passes") {
  TempDir dir;
  constexpr std::uint64_t kPerLane = 60;
  {
    auto store = must_open(options_for(dir.path()));
    auto t = store->open_topic("batched", TopicSpec{3, false, {}});
    REQUIRE(t.ok());
    append_in_one_batch(*store, *t, kPerLane, 1'000'000);
    // Read back in small and large reads: every offset, in order, intact.
    for (std::uint32_t lane = 0; lane < 3; ++lane) {
      for (std::uint32_t per_read : {1u, 5u, 1024u}) {
        std::uint64_t next = 0;
        while (next < kPerLane) {
          auto b = store->read(*t, lane, next, {per_read, 1 << 20});
          REQUIRE(b.ok());
          REQUIRE(!b->messages.empty());
          for (const auto& m : b->messages) {
            CHECK(m.offset == next);
            CHECK(m.payload == payload_of(lane, next));
            CHECK(m.header.correlation_id == next + 1);
            CHECK(m.key == "k" + std::to_string(lane));
            ++next;
          }
        }
      }
      auto li = store->lane_info(*t, lane);
      REQUIRE(li.ok());
      CHECK(li->count == kPerLane);
    }
    REQUIRE(store->close().ok());
  }
  const LogShape shape = log_shape(dir.path());
  MESSAGE("log entries=" << shape.entries << " batches=" << shape.batches << " records=" << 3 * kPerLane);
  CHECK(shape.batches > 0);
  CHECK(shape.entries < 3 * kPerLane / 4);  // the records of 3 lanes in far fewer values
  auto report = lanebus::detail::verify_store(dir.path());
  REQUIRE(report.ok());
  INFO(report->summary());
  CHECK(report->ok());
  CHECK(report->log_records == 3 * kPerLane);
}

TEST_CASE("reads in place: views into the map, held until released, valid while the log is rewritten") {
  TempDir dir;
  auto o = options_for(dir.path());
  auto store = must_open(o);
  CHECK(store->map_at_max());  // reserved at open: a held read never waits for a resize
  lanebus::RetentionOptions keep;
  keep.max_count = 5;
  auto t = store->open_topic("inplace", TopicSpec{2, false, keep});
  REQUIRE(t.ok());
  append_in_one_batch(*store, *t, 40, 1'000'000);
  lanebus::detail::InPlaceBatch ib;
  // Retention has not run yet: all 40 are there. Read 10 from offset 3.
  REQUIRE(store->read_in_place(*t, 1, 3, {10, 1 << 20}, &ib).ok());
  REQUIRE(ib.held());
  REQUIRE(ib.messages.size() == 10);
  CHECK(ib.first_offset == 3);
  CHECK(ib.next_offset == 13);
  CHECK(ib.end_offset == 40);
  for (std::size_t i = 0; i < 10; ++i) {
    const auto& m = ib.messages[i];
    CHECK(m.offset == 3 + i);
    CHECK(m.lane == 1);
    CHECK(m.key == "k1");
    CHECK(m.header.correlation_id == 4 + i);
    CHECK(m.payload == payload_of(1, 3 + i));
    CHECK(store->in_map(m.payload.data()));  // not a copy
  }
  // While the read is held, retention deletes every record it sees and the
  // writer appends more (reusing free pages): the held views do not change.
  REQUIRE(store->run_retention().ok());
  append_in_one_batch(*store, *t, 40, 2'000'000);
  REQUIRE(store->run_retention().ok());
  for (std::size_t i = 0; i < 10; ++i) CHECK(ib.messages[i].payload == payload_of(1, 3 + i));
  ib.release();
  CHECK_FALSE(ib.held());
  CHECK(ib.messages.size() == 10);  // offsets and headers stay; the views may not be used
  // A read after retention: the skip is reported, the newest 5 come.
  REQUIRE(store->read_in_place(*t, 1, 0, {100, 1 << 20}, &ib).ok());
  CHECK(ib.skipped == 75);
  REQUIRE(ib.messages.size() == 5);
  CHECK(ib.messages.front().offset == 75);
  CHECK(ib.messages.back().payload == payload_of(1, 39));
  // A read at the end returns nothing and holds nothing; a bad lane is an error.
  REQUIRE(store->read_in_place(*t, 1, 80, {100, 1 << 20}, &ib).ok());
  CHECK(ib.messages.empty());
  CHECK_FALSE(ib.held());
  CHECK(store->read_in_place(*t, 2, 0, {100, 1 << 20}, &ib).code() == Code::InvalidArgument);
  CHECK_FALSE(ib.held());
  // A held read holds no lock of the store: reads and writes of other threads
  // go on, and close() waits for its release.
  REQUIRE(store->read_in_place(*t, 0, 0, {100, 1 << 20}, &ib).ok());
  REQUIRE(ib.held());
  std::atomic<bool> worked{false}, released{false};
  std::thread other([&] {
    CHECK(store->lane_info(*t, 1).ok());
    append_in_one_batch(*store, *t, 2, 3'000'000);
    worked = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    released = true;
    ib.release();
  });
  while (!worked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(store->close().ok());
  CHECK(released.load());
  other.join();
}

TEST_CASE("record batches: retention cuts through a batch and keeps exactly the newest records") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  lanebus::RetentionOptions keep;
  keep.max_count = 7;
  auto t = store->open_topic("cut", TopicSpec{1, false, keep});
  REQUIRE(t.ok());
  append_in_one_batch(*store, *t, 30, 1'000'000);
  auto before = store->lane_info(*t, 0);
  REQUIRE(before.ok());
  REQUIRE(store->run_retention().ok());
  auto li = store->lane_info(*t, 0);
  REQUIRE(li.ok());
  CHECK(li->first_offset == 23);
  CHECK(li->count == 7);
  std::uint64_t kept_bytes = 0;
  auto b = store->read(*t, 0, 0);
  REQUIRE(b.ok());
  CHECK(b->skipped == 23);
  REQUIRE(b->messages.size() == 7);
  for (std::size_t i = 0; i < 7; ++i) {
    CHECK(b->messages[i].offset == 23 + i);
    CHECK(b->messages[i].payload == payload_of(0, 23 + i));
    kept_bytes += 64 + b->messages[i].key.size() + b->messages[i].payload.size() + 4;  // format 1 record
  }
  CHECK(li->bytes == kept_bytes);  // the lane's byte count is the kept records' sizes
  CHECK(li->bytes < before->bytes);
  // Cut again, by one more append's worth: still exact.
  append_in_one_batch(*store, *t, 3, 2'000'000);
  REQUIRE(store->run_retention().ok());
  auto again = store->read(*t, 0, 0);
  REQUIRE(again.ok());
  REQUIRE(again->messages.size() == 7);
  CHECK(again->messages.front().offset == 26);
  CHECK(again->messages.back().offset == 32);
  REQUIRE(store->close().ok());
  auto report = lanebus::detail::verify_store(dir.path());
  REQUIRE(report.ok());
  INFO(report->summary());
  CHECK(report->ok());
}

TEST_CASE("record batches: seek by time and queue claims find records inside a batch") {
  TempDir dir;
  auto store = must_open(options_for(dir.path()));
  auto t = store->open_topic("timed", TopicSpec{2, false, {}});
  REQUIRE(t.ok());
  append_in_one_batch(*store, *t, 40, 1'000'000);  // created 1,000,000 + i * 1000
  for (std::uint64_t i : {0u, 1u, 12u, 13u, 27u, 39u}) {
    auto o = store->offset_for_time(*t, 1, 1'000'000 + static_cast<std::int64_t>(i) * 1000);
    REQUIRE(o.ok());
    CHECK(*o == i);
    auto between = store->offset_for_time(*t, 0, 1'000'000 + static_cast<std::int64_t>(i) * 1000 - 1);
    REQUIRE(between.ok());
    CHECK(*between == i);
  }
  auto end = store->offset_for_time(*t, 0, 9'000'000);
  REQUIRE(end.ok());
  CHECK(*end == 40);
  auto g = store->open_group(*t, "from-time", StartPosition::at_time(1'000'000 + 21 * 1000));
  REQUIRE(g.ok());
  auto info = store->group_info(*g);
  REQUIRE(info.ok());
  CHECK((*info)[0].committed == 21);
  CHECK((*info)[1].committed == 21);

  auto q = store->open_topic("jobs", TopicSpec{1, true, {}});
  REQUIRE(q.ok());
  auto workers = store->open_group(*q, "workers");
  REQUIRE(workers.ok());
  append_in_one_batch(*store, *q, 25, 1'000'000);
  for (std::uint64_t i = 0; i < 25; ++i) {
    auto c = store->claim(*workers, 0);
    REQUIRE(c.ok());
    REQUIRE(c->has_value());
    CHECK((*c)->message.offset == i);
    CHECK((*c)->message.payload == payload_of(0, i));
    REQUIRE(store->ack(*workers, 0, i, (*c)->attempt).ok());
  }
  auto none = store->claim(*workers, 0);
  REQUIRE(none.ok());
  CHECK(!none->has_value());
}

TEST_CASE("record batches: a damaged record inside a batch is Corruption naming its own offset") {
  TempDir dir;
  {
    auto store = must_open(options_for(dir.path()));
    auto t = store->open_topic("crc", TopicSpec{1, false, {}});
    REQUIRE(t.ok());
    append_in_one_batch(*store, *t, 10, 1'000'000);
    REQUIRE(store->close().ok());
  }
  SUBCASE("a flipped payload bit") {
    // The batch at offset 0 holds offsets 0..9; flip a bit of offset 4's payload.
    edit_log_value(dir.path(), 0, 0, [](std::string& v) {
      REQUIRE(v[0] == 16);
      std::vector<std::string_view> recs;
      REQUIRE(lanebus::detail::split_log_value(v, "crc", 0, 0, &recs).ok());
      REQUIRE(recs.size() == 10);
      const std::size_t at = static_cast<std::size_t>(recs[4].data() - v.data());
      v[at + recs[4].size() - 6] ^= 0x01;
    });
    auto store = must_open(options_for(dir.path()));
    auto t = store->find_topic("crc");
    REQUIRE(t.ok());
    auto b = store->read(*t, 0, 0);
    CHECK(b.code() == Code::Corruption);
    CHECK(b.status().message().find("\"crc\" lane 0 offset 4: record checksum mismatch") != std::string::npos);
    auto first = store->read(*t, 0, 0, {4, 1 << 20});
    REQUIRE(first.ok());  // the intact records before it still read
    CHECK(first->messages.size() == 4);
    lanebus::detail::InPlaceBatch ib;  // read in place: the same error, and no read left held
    auto in_place = store->read_in_place(*t, 0, 0, {100, 1 << 20}, &ib);
    CHECK(in_place.code() == Code::Corruption);
    CHECK(in_place.message().find("\"crc\" lane 0 offset 4: record checksum mismatch") != std::string::npos);
    CHECK(ib.messages.empty());
    CHECK_FALSE(ib.held());
    auto after = store->read(*t, 0, 5);
    REQUIRE(after.ok());  // and those after it
    CHECK(after->messages.size() == 5);
  }
  SUBCASE("a value too short to be a record") {
    edit_log_value(dir.path(), 0, 0, [](std::string& v) { v.assign("\x01short", 6); });
    auto store = must_open(options_for(dir.path()));
    auto t = store->find_topic("crc");
    REQUIRE(t.ok());
    auto b = store->read(*t, 0, 0);
    CHECK(b.code() == Code::Corruption);
    CHECK(b.status().message().find("offset 0: record shorter than its header") != std::string::npos);
    auto at = store->offset_for_time(*t, 0, 1'000'000);  // seek by time reads it too: an error, not a crash
    CHECK(at.code() == Code::Corruption);
  }
  SUBCASE("a batch whose count does not match its records") {
    edit_log_value(dir.path(), 0, 0, [](std::string& v) { v[2] = 11; });
    auto store = must_open(options_for(dir.path()));
    auto t = store->find_topic("crc");
    REQUIRE(t.ok());
    auto b = store->read(*t, 0, 0);
    CHECK(b.code() == Code::Corruption);
    CHECK(b.status().message().find("record batch") != std::string::npos);
    REQUIRE(store->close().ok());
    auto report = lanebus::detail::verify_store(dir.path());
    REQUIRE(report.ok());
    CHECK(!report->ok());
  }
}

TEST_CASE("a layout-1 store is raised to layout 2 when opened for writing, not when opened read-only") {
  TempDir dir;
  {
    auto store = must_open(options_for(dir.path()));
    auto t = store->open_topic("old", TopicSpec{1, false, {}});
    REQUIRE(t.ok());
    AppendRequest r;
    r.topic_id = t->id;
    r.key = "k";
    r.payload = "one";
    REQUIRE(store->append(std::move(r)).ok());
    REQUIRE(store->close().ok());
  }
  auto layout = [&](std::uint32_t set) {
    auto env = open_raw(dir.path());
    auto txn = env->begin_write();
    REQUIRE(txn.ok());
    auto meta = env->open_dbi(*txn, "meta", false);
    REQUIRE(meta.ok());
    if (set != 0) REQUIRE(txn->put(*meta, "layout", lanebus::detail::encode_layout_record(set)).ok());
    auto v = txn->get(*meta, "layout");
    REQUIRE(v.ok());
    REQUIRE(v->size() == 12);
    std::uint32_t version = 0;
    std::memcpy(&version, v->data() + 8, 4);
    REQUIRE(txn->commit().ok());
    return version;
  };
  CHECK(layout(0) == lanebus::detail::kLayoutVersion);
  CHECK(layout(1) == 1);  // forge a store written by a layout-1 release
  {
    StoreOptions ro = options_for(dir.path());
    ro.read_only = true;
    auto store = must_open(ro);
    auto t = store->find_topic("old");
    REQUIRE(t.ok());
    auto b = store->read(*t, 0, 0);
    REQUIRE(b.ok());
    CHECK(b->messages.size() == 1);
  }
  CHECK(layout(0) == 1);
  {
    auto store = must_open(options_for(dir.path()));
    REQUIRE(store->close().ok());
  }
  CHECK(layout(0) == 2);
}
