// lanebus — MIT License.
// The verify walk: every page and record of a durable store checked against
// doc/storage-format.md, in this process or in a forked child.
#include "verify.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coding.hpp"
#include "dlq.hpp"
#include "lmdb_store.hpp"
#include "names.hpp"
#include "quote.hpp"
#include "store_codec.hpp"

// Design notes
//
// - LMDB does not checksum its pages (doc/storage-format.md). The walk reads
//   every entry of every database through a cursor, which visits every branch,
//   leaf and overflow page reachable from the snapshot's roots, then checks
//   LMDB's page accounting (pages of every tree + listed free pages + the two
//   meta pages == pages in the snapshot), as LMDB's own mdb_audit does.
// - lanebus's own values are decoded with the store's decoders
//   (lib/store/store_codec.hpp, dlq.hpp), and the cross-table invariants of
//   doc/storage-format.md are checked: log keys exactly [first, next) per lane,
//   count and bytes, monotonic index timestamps, cursors and claims inside the
//   lane, DLQ pending marks pointing at entries.
// - A damaged branch page can send LMDB outside the map: the child variant
//   confines that to a process that may die. The child streams its findings
//   over a pipe as they are found, so a crash keeps what was found before it.

namespace lanebus::detail {
namespace {



// Reads every byte of a value (overflow pages included) for databases whose
// values lanebus does not interpret.
std::uint64_t touch(std::string_view v) {
  std::uint64_t sum = 0;
  for (unsigned char c : v) sum += c;
  return sum;
}

struct LaneCheck {
  LaneRecord rec;
  bool present = false;
  std::uint64_t seen = 0, bytes = 0;
  std::uint64_t expect_next = 0;  // next log offset expected in key order
  bool gap_reported = false;
  std::int64_t last_ts = 0;
};

class Walker {
 public:
  Walker(const std::string& dir, const VerifyOptions& o, VerifyReport* r) : dir_(dir), o_(o), r_(r) {}

  void problem(std::string what) {
    ++r_->problem_count;
    if (r_->problems.size() < o_.max_problems_listed) r_->problems.push_back(what);
    if (o_.progress) o_.progress("problem: " + what);
  }
  void note(const std::string& line) {
    if (o_.progress) o_.progress(line);
  }
  void tick(const std::string& db, std::uint64_t n) {
    if (o_.progress && o_.progress_every != 0 && n % o_.progress_every == 0) {
      o_.progress(db + ": " + std::to_string(n) + " records checked");
    }
  }

  void run(LmdbWalk& w) {
    r_->page_size = w.page_size();
    r_->file_pages = w.pages_in_snapshot();
    std::uint64_t tree_pages = 0;
    // LMDB's own trees.
    if (auto fs = w.free_stat(); fs.ok()) {
      tree_pages += fs->pages();
    } else {
      problem(fs.status().to_string());
    }
    std::uint64_t listed_free = 0;
    Status s = w.scan_freelist([&](std::uint64_t txnid, std::uint64_t n, bool bad) {
      listed_free += n;
      ++r_->records;
      if (bad) problem("free list entry of transaction " + std::to_string(txnid) + " is malformed or names a page outside the file");
    });
    if (!s.ok()) problem(s.to_string());
    r_->free_pages = listed_free;
    if (auto ms = w.main_stat(); ms.ok()) {
      tree_pages += ms->pages();
    } else {
      problem(ms.status().to_string());
    }
    auto names = w.main_keys();
    if (!names.ok()) {
      problem(names.status().to_string());
      return;
    }
    // lanebus's databases in dependency order (topics before lanes before log, ...).
    static const char* const kOrder[] = {"meta", "topics", "lanes", "log", "groups", "cursors", "inflight",
                                         "idem", "idem_age", "dlq", "dlq_audit", "fence", "user"};
    std::vector<std::string> order;
    for (const char* n : kOrder) {
      if (std::find(names->begin(), names->end(), n) != names->end()) order.emplace_back(n);
    }
    for (const std::string& n : *names) {
      if (std::find(order.begin(), order.end(), n) == order.end()) order.push_back(n);
    }
    for (const char* n : {"meta", "topics", "lanes", "log", "groups", "cursors", "inflight"}) {
      if (std::find(names->begin(), names->end(), n) == names->end()) problem("database " + quoted(n) + " is missing");
    }
    for (const std::string& db : order) {
      auto st = w.stat(db);
      if (!st.ok()) {
        problem(st.status().to_string());
        continue;
      }
      ++r_->databases;
      tree_pages += st->pages();
      note("database " + db + ": " + std::to_string(st->entries) + " entries, " + std::to_string(st->pages()) +
           " pages (" + std::to_string(st->branch_pages) + " branch, " + std::to_string(st->leaf_pages) + " leaf, " +
           std::to_string(st->overflow_pages) + " overflow), depth " + std::to_string(st->depth));
      std::uint64_t n = 0;
      Status ws = w.scan(db, [&](std::string_view k, std::string_view v) {
        ++n;
        ++r_->records;
        visit(db, k, v);
        tick(db, n);
        return true;
      });
      if (!ws.ok()) problem(ws.to_string());
      if (ws.ok() && n != st->entries) {
        problem("database " + quoted(db) + ": " + std::to_string(n) + " entries walked, its header says " +
                std::to_string(st->entries));
      }
      finish(db);
    }
    r_->pages = tree_pages;
    if (r_->file_pages != 0 && tree_pages + listed_free + 2 != r_->file_pages) {
      problem("page accounting: " + std::to_string(tree_pages) + " tree pages + " + std::to_string(listed_free) +
              " free pages + 2 meta pages != " + std::to_string(r_->file_pages) + " pages in the snapshot");
    }
  }

