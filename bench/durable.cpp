// lanebus — MIT License.
// bench/durable: durable publish (sync/async group commit) and replay against raw
// LMDB and SQLite doing the same work, in one run. `--smoke` = tiny run; `--run CASE`.
//
// Cases (64-byte payloads; every producer keeps up to 512 publishes in flight
// through the completion form):
//   sync_1p   1 producer, Durability::Sync     vs lmdb_fsync, sqlite_full
//   sync_4p   4 producers, Durability::Sync    vs lmdb_fsync, lmdb_fsync_lanes, sqlite_full,
//             sqlite_full_batched, and two prototype log formats in raw LMDB:
//             lmdb_fsync_lane_batches (a lane's records of a txn packed into values of
//             up to 13) and lmdb_fsync_lane_dbs (one tree per lane, MDB_APPEND)
//   async_4p  4 producers, Durability::Async   vs lmdb_nosync, lmdb_nosync_lanes,
//             lmdb_nosync_lane_batches, lmdb_nosync_lane_dbs
//   sync_batch64  1 thread, Topic::publish_batch of 64 on a Sync durable topic through the Bus
//             vs the same thread publishing one by one, and lmdb_fsync with 64 puts per txn
//   replay    one group reads every lane of sync_4p's log from offset 0 (DurableStore::read);
//             replay_in_place: the same with DurableStore::read_in_place (views, no copy);
//             replay_bus / replay_bus_batch: the same log through Bus::subscribe / subscribe_batch
//             (BENCH_REPLAY_BATCH=N sets the group's batch and batch_max, BENCH_REPLAY_WORKERS the workers)
//             vs lmdb_cursor (raw cursor scan of lmdb_fsync's table), and
//             vs lmdb_cursor_lanebus_log (the same scan of lanebus's own log); median of --repeats;
//             replay_lane_batches_decoded / _in_place: the lane-batches prototype's log read
//             with each record decoded and copied as lanebus's reader does, or checked in place
//   queue_consume_4c  workers = 4 ack a pre-filled Sync durable queue (8 lanes) through
//             Bus::consume  vs lmdb_batch_ack, sqlite_batch_ack (queue_consume_4c_batch: Bus::consume_batch)
//   tx_consume_4c     the same through Bus::consume_tx, one tx.put row per message
//             vs lmdb_batch_ack_row
//   e2e_latency_queue publish_async -> handler latency on a Sync durable queue at a paced
//             10k msg/s (steady-clock stamp in the payload) vs lmdb_commit (latency of
//             one raw LMDB put + fsynced commit: the floor of any durable hop);
//             here ratio = lanebus p50 / lmdb_commit p50 (lower is better);
//             hop_p50_us / hop_p90_us: a publish's completion (its commit) to its
//             handler call; hop_over_commit_pct: the messages whose hop is longer than
//             one raw commit (doc/performance.md, "The hop after the commit")
//             commit_call_avg_us / build_avg_us: of lanebus's average commit, the time in
//             LMDB's commit call (page writes, fsyncs) and the time building the transaction
//   layouts   (only with --run) prototype log layouts in raw LMDB, lanebus's 137-byte records
//             at lanebus's own sync_4p / async_4p batch: lanebus's layout (lanes), one sequence
//             with MDB_APPEND (seq), and seq with a dense per-lane index (seq_index), against
//             the issue's baseline; small fsynced commits of 5 appends (time, bytes written);
//             replay of the seq log whole and of the seq_index log lane by lane
//   commit_shapes (only with --run) fsynced commits shaped like e2e_latency_queue's in raw
//             LMDB, 2 and 5 appends, claims and acks each: layout 1 against a proposed layout
//             2 and each of its halves (commit_shape), and the backlog read back (replay_shape)
//   e2e_latency_queue_xproc the same with the publisher in a child process (this binary,
//             --publish-child): the consumer is woken by the commit (wake.shm) or, as
//             its baseline in the same run, finds the messages by its 50 ms poll alone
// Baselines: raw LMDB through lanebus's thin wrapper (lib/store/lmdb_store.hpp, one
// write txn per batch with MDB_APPEND; batch = lanebus's average commit in the
// matching case — the ceiling); SQLite WAL synchronous=FULL, one transaction
// per message per producer thread (durable on return), and batched like lanebus.
// Consume baselines (4 threads, thread t owns lanes t and t+4 like a worker):
// lmdb_batch_ack = per fsynced write txn, 64 messages of one lane: read the log
// record, put an inflight (claim) record, then delete it and advance the lane's
// cursor (claim + ack in one txn: the ceiling); _row adds one row put per message.
// sqlite_batch_ack = WAL, synchronous=FULL: select 64 rows of a lane, delete them,
// one transaction. The lanebus consume cases are bounded by --seconds; the
// queue is pre-filled once (Async durability, closed = synced) and copied per
// repeat. Consume/replay/latency lines print the median of --repeats runs
// (default 3, smoke 1) and the spread (min..max) before `ratio=`.
#include <fcntl.h>
#include <lmdb.h>
#include <spawn.h>
#include <sqlite3.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "access.hpp"
#include "bus_impl.hpp"
#include "coding.hpp"
#include "crc32c.hpp"
#include "durable_store.hpp"
#include "durable_store_impl.hpp"
#include "lanebus/lanebus.hpp"
#include "lmdb_store.hpp"
#include "store_codec.hpp"

#ifndef BENCH_BUILDTYPE
#define BENCH_BUILDTYPE "unknown"
#endif

using lanebus::detail::AppendRequest;
using lanebus::detail::DurableStore;
using Clock = std::chrono::steady_clock;

namespace {

double g_seconds = 2.0;  // per measured case
int g_repeats = 3;       // consume, replay and latency cases: median of this many runs
std::uint64_t g_queue_messages = 50000;  // pre-filled queue size (consume cases)
int g_window = 512;  // publishes each producer keeps in flight (batch_sweep varies it)
double g_rate = 10000;  // offered msg/s of the e2e latency cases (--rate)
const std::string kPayload(64, 'p');

struct Run {
  double msgs_per_sec = 0;
  double avg_batch = 1;
  std::uint64_t p50_ns = 0, p99_ns = 0, p999_ns = 0;
  std::uint64_t msgs = 0;
};

std::string fresh_dir(const std::string& name) {
  static std::string root;
  if (root.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "lanebus-bench-XXXXXX").string();
    root = mkdtemp(tmpl.data());
  }
  std::string d = root + "/" + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

std::uint64_t pct(std::vector<std::uint64_t>& v, double p) {
  if (v.empty()) return 0;
  std::size_t i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

// lanebus durable publish: `producers` threads, each with g_window in flight.
// `retention` (retained_sync_4p): the topic's retention; `slices`: the rate in
// each of that many equal parts of the run, in order.
Run lanebus_publish(int producers, lanebus::Durability mode, const std::string& dir,
                    const lanebus::RetentionOptions& retention = {}, std::vector<double>* slices = nullptr) {
  lanebus::StoreOptions o;
  o.directory = dir;
  o.durability = mode;
  o.map_size_initial = 256ull << 20;
  auto store = DurableStore::open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().to_string().c_str());
    std::exit(1);
  }
  auto t = (*store)->open_topic("bench.topic", lanebus::detail::TopicSpec{8, false, retention});
  if (!t.ok()) std::exit(1);
  // Completions all run on the store's writer thread: `lat` is only touched there.
  std::vector<std::uint64_t> lat;
  lat.reserve(4 << 20);
  std::atomic<std::uint64_t> done{0};
  std::atomic<bool> stop{false};
  auto before = (*store)->counters();
  auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      std::atomic<int> in_flight{0};
      for (std::uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        // Sleep rather than spin: on 2 cores a spinning producer steals the writer's CPU.
        while (in_flight.load(std::memory_order_acquire) >= g_window) std::this_thread::sleep_for(std::chrono::microseconds(50));
        AppendRequest r;
        r.topic_id = t->id;
        r.key = "key" + std::to_string((i * 4 + static_cast<std::uint64_t>(p)) % 64);
        r.lane = lanebus::lane_for_key(r.key, 8);
        r.payload = kPayload;
        auto t0 = Clock::now();
        in_flight.fetch_add(1, std::memory_order_relaxed);
        auto s = (*store)->append_async(std::move(r), [&, t0](const lanebus::Status& st,
                                                              const lanebus::detail::AppendResult&) {
          if (st.ok()) {
            lat.push_back(static_cast<std::uint64_t>(
                std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()));
          }
          done.fetch_add(1, std::memory_order_relaxed);
          in_flight.fetch_sub(1, std::memory_order_release);
        });
        if (!s.ok()) std::exit(1);
      }
      while (in_flight.load(std::memory_order_acquire) > 0) std::this_thread::yield();
    });
  }
  if (slices == nullptr) {
    std::this_thread::sleep_for(std::chrono::duration<double>(g_seconds));
  } else {
    const std::size_t parts = slices->size();
    std::uint64_t last = 0;
    for (std::size_t i = 0; i < parts; ++i) {
      const auto t0 = Clock::now();
      std::this_thread::sleep_for(std::chrono::duration<double>(g_seconds / static_cast<double>(parts)));
      const std::uint64_t now_done = done.load();
      (*slices)[i] = static_cast<double>(now_done - last) / std::chrono::duration<double>(Clock::now() - t0).count();
      last = now_done;
    }
  }
  stop.store(true);
  for (auto& th : threads) th.join();
  auto elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  auto after = (*store)->counters();
  if (!(*store)->close().ok()) std::exit(1);  // joins the writer: `lat` is complete and ours now
  Run r;
  r.msgs = done.load();
  r.msgs_per_sec = static_cast<double>(r.msgs) / elapsed;
  std::uint64_t commits = after.commits - before.commits;
  r.avg_batch = commits > 0 ? static_cast<double>(after.batched_ops - before.batched_ops) / static_cast<double>(commits) : 1;
  r.p50_ns = pct(lat, 0.50);
  r.p99_ns = pct(lat, 0.99);
  r.p999_ns = pct(lat, 0.999);
  return r;
}

// Records of one lane per LMDB value in the *_lane_batches layout: at most
// this many 137-byte records, so a value stays under LMDB's node limit for
// 4 KiB pages (about 2 KiB) and lives on its leaf page, not an overflow page.
constexpr std::uint32_t kRecordsPerValue = 13;

// The puts of lmdb_raw's baselines.
enum class RawLayout {
  // The issue's baseline: one sequence of 8-byte keys, MDB_APPEND, 64-byte values.
  Sequence,
  // The puts lanebus's log makes (*_lanes): 16-byte keys (topic, lane,
  // offset) of 8 lanes growing side by side in one tree, without MDB_APPEND
  // (every put searches and most land mid-tree), values the size of
  // lanebus's record for the same message.
  Lanes,
  // A prototype log format, not lanebus's (*_lane_batches): the same records
  // and keys, but each transaction's records of a lane packed into values of
  // up to kRecordsPerValue records keyed by the first one's offset (Kafka's
  // record batches): one put per lane and value instead of one per message.
  LaneBatches,
  // A prototype log format (*_lane_dbs): one named database per lane, 8-byte
  // offset keys, each lane appended with MDB_APPEND through a cursor of its own.
  LaneDbs,
  // A prototype log format (*_seq, the `layouts` case): one sequence for the
  // whole log, 8-byte keys appended with MDB_APPEND, each value the record
  // with its lane (4 bytes) and lane offset (8) in front, since the key no
  // longer carries them. No per-lane index: a reader walks the sequence.
  Seq,
  // Seq plus a dense per-lane index (*_seq_index): table "lane_index", key
  // (topic, lane, offset) as lanebus's log key, value the 8-byte sequence
  // number. The index's 8 lanes grow side by side (no MDB_APPEND), as the log
  // does today, but with 24-byte entries instead of 153-byte ones.
  SeqIndex,
};

// The *_seq layouts' value: lane and lane offset, then the record.
std::string seq_value(std::string_view record, std::uint32_t lane, std::uint64_t offset) {
  std::string v(12, '\0');
  lanebus::detail::put_be32(v.data(), lane);
  lanebus::detail::put_be64(v.data() + 4, offset);
  v += record;
  return v;
}

[[noreturn]] void raw_failed(const std::string& what) {
  std::fprintf(stderr, "lmdb baseline: %s\n", what.c_str());
  std::exit(1);
}

// Raw LMDB: one thread, write txns of `batch` puts each in `layout`
// (doc/performance.md, "Two log formats tried in raw LMDB"). Message n goes
// to lane n % 8 at offset n / 8 in the layouts with lanes.
// With `commit_probe`: exactly commit_probe->commits transactions, each timed
// (begin to the commit's return) and the bytes the thread wrote for it read
// from /proc/thread-self/io (wchar: LMDB's pwrite/writev of pages and meta).
struct CommitProbe {
  std::uint64_t commits = 0;
  /// With no_meta_sync: sync() after every commit and time it with the
  /// commit (an idle writer making its last commit durable).
  bool sync_each = false;
  double avg_commit_us = 0;
  double avg_written_kb = 0;
};

// This thread's bytes written so far (wchar of /proc/thread-self/io), 0 if unreadable.
std::uint64_t thread_wchar() {
  std::FILE* f = std::fopen("/proc/thread-self/io", "r");
  if (f == nullptr) return 0;
  char line[128];
  std::uint64_t w = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::strncmp(line, "wchar: ", 7) == 0) w = std::strtoull(line + 7, nullptr, 10);
  std::fclose(f);
  return w;
}

