// lanebus — MIT License.
// Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/) from real
// data made through the library: records, DLQ entries, catalogue values of a
// real store, a real lease segment and a real data.mdb. Run once by hand:
//   build-fuzz/fuzz/make_corpus fuzz/corpus
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "dlq.hpp"
#include "durable_store.hpp"
#include "lanebus/lease.hpp"
#include "header_block.hpp"
#include "lanebus/record.hpp"
#include "lmdb_store.hpp"
#include "store_codec.hpp"

using namespace lanebus;
namespace fs = std::filesystem;

namespace {
std::string root;
int n = 0;
void put(const std::string& target, const std::string& bytes) {
  fs::create_directories(root + "/" + target);
  std::ofstream f(root + "/" + target + "/seed-" + std::to_string(++n), std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus DIR\n");
    return 2;
  }
  root = argv[1];
  const std::string tmp = fs::temp_directory_path() / ("lanebus-corpus-" + std::to_string(::getpid()));
  fs::create_directories(tmp);

  // Records.
  for (int i = 0; i < 3; ++i) {
    detail::AppendRequest r;
    r.key = i == 0 ? "" : "key-" + std::to_string(i);
    r.idempotency_key = i == 2 ? "idem-2" : "";
    r.payload = std::string(static_cast<std::size_t>(1 + i * 40), static_cast<char>('a' + i));
    r.header.id = 100 + static_cast<std::uint64_t>(i);
    r.header.created_at_ns = 1700000000000000000 + i;
    put("record_fuzz", detail::encode_log_record(r, r.header.created_at_ns));
  }
  {
    // Format 2 (an expiry) and format 3 (message headers, doc/tracing.md).
    detail::AppendRequest r;
    r.key = "key-3";
    r.payload = "timed";
    r.expires_ns = 1700000000000000000;
    put("record_fuzz", detail::encode_log_record(r, 1));
    detail::HeaderBlock h;
    h.add("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    h.add("tenant", "acme");
    r.headers.assign(h.bytes());
    put("record_fuzz", detail::encode_log_record(r, 1));
    // A record batch (layout 2): header (16, 0, le16 count 2, 0) and two records.
    std::string batch("\x10\0\x02\0\0\0\0\0", 8);
    batch += detail::encode_log_record(r, 1);
    r.headers.clear();
    batch += detail::encode_log_record(r, 2);
    put("record_fuzz", batch);
  }
  // DLQ entries: format 1, and format 2 (the third, with headers).
  for (int i = 0; i < 3; ++i) {
    DlqEntry e;
    e.id = 1 + static_cast<std::uint64_t>(i);
    e.topic = "orders";
    e.group = "billing";
    e.key = "k";
    e.payload = "{\"n\":1}";
    e.reason = "deserialize";
    e.error_text = "bad field";
    e.attempts = 3;
    if (i == 1) e.state = DlqState::Archived, e.state_changed_by = "ops";
    if (i == 2) e.headers = std::string("\x01\x00\x0d\x00\x06\x04\x00tenantacme", 17);
    put("dlq_entry_fuzz", detail::encode_dlq_entry(e));
  }
  // A small real store: its data.mdb, and its catalogue values by database.
  const std::string sdir = tmp + "/store";
  {
    StoreOptions o;
    o.directory = sdir;
    auto store = detail::DurableStore::open(o).value();
    detail::TopicSpec spec;
    spec.lanes = 2;
    auto t = store->open_topic("orders", spec).value();
    spec.is_queue = true;
    auto q = store->open_topic("jobs", spec).value();
    for (int i = 0; i < 6; ++i) {
      detail::AppendRequest r;
      r.topic_id = i % 2 ? t.id : q.id;
      r.lane = static_cast<std::uint32_t>(i % 2);
      r.key = "k" + std::to_string(i);
      r.payload = "payload-" + std::to_string(i);
      (void)store->append(r).value();
    }
    auto g = store->open_group(t, "billing").value();
    (void)store->commit_offset(g, 0, 1);
    auto w = store->open_group(q, "workers").value();
    auto c = store->claim(w, 0).value();
    detail::DlqStore dlq(*store);
    DlqEntry e;
    e.topic = "jobs";
    e.topic_id = q.id;
    e.payload = "x";
    e.reason = "r";
    (void)dlq.add(e);
    (void)store->close();
  }
  put("store_open_fuzz", slurp(sdir + "/data.mdb"));
  {
    auto walk = detail::LmdbWalk::open(sdir).value();
    const std::pair<const char*, char> dbs[] = {{"topics", 0}, {"lanes", 1}, {"groups", 2},
                                                {"cursors", 3}, {"inflight", 4}, {"meta", 5}};
    for (const auto& [db, sel] : dbs) {
      (void)walk->scan(db, [&, sel = sel](std::string_view k, std::string_view v) {
        std::string s(1, sel);
        if (sel == 0) {
          s += std::string(k) + '\0';
        } else if (sel == 5 && k != "layout") {
          return true;
        }
        s += std::string(v);
        put("catalogue_fuzz", s);
        return true;
      });
    }
  }
  // Typed records (issue 12).
  {
    char buf[512];
    RecordBuilder b(buf, sizeof(buf));
    b.add_string(1, "S-1").add_int64(2, -42);
    put("schema_record_fuzz", std::string(*b.finish()));
    b.reset();
    b.add_string(1, "x").begin_list(3, FieldType::String).add_string(0, "a").add_string(0, "bb").end_list();
    b.begin_record(4).add_double(1, 2.5).end_record();
    put("schema_record_fuzz", std::string(*b.finish()));
    b.reset();
    b.add_string(1, "y").begin_list(5, FieldType::Record);
    for (int i = 0; i < 3; ++i) b.begin_record(0).add_uint64(1, i).end_record();
    b.end_list().add_bool(9, true).add_timestamp(10, 1700000000000000000).add_bytes(11, "\x01\x02");
    put("schema_record_fuzz", std::string(*b.finish()));
  }
  // Names.
  for (const char* name : {"orders", "billing.eu-west_1", "a", "x..y", "UPPER", "leases/slot-3"}) put("names_fuzz", name);
  // A real lease segment.
  {
    LeaseTableOptions o;
    o.capacity = 4;
    o.allow_volatile_epoch = true;
    auto t = LeaseTable::open(tmp + "/leases", o).value();
    auto owner = LeaseOwner::generate().value();
    (void)t->acquire("fuzz.lease", owner, std::chrono::seconds(30));
    put("lease_segment_fuzz", slurp(tmp + "/leases"));
  }
  // CLI arguments (first byte picks the parser: 0 tail, 1 verify, 2 u64).
  using namespace std::string_literals;
  put("cli_args_fuzz", "\x00/var/lib/bus\x00orders\x00--from\x00@1700000000\x00--lane\x00"s "3\x00--count\x00"s "0"s);
  put("cli_args_fuzz", "\x00/var/lib/bus\x00orders\x00--from\x00latest"s);
  put("cli_args_fuzz", "\x01/var/lib/bus\x00--quiet\x00--progress\x00"s "1000"s);
  put("cli_args_fuzz", "\x02"s "18446744073709551615"s);
  fs::remove_all(tmp);
  std::printf("make_corpus: %d seeds in %s\n", n, root.c_str());
  return 0;
}