 private:
  void visit(const std::string& db, std::string_view k, std::string_view v) {
    if (db == "meta") return visit_meta(k, v);
    if (db == "topics") return visit_topic(k, v);
    if (db == "lanes") return visit_lane(k, v);
    if (db == "log") return visit_log(k, v);
    if (db == "groups") return visit_group(k, v);
    if (db == "cursors") return visit_cursor(k, v);
    if (db == "inflight") return visit_inflight(k, v);
    if (db == "idem") return visit_idem(k, v);
    if (db == "dlq") return visit_dlq(k, v);
    if (db == "dlq_audit") {
      if (Status s = check_dlq_audit_record(k, v); !s.ok()) problem("dlq_audit: " + s.to_string());
      return;
    }
    sink_ += touch(k) + touch(v);  // idem_age, fence, user and anything newer
  }

  void finish(const std::string& db) {
    if (db == "log") {
      for (auto& [key, lc] : lanes_) {
        if (!lc.present) continue;
        const std::string where = lane_name(key);
        if (lc.seen != lc.rec.count) {
          problem(where + ": " + std::to_string(lc.seen) + " log records found, the lane record says " +
                  std::to_string(lc.rec.count) + " in [" + std::to_string(lc.rec.first) + ", " +
                  std::to_string(lc.rec.next) + ")");
        } else if (lc.bytes != lc.rec.bytes) {
          problem(where + ": log records hold " + std::to_string(lc.bytes) + " bytes, the lane record says " +
                  std::to_string(lc.rec.bytes));
        }
      }
    } else if (db == "dlq") {
      for (std::uint64_t id : pending_) {
        if (entries_.count(id) == 0) problem("dlq: pending mark " + std::to_string(id) + " has no entry");
      }
    }
  }

  static std::uint64_t lk(std::uint32_t tid, std::uint32_t lane) { return (std::uint64_t{tid} << 32) | lane; }
  std::string lane_name(std::uint64_t key) const {
    auto t = topics_.find(static_cast<std::uint32_t>(key >> 32));
    return "topic " + (t == topics_.end() ? "#" + std::to_string(key >> 32) : quoted(t->second.name)) + " lane " +
           std::to_string(static_cast<std::uint32_t>(key));
  }

  void visit_meta(std::string_view k, std::string_view v) {
    if (k == "layout") {
      have_layout_ = true;
      if (Status s = check_layout_record(v); !s.ok()) problem("meta: " + s.to_string());
    } else if (k == "id_next" || k == "next_topic_id" || k == "next_group_id") {
      if (v.size() != 8) problem("meta: record " + quoted(k) + " is malformed");
    } else {
      note("meta: unknown record " + quoted(k) + " (newer lanebus?)");
    }
  }

  void visit_topic(std::string_view k, std::string_view v) {
    if (!have_layout_) {
      problem("meta: no layout record");
      have_layout_ = true;  // once
    }
    TopicRef t;
    if (Status s = check_name(k, "topic"); !s.ok()) return problem("topics: " + s.to_string());
    if (!decode_topic_record(k, v, &t)) return problem("topics: the record of " + quoted(k) + " is malformed");
    if (!topics_.emplace(t.id, t).second) problem("topics: id " + std::to_string(t.id) + " is used twice");
  }