// `no_meta_sync`: MDB_NOMETASYNC (lmdb_store.hpp), a commit durable after
// the next one's fsync: what a writer that pipelines its acknowledgements
// would pay per commit.
Run lmdb_raw(bool no_sync, std::uint64_t batch, const std::string& dir, RawLayout layout = RawLayout::Sequence,
             CommitProbe* commit_probe = nullptr, bool no_meta_sync = false) {
  lanebus::detail::LmdbEnv::Config c;
  c.path = dir;
  c.map_size_initial = 8ull << 30;  // sparse: only written pages use disk
  c.map_size_max = 8ull << 30;
  c.no_sync = no_sync;
  c.no_meta_sync = no_meta_sync;
  auto env = lanebus::detail::LmdbEnv::open(c);
  if (!env.ok()) std::exit(1);
  lanebus::detail::LmdbDbi dbi = 0;
  lanebus::detail::LmdbDbi lane_dbi[8] = {};
  lanebus::detail::LmdbDbi index_dbi = 0;
  {
    auto txn = (*env)->begin_write();
    auto d = (*env)->open_dbi(*txn, "log", true);
    if (!d.ok()) std::exit(1);
    dbi = *d;
    if (layout == RawLayout::SeqIndex) {
      auto x = (*env)->open_dbi(*txn, "lane_index", true);
      if (!x.ok()) std::exit(1);
      index_dbi = *x;
    }
    for (std::uint32_t l = 0; layout == RawLayout::LaneDbs && l < 8; ++l) {
      const std::string name = "log" + std::to_string(l);
      auto ld = (*env)->open_dbi(*txn, name.c_str(), true);
      if (!ld.ok()) std::exit(1);
      lane_dbi[l] = *ld;
    }
    if (!txn->commit().ok()) std::exit(1);
  }
  std::uint64_t n = 0;
  auto start = Clock::now();
  auto until = start + std::chrono::duration<double>(g_seconds);
  char key[16] = {};
  std::string value = kPayload;
  if (layout != RawLayout::Sequence) {
    AppendRequest r;
    r.key = "key00";
    r.payload = kPayload;
    value = lanebus::detail::encode_log_record(r, 0);
  }
  // lanebus's log key (log_key in durable_store_impl.hpp): topic 1, lane, offset.
  auto log_key = [&](std::uint32_t lane, std::uint64_t offset) {
    lanebus::detail::put_be32(key, 1);
    lanebus::detail::put_be32(key + 4, lane);
    lanebus::detail::put_be64(key + 8, offset);
    return std::string_view(key, 16);
  };
  std::string packed;
  // The *_seq layouts' values, one per lane (the lane offset is rewritten per put).
  std::string seq_values[8];
  for (std::uint32_t l = 0; l < 8; ++l) seq_values[l] = seq_value(value, l, 0);
  char seq_key[8] = {};
  char index_value[8] = {};
  const bool probe = commit_probe != nullptr;
  std::uint64_t commit_ns = 0, commits = 0, wchar_total = 0;
  while (probe ? commits < commit_probe->commits : Clock::now() < until) {
    std::uint64_t wchar_before = probe ? thread_wchar() : 0;
    const auto t0 = Clock::now();
    auto txn = (*env)->begin_write();
    if (!txn.ok()) std::exit(1);
    switch (layout) {
      case RawLayout::Sequence:
        for (std::uint64_t i = 0; i < batch; ++i, ++n) {
          lanebus::detail::put_be64(key, n);
          if (auto st = txn->put_append(dbi, std::string_view(key, 8), value); !st.ok()) raw_failed(st.to_string());
        }
        break;
      case RawLayout::Lanes:
        for (std::uint64_t i = 0; i < batch; ++i, ++n) {
          if (auto st = txn->put(dbi, log_key(static_cast<std::uint32_t>(n % 8), n / 8), value); !st.ok())
            raw_failed(st.to_string());
        }
        break;
      case RawLayout::LaneBatches:
        // Each lane's share of messages n..n+batch-1, in values of up to kRecordsPerValue records.
        for (std::uint32_t lane = 0; lane < 8; ++lane) {
          std::uint64_t m = n + ((lane + 8 - n % 8) % 8);  // this lane's first message of the txn
          while (m < n + batch) {
            const std::uint64_t first = m / 8;
            packed.clear();
            for (std::uint32_t k = 0; k < kRecordsPerValue && m < n + batch; ++k, m += 8) packed += value;
            if (auto st = txn->put(dbi, log_key(lane, first), packed); !st.ok()) raw_failed(st.to_string());
          }
        }
        n += batch;
        break;
      case RawLayout::LaneDbs: {
        // Closed before the commit (LMDB frees a write txn's cursors itself).
        MDB_cursor* cur[8] = {};
        for (std::uint32_t l = 0; l < 8; ++l)
          if (mdb_cursor_open(txn->raw(), lane_dbi[l], &cur[l]) != 0) std::exit(1);
        for (std::uint64_t i = 0; i < batch; ++i, ++n) {
          lanebus::detail::put_be64(key, n / 8);
          MDB_val k{8, key};
          MDB_val v{value.size(), value.data()};
          if (const int rc = mdb_cursor_put(cur[n % 8], &k, &v, MDB_APPEND); rc != 0) raw_failed(mdb_strerror(rc));
        }
        for (MDB_cursor* cu : cur) mdb_cursor_close(cu);
        break;
      }
      case RawLayout::Seq:
      case RawLayout::SeqIndex:
        for (std::uint64_t i = 0; i < batch; ++i, ++n) {
          const auto lane = static_cast<std::uint32_t>(n % 8);
          std::string& v = seq_values[lane];
          lanebus::detail::put_be64(v.data() + 4, n / 8);
          lanebus::detail::put_be64(seq_key, n);
          if (auto st = txn->put_append(dbi, std::string_view(seq_key, 8), v); !st.ok()) raw_failed(st.to_string());
          if (layout == RawLayout::SeqIndex) {
            lanebus::detail::put_be64(index_value, n);
            if (auto st = txn->put(index_dbi, log_key(lane, n / 8), std::string_view(index_value, 8)); !st.ok())
              raw_failed(st.to_string());
          }
        }
        break;
    }
    if (auto st = txn->commit(); !st.ok()) raw_failed(st.to_string());
    if (probe && commit_probe->sync_each && !(*env)->sync().ok()) std::exit(1);
    if (probe) {
      commit_ns += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
      wchar_total += thread_wchar() - wchar_before;
      ++commits;
    }
  }
  if (probe) {
    commit_probe->avg_commit_us = static_cast<double>(commit_ns) / 1e3 / static_cast<double>(std::max<std::uint64_t>(commits, 1));
    commit_probe->avg_written_kb =
        static_cast<double>(wchar_total) / 1024.0 / static_cast<double>(std::max<std::uint64_t>(commits, 1));
  }
  if ((no_sync || no_meta_sync) && !(*env)->sync().ok()) std::exit(1);
  Run r;
  r.msgs = n;
  r.msgs_per_sec = static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

// The `commit_shapes` case (doc/performance.md, "The e2e commit in raw LMDB"):
// fsynced commits of the shape e2e_latency_queue's commits have, in raw LMDB,
// for lanebus's layout today and for a proposed sequence layout. Each commit appends
// `per_commit` messages to as many of 8 lanes (round robin), claims as many
// appended two commits before and acks as many claimed two commits before, on
// logs that already hold kShapeBacklog records a lane. Nothing here is
// lanebus's code.
enum class CommitShape {
  // A commit of the e2e case's raw baseline: one 64-byte put, MDB_APPEND.
  RawOne,
  // Layout 1 (doc/storage-format.md): `log` (topic, lane, offset) -> record,
  // `lanes` (topic, lane) -> 40 B per appended lane, `inflight` (topic,
  // group, lane, offset) -> 24 B put per claim and deleted per ack, `cursors`
  // (topic, group, lane) -> 16 B per acked lane, `meta` id_next.
  Today,
  // The sequence layout, proposed: `log` keyed by one store-wide sequence (MDB_APPEND),
  // each value the lane and lane offset then the record; the queue's state in
  // one tree `qstate`, a lane's records side by side: (topic, lane, 0) the
  // lane record, (topic, lane, 1, group) the cursor, (topic, lane, 2, group,
  // offset) an in-flight entry. No id_next (the log's last key is the id).
  Seq,
  // Seq with a record of 101 bytes instead of 137 (a smaller fixed header).
  SeqCompact,
  // Today's log (one tree, lanes side by side) with the queue's state in
  // Seq's one `qstate` tree: the two parts of the sequence layout, apart.
  LanesQstate,
  // Seq's log with today's separate state trees (lanes, inflight, cursors,
  // meta): the log's part of the sequence layout alone.
  SeqTodayState,
  // Seq plus an append-only run index `runs`: key the sequence number of a
  // run's first record, value (lane, first offset, count), one entry per lane
  // and commit (a commit's appends ordered by lane, so each lane's are one
  // run). A lane's reader walks `runs` and reads its runs from the log.
  SeqRuns,
};

constexpr std::uint64_t kShapeBacklog = 250000;

struct ShapeResult {
  double commit_us = 0, written_kb = 0;
  // The backlog read back lane by lane (Today: a cursor per lane; SeqRuns:
  // through `runs`) or, for Seq, in one walk of the sequence; values copied.
  double replay_msgs_per_sec = 0;
};

// commit_shape's replay (ShapeResult::replay_msgs_per_sec): every record of
// the log once, copied out, in the order the shape's reader takes them.
double replay_shape(lanebus::detail::LmdbEnv& env, CommitShape shape, lanebus::detail::LmdbDbi log,
                    lanebus::detail::LmdbDbi runs) {
  auto txn = env.begin_read();
  if (!txn.ok()) raw_failed(txn.status().to_string());
  auto lc = lanebus::detail::LmdbCursor::open(*txn, log, "shape");
  if (!lc.ok()) raw_failed(lc.status().to_string());
  std::string copy;
  std::uint64_t n = 0;
  const auto start = Clock::now();
  if (shape == CommitShape::Seq) {
    for (auto r = lc->first(); r.ok() && *r; r = lc->next(), ++n) copy.assign(lc->value());
  } else if (shape == CommitShape::Today) {
    char from[16];
    for (std::uint32_t lane = 0; lane < 8; ++lane) {
      lanebus::detail::put_be32(from, 1);
      lanebus::detail::put_be32(from + 4, lane);
      lanebus::detail::put_be64(from + 8, 0);
      for (auto r = lc->seek(std::string_view(from, 16)); r.ok() && *r; r = lc->next(), ++n) {
        if (lanebus::detail::get_be32(lc->key().data() + 4) != lane) break;
        copy.assign(lc->value());
      }
    }
  } else {
    auto rc = lanebus::detail::LmdbCursor::open(*txn, runs, "shape");
    if (!rc.ok()) raw_failed(rc.status().to_string());
    char at[8];
    for (std::uint32_t lane = 0; lane < 8; ++lane) {
      for (auto r = rc->first(); r.ok() && *r; r = rc->next()) {
        const std::string_view v = rc->value();
        if (lanebus::detail::get_le32(v.data()) != lane) continue;
        std::uint32_t count = lanebus::detail::get_le32(v.data() + 12);
        std::memcpy(at, rc->key().data(), 8);
        for (auto x = lc->seek(std::string_view(at, 8)); x.ok() && *x && count > 0; --count, ++n) {
          copy.assign(lc->value());
          if (count > 1) x = lc->next();
        }
      }
    }
  }
  if (n == 0) raw_failed("replay read nothing");
  return static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - start).count();
}