  const TopicRef* topic(std::uint32_t id) const {
    auto it = topics_.find(id);
    return it == topics_.end() ? nullptr : &it->second;
  }

  void visit_lane(std::string_view k, std::string_view v) {
    if (k.size() != 8) return problem("lanes: a key of " + std::to_string(k.size()) + " bytes");
    const std::uint32_t tid = get_be32(k.data()), lane = get_be32(k.data() + 4);
    const TopicRef* t = topic(tid);
    if (t == nullptr || lane >= t->lanes) {
      return problem("lanes: record for topic #" + std::to_string(tid) + " lane " + std::to_string(lane) +
                     " that does not exist");
    }
    LaneCheck& lc = lanes_[lk(tid, lane)];
    if (!decode_lane_record(v, &lc.rec)) return problem(lane_name(lk(tid, lane)) + ": the lane record is malformed");
    lc.present = true;
    lc.expect_next = lc.rec.first;
  }

  void visit_log(std::string_view k, std::string_view v) {
    if (k.size() != 16) return problem("log: a key of " + std::to_string(k.size()) + " bytes");
    const std::uint32_t tid = get_be32(k.data()), lane = get_be32(k.data() + 4);
    const std::uint64_t first = get_be64(k.data() + 8);
    const TopicRef* t = topic(tid);
    if (t == nullptr || lane >= t->lanes) {
      return problem("log: record at offset " + std::to_string(first) + " of topic #" + std::to_string(tid) +
                     " lane " + std::to_string(lane) + " that does not exist");
    }
    // A record batch holds the records of offsets first, first + 1, ...
    if (Status s = split_log_value(v, t->name, lane, first, &records_); !s.ok()) return problem(s.to_string());
    for (std::size_t i = 0; i < records_.size(); ++i) visit_record(*t, tid, lane, first + i, records_[i]);
  }

  void visit_record(const TopicRef& topic, std::uint32_t tid, std::uint32_t lane, std::uint64_t off,
                    std::string_view v) {
    ++r_->log_records;
    msg_.payload.clear();
    if (Status s = decode_log_record(v, topic.name, lane, off, &msg_); !s.ok()) problem(s.to_string());
    auto it = lanes_.find(lk(tid, lane));
    if (it == lanes_.end() || !it->second.present) {
      return problem(lane_name(lk(tid, lane)) + ": log record at offset " + std::to_string(off) +
                     " without a lane record");
    }
    LaneCheck& lc = it->second;
    if (off < lc.rec.first || off >= lc.rec.next) {
      return problem(lane_name(lk(tid, lane)) + ": log record at offset " + std::to_string(off) + " outside [" +
                     std::to_string(lc.rec.first) + ", " + std::to_string(lc.rec.next) + ")");
    }
    if (off != lc.expect_next && !lc.gap_reported) {
      lc.gap_reported = true;
      problem(lane_name(lk(tid, lane)) + ": log offsets jump from " + std::to_string(lc.expect_next) + " to " +
              std::to_string(off));
    }
    lc.expect_next = off + 1;
    ++lc.seen;
    lc.bytes += v.size();
    if (v.size() >= 24) {
      std::int64_t ts = 0;
      for (int i = 7; i >= 0; --i) ts = static_cast<std::int64_t>((static_cast<std::uint64_t>(ts) << 8) | static_cast<unsigned char>(v[16 + i]));
      if (lc.seen > 1 && ts < lc.last_ts) {
        problem(lane_name(lk(tid, lane)) + ": index timestamp goes backwards at offset " + std::to_string(off));
      }
      lc.last_ts = ts;
    }
  }

  void visit_group(std::string_view k, std::string_view v) {
    if (k.size() < 5) return problem("groups: a key of " + std::to_string(k.size()) + " bytes");
    const std::uint32_t tid = get_be32(k.data());
    const std::string_view name = k.substr(4);
    if (topic(tid) == nullptr) return problem("groups: group of topic #" + std::to_string(tid) + " that does not exist");
    if (Status s = check_name(name, "group"); !s.ok()) return problem("groups: " + s.to_string());
    GroupRecord g;
    if (!decode_group_record(v, &g)) return problem("groups: the record of group " + quoted(name) + " is malformed");
    groups_.insert(lk(tid, g.group_id));
  }

  void visit_cursor(std::string_view k, std::string_view v) {
    if (k.size() != 12) return problem("cursors: a key of " + std::to_string(k.size()) + " bytes");
    const std::uint32_t tid = get_be32(k.data()), gid = get_be32(k.data() + 4), lane = get_be32(k.data() + 8);
    const TopicRef* t = topic(tid);
    if (t == nullptr || lane >= t->lanes || groups_.count(lk(tid, gid)) == 0) {
      return problem("cursors: cursor of topic #" + std::to_string(tid) + " group #" + std::to_string(gid) +
                     " lane " + std::to_string(lane) + " that does not exist");
    }
    CursorRecord c;
    if (!decode_cursor_record(v, &c)) return problem("cursors: a cursor record is malformed");
    auto it = lanes_.find(lk(tid, lane));
    const std::uint64_t next = it == lanes_.end() ? 0 : it->second.rec.next;
    if (c.committed > next) {
      problem(lane_name(lk(tid, lane)) + ": group #" + std::to_string(gid) + " committed offset " +
              std::to_string(c.committed) + " is past the end " + std::to_string(next));
    }
    cursors_[std::make_pair(lk(tid, gid), lane)] = c.committed;
  }

  void visit_inflight(std::string_view k, std::string_view v) {
    if (k.size() != 20) return problem("inflight: a key of " + std::to_string(k.size()) + " bytes");
    const std::uint32_t tid = get_be32(k.data()), gid = get_be32(k.data() + 4), lane = get_be32(k.data() + 8);
    const std::uint64_t off = get_be64(k.data() + 12);
    InflightRecord r;
    if (!decode_inflight_record(v, &r)) return problem("inflight: the claim of offset " + std::to_string(off) + " is malformed");
    auto c = cursors_.find(std::make_pair(lk(tid, gid), lane));
    if (c == cursors_.end()) {
      return problem("inflight: claim of offset " + std::to_string(off) + " for a group lane without a cursor");
    }
    auto it = lanes_.find(lk(tid, lane));
    if (off < c->second || it == lanes_.end() || off >= it->second.rec.next) {
      problem(lane_name(lk(tid, lane)) + ": claim of offset " + std::to_string(off) +
              " outside [committed, end) of group #" + std::to_string(gid));
    }
  }

  void visit_idem(std::string_view k, std::string_view v) {
    if (k.size() < 2 || (static_cast<std::size_t>(static_cast<unsigned char>(k[0])) << 8 |
                         static_cast<unsigned char>(k[1])) > k.size() - 2) {
      return problem("idem: a key whose scope length does not fit");
    }
    if (v.size() < 9 || (v[0] != 1 && v[0] != 2)) problem("idem: a record is malformed");
    sink_ += touch(v);
  }

  void visit_dlq(std::string_view k, std::string_view v) {
    const char kind = k.empty() ? '\0' : k[0];
    switch (kind) {
      case 'e': {
        if (k.size() != 9) return problem("dlq: an entry key of " + std::to_string(k.size()) + " bytes");
        auto e = decode_dlq_entry(v);
        if (!e.ok()) return problem("dlq: entry " + std::to_string(get_be64(k.data() + 1)) + ": " + e.status().to_string());
        entries_.insert(get_be64(k.data() + 1));
        return;
      }
      case 'p':
        if (k.size() != 9 || !v.empty()) return problem("dlq: a pending mark is malformed");
        pending_.push_back(get_be64(k.data() + 1));
        return;
      case 's':  // 16 u64 fields; 17 since arrivals of class `expired` were appended
        if (k.size() != 1 || (v.size() != 16 * 8 && v.size() != 17 * 8)) problem("dlq: the stats record is malformed");
        return;
      case 'o':
        if (k.size() != 21 || v.size() != 4) problem("dlq: an outcome record is malformed");
        return;
      case 'm':
        if (k.size() != 13 || v.size() != 28) problem("dlq: a delivery mark is malformed");
        return;
      default: problem("dlq: a record of unknown kind");
    }
  }