ShapeResult commit_shape(CommitShape shape, std::uint64_t per_commit, std::uint64_t commits, const std::string& dir) {
  lanebus::detail::LmdbEnv::Config c;
  c.path = dir;
  c.map_size_initial = 1ull << 30;
  c.map_size_max = 1ull << 30;
  auto env = lanebus::detail::LmdbEnv::open(c);
  if (!env.ok()) raw_failed(env.status().to_string());
  AppendRequest req;
  req.key = "key00";
  req.payload = kPayload;
  std::string record = lanebus::detail::encode_log_record(req, 0);
  if (shape == CommitShape::SeqCompact) record.resize(101);
  const bool seq = shape == CommitShape::Seq || shape == CommitShape::SeqCompact || shape == CommitShape::SeqTodayState ||
                   shape == CommitShape::SeqRuns;
  const bool today_state = shape == CommitShape::Today || shape == CommitShape::SeqTodayState;  // lanes, inflight, cursors, meta
  const bool merged_state = !today_state;
  if (seq) record = std::string(12, '\0') + record;  // lane, lane offset
  lanebus::detail::LmdbDbi log = 0, lanes = 0, inflight = 0, cursors = 0, meta = 0, qstate = 0, runs = 0;
  auto must = [](const lanebus::Status& st) {
    if (!st.ok()) raw_failed(st.to_string());
  };
  {
    auto txn = (*env)->begin_write();
    if (!txn.ok()) raw_failed(txn.status().to_string());
    auto open = [&](const char* name) {
      auto d = (*env)->open_dbi(*txn, name, true);
      if (!d.ok()) raw_failed(d.status().to_string());
      return *d;
    };
    log = open("log");
    if (today_state) {
      lanes = open("lanes");
      inflight = open("inflight");
      cursors = open("cursors");
      meta = open("meta");
    } else if (shape != CommitShape::RawOne) {
      qstate = open("qstate");
    }
    if (shape == CommitShape::SeqRuns) runs = open("runs");
    must(txn->commit());
  }
  char k[32];
  std::uint64_t next[8] = {}, seqno = 0;
  std::string lane_value(40, '\0'), cursor_value(16, '\0'), inflight_value(24, '\0'), id_value(8, '\0');
  char run_key[8], run_value[16];
  // SeqRuns: the run of `count` records of `lane` just appended, from next[lane] - count.
  auto add_run = [&](lanebus::detail::LmdbTxn& txn, std::uint32_t lane, std::uint32_t count) {
    lanebus::detail::put_be64(run_key, seqno - count);
    lanebus::detail::put_le32(run_value, lane);
    lanebus::detail::put_le64(run_value + 4, next[lane] - count);
    lanebus::detail::put_le32(run_value + 12, count);
    must(txn.put_append(runs, std::string_view(run_key, 8), std::string_view(run_value, 16)));
  };
  // One message appended to `lane` at next[lane] (and, with seq, seqno).
  auto append = [&](lanebus::detail::LmdbTxn& txn, std::uint32_t lane) {
    if (shape == CommitShape::RawOne) {
      lanebus::detail::put_be64(k, seqno++);
      must(txn.put_append(log, std::string_view(k, 8), kPayload));
      return;
    }
    if (seq) {
      lanebus::detail::put_be32(record.data(), lane);
      lanebus::detail::put_be64(record.data() + 4, next[lane]);
      lanebus::detail::put_be64(k, seqno++);
      must(txn.put_append(log, std::string_view(k, 8), record));
    } else {
      lanebus::detail::put_be32(k, 1);
      lanebus::detail::put_be32(k + 4, lane);
      lanebus::detail::put_be64(k + 8, next[lane]);
      must(txn.put(log, std::string_view(k, 16), record));
    }
    // The lane record: `lanes` (topic, lane), or `qstate` (topic, lane, 0).
    lanebus::detail::put_be32(k, 1);
    lanebus::detail::put_be32(k + 4, lane);
    k[8] = 0;
    must(txn.put(today_state ? lanes : qstate, std::string_view(k, today_state ? 8 : 9), lane_value));
    ++next[lane];
  };
  // The in-flight key of (lane, offset) in this shape; the cursor's when `cursor`.
  auto state_key = [&](std::uint32_t lane, std::uint64_t offset, bool cursor) {
    if (merged_state) {
      lanebus::detail::put_be32(k, 1);
      lanebus::detail::put_be32(k + 4, lane);
      k[8] = cursor ? 1 : 2;
      lanebus::detail::put_be32(k + 9, 1);
      lanebus::detail::put_be64(k + 13, offset);
      return std::string_view(k, cursor ? 13 : 21);
    }
    lanebus::detail::put_be32(k, 1);
    lanebus::detail::put_be32(k + 4, 1);
    lanebus::detail::put_be32(k + 8, lane);
    lanebus::detail::put_be64(k + 12, offset);
    return std::string_view(k, cursor ? 12 : 20);
  };
  // The backlog: kShapeBacklog records a lane, in commits of 1,000.
  for (std::uint64_t done = 0; shape != CommitShape::RawOne && done < kShapeBacklog * 8;) {
    auto txn = (*env)->begin_write();
    if (!txn.ok()) raw_failed(txn.status().to_string());
    if (shape == CommitShape::SeqRuns) {
      // The writer orders a commit's appends by lane: 8 runs of 125.
      for (std::uint32_t lane = 0; lane < 8; ++lane) {
        for (int i = 0; i < 125; ++i) append(*txn, lane);
        add_run(*txn, lane, 125);
      }
      done += 1000;
    } else {
      for (int i = 0; i < 1000; ++i, ++done) append(*txn, static_cast<std::uint32_t>(done % 8));
    }
    must(txn->commit());
  }
  // Message m of the measured ones: lane m % 8 at offset kShapeBacklog + m / 8.
  auto lane_of = [](std::uint64_t m) { return static_cast<std::uint32_t>(m % 8); };
  auto offset_of = [](std::uint64_t m) { return kShapeBacklog + m / 8; };
  std::uint64_t m = 0, commit_ns = 0, wchar = 0;
  for (std::uint64_t i = 0; i < commits; ++i) {
    const std::uint64_t w0 = thread_wchar();
    const auto t0 = Clock::now();
    auto txn = (*env)->begin_write();
    if (!txn.ok()) raw_failed(txn.status().to_string());
    if (shape == CommitShape::RawOne) {
      append(*txn, 0);
    } else {
      const std::uint64_t n = per_commit;
      for (std::uint64_t j = 0; j < n; ++j) {
        append(*txn, lane_of(m + j));
        if (shape == CommitShape::SeqRuns) add_run(*txn, lane_of(m + j), 1);  // n <= 8: one lane each
      }
      // Claims of the messages appended two commits ago, acks of those claimed two commits before that.
      for (std::uint64_t j = 0; j < n && m >= 2 * n; ++j) {
        const std::uint64_t c2 = m - 2 * n + j;
        must(txn->put(today_state ? inflight : qstate, state_key(lane_of(c2), offset_of(c2), false), inflight_value));
      }
      for (std::uint64_t j = 0; j < n && m >= 4 * n; ++j) {
        const std::uint64_t a = m - 4 * n + j;
        must(txn->del(today_state ? inflight : qstate, state_key(lane_of(a), offset_of(a), false)));
        must(txn->put(today_state ? cursors : qstate, state_key(lane_of(a), 0, true), cursor_value));
      }
      if (today_state) must(txn->put(meta, "id_next", id_value));
      m += n;
    }
    must(txn->commit());
    commit_ns += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    wchar += thread_wchar() - w0;
  }
  ShapeResult r;
  r.commit_us = static_cast<double>(commit_ns) / 1e3 / static_cast<double>(commits);
  r.written_kb = static_cast<double>(wchar) / 1024.0 / static_cast<double>(commits);
  if (shape == CommitShape::Today || shape == CommitShape::Seq || shape == CommitShape::SeqRuns)
    r.replay_msgs_per_sec = replay_shape(**env, shape, log, runs);
  return r;
}