  const std::string& dir_;
  const VerifyOptions& o_;
  VerifyReport* r_;
  bool have_layout_ = false;
  std::map<std::uint32_t, TopicRef> topics_;
  std::map<std::uint64_t, LaneCheck> lanes_;
  std::set<std::uint64_t> groups_;
  std::map<std::pair<std::uint64_t, std::uint32_t>, std::uint64_t> cursors_;
  std::set<std::uint64_t> entries_;
  std::vector<std::uint64_t> pending_;
  StoredMessage msg_;
  std::vector<std::string_view> records_;  // visit_log: the records of one log value
  std::uint64_t sink_ = 0;
};

// ---- the child's line protocol: one line per event, tab-free fields ----
//   P <text>          progress
//   S <9 numbers>     the report's counters (last line of a finished walk)
//   E <code> <text>   the walk could not start
void write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::write(fd, s.data(), s.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    s.remove_prefix(static_cast<std::size_t>(n));
  }
}
std::string one_line(std::string_view s) {
  std::string o(s);
  std::replace(o.begin(), o.end(), '\n', ' ');
  return o;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGABRT: return "SIGABRT";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
  }
  return "a signal";
}

}  // namespace

std::string VerifyReport::summary() const {
  std::string s = ok() ? "OK: " : "DAMAGED: " + std::to_string(problem_count) + " problem(s); ";
  s += std::to_string(databases) + " databases, " + std::to_string(records) + " entries (" +
       std::to_string(log_records) + " message records CRC-checked), " + std::to_string(pages) + " pages in use + " +
       std::to_string(free_pages) + " free";
  if (file_pages != 0) s += " of " + std::to_string(file_pages);
  s += " (" + std::to_string(page_size) + " B pages)";
  if (walk_died) s += "; the walk died: LMDB could not read a damaged page";
  return s;
}

Result<VerifyReport> verify_store(const std::string& directory, const VerifyOptions& options) {
  VerifyReport report;
  auto w = LmdbWalk::open(directory);
  if (!w.ok()) {
    const Code c = w.code();
    if (c != Code::Corruption && c != Code::VersionTooNew) return w.status();
    ++report.problem_count;
    report.problems.push_back(w.status().to_string());
    if (options.progress) options.progress("problem: " + w.status().to_string());
    return report;
  }
  Walker walker(directory, options, &report);
  walker.run(**w);
  return report;
}

namespace {

// The child's side: walk the store and write the walk's lines to `out` ("P"
// progress and problems, then "S" the summary, or "E" an error), then exit:
// 0 clean, 1 problems found, 3 an error, 4 the parent is gone.
[[noreturn]] void run_verify_child(const std::string& directory, const VerifyOptions& options, pid_t parent,
                                   int out) {
  // Die by the signal itself (no handler inherited from the application or a
  // sanitizer turns a crash into an exit code).
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) std::signal(sig, SIG_DFL);
  // A walk looping on a damaged page must not outlive a caller that died.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(4);
  std::signal(SIGPIPE, SIG_IGN);
  VerifyOptions child = options;
  // Only the problems the caller keeps cross the pipe (the summary counts
  // them all): a badly damaged file can report one per page, and a write per
  // line made such a walk cost ~50 ms (store_open_fuzz ran at ~20 inputs/s).
  std::size_t problems_sent = 0;
  const std::size_t keep = options.max_problems_listed;
  child.progress = [out, &problems_sent, keep](std::string_view line) {
    if (line.substr(0, 9) == "problem: " && problems_sent++ >= keep) return;
    write_all(out, "P " + one_line(line) + "\n");
  };
  auto r = verify_store(directory, child);
  if (!r.ok()) {
    write_all(out, "E " + std::to_string(static_cast<int>(r.code())) + " " + one_line(r.status().message()) + "\n");
    ::_exit(3);
  }
  char b[256];
  std::snprintf(b, sizeof b, "S %llu %llu %llu %llu %llu %llu %llu %llu\n",
                static_cast<unsigned long long>(r->databases), static_cast<unsigned long long>(r->records),
                static_cast<unsigned long long>(r->log_records), static_cast<unsigned long long>(r->pages),
                static_cast<unsigned long long>(r->free_pages), static_cast<unsigned long long>(r->file_pages),
                static_cast<unsigned long long>(r->page_size), static_cast<unsigned long long>(r->problem_count));
  write_all(out, b);
  ::_exit(r->ok() ? 0 : 1);
}

// The parent's side: what the child's lines said.
struct ChildLines {
  VerifyReport report;
  std::string last_progress, error_line;
  bool have_summary = false;
  std::uint64_t problems_seen = 0;

  void take(std::string_view l, const VerifyOptions& options) {
    if (l.size() < 2) return;
    const std::string_view body = l.substr(2);
    if (l[0] == 'P') {
      if (body.substr(0, 9) == "problem: ") {
        ++problems_seen;
        if (report.problems.size() < options.max_problems_listed) report.problems.emplace_back(body.substr(9));
      } else {
        last_progress = std::string(body);
      }
      if (options.progress) options.progress(body);
    } else if (l[0] == 'S') {
      unsigned long long v[8] = {};
      if (std::sscanf(std::string(body).c_str(), "%llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                      &v[4], &v[5], &v[6], &v[7]) == 8) {
        have_summary = true;
        report.databases = v[0];
        report.records = v[1];
        report.log_records = v[2];
        report.pages = v[3];
        report.free_pages = v[4];
        report.file_pages = v[5];
        report.page_size = v[6];
        report.problem_count = v[7];
      }
    } else if (l[0] == 'E') {
      error_line = std::string(body);
    }
  }
};

// Read the child's lines from `fd` until it closes the pipe; kill the child
// when no line comes for stall_timeout or the time limit passes. Returns true
// when the child was killed for that.
bool read_child(int fd, pid_t pid, const VerifyOptions& options, ChildLines* lines) {
  std::string buf;
  char chunk[4096];
  const auto started = std::chrono::steady_clock::now();
  for (;;) {
    if (options.stall_timeout.count() > 0 || options.time_limit.count() > 0) {
      long wait_ms = options.stall_timeout.count() > 0 ? static_cast<long>(options.stall_timeout.count()) : -1;
      if (options.time_limit.count() > 0) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                              started + options.time_limit - std::chrono::steady_clock::now())
                              .count();
        wait_ms = wait_ms < 0 ? std::max<long>(0, left) : std::min<long>(wait_ms, std::max<long>(0, left));
      }
      pollfd pfd{fd, POLLIN, 0};
      const int pr = ::poll(&pfd, 1, static_cast<int>(wait_ms));
      if (pr < 0 && errno == EINTR) continue;
      if (pr == 0) {  // no line for stall_timeout: the walk loops on a damaged page
        ::kill(pid, SIGKILL);
        return true;
      }
    }
    ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buf.append(chunk, static_cast<std::size_t>(n));
    std::size_t pos;
    while ((pos = buf.find('\n')) != std::string::npos) {
      lines->take(std::string_view(buf).substr(0, pos), options);
      buf.erase(0, pos + 1);
    }
  }
}

// The report of a child that did not finish its walk: one more problem, naming how it ended.
VerifyReport died_report(ChildLines& lines, int status, bool stalled, const VerifyOptions& options) {
  VerifyReport& report = lines.report;
  // The child died: a page LMDB could not read (or a sanitizer stopped it).
  report.walk_died = true;
  report.problem_count = lines.problems_seen + 1;
  std::string why = stalled ? "was killed: no end after its time limit or no line for its stall timeout ("
                                  + std::to_string(options.stall_timeout.count()) + " ms)"
                   : WIFSIGNALED(status) ? std::string("died with ") + signal_name(WTERMSIG(status)) + " (" +
                                              std::to_string(WTERMSIG(status)) + ")"
                                        : "exited with status " + std::to_string(WEXITSTATUS(status));
  std::string p = "the verify walk " + why + ": LMDB could not read a damaged page";
  if (!lines.last_progress.empty()) p += " (last progress: " + lines.last_progress + ")";
  if (report.problems.size() < options.max_problems_listed) report.problems.push_back(p);
  if (options.progress) options.progress("problem: " + p);
  return report;
}

}  // namespace

Result<VerifyReport> verify_store_in_child(const std::string& directory, const VerifyOptions& options) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status(Code::IOError, "verify " + quoted(directory) + ": pipe: " + std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return Status(Code::IOError, "verify " + quoted(directory) + ": fork: " + std::strerror(e));
  }
  if (pid == 0) {
    ::close(fds[0]);
    run_verify_child(directory, options, parent, fds[1]);
  }
  ::close(fds[1]);
  ChildLines lines;
  const bool stalled = read_child(fds[0], pid, options, &lines);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Status(Code::IOError, "verify " + quoted(directory) + ": waitpid: " + std::strerror(errno));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3 && !lines.error_line.empty()) {
    const std::string& error_line = lines.error_line;
    const int code = std::atoi(error_line.c_str());
    const auto sp = error_line.find(' ');
    return Status(static_cast<Code>(code), sp == std::string::npos ? std::string() : error_line.substr(sp + 1));
  }
  if (WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 1) && lines.have_summary) {
    return lines.report;
  }
  return died_report(lines, status, stalled, options);
}

}  // namespace lanebus::detail