// SQLite WAL, synchronous=FULL: `threads` connections, `batch` inserts per transaction.
Run sqlite_full(int threads, std::uint64_t batch, const std::string& dir) {
  const std::string path = dir + "/q.db";
  {
    sqlite3* db = nullptr;
    sqlite3_open(path.c_str(), &db);
    sqlite3_exec(db, "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS q(id INTEGER PRIMARY KEY, k BLOB, v BLOB);",
                 nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  std::atomic<std::uint64_t> total{0};
  auto start = Clock::now();
  auto until = start + std::chrono::duration<double>(g_seconds);
  std::vector<std::thread> ts;
  for (int p = 0; p < threads; ++p) {
    ts.emplace_back([&, p] {
      sqlite3* db = nullptr;
      sqlite3_open(path.c_str(), &db);
      sqlite3_busy_timeout(db, 10000);
      sqlite3_exec(db, "PRAGMA synchronous=FULL;", nullptr, nullptr, nullptr);
      sqlite3_stmt* ins = nullptr;
      sqlite3_prepare_v2(db, "INSERT INTO q(k, v) VALUES(?, ?)", -1, &ins, nullptr);
      std::uint64_t n = 0;
      while (Clock::now() < until) {
        if (sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) continue;
        for (std::uint64_t i = 0; i < batch; ++i) {
          std::string k = "key" + std::to_string((n + i) * 4 + static_cast<std::uint64_t>(p));
          sqlite3_bind_blob(ins, 1, k.data(), static_cast<int>(k.size()), SQLITE_TRANSIENT);
          sqlite3_bind_blob(ins, 2, kPayload.data(), static_cast<int>(kPayload.size()), SQLITE_STATIC);
          sqlite3_step(ins);
          sqlite3_reset(ins);
        }
        if (sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK) n += batch;
      }
      sqlite3_finalize(ins);
      sqlite3_close(db);
      total.fetch_add(n);
    });
  }
  for (auto& t : ts) t.join();
  Run r;
  r.msgs = total.load();
  r.msgs_per_sec = static_cast<double>(r.msgs) / std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

// A Bus with one worker over a Sync store in `dir` and one durable topic.
struct SyncBus {
  std::unique_ptr<lanebus::Bus> bus;
  lanebus::Topic topic;
};
SyncBus open_sync_bus(const std::string& dir, const char* topic_name) {
  lanebus::BusOptions bo;
  bo.workers = 1;
  bo.store.directory = dir;
  bo.store.durability = lanebus::Durability::Sync;
  bo.store.map_size_initial = 256ull << 20;
  auto bus = lanebus::Bus::open(bo);
  if (!bus.ok()) std::exit(1);
  lanebus::TopicOptions to;
  to.durable = true;
  auto topic = (*bus)->create_topic(topic_name, to);
  if (!topic.ok()) std::exit(1);
  return {std::move(*bus), *topic};
}

// delayed_sync_4p (doc/delays.md): 4 producers publish_async through a Bus
// (Durability::Sync, g_window in flight each) to a durable topic with one
// consuming group, every message delayed by 1 ms (stored in the delayed
// index, moved to its lane when due) or not; msgs/s from the first publish to
// the last delivery, so the delayed side pays its store put, the move
// transaction and the delivery.
double bus_publish_4p(bool delayed, const std::string& dir) {
  SyncBus sb = open_sync_bus(dir, "bench.delayed");
  std::unique_ptr<lanebus::Bus>& bus = sb.bus;
  lanebus::Topic& topic = sb.topic;
  std::atomic<std::uint64_t> delivered{0}, published{0};
  auto sub = bus->subscribe(topic, "g", [&](const lanebus::MessageView&) {
    delivered.fetch_add(1, std::memory_order_relaxed);
    return lanebus::Outcome::ack();
  });
  if (!sub.ok()) std::exit(1);
  std::atomic<bool> stop{false};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int p = 0; p < 4; ++p) {
    threads.emplace_back([&, p] {
      std::atomic<int> in_flight{0};
      for (std::uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        while (in_flight.load(std::memory_order_acquire) >= g_window) std::this_thread::sleep_for(std::chrono::microseconds(50));
        const std::string key = "key" + std::to_string((i * 4 + static_cast<std::uint64_t>(p)) % 64);
        lanebus::OutgoingMessage m{.key = key, .payload = kPayload};
        if (delayed) m.delay = std::chrono::milliseconds(1);
        in_flight.fetch_add(1, std::memory_order_relaxed);
        auto s = topic.publish_async(m, [&](const lanebus::Status& st, std::uint64_t) {
          if (st.ok()) published.fetch_add(1, std::memory_order_relaxed);
          in_flight.fetch_sub(1, std::memory_order_release);
        });
        if (!s.ok()) std::exit(1);
      }
      while (in_flight.load(std::memory_order_acquire) > 0) std::this_thread::yield();
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(g_seconds));
  stop.store(true);
  for (auto& th : threads) th.join();
  const std::uint64_t n = published.load();
  while (delivered.load(std::memory_order_relaxed) < n) std::this_thread::sleep_for(std::chrono::microseconds(200));
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(n) / elapsed;
}

// One thread publishing to a durable Sync topic through the Bus for
// g_seconds: Topic::publish_batch of `batch` messages at a time (batch > 1),
// or Topic::publish one by one (batch == 1). Returns messages committed per second.
double bus_publish_batched(std::size_t batch, const std::string& dir) {
  SyncBus sb = open_sync_bus(dir, "bench.batched");  // the bus lives until the return
  lanebus::Topic& topic = sb.topic;
  std::vector<std::string> keys;
  for (int k = 0; k < 64; ++k) keys.push_back("key" + std::to_string(k));
  std::vector<lanebus::OutgoingMessage> span(batch);
  for (std::size_t i = 0; i < batch; ++i) span[i] = {.key = keys[i % keys.size()], .payload = kPayload};
  std::uint64_t n = 0;
  const auto start = Clock::now();
  const auto until = start + std::chrono::duration<double>(g_seconds);
  while (Clock::now() < until) {
    if (batch == 1) {
      if (!topic.publish(span[0]).ok()) std::exit(1);
      n += 1;
    } else {
      lanebus::BatchPublishResult r = topic.publish_batch(span);
      if (!r.ok()) std::exit(1);
      n += r.published;
    }
  }
  return static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - start).count();
}

// Replay: a new group reads every lane of the sync_4p topic from offset 0.
Run lanebus_replay(const std::string& dir, bool in_place = false) {
  lanebus::StoreOptions o;
  o.directory = dir;
  auto store = DurableStore::open(o);
  if (!store.ok()) std::exit(1);
  auto t = (*store)->find_topic("bench.topic");
  if (!t.ok()) std::exit(1);
  auto g = (*store)->open_group(*t, "replay", lanebus::StartPosition::earliest());
  if (!g.ok()) std::exit(1);
  std::uint64_t n = 0;
  std::size_t bytes = 0;
  // One ReadBatch reused across reads, as a durable topic group's lane does
  // (read_into keeps the messages' storage).
  // `in_place`: read_in_place instead, views into the map, each read held
  // while its messages are used, as a batch handler's span is.
  lanebus::detail::ReadBatch batch;
  lanebus::detail::InPlaceBatch views;
  auto start = Clock::now();
  for (std::uint32_t lane = 0; lane < t->lanes; ++lane) {
    for (std::uint64_t from = 0; in_place;) {
      if (!(*store)->read_in_place(*t, lane, from, {1024, 4 << 20}, &views).ok()) std::exit(1);
      if (views.messages.empty()) break;
      for (const auto& m : views.messages) bytes += m.payload.size();
      n += views.messages.size();
      from = views.next_offset;
    }
    for (std::uint64_t from = 0; !in_place;) {
      if (!(*store)->read_into(*t, lane, from, {1024, 4 << 20}, &batch).ok()) std::exit(1);
      if (batch.messages.empty()) break;
      for (const auto& m : batch.messages) bytes += m.payload.size();
      n += batch.messages.size();
      from = batch.next_offset;
    }
  }
  Run r;
  r.msgs = n;
  r.msgs_per_sec = static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - start).count();
  if (bytes == 0 && n > 0) std::exit(1);
  views.release();
  (void)(*store)->close();
  return r;
}

// The raw scans below: table "log" of the store in `dir`, opened read-only
// in one read transaction. `scan(cursor)` walks it and returns the messages
// it counted; the result is their rate. `leaf_pages`: the table's leaf pages.
// The raw environment in `dir`, read-only (the raw scans and replays below).
std::unique_ptr<lanebus::detail::LmdbEnv> open_raw_read_only(const std::string& dir) {
  lanebus::detail::LmdbEnv::Config c;
  c.path = dir;
  c.map_size_initial = 8ull << 30;
  c.map_size_max = 8ull << 30;
  c.read_only = true;
  auto env = lanebus::detail::LmdbEnv::open(c);
  if (!env.ok()) std::exit(1);
  return std::move(*env);
}

template <typename Scan>
Run scan_log(const std::string& dir, Scan&& scan, std::uint64_t* pages = nullptr) {
  auto env = open_raw_read_only(dir);
  auto txn = env->begin_read();
  auto dbi = env->open_dbi(*txn, "log", false);
  if (!dbi.ok()) std::exit(1);
  if (pages != nullptr) {
    MDB_stat st{};
    if (mdb_stat(txn->raw(), *dbi, &st) != 0) std::exit(1);
    *pages = st.ms_leaf_pages + st.ms_overflow_pages;
  }
  auto cur = lanebus::detail::LmdbCursor::open(*txn, *dbi, dir);
  if (!cur.ok()) std::exit(1);
  auto start = Clock::now();
  Run out;
  out.msgs = scan(*cur);
  out.msgs_per_sec = static_cast<double>(out.msgs) / std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

// Raw cursor scan of table "log" in `dir`, copying each value: the
// lmdb_fsync baseline's table (one MDB_APPEND run: full pages, 8-byte keys,
// 64-byte values), or lanebus's own log (16-byte keys, 137-byte records, 8
// lanes side by side in one tree; `lanebus_log`: a value that is a record
// batch counts its records). `fill`: messages per page (leaf and overflow).
Run lmdb_cursor(const std::string& dir, double* fill = nullptr, bool lanebus_log = false) {
  std::uint64_t pages = 0;
  Run out = scan_log(
      dir,
      [lanebus_log](lanebus::detail::LmdbCursor& cur) {
        std::uint64_t n = 0;
        std::string copy;
        for (auto r = cur.first(); r.ok() && *r; r = cur.next()) {
          copy.assign(cur.value());
          n += lanebus_log && copy.size() > 8 && copy[0] == 16 ? lanebus::detail::get_le16(copy.data() + 2) : 1;
        }
        return n;
      },
      &pages);
  if (fill != nullptr && pages > 0) *fill = static_cast<double>(out.msgs) / static_cast<double>(pages);
  return out;
}

// Replay of a *_lane_batches log (lmdb_raw's prototype format): a cursor
// over its values, each value cut into its records by their lengths and
// every record decoded as lanebus's reader decodes it (checksum, copy into a
// StoredMessage), or with `in_place` only its checksum checked and its
// payload's length read where it lies (what a zero-copy reader does). Counts
// records.
Run lmdb_cursor_lane_batches(const std::string& dir, bool in_place, double* per_leaf = nullptr) {
  std::uint64_t leaves = 0;
  Run out = scan_log(
      dir,
      [in_place](lanebus::detail::LmdbCursor& cur) {
        std::uint64_t n = 0;
        lanebus::detail::StoredMessage m;
        std::size_t bytes = 0;
        for (auto r = cur.first(); r.ok() && *r; r = cur.next()) {
          std::string_view v = cur.value();
          while (!v.empty()) {
            // A record's size from its header: the fixed part and trailer, key, idempotency key, payload, extension.
            const char* p = v.data();
            const std::size_t size = lanebus::detail::kRecordOverhead + lanebus::detail::get_le16(p + 2) + lanebus::detail::get_le16(p + 4) +
                                     lanebus::detail::get_le32(p + 8) +
                                     (p[0] != 1 ? lanebus::detail::get_le16(p + 6) : 0);
            if (size > v.size()) {
              std::fprintf(stderr, "lane batches replay: bad record\n");
              std::exit(1);
            }
            if (in_place) {
              if (lanebus::detail::crc32c(p, size - 4) != lanebus::detail::get_le32(p + size - 4)) {
                std::fprintf(stderr, "lane batches replay: checksum mismatch\n");
                std::exit(1);
              }
              bytes += lanebus::detail::get_le32(p + 8);
            } else {
              if (!lanebus::detail::decode_log_record(v.substr(0, size), "bench", 0, n, &m).ok()) {
                std::fprintf(stderr, "lane batches replay: bad record\n");
                std::exit(1);
              }
              bytes += m.payload.size();
            }
            v.remove_prefix(size);
            ++n;
          }
        }
        if (bytes == 0 && n > 0) std::exit(1);
        return n;
      },
      &leaves);
  if (per_leaf != nullptr && leaves > 0) *per_leaf = static_cast<double>(out.msgs) / static_cast<double>(leaves);
  return out;
}

// One value of a *_seq log (lane, offset, record), decoded and copied into `m`
// as lanebus's reader decodes a record; exits on a bad one. Returns the payload's size.
std::size_t decode_seq_value(std::string_view v, lanebus::detail::StoredMessage* m) {
  if (v.size() < 12 || !lanebus::detail::decode_log_record(v.substr(12), "bench", lanebus::detail::get_be32(v.data()),
                                                              lanebus::detail::get_be64(v.data() + 4), m)
                             .ok()) {
    std::fprintf(stderr, "seq replay: bad record\n");
    std::exit(1);
  }
  return m->payload.size();
}

// Replay of a *_seq log (the `layouts` case): one cursor over the whole
// sequence, every record decoded and copied as lanebus's reader does, its lane
// and offset taken from the value's prefix. What a topic-wide reader (one
// group reading all lanes at once, as `replay` does) would cost.
Run lmdb_cursor_seq(const std::string& dir) {
  return scan_log(dir, [](lanebus::detail::LmdbCursor& cur) {
    std::uint64_t n = 0, bytes = 0;
    lanebus::detail::StoredMessage m;
    for (auto r = cur.first(); r.ok() && *r; r = cur.next()) {
      bytes += decode_seq_value(cur.value(), &m);
      ++n;
    }
    if (bytes == 0 && n > 0) std::exit(1);
    return n;
  });
}

// Replay of a *_seq_index log lane by lane, as a per-lane reader (a consumer
// group's worker) would read it: a cursor over the lane's index entries and,
// for each, a lookup of the record by its sequence number, decoded and copied.
Run lmdb_lanes_through_index(const std::string& dir) {
  auto env = open_raw_read_only(dir);
  auto txn = env->begin_read();
  auto log = env->open_dbi(*txn, "log", false);
  auto index = env->open_dbi(*txn, "lane_index", false);
  if (!log.ok() || !index.ok()) std::exit(1);
  auto cur = lanebus::detail::LmdbCursor::open(*txn, *index, dir);
  if (!cur.ok()) std::exit(1);
  const auto start = Clock::now();
  std::uint64_t n = 0, bytes = 0;
  lanebus::detail::StoredMessage m;
  char from[16] = {};
  for (std::uint32_t lane = 0; lane < 8; ++lane) {
    lanebus::detail::put_be32(from, 1);
    lanebus::detail::put_be32(from + 4, lane);
    lanebus::detail::put_be64(from + 8, 0);
    for (auto r = cur->seek(std::string_view(from, 16)); r.ok() && *r; r = cur->next()) {
      const std::string_view k = cur->key();
      if (k.size() != 16 || lanebus::detail::get_be32(k.data() + 4) != lane) break;
      auto v = txn->get(*log, cur->value());
      bytes += decode_seq_value(v.ok() ? *v : std::string_view(), &m);
      ++n;
    }
  }
  if (bytes == 0 && n > 0) std::exit(1);
  Run out;
  out.msgs = n;
  out.msgs_per_sec = static_cast<double>(n) / std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

// ---- repeats ----------------------------------------------------------------

struct Spread {
  double median = 0, min = 0, max = 0;
};

Spread spread(std::vector<double> v) {
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  return s;
}

// "case=NAME repeats=R msg_per_s=M msg_per_s_spread=a..b BASE=M' BASE_spread=c..d ratio=M/M'"
void ratio_line(const char* name, const char* unit, const std::vector<double>& x, const char* baseline,
                const std::vector<double>& y, const char* extra = "") {
  Spread a = spread(x), b = spread(y);
  std::printf("bench=durable case=%s repeats=%zu %s%s=%.0f %s_spread=%.0f..%.0f %s=%.0f %s_spread=%.0f..%.0f ratio=%.3f\n",
              name, x.size(), extra, unit, a.median, unit, a.min, a.max, baseline, b.median, baseline, b.min, b.max,
              b.median > 0 ? a.median / b.median : 0.0);
  std::fflush(stdout);
}

void run_commit_shapes() {
  const struct {
    const char* name;
    CommitShape shape;
  } shapes[] = {{"raw_one", CommitShape::RawOne},
                {"today", CommitShape::Today},
                {"seq", CommitShape::Seq},
                {"seq_compact", CommitShape::SeqCompact},
                {"lanes_qstate", CommitShape::LanesQstate},
                {"seq_today_state", CommitShape::SeqTodayState},
                {"seq_runs", CommitShape::SeqRuns}};
  constexpr int kShapes = sizeof shapes / sizeof shapes[0];
  // 2 of each a commit: what e2e_latency_queue's commits carry at 10 k msg/s
  // (its ops_per_commit, about 5); 5 of each: a busier writer.
  for (const std::uint64_t per_commit : {2, 5}) {
    std::vector<double> us[kShapes], kb[kShapes], replay[kShapes];
    for (int r = 0; r < g_repeats; ++r) {
      for (int i = 0; i < kShapes; ++i) {  // in rounds: each shape beside the others, on the same disk state
        const ShapeResult x =
            commit_shape(shapes[i].shape, per_commit, 400, fresh_dir(std::string("shape_") + shapes[i].name));
        us[i].push_back(x.commit_us);
        kb[i].push_back(x.written_kb);
        replay[i].push_back(x.replay_msgs_per_sec);
      }
    }
    if (per_commit == 2) {
      // The backlog (20,000 records a lane) read back: layout 1 lane by lane,
      // the sequence layout in one walk and lane by lane through the run index.
      for (int i = 1; i < kShapes; ++i) {
        if (replay[i][0] == 0 || shapes[i].shape == CommitShape::Today) continue;
        const std::string name = std::string("replay_shape_") + shapes[i].name;
        ratio_line(name.c_str(), "msg_per_s", replay[i], "today_by_lane_msg_per_s", replay[1]);
      }
    }
    for (int i = 1; i < kShapes; ++i) {
      const std::string name = std::string("commit_shape_") + shapes[i].name;
      char extra[128];
      std::snprintf(extra, sizeof extra, "per_commit=%llu written_kb_per_commit=%.1f raw_one_written_kb=%.1f ",
                    static_cast<unsigned long long>(per_commit), spread(kb[i]).median, spread(kb[0]).median);
      ratio_line(name.c_str(), "commit_us", us[i], "raw_one_commit_us", us[0], extra);
    }
  }
}

[[noreturn]] void die(const char* what, const lanebus::Status& st) {
  std::fprintf(stderr, "bench durable: %s: %s\n", what, st.to_string().c_str());
  std::exit(1);
}

// Replay through the Bus: a new group of the sync_4p topic reads every lane
// from the earliest message with a one-message handler (Bus::subscribe) or a
// batch handler (subscribe_batch, spans of 64); every payload is touched.
// Rate = messages handled / time from subscribe to the last one.
Run bus_replay(const std::string& dir, std::uint64_t n, bool batch, int repeat) {
  lanebus::BusOptions o;
  o.workers = 2;
  o.store.directory = dir;
  o.store.durability = lanebus::Durability::Async;
  auto bus = lanebus::Bus::open(o);
  if (!bus.ok()) die("bus replay open", bus.status());
  auto t = (*bus)->create_topic("bench.topic", {.lanes = 8, .durable = true});
  if (!t.ok()) die("bus replay topic", t.status());
  std::atomic<std::uint64_t> handled{0}, bytes{0};
  lanebus::GroupOptions g{.start = lanebus::StartPosition::earliest()};
  if (const char* e = std::getenv("BENCH_REPLAY_BATCH")) g.batch = g.batch_max = static_cast<std::uint32_t>(std::atoi(e));
  if (const char* e = std::getenv("BENCH_REPLAY_WORKERS")) o.workers = std::atoi(e);
  const std::string group = (batch ? "bus_replay_batch_" : "bus_replay_") + std::to_string(repeat);  // new each time
  auto start = Clock::now();
  lanebus::Result<lanebus::Subscription> sub =
      batch ? (*bus)->subscribe_batch(*t, group,
                                      [&](std::span<const lanebus::MessageView> ms) {
                                        std::size_t b = 0;
                                        for (const auto& m : ms) b += static_cast<unsigned char>(m.payload()[0]);
                                        bytes.fetch_add(b, std::memory_order_relaxed);
                                        handled.fetch_add(ms.size(), std::memory_order_relaxed);
                                        return lanebus::BatchOutcome::all_acked();
                                      },
                                      g)
            : (*bus)->subscribe(*t, group,
                                [&](const lanebus::MessageView& m) {
                                  bytes.fetch_add(static_cast<unsigned char>(m.payload()[0]), std::memory_order_relaxed);
                                  handled.fetch_add(1, std::memory_order_relaxed);
                                  return lanebus::Outcome::ack();
                                },
                                g);
  if (!sub.ok()) die("bus replay subscribe", sub.status());
  auto until = start + std::chrono::seconds(60);
  while (handled.load(std::memory_order_relaxed) < n && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  Run r;
  r.msgs = handled.load();
  r.msgs_per_sec = static_cast<double>(r.msgs) / std::chrono::duration<double>(Clock::now() - start).count();
  (void)sub->close();
  (void)(*bus)->shutdown(lanebus::ShutdownMode::Abandon, std::chrono::seconds(10));
  if (r.msgs < n) die("bus replay", lanebus::Status(lanebus::Code::Internal, "not every message was handled"));
  return r;
}

std::uint64_t steady_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

// ---- queue consume through the Bus -----------------------------------------

constexpr std::uint32_t kQueueLanes = 8;
constexpr int kConsumeThreads = 4;
constexpr std::uint64_t kAckBatch = 64;

std::uint64_t queue_acked(const lanebus::Bus& bus) {
  for (const auto& t : bus.stats().topics) {
    if (t.name == "bench.queue" && !t.groups.empty()) return t.groups[0].total.acked;
  }
  return 0;
}

// Pre-fill `dir` with a durable queue of `n` messages (Async: fast; the Bus's
// shutdown closes the store, which syncs). Bounded to 60 s.
std::uint64_t prefill_queue(const std::string& dir, std::uint64_t n) {
  lanebus::BusOptions o;
  o.workers = 1;
  o.store.directory = dir;
  o.store.durability = lanebus::Durability::Async;
  o.store.map_size_initial = 256ull << 20;
  auto bus = lanebus::Bus::open(o);
  if (!bus.ok()) die("prefill open", bus.status());
  auto q = (*bus)->create_queue("bench.queue", {.lanes = kQueueLanes, .durable = true});
  if (!q.ok()) die("prefill create_queue", q.status());
  std::atomic<std::uint64_t> done{0}, failed{0};
  auto until = Clock::now() + std::chrono::seconds(60);
  std::uint64_t sent = 0;
  for (; sent < n && Clock::now() < until; ++sent) {
    while (sent - done.load(std::memory_order_acquire) >= 8192) std::this_thread::sleep_for(std::chrono::microseconds(100));
    std::string key = "key" + std::to_string(sent % 256);
    auto st = q->publish_async({.key = key, .payload = kPayload}, [&](const lanebus::Status& s, std::uint64_t) {
      if (!s.ok()) failed.fetch_add(1, std::memory_order_relaxed);
      done.fetch_add(1, std::memory_order_release);
    });
    if (!st.ok()) die("prefill publish", st);
  }
  while (done.load(std::memory_order_acquire) < sent) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (failed.load() != 0) die("prefill", lanebus::Status(lanebus::Code::Internal, "publish failed"));
  if (auto st = (*bus)->shutdown(lanebus::ShutdownMode::Drain, std::chrono::seconds(30)); !st.ok()) die("prefill shutdown", st);
  return sent;
}

// Copy the pre-filled store and consume it with workers = 4 (Sync), for at
// most g_seconds; msgs = committed acks (Bus stats), not handler calls.
enum class ConsumeHandler { Plain, Tx, Batch };

Run bus_consume(const std::string& tmpl, std::uint64_t n, ConsumeHandler handler, const std::string& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::copy(tmpl, dir, std::filesystem::copy_options::recursive);
  lanebus::BusOptions o;
  o.workers = kConsumeThreads;
  o.store.directory = dir;
  o.store.durability = lanebus::Durability::Sync;
  o.store.map_size_initial = 256ull << 20;
  auto bus = lanebus::Bus::open(o);
  if (!bus.ok()) die("consume open", bus.status());
  auto q = (*bus)->create_queue("bench.queue", {.lanes = kQueueLanes, .durable = true});
  if (!q.ok()) die("consume create_queue", q.status());
  std::atomic<std::uint64_t> calls{0};
  auto start = Clock::now();
  auto until = start + std::chrono::duration<double>(g_seconds);
  lanebus::Result<lanebus::Subscription> sub =
      handler == ConsumeHandler::Batch
          ? (*bus)->consume_batch(*q,
                                  [&](std::span<const lanebus::MessageView> ms) {
                                    calls.fetch_add(ms.size(), std::memory_order_relaxed);
                                    return lanebus::BatchOutcome::all_acked();
                                  })
      : handler == ConsumeHandler::Tx ? (*bus)->consume_tx(*q,
                              [&](const lanebus::MessageView& m, lanebus::Transaction& t) {
                                calls.fetch_add(1, std::memory_order_relaxed);
                                char k[32];
                                int len = std::snprintf(k, sizeof k, "%u:%llu", m.lane(),
                                                        static_cast<unsigned long long>(m.offset()));
                                if (!t.put("bench_rows", std::string_view(k, static_cast<std::size_t>(len)), m.payload()).ok())
                                  return lanebus::Outcome::retry("put");
                                return lanebus::Outcome::ack();
                              })
         : (*bus)->consume(*q, [&](const lanebus::MessageView&) {
             calls.fetch_add(1, std::memory_order_relaxed);
             return lanebus::Outcome::ack();
           });
  if (!sub.ok()) die("consume", sub.status());
  std::uint64_t acked = 0;
  while ((acked = queue_acked(**bus)) < n && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  (void)sub->close();
  (void)(*bus)->shutdown(lanebus::ShutdownMode::Abandon, std::chrono::seconds(10));
  Run r;
  r.msgs = acked;
  r.msgs_per_sec = static_cast<double>(acked) / elapsed;
  return r;
}

std::string lane_key(std::uint32_t lane, std::uint64_t off) {
  std::string k(12, '\0');
  for (int b = 0; b < 4; ++b) k[static_cast<std::size_t>(b)] = static_cast<char>(lane >> (24 - 8 * b));
  for (int b = 0; b < 8; ++b) k[static_cast<std::size_t>(4 + b)] = static_cast<char>(off >> (56 - 8 * b));
  return k;
}

// Raw LMDB queue: see the file comment. `n` messages over kQueueLanes lanes.
Run lmdb_batch_ack(std::uint64_t n, bool with_row, const std::string& dir) {
  lanebus::detail::LmdbEnv::Config c;
  c.path = dir;
  c.map_size_initial = 1ull << 30;
  c.map_size_max = 1ull << 30;
  auto env = lanebus::detail::LmdbEnv::open(c);
  if (!env.ok()) die("lmdb_batch_ack open", env.status());
  lanebus::detail::LmdbDbi log = 0, inflight = 0, cursor = 0, rows = 0;
  const std::uint64_t per_lane = n / kQueueLanes;
  {
    auto txn = (*env)->begin_write();
    auto a = (*env)->open_dbi(*txn, "log", true);
    auto b = (*env)->open_dbi(*txn, "inflight", true);
    auto d = (*env)->open_dbi(*txn, "cursor", true);
    auto e = (*env)->open_dbi(*txn, "rows", true);
    if (!a.ok() || !b.ok() || !d.ok() || !e.ok()) std::exit(1);
    log = *a, inflight = *b, cursor = *d, rows = *e;
    for (std::uint32_t lane = 0; lane < kQueueLanes; ++lane)
      for (std::uint64_t off = 0; off < per_lane; ++off)
        if (auto st = txn->put_append(log, lane_key(lane, off), kPayload); !st.ok()) die("lmdb prefill", st);
    if (auto st = txn->commit(); !st.ok()) die("lmdb prefill commit", st);
  }
  std::atomic<std::uint64_t> total{0};
  auto start = Clock::now();
  auto until = start + std::chrono::duration<double>(g_seconds);
  std::vector<std::thread> ts;
  for (int t = 0; t < kConsumeThreads; ++t) {
    ts.emplace_back([&, t] {
      std::uint64_t mine = 0;
      std::string copy, claim(12, 'c');
      std::vector<std::string> keys;
      for (std::uint32_t turn = 0; Clock::now() < until; ++turn) {
        auto txn = (*env)->begin_write();
        if (!txn.ok()) die("lmdb_batch_ack begin", txn.status());
        // This thread's lanes: t and t + 4; take the next one with messages left.
        std::uint32_t lane = 0;
        std::uint64_t off = per_lane;
        for (std::uint32_t k = 0; k < 2 && off >= per_lane; ++k) {
          lane = static_cast<std::uint32_t>(t) + 4 * ((turn + k) % 2);
          auto cur = txn->get(cursor, lane_key(lane, 0));
          off = 0;
          if (cur.ok()) std::memcpy(&off, cur->data(), sizeof off);
        }
        if (off >= per_lane) break;  // both lanes drained
        std::uint64_t cnt = std::min(kAckBatch, per_lane - off);
        keys.clear();
        for (std::uint64_t i = 0; i < cnt; ++i) {  // claim
          keys.push_back(lane_key(lane, off + i));
          auto v = txn->get(log, keys.back());
          if (!v.ok()) die("lmdb_batch_ack get", v.status());
          copy.assign(*v);
          if (auto st = txn->put(inflight, keys.back(), claim); !st.ok()) die("lmdb_batch_ack claim", st);
        }
        for (std::uint64_t i = 0; i < cnt; ++i) {  // ack
          if (with_row) {
            if (auto st = txn->put(rows, keys[i], kPayload); !st.ok()) die("lmdb_batch_ack row", st);
          }
          if (auto st = txn->del(inflight, keys[i]); !st.ok()) die("lmdb_batch_ack ack", st);
        }
        std::uint64_t next = off + cnt;
        if (auto st = txn->put(cursor, lane_key(lane, 0), std::string_view(reinterpret_cast<const char*>(&next), sizeof next));
            !st.ok())
          die("lmdb_batch_ack cursor", st);
        if (auto st = txn->commit(); !st.ok()) die("lmdb_batch_ack commit", st);
        mine += cnt;
      }
      total.fetch_add(mine);
    });
  }
  for (auto& th : ts) th.join();
  Run r;
  r.msgs = total.load();
  r.msgs_per_sec = static_cast<double>(r.msgs) / std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

// SQLite WAL synchronous=FULL: per transaction select 64 rows of one lane and delete them.
Run sqlite_batch_ack(std::uint64_t n, const std::string& dir) {
  const std::string path = dir + "/q.db";
  {
    sqlite3* db = nullptr;
    sqlite3_open(path.c_str(), &db);
    sqlite3_exec(db,
                 "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF;"
                 "CREATE TABLE q(id INTEGER PRIMARY KEY, lane INTEGER, v BLOB);"
                 "CREATE INDEX q_lane ON q(lane, id); BEGIN;",
                 nullptr, nullptr, nullptr);
    sqlite3_stmt* ins = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO q(lane, v) VALUES(?, ?)", -1, &ins, nullptr);
    for (std::uint64_t i = 0; i < n; ++i) {
      sqlite3_bind_int(ins, 1, static_cast<int>(i % kQueueLanes));
      sqlite3_bind_blob(ins, 2, kPayload.data(), static_cast<int>(kPayload.size()), SQLITE_STATIC);
      sqlite3_step(ins);
      sqlite3_reset(ins);
    }
    sqlite3_finalize(ins);
    sqlite3_exec(db, "COMMIT; PRAGMA wal_checkpoint(TRUNCATE);", nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  std::atomic<std::uint64_t> total{0};
  auto start = Clock::now();
  auto until = start + std::chrono::duration<double>(g_seconds);
  std::vector<std::thread> ts;
  for (int t = 0; t < kConsumeThreads; ++t) {
    ts.emplace_back([&, t] {
      sqlite3* db = nullptr;
      sqlite3_open(path.c_str(), &db);
      sqlite3_busy_timeout(db, 10000);
      sqlite3_exec(db, "PRAGMA synchronous=FULL;", nullptr, nullptr, nullptr);
      sqlite3_stmt* sel = nullptr;
      sqlite3_stmt* del = nullptr;
      sqlite3_prepare_v2(db, "SELECT id, v FROM q WHERE lane = ? ORDER BY id LIMIT 64", -1, &sel, nullptr);
      sqlite3_prepare_v2(db, "DELETE FROM q WHERE id = ?", -1, &del, nullptr);
      std::uint64_t mine = 0;
      bool drained[2] = {false, false};
      std::string copy;
      std::vector<sqlite3_int64> ids;
      for (std::uint32_t turn = 0; Clock::now() < until && !(drained[0] && drained[1]); ++turn) {
        std::uint32_t which = turn % 2;
        if (drained[which]) which ^= 1;
        if (sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) continue;
        sqlite3_bind_int(sel, 1, t + 4 * static_cast<int>(which));
        ids.clear();
        while (sqlite3_step(sel) == SQLITE_ROW) {
          ids.push_back(sqlite3_column_int64(sel, 0));
          copy.assign(static_cast<const char*>(sqlite3_column_blob(sel, 1)),
                      static_cast<std::size_t>(sqlite3_column_bytes(sel, 1)));
        }
        sqlite3_reset(sel);
        for (auto id : ids) {
          sqlite3_bind_int64(del, 1, id);
          sqlite3_step(del);
          sqlite3_reset(del);
        }
        if (ids.empty()) drained[which] = true;
        if (sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK) mine += ids.size();
      }
      sqlite3_finalize(sel);
      sqlite3_finalize(del);
      sqlite3_close(db);
      total.fetch_add(mine);
    });
  }
  for (auto& th : ts) th.join();
  Run r;
  r.msgs = total.load();
  r.msgs_per_sec = static_cast<double>(r.msgs) / std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

// ---- end-to-end latency on a Sync durable queue ------------------------------

struct Latency {
  double p50_us = 0, p99_us = 0, p999_us = 0, mean_us = 0, msgs_per_sec = 0;
  std::uint64_t sent = 0, handled = 0;
  // e2e_latency_queue only: the store's write transactions while it ran (a
  // commit's time, begin to return, and the operations it carried).
  double commit_avg_us = 0, commit_call_avg_us = 0, ops_per_commit = 0;
  // e2e_latency_queue only: the hop from a publish's completion (its commit)
  // to its handler call, in ns, one per handled message.
  std::vector<std::uint64_t> hops;
};

Latency percentiles(std::vector<std::uint64_t>& v) {
  Latency l;
  l.p50_us = static_cast<double>(pct(v, 0.50)) / 1e3;
  l.p99_us = static_cast<double>(pct(v, 0.99)) / 1e3;
  l.p999_us = static_cast<double>(pct(v, 0.999)) / 1e3;
  double sum = 0;
  for (std::uint64_t x : v) sum += static_cast<double>(x);
  l.mean_us = v.empty() ? 0 : sum / static_cast<double>(v.size()) / 1e3;
  return l;
}

// The consuming side of the e2e latency cases: a Sync durable queue on a bus
// of two workers whose handler reads the steady-clock stamp at the head of
// each payload (CLOCK_MONOTONIC: one clock for every process on the machine).
// `wake`: StoreOptions::wake_on_commit (false = other processes' appends are
// found by the poll alone, BusOptions::durable_poll at its default 50 ms).
struct LatencyQueue {
  LatencyQueue(double rate, const std::string& dir, bool wake, const char* what)
      : what(what), cap(static_cast<std::size_t>(rate * g_seconds * 1.5) + 1024), lat(cap) {
    lanebus::BusOptions o;
    o.workers = 2;
    o.store.directory = dir;
    o.store.durability = lanebus::Durability::Sync;
    o.store.map_size_initial = 256ull << 20;
    o.store.wake_on_commit = wake;
    auto b = lanebus::Bus::open(o);
    if (!b.ok()) die((std::string(what) + " open").c_str(), b.status());
    bus = std::move(*b);
    auto q = bus->create_queue("bench.latency", {.lanes = kQueueLanes, .durable = true});
    if (!q.ok()) die((std::string(what) + " create_queue").c_str(), q.status());
    queue = *q;
    auto s = bus->consume(queue, [this](const lanebus::MessageView& m) {
      std::uint64_t t0 = 0, seq = 0;
      std::memcpy(&t0, m.payload().data(), sizeof t0);
      std::memcpy(&seq, m.payload().data() + sizeof t0, sizeof seq);
      const std::uint64_t now = steady_ns();
      std::uint64_t d = now - t0;
      // Relaxed: each handler call owns its slot; `lat` is read after close() joins the calls.
      std::size_t i = slot.fetch_add(1, std::memory_order_relaxed);
      if (i < cap) lat[i] = d;
      if (i < cap && seq < cap) {
        // The completion ran on the writer thread after the commit; 0: not
        // yet (the handler ran first), a hop of 0.
        const std::uint64_t done = done_at[seq].load(std::memory_order_acquire);
        hop[i] = done != 0 && now > done ? now - done : 0;
      }
      handled.fetch_add(1, std::memory_order_release);
      return lanebus::Outcome::ack();
    });
    if (!s.ok()) die((std::string(what) + " consume").c_str(), s.status());
    sub = std::move(*s);
  }

  // Waits for `sent` handled, bounded: a consumer slower than the offered
  // rate leaves messages unhandled (printed as handled < sent; the
  // percentiles then cover the handled ones only).
  void drain(std::uint64_t sent) const {
    auto until = Clock::now() + std::chrono::duration<double>(std::max(1.0, g_seconds));
    while (handled.load(std::memory_order_acquire) < sent && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  Latency finish(std::uint64_t sent, double msgs_per_sec) {
    (void)sub.close();
    (void)bus->shutdown(lanebus::ShutdownMode::Abandon, std::chrono::seconds(10));
    lat.resize(std::min(handled.load(), cap));
    hop.resize(lat.size());
    Latency l = percentiles(lat);
    l.hops = std::move(hop);
    l.sent = sent;
    l.handled = handled.load();
    l.msgs_per_sec = msgs_per_sec;
    return l;
  }

  const char* what;
  std::size_t cap;
  std::vector<std::uint64_t> lat;
  // done_at[seq]: steady_ns() when message seq's publish completed (0: not
  // yet); hop[i]: handler call i's time since its message's completion.
  std::unique_ptr<std::atomic<std::uint64_t>[]> done_at = std::make_unique<std::atomic<std::uint64_t>[]>(cap);
  std::vector<std::uint64_t> hop = std::vector<std::uint64_t>(cap);
  std::atomic<std::size_t> slot{0}, handled{0};
  std::unique_ptr<lanebus::Bus> bus;
  lanebus::Topic queue;
  lanebus::Subscription sub;
};

// Publishes to `q` at `rate` msg/s for `seconds` with publish_async, each
// payload stamped with steady_ns() at its head and its sequence number after
// it; failed completions counted in `failed`. `done_at` (when not null, `cap`
// entries): each completion's steady_ns() at its sequence number. Returns the
// count sent and the seconds it took.
struct Paced {
  std::uint64_t sent = 0;
  double seconds = 0;
};
Paced publish_paced(const lanebus::Topic& q, double rate, double seconds, std::atomic<std::uint64_t>& failed,
                    const char* what, std::atomic<std::uint64_t>* done_at = nullptr, std::size_t cap = 0) {
  std::string payload = kPayload;
  auto start = Clock::now();
  auto until = start + std::chrono::duration<double>(seconds);
  const auto gap = std::chrono::nanoseconds(static_cast<std::int64_t>(1e9 / rate));
  Paced r;
  for (auto next = start; next < until; next += gap, ++r.sent) {
    std::this_thread::sleep_until(next);
    std::uint64_t now = steady_ns();
    std::memcpy(payload.data(), &now, sizeof now);
    const std::uint64_t seq = r.sent;
    std::memcpy(payload.data() + sizeof now, &seq, sizeof seq);
    std::string key = "key" + std::to_string(r.sent % 256);
    auto st = q.publish_async({.key = key, .payload = payload}, [&failed, done_at, cap, seq](const lanebus::Status& s, std::uint64_t) {
      if (done_at != nullptr && seq < cap) done_at[seq].store(steady_ns(), std::memory_order_release);
      if (!s.ok()) failed.fetch_add(1, std::memory_order_relaxed);
    });
    if (!st.ok()) die(what, st);
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

// One producer paced at `rate` msg/s with publish_async for g_seconds.
Latency e2e_queue(double rate, const std::string& dir) {
  LatencyQueue c(rate, dir, true, "e2e");
  const auto before = lanebus::detail::Access::core(*c.bus)->store()->counters();
  std::atomic<std::uint64_t> failed{0};
  const Paced p = publish_paced(c.queue, rate, g_seconds, failed, "e2e publish", c.done_at.get(), c.cap);
  const std::uint64_t sent = p.sent;
  const double send_elapsed = p.seconds;
  c.drain(sent);
  const auto k = lanebus::detail::Access::core(*c.bus)->store()->counters();
  const double commits = static_cast<double>(k.commits - before.commits);
  if (std::getenv("BENCH_DEBUG") != nullptr) {
    std::fprintf(stderr, "e2e commits=%llu claims=%llu claims_ahead=%llu acks=%llu\n",
                 static_cast<unsigned long long>(k.commits), static_cast<unsigned long long>(k.claims),
                 static_cast<unsigned long long>(k.claims_ahead), static_cast<unsigned long long>(k.acks));
  }
  Latency l = c.finish(sent, static_cast<double>(sent) / send_elapsed);
  if (commits > 0) {
    l.commit_avg_us = static_cast<double>(k.commit_ns - before.commit_ns) / commits / 1e3;
    l.commit_call_avg_us = static_cast<double>(k.commit_call_ns - before.commit_call_ns) / commits / 1e3;
    l.ops_per_commit = static_cast<double>(k.batched_ops - before.batched_ops) / commits;
  }
  if (failed.load() != 0) std::fprintf(stderr, "e2e: %llu publishes failed\n", static_cast<unsigned long long>(failed.load()));
  return l;
}

// Cross-process: a child (this binary with --publish-child) publishes at
// `rate` for g_seconds to a Sync durable queue; this process consumes it.
Latency e2e_queue_xproc(double rate, const std::string& dir, bool wake) {
  LatencyQueue c(rate, dir, wake, "xproc");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) std::exit(1);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  char rate_s[32], secs_s[32];
  std::snprintf(rate_s, sizeof rate_s, "%.0f", rate);
  std::snprintf(secs_s, sizeof secs_s, "%.3f", g_seconds);
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<char*> args = {self.data(), const_cast<char*>("--publish-child"), const_cast<char*>(dir.c_str()),
                             rate_s, secs_s, nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, self.c_str(), &fa, nullptr, args.data(), environ) != 0) std::exit(1);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int wst = 0;
  waitpid(pid, &wst, 0);
  std::uint64_t sent = 0;
  double offered = 0;
  if (std::sscanf(out.c_str(), "sent %llu rate %lf", reinterpret_cast<unsigned long long*>(&sent), &offered) != 2) {
    std::fprintf(stderr, "xproc: publisher child failed: %s\n", out.c_str());
    std::exit(1);
  }
  c.drain(sent);
  if (std::getenv("BENCH_DEBUG") != nullptr) {
    auto k = lanebus::detail::Access::core(*c.bus)->store()->counters();
    std::fprintf(stderr, "xproc wake=%d wakes_received=%llu commits=%llu claims=%llu\n", wake ? 1 : 0,
                 static_cast<unsigned long long>(k.commit_wakes_received), static_cast<unsigned long long>(k.commits),
                 static_cast<unsigned long long>(k.claims));
  }
  return c.finish(sent, offered);
}

// The publisher process of e2e_queue_xproc: prints "sent N rate R" at the end.
int publish_child(const char* dir, double rate, double seconds) {
  lanebus::BusOptions o;
  o.workers = 1;
  o.store.directory = dir;
  o.store.durability = lanebus::Durability::Sync;
  o.store.map_size_initial = 256ull << 20;
  auto bus = lanebus::Bus::open(o);
  if (!bus.ok()) die("xproc child open", bus.status());
  auto q = (*bus)->create_queue("bench.latency", {.lanes = kQueueLanes, .durable = true});
  if (!q.ok()) die("xproc child create_queue", q.status());
  // A failed completion is not counted here: the consumer's handled < sent shows it.
  std::atomic<std::uint64_t> failed{0};
  const Paced p = publish_paced(*q, rate, seconds, failed, "xproc child publish");
  const std::uint64_t sent = p.sent;
  const double elapsed = p.seconds;
  (void)(*bus)->shutdown(lanebus::ShutdownMode::Drain, std::chrono::seconds(10));
  std::printf("sent %llu rate %.0f\n", static_cast<unsigned long long>(sent), static_cast<double>(sent) / elapsed);
  std::fflush(stdout);
  return 0;
}

// The floor of a durable hop: one put + fsynced commit, back to back, for g_seconds / 2.
Latency lmdb_commit_latency(const std::string& dir) {
  lanebus::detail::LmdbEnv::Config c;
  c.path = dir;
  c.map_size_initial = 256ull << 20;
  c.map_size_max = 256ull << 20;
  auto env = lanebus::detail::LmdbEnv::open(c);
  if (!env.ok()) die("lmdb_commit open", env.status());
  lanebus::detail::LmdbDbi dbi = 0;
  {
    auto txn = (*env)->begin_write();
    auto d = (*env)->open_dbi(*txn, "log", true);
    if (!d.ok() || !txn->commit().ok()) std::exit(1);
    dbi = *d;
  }
  std::vector<std::uint64_t> lat;
  auto until = Clock::now() + std::chrono::duration<double>(g_seconds / 2);
  for (std::uint64_t i = 0; Clock::now() < until; ++i) {
    std::uint64_t t0 = steady_ns();
    auto txn = (*env)->begin_write();
    if (!txn.ok()) die("lmdb_commit begin", txn.status());
    if (auto st = txn->put_append(dbi, lane_key(0, i), kPayload); !st.ok()) die("lmdb_commit put", st);
    if (auto st = txn->commit(); !st.ok()) die("lmdb_commit commit", st);
    lat.push_back(steady_ns() - t0);
  }
  Latency l = percentiles(lat);
  l.handled = l.sent = lat.size();
  return l;
}

void line(const char* name, const Run& x, const char* baseline, const Run& y, bool latency) {
  std::printf("bench=durable case=%s lanebus_msgs_per_sec=%.0f baseline=%s baseline_msgs_per_sec=%.0f ratio=%.2f", name,
              x.msgs_per_sec, baseline, y.msgs_per_sec, y.msgs_per_sec > 0 ? x.msgs_per_sec / y.msgs_per_sec : 0.0);
  if (latency) {
    std::printf(" lanebus_p50_ns=%llu lanebus_p99_ns=%llu lanebus_p999_ns=%llu lanebus_avg_batch=%.1f",
                static_cast<unsigned long long>(x.p50_ns), static_cast<unsigned long long>(x.p99_ns),
                static_cast<unsigned long long>(x.p999_ns), x.avg_batch);
  }
  std::printf("\n");
  std::fflush(stdout);
}

void banner() {
  utsname u{};
  uname(&u);
  std::string cpu = "unknown";
  std::ifstream in("/proc/cpuinfo");
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("model name", 0) == 0) {
      cpu = l.substr(l.find(':') + 2);
      break;
    }
  }
  std::printf("bench=durable machine=\"%s, %u cpus, %s %s\" compiler=\"%s\" build=%s lmdb=\"%s\" sqlite=%s tmp=%s\n",
              cpu.c_str(), std::thread::hardware_concurrency(), u.sysname, u.release, __VERSION__, BENCH_BUILDTYPE,
              lanebus::detail::lmdb_version_string(), sqlite3_libversion(),
              std::filesystem::temp_directory_path().c_str());
#if !defined(__OPTIMIZE__)
  std::printf("WARNING: built without optimization; numbers are not representative\n");
#endif
#if !defined(NDEBUG)
  std::printf("WARNING: asserts are enabled (build with -Dbuildtype=release for real numbers)\n");
#endif
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--publish-child") == 0) {
    return publish_child(argv[2], std::atof(argv[3]), std::atof(argv[4]));
  }
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--smoke") == 0) {
      g_seconds = 0.15;
      g_repeats = 1;
      g_queue_messages = 512;
    }
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) g_seconds = std::atof(argv[++i]);
    if (std::strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) g_repeats = std::max(1, std::atoi(argv[++i]));
    if (std::strcmp(argv[i], "--messages") == 0 && i + 1 < argc) g_queue_messages = std::strtoull(argv[++i], nullptr, 10);
    if (std::strcmp(argv[i], "--run") == 0 && i + 1 < argc) only = argv[++i];
    if (std::strcmp(argv[i], "--rate") == 0 && i + 1 < argc) g_rate = std::max(1.0, std::atof(argv[++i]));
    if (std::strcmp(argv[i], "--help") == 0) {
      std::printf("usage: durable [--smoke] [--seconds S] [--repeats R] [--messages N] [--rate MSG_PER_S] [--run CASE]\n"
                  "cases: sync_1p sync_4p async_4p replay queue_consume_4c tx_consume_4c e2e_latency_queue\n"
                  "       e2e_latency_queue_xproc (publisher in a child process; consumer woken by the commit or by the poll)\n"
                  "       batch_sweep (only with --run: Sync throughput of 4 producers against the group-commit batch)\n"
                  "       delayed_sync_4p (only with --run: sync_4p through a Bus with every message delayed 1 ms,\n"
                  "       publish to delivery, against the same undelayed)\n"
                  "       layouts (only with --run: prototype log layouts in raw LMDB, one sequence with and without\n"
                  "       a per-lane index, against the baseline and lanebus's layout: appends, small commits, replay)\n"
                  "       commit_shapes (only with --run: fsynced commits shaped like e2e_latency_queue's, in raw LMDB,\n"
                  "       lanebus's layout against a proposed sequence layout, against one 64-byte put)\n"
                  "       retained_sync_4p (only with --run: sync_4p for 4x --seconds on a topic that keeps\n"
                  "       50,000 messages a lane, so retention frees pages as fast as appends take them:\n"
                  "       the rate in each quarter of the run, and the data file's size)\n");
      return 0;
    }
  }
  banner();
  auto want = [&](const char* c) { return only.empty() || only == c; };
  if (only == "batch_sweep") {
    // Sync publish with 4 producers at growing in-flight windows: the group
    // commit batch grows with them; raw LMDB commits the same batch per fsync.
    for (int w : {1, 2, 8, 32, 128, 512}) {
      g_window = w;
      Run x = lanebus_publish(4, lanebus::Durability::Sync, fresh_dir("sweep"));
      auto b = static_cast<std::uint64_t>(std::max(1.0, x.avg_batch + 0.5));
      Run y = lmdb_raw(false, b, fresh_dir("sweep_lmdb"));
      std::printf("bench=durable case=batch_sweep producers=4 window=%d lanebus_avg_batch=%.1f lanebus_msgs_per_sec=%.0f "
                  "lanebus_p50_ns=%llu lanebus_p99_ns=%llu baseline=lmdb_fsync baseline_batch=%llu "
                  "baseline_msgs_per_sec=%.0f\n",
                  w, x.avg_batch, x.msgs_per_sec, static_cast<unsigned long long>(x.p50_ns),
                  static_cast<unsigned long long>(x.p99_ns), static_cast<unsigned long long>(b), y.msgs_per_sec);
      std::fflush(stdout);
    }
  }
  if (only == "retained_sync_4p") {
    // Record batches live on runs of overflow pages (doc/storage-format.md):
    // once retention deletes as fast as publishers append, every batch needs
    // a run of free pages. The rate per quarter shows whether that slows.
    lanebus::RetentionOptions keep;
    keep.max_count = 50'000;
    const double seconds = g_seconds;
    g_seconds = 4 * seconds;
    std::vector<double> quarters(4);
    const std::string dir = fresh_dir("retained_sync_4p");
    Run x = lanebus_publish(4, lanebus::Durability::Sync, dir, keep, &quarters);
    g_seconds = seconds;
    std::error_code ec;
    const auto file = std::filesystem::file_size(dir + "/data.mdb", ec);
    std::printf("bench=durable case=retained_sync_4p max_count_per_lane=50000 lanebus_msgs_per_sec=%.0f "
                "quarter1=%.0f quarter2=%.0f quarter3=%.0f quarter4=%.0f last_over_first=%.2f "
                "data_file_mb=%.1f lanebus_avg_batch=%.1f\n",
                x.msgs_per_sec, quarters[0], quarters[1], quarters[2], quarters[3],
                quarters[0] > 0 ? quarters[3] / quarters[0] : 0.0, ec ? 0.0 : static_cast<double>(file) / 1e6,
                x.avg_batch);
    std::fflush(stdout);
  }
  std::string sync4_dir;
  if (want("sync_1p")) {
    Run x = lanebus_publish(1, lanebus::Durability::Sync, fresh_dir("sync_1p"));
    auto b = static_cast<std::uint64_t>(std::max(1.0, x.avg_batch + 0.5));
    line("sync_1p", x, "lmdb_fsync", lmdb_raw(false, b, fresh_dir("lmdb_fsync_1")), true);
    line("sync_1p", x, "sqlite_full", sqlite_full(1, 1, fresh_dir("sqlite_full_1")), true);
  }
  if (want("sync_4p") || want("replay")) {
    sync4_dir = fresh_dir("sync_4p");
    Run x = lanebus_publish(4, lanebus::Durability::Sync, sync4_dir);
    auto b = static_cast<std::uint64_t>(std::max(1.0, x.avg_batch + 0.5));
    std::string lmdb_dir = fresh_dir("lmdb_fsync_4");
    Run lm = lmdb_raw(false, b, lmdb_dir);
    // The record-batch prototype's log (lmdb_raw): its append rate, and its replay below.
    const std::string batches_dir = fresh_dir("lmdb_fsync_lane_batches");
    Run lm_batches = lmdb_raw(false, b, batches_dir, RawLayout::LaneBatches);
    if (want("sync_4p")) {
      std::printf("bench=durable note=\"lmdb_fsync and sqlite_full_batched commit %llu messages per txn (lanebus's average batch in sync_4p)\"\n",
                  static_cast<unsigned long long>(b));
      line("sync_4p", x, "lmdb_fsync", lm, true);
      line("sync_4p", x, "lmdb_fsync_lanes", lmdb_raw(false, b, fresh_dir("lmdb_fsync_lanes"), RawLayout::Lanes), true);
      line("sync_4p", x, "lmdb_fsync_lane_batches", lm_batches, true);
      line("sync_4p", x, "lmdb_fsync_lane_dbs", lmdb_raw(false, b, fresh_dir("lmdb_fsync_lane_dbs"), RawLayout::LaneDbs),
           true);
      line("sync_4p", x, "sqlite_full", sqlite_full(4, 1, fresh_dir("sqlite_full_4")), true);
      line("sync_4p", x, "sqlite_full_batched", sqlite_full(4, b, fresh_dir("sqlite_batched_4")), true);
    }
    if (want("replay")) {
      // Also the raw cursor over lanebus's own log: what the log's layout
      // costs (page fill, record size) apart from lanebus's reader.
      std::vector<double> x, y, z, v;
      double fill_raw = 0, fill_log = 0;
      std::uint64_t logged = 0;
      for (int r = 0; r < g_repeats; ++r) {
        const Run rr = lanebus_replay(sync4_dir);
        x.push_back(rr.msgs_per_sec);
        logged = rr.msgs;
        y.push_back(lmdb_cursor(lmdb_dir, &fill_raw).msgs_per_sec);
        z.push_back(lmdb_cursor(sync4_dir, &fill_log, true).msgs_per_sec);
        v.push_back(lanebus_replay(sync4_dir, true).msgs_per_sec);
      }
      ratio_line("replay", "msg_per_s", x, "lmdb_cursor", y);
      ratio_line("replay_in_place", "msg_per_s", v, "lmdb_cursor", y);
      ratio_line("replay_in_place", "msg_per_s", v, "replay", x);
      char fills[96];
      std::snprintf(fills, sizeof fills, "msgs_per_page=%.1f baseline_msgs_per_page=%.1f ", fill_log, fill_raw);
      ratio_line("replay", "msg_per_s", x, "lmdb_cursor_lanebus_log", z, fills);
      // The same log through the Bus: a new group with a one-message handler
      // and one with a batch handler (spans of 64), each from the earliest message.
      std::vector<double> bs, bb;
      for (int r = 0; r < g_repeats; ++r) {
        bs.push_back(bus_replay(sync4_dir, logged, false, r).msgs_per_sec);
        bb.push_back(bus_replay(sync4_dir, logged, true, r).msgs_per_sec);
      }
      ratio_line("replay_bus", "msg_per_s", bs, "lmdb_cursor", y);
      ratio_line("replay_bus_batch", "msg_per_s", bb, "lmdb_cursor", y);
      ratio_line("replay_bus_batch", "msg_per_s", bb, "replay_bus", bs);
      // The prototype's log read as lanebus's reader reads (checksum and copy
      // per record), against the issue's raw cursor.
      std::vector<double> w, w0;
      double per_leaf = 0;
      for (int r = 0; r < g_repeats; ++r) {
        w.push_back(lmdb_cursor_lane_batches(batches_dir, false, &per_leaf).msgs_per_sec);
        w0.push_back(lmdb_cursor_lane_batches(batches_dir, true).msgs_per_sec);
      }
      std::snprintf(fills, sizeof fills, "records_per_leaf_page=%.1f baseline_entries_per_leaf_page=%.1f ", per_leaf,
                    fill_raw);
      ratio_line("replay_lane_batches_decoded", "msg_per_s", w, "lmdb_cursor", y, fills);
      ratio_line("replay_lane_batches_in_place", "msg_per_s", w0, "lmdb_cursor", y, fills);
    }
  }
  if (want("sync_batch64")) {
    // Durable publish_batch (one writer request, one fsync per span) against
    // the same thread publishing one by one (one fsync each), and raw LMDB
    // committing 64 puts per fsynced transaction.
    std::vector<double> x, one, lm;
    for (int r = 0; r < g_repeats; ++r) {
      x.push_back(bus_publish_batched(64, fresh_dir("sync_batch64")));
      one.push_back(bus_publish_batched(1, fresh_dir("sync_batch64_one")));
      lm.push_back(lmdb_raw(false, 64, fresh_dir("lmdb_fsync_64")).msgs_per_sec);
    }
    ratio_line("sync_batch64", "msg_per_s", x, "publish_one_by_one", one, "note=Bus_publish_batch_of_64_durable_Sync ");
    ratio_line("sync_batch64", "msg_per_s", x, "lmdb_fsync_64", lm, "note=Bus_publish_batch_of_64_durable_Sync ");
  }
  if (only == "delayed_sync_4p") {
    std::vector<double> x, y;
    for (int r = 0; r < g_repeats; ++r) {
      x.push_back(bus_publish_4p(true, fresh_dir("delayed_sync_4p")));
      y.push_back(bus_publish_4p(false, fresh_dir("sync_4p_bus")));
    }
    ratio_line("delayed_sync_4p", "msg_per_s", x, "sync_4p_bus_undelayed", y,
               "note=publish_to_delivery_through_a_Bus_delay_1ms ");
  }
  if (want("async_4p")) {
    Run x = lanebus_publish(4, lanebus::Durability::Async, fresh_dir("async_4p"));
    auto b = static_cast<std::uint64_t>(std::max(1.0, x.avg_batch + 0.5));
    line("async_4p", x, "lmdb_nosync", lmdb_raw(true, b, fresh_dir("lmdb_nosync")), false);
    line("async_4p", x, "lmdb_nosync_lanes", lmdb_raw(true, b, fresh_dir("lmdb_nosync_lanes"), RawLayout::Lanes), false);
    line("async_4p", x, "lmdb_nosync_lane_batches", lmdb_raw(true, b, fresh_dir("lmdb_nosync_lane_batches"), RawLayout::LaneBatches),
         false);
    line("async_4p", x, "lmdb_nosync_lane_dbs", lmdb_raw(true, b, fresh_dir("lmdb_nosync_lane_dbs"), RawLayout::LaneDbs),
         false);
  }
  if (only == "commit_shapes") {
    run_commit_shapes();
    return 0;
  }
  if (only == "layouts") {
    // Prototype log layouts in raw LMDB (doc/performance.md, "One sequence for
    // the log"): lanebus's record in lanebus's layout, in one sequence, and in
    // one sequence with a per-lane index, against the issue's baseline, each at
    // lanebus's own batch (sync_4p, async_4p); then small fsynced commits
    // (the e2e_latency_queue shape: commit time and bytes written), then replay.
    const Run xs = lanebus_publish(4, lanebus::Durability::Sync, fresh_dir("layouts_sync"));
    const Run xa = lanebus_publish(4, lanebus::Durability::Async, fresh_dir("layouts_async"));
    const auto bs = static_cast<std::uint64_t>(std::max(1.0, xs.avg_batch + 0.5));
    const auto ba = static_cast<std::uint64_t>(std::max(1.0, xa.avg_batch + 0.5));
    std::printf("bench=durable case=layouts note=\"lanebus sync_4p %.0f msg/s (batch %llu), async_4p %.0f msg/s (batch %llu)\"\n",
                xs.msgs_per_sec, static_cast<unsigned long long>(bs), xa.msgs_per_sec, static_cast<unsigned long long>(ba));
    struct L {
      const char* name;
      RawLayout layout;
    };
    const L layouts[] = {{"sequence", RawLayout::Sequence}, {"lanes", RawLayout::Lanes}, {"seq", RawLayout::Seq},
                         {"seq_index", RawLayout::SeqIndex}};
    std::vector<double> sync_rate[4], async_rate[4];
    std::string seq_dir, seq_index_dir, sequence_dir;
    for (int r = 0; r < g_repeats; ++r) {
      for (int i = 0; i < 4; ++i) {
        const std::string d = fresh_dir(std::string("layouts_") + layouts[i].name);
        sync_rate[i].push_back(lmdb_raw(false, bs, d, layouts[i].layout).msgs_per_sec);
        if (layouts[i].layout == RawLayout::Seq) seq_dir = d;
        if (layouts[i].layout == RawLayout::SeqIndex) seq_index_dir = d;
        if (layouts[i].layout == RawLayout::Sequence) sequence_dir = d;
        async_rate[i].push_back(lmdb_raw(true, ba, fresh_dir(std::string("layouts_async_") + layouts[i].name),
                                         layouts[i].layout)
                                    .msgs_per_sec);
      }
    }
    // The baseline's own layout with MDB_NOMETASYNC: one fsync per commit
    // instead of two (data pages, then the meta page through O_DSYNC).
    std::vector<double> sync_pipelined;
    for (int r = 0; r < g_repeats; ++r)
      sync_pipelined.push_back(lmdb_raw(false, bs, fresh_dir("layouts_nometasync"), RawLayout::Sequence, nullptr, true).msgs_per_sec);
    ratio_line("layout_sync_sequence_nometasync", "msg_per_s", sync_pipelined, "lmdb_fsync", sync_rate[0]);
    for (int i = 1; i < 4; ++i) {
      const std::string a = std::string("layout_sync_") + layouts[i].name;
      const std::string b = std::string("layout_async_") + layouts[i].name;
      ratio_line(a.c_str(), "msg_per_s", sync_rate[i], "lmdb_fsync", sync_rate[0]);
      ratio_line(b.c_str(), "msg_per_s", async_rate[i], "lmdb_nosync", async_rate[0]);
    }
    // Small fsynced commits: 5 appends each (e2e_latency_queue's commits carry
    // about 5 appends and 5 claims or acks), 300 commits a layout, in rounds.
    std::vector<double> commit_us[4], written_kb[4];
    for (int r = 0; r < g_repeats; ++r) {
      for (int i = 0; i < 4; ++i) {
        CommitProbe probe;
        probe.commits = 300;
        lmdb_raw(false, 5, fresh_dir(std::string("layouts_commit_") + layouts[i].name), layouts[i].layout, &probe);
        commit_us[i].push_back(probe.avg_commit_us);
        written_kb[i].push_back(probe.avg_written_kb);
      }
    }
    for (int i = 0; i < 4; ++i) {
      const std::string a = std::string("layout_commit5_") + layouts[i].name;
      char extra[64];
      std::snprintf(extra, sizeof extra, "written_kb_per_commit=%.1f ", spread(written_kb[i]).median);
      ratio_line(a.c_str(), "commit_us", commit_us[i], "sequence_commit_us", commit_us[0], extra);
    }
    // The same 5-append commits of the baseline's layout with MDB_NOMETASYNC:
    // alone (a busy writer: each commit durable when the next one returns) and
    // followed by a sync (an idle writer making its last commit durable).
    std::vector<double> pipelined_us, idle_us;
    for (int r = 0; r < g_repeats; ++r) {
      CommitProbe probe;
      probe.commits = 300;
      lmdb_raw(false, 5, fresh_dir("layouts_commit_nometasync"), RawLayout::Sequence, &probe, true);
      pipelined_us.push_back(probe.avg_commit_us);
      probe.sync_each = true;
      lmdb_raw(false, 5, fresh_dir("layouts_commit_nometasync_sync"), RawLayout::Sequence, &probe, true);
      idle_us.push_back(probe.avg_commit_us);
    }
    ratio_line("layout_commit5_sequence_nometasync", "commit_us", pipelined_us, "sequence_commit_us", commit_us[0]);
    ratio_line("layout_commit5_sequence_nometasync_then_sync", "commit_us", idle_us, "sequence_commit_us", commit_us[0]);
    // Replay: the seq log walked whole (a topic-wide reader), and the
    // seq_index log read lane by lane through its index.
    std::vector<double> base, copy_only, whole, by_lane;
    for (int r = 0; r < g_repeats; ++r) {
      base.push_back(lmdb_cursor(sequence_dir).msgs_per_sec);
      copy_only.push_back(lmdb_cursor(seq_dir).msgs_per_sec);
      whole.push_back(lmdb_cursor_seq(seq_dir).msgs_per_sec);
      by_lane.push_back(lmdb_lanes_through_index(seq_index_dir).msgs_per_sec);
    }
    ratio_line("layout_replay_seq_copy_only", "msg_per_s", copy_only, "lmdb_cursor", base);
    ratio_line("layout_replay_seq_whole", "msg_per_s", whole, "lmdb_cursor", base);
    ratio_line("layout_replay_seq_index_by_lane", "msg_per_s", by_lane, "lmdb_cursor", base);
  }
  if (want("queue_consume_4c") || want("tx_consume_4c")) {
    const std::string tmpl = fresh_dir("queue_template");
    const std::uint64_t n = prefill_queue(tmpl, g_queue_messages);
    std::printf("bench=durable note=\"consume cases: %llu pre-filled messages, %u lanes, 4 workers (oversubscribed on %u cpus), "
                "at most %.2f s each; baselines claim+ack %llu per fsynced txn with 4 threads\"\n",
                static_cast<unsigned long long>(n), kQueueLanes, std::thread::hardware_concurrency(), g_seconds,
                static_cast<unsigned long long>(kAckBatch));
    if (want("queue_consume_4c")) {
      std::vector<double> x, xb, lm, sq;
      for (int r = 0; r < g_repeats; ++r) {
        x.push_back(bus_consume(tmpl, n, ConsumeHandler::Plain, fresh_dir("queue_consume")).msgs_per_sec);
        xb.push_back(bus_consume(tmpl, n, ConsumeHandler::Batch, fresh_dir("queue_consume_batch")).msgs_per_sec);
        lm.push_back(lmdb_batch_ack(n, false, fresh_dir("lmdb_batch_ack")).msgs_per_sec);
        sq.push_back(sqlite_batch_ack(n, fresh_dir("sqlite_batch_ack")).msgs_per_sec);
      }
      ratio_line("queue_consume_4c", "msg_per_s", x, "lmdb_batch_ack", lm);
      ratio_line("queue_consume_4c", "msg_per_s", x, "sqlite_batch_ack", sq);
      // Bus::consume_batch (spans of a claim batch, doc/durable.md) on the same queue.
      ratio_line("queue_consume_4c_batch", "msg_per_s", xb, "lmdb_batch_ack", lm);
      ratio_line("queue_consume_4c_batch", "msg_per_s", xb, "queue_consume_4c", x);
    }
    if (want("tx_consume_4c")) {
      std::vector<double> x, lm;
      for (int r = 0; r < g_repeats; ++r) {
        x.push_back(bus_consume(tmpl, n, ConsumeHandler::Tx, fresh_dir("tx_consume")).msgs_per_sec);
        lm.push_back(lmdb_batch_ack(n, true, fresh_dir("lmdb_batch_ack_row")).msgs_per_sec);
      }
      ratio_line("tx_consume_4c", "msg_per_s", x, "lmdb_batch_ack_row", lm);
    }
  }
  if (want("e2e_latency_queue")) {
    const double kRate = g_rate;
    std::vector<double> p50, p99, p999, floor50, floor99, floor999, rate, hop50, hop90, hop_slow, commit_avg, commit_call, floor_avg, ops;
    std::uint64_t sent = 0, handled = 0;
    for (int r = 0; r < g_repeats; ++r) {
      Latency l = e2e_queue(kRate, fresh_dir("e2e_latency"));
      Latency f = lmdb_commit_latency(fresh_dir("lmdb_commit"));
      p50.push_back(l.p50_us), p99.push_back(l.p99_us), p999.push_back(l.p999_us), rate.push_back(l.msgs_per_sec);
      floor50.push_back(f.p50_us), floor99.push_back(f.p99_us), floor999.push_back(f.p999_us);
      commit_avg.push_back(l.commit_avg_us), floor_avg.push_back(f.mean_us), ops.push_back(l.ops_per_commit);
      commit_call.push_back(l.commit_call_avg_us);
      sent += l.sent, handled += l.handled;
      // The hop from completion to handler, and the share of messages whose
      // hop is longer than one raw commit (they waited for a later commit).
      if (!l.hops.empty()) {
        std::size_t slow = 0;
        for (std::uint64_t h : l.hops) slow += static_cast<double>(h) > f.p50_us * 1e3;
        hop_slow.push_back(100.0 * static_cast<double>(slow) / static_cast<double>(l.hops.size()));
        hop50.push_back(static_cast<double>(pct(l.hops, 0.50)) / 1e3);
        hop90.push_back(static_cast<double>(pct(l.hops, 0.90)) / 1e3);
      }
    }
    std::printf("bench=durable case=e2e_latency_queue repeats=%d target_rate=%.0f offered_msg_per_s=%.0f sent=%llu handled=%llu "
                "p50_us=%.1f p50_us_spread=%.1f..%.1f p99_us=%.1f p99_us_spread=%.1f..%.1f p999_us=%.1f p999_us_spread=%.1f..%.1f "
                "lmdb_commit_p50_us=%.1f lmdb_commit_p99_us=%.1f lmdb_commit_p999_us=%.1f ratio=%.2f "
                "hop_p50_us=%.1f hop_p90_us=%.1f hop_over_commit_pct=%.1f "
                "commit_avg_us=%.1f lmdb_commit_avg_us=%.1f commit_over_lmdb=%.2f ops_per_commit=%.1f "
                "commit_call_avg_us=%.1f build_avg_us=%.1f\n",
                g_repeats, kRate, spread(rate).median, static_cast<unsigned long long>(sent),
                static_cast<unsigned long long>(handled), spread(p50).median, spread(p50).min, spread(p50).max,
                spread(p99).median, spread(p99).min, spread(p99).max, spread(p999).median, spread(p999).min,
                spread(p999).max, spread(floor50).median, spread(floor99).median, spread(floor999).median,
                spread(floor50).median > 0 ? spread(p50).median / spread(floor50).median : 0.0, spread(hop50).median,
                spread(hop90).median, spread(hop_slow).median, spread(commit_avg).median, spread(floor_avg).median,
                spread(floor_avg).median > 0 ? spread(commit_avg).median / spread(floor_avg).median : 0.0,
                spread(ops).median, spread(commit_call).median, spread(commit_avg).median - spread(commit_call).median);
    std::fflush(stdout);
  }
  if (want("e2e_latency_queue_xproc")) {
    // Another process publishes (same pacing); this one consumes, woken by
    // the commit (wake.shm) or by its 50 ms poll alone, alternating per repeat.
    const double kRate = g_rate;
    for (bool wake : {false, true}) {
      std::vector<double> p50, p99, p999, rate;
      std::uint64_t sent = 0, handled = 0;
      for (int r = 0; r < g_repeats; ++r) {
        Latency l = e2e_queue_xproc(kRate, fresh_dir("e2e_xproc"), wake);
        p50.push_back(l.p50_us), p99.push_back(l.p99_us), p999.push_back(l.p999_us), rate.push_back(l.msgs_per_sec);
        sent += l.sent, handled += l.handled;
      }
      std::printf("bench=durable case=e2e_latency_queue_xproc consumer=%s repeats=%d target_rate=%.0f "
                  "offered_msg_per_s=%.0f sent=%llu handled=%llu p50_us=%.1f p50_us_spread=%.1f..%.1f p99_us=%.1f "
                  "p99_us_spread=%.1f..%.1f p999_us=%.1f p999_us_spread=%.1f..%.1f\n",
                  wake ? "wake_on_commit" : "poll_50ms", g_repeats, kRate, spread(rate).median,
                  static_cast<unsigned long long>(sent), static_cast<unsigned long long>(handled), spread(p50).median,
                  spread(p50).min, spread(p50).max, spread(p99).median, spread(p99).min, spread(p99).max,
                  spread(p999).median, spread(p999).min, spread(p999).max);
      std::fflush(stdout);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(std::filesystem::path(fresh_dir("x")).parent_path(), ec);
  return 0;
}
