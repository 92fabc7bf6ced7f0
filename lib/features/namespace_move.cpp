// lanebus — MIT License.
// The offline namespace move (see namespace_move.hpp; manual: doc/tenancy.md
// "Moving a namespace"; record layouts: doc/storage-format.md).
#include "namespace_move.hpp"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lanebus/tenancy.hpp"
#include "dlq.hpp"
#include "durable_store.hpp"
#include "coding.hpp"
#include "delayed_index.hpp"
#include "hash.hpp"
#include "names.hpp"
#include "quote.hpp"
#include "tenancy.hpp"

namespace lanebus::detail {

namespace {

using Core = StoreTxn::Core;


std::string le64(std::uint64_t v) {
  std::string o;
  put_le64(o, v);
  return o;
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
std::uint64_t record_hash(std::string_view lkey, std::string_view lval) {
  return mix(fnv1a64(lval, mix(fnv1a64(lkey)) ^ lkey.size()) ^ lval.size());
}

// ---------------------------------------------------------------- membership

// Which names belong to the namespace: covered by it segment-wise and not by
// a longer declared namespace (which would hold them instead).
struct Scope {
  std::string ns;
  std::vector<std::string> inner;  // declared namespaces strictly inside ns
  bool holds(std::string_view name) const {
    if (!prefix_covers(ns, name)) return false;
    for (const std::string& d : inner) {
      if (prefix_covers(d, name)) return false;
    }
    return true;
  }
};

Status add_declared(StoreTxn& t, Scope* scope) {
  return t.scan(StoreTable::Tenancy, "n/", "n/", [&](std::string_view k, std::string_view) {
    std::string d(k.substr(2));
    if (d != scope->ns && prefix_covers(scope->ns, d)) scope->inner.push_back(std::move(d));
    return true;
  });
}

// The namespace's topics and groups in one store: id -> name.
struct Side {
  std::map<std::uint32_t, std::string> topics;
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::string> groups;  // (topic id, group id)
  std::map<std::string, std::uint32_t> topic_ids;                           // name -> id
  std::map<std::pair<std::string, std::string>, std::uint32_t> group_ids;   // (topic, group) -> id
};

Status load_side(StoreTxn& t, const Scope& scope, Side* side) {
  *side = Side{};
  Status bad;
  Status s = t.core_scan(Core::Topics, {}, {}, [&](std::string_view k, std::string_view v) {
    if (!scope.holds(k)) return true;
    if (v.size() < 8) {
      bad = Status(Code::Corruption, "topic " + quoted(k) + ": malformed record");
      return false;
    }
    const std::uint32_t id = get_le32(v.data() + 4);
    side->topics[id] = std::string(k);
    side->topic_ids[std::string(k)] = id;
    return true;
  });
  if (!s.ok()) return s;
  if (!bad.ok()) return bad;
  for (const auto& topic : side->topics) {
    // Named copies, not a structured binding: lambdas below capture them
    // (clang 14, used for the fuzz build, rejects capturing a binding).
    const std::uint32_t id = topic.first;
    const std::string& name = topic.second;
    std::string prefix;
    put_be32(prefix, id);
    s = t.core_scan(Core::Groups, prefix, prefix, [&](std::string_view k, std::string_view v) {
      if (v.size() < 8) {
        bad = Status(Code::Corruption, "topic " + quoted(name) + ": malformed group record");
        return false;
      }
      const std::uint32_t gid = get_le32(v.data() + 4);
      std::string g(k.substr(4));
      side->groups[{id, gid}] = g;
      side->group_ids[{name, g}] = gid;
      return true;
    });
    if (!s.ok()) return s;
    if (!bad.ok()) return bad;
  }
  return Status();
}

// ---------------------------------------------------------------- the walk

// One record of the namespace in one store: its physical key and value, and
// its logical form (topic and group ids replaced by names) for the checksum
// and for the copy. Logical keys of id-keyed tables: topic \0 group \0 rest.
struct Item {
  MoveTable table;
  std::string_view key, value;  // physical (valid during the visit)
  std::string lkey, lval;       // logical
  DlqEntry entry;               // DlqEntries only
};

std::string lk(std::string_view topic, std::string_view group, std::string_view rest) {
  std::string o(topic);
  o.push_back('\0');
  o.append(group);
  o.push_back('\0');
  o.append(rest);
  return o;
}

// Visits every record of the namespace in the store of `t`, table by table
// (walk() runs the steps in a fixed order: the copy imports DLQ entries in
// it). Each step returns the first error of a scan, else of a visit.
class Walker {
 public:
  Walker(StoreTxn& t, const Scope& scope, const Side& side, const std::function<Status(Item&)>& visit)
      : t_(t), scope_(scope), side_(side), visit_(visit) {}

  // The topics, then each topic's lanes, log, groups, cursors, claims and fence records.
  Status topics() {
    Status s = t_.core_scan(Core::Topics, {}, {}, [&](std::string_view k, std::string_view v) {
      if (!scope_.holds(k)) return true;
      std::string lv(v);
      put_le32(lv.data() + 4, 0);
      return run(Item{MoveTable::Topics, k, v, std::string(k), std::move(lv), {}});
    });
    if (Status r = after(s); !r.ok()) return r;
    for (const auto& topic : side_.topics) {
      if (Status r = topic_tables(topic.first, topic.second); !r.ok()) return r;
    }
    return Status();
  }

  // Delayed messages of the namespace's topics (key: be64 due, be64 created,
  // be32 topic id, be32 tie-break; delayed_index.hpp). Logical key: topic
  // name and the key without the id; logical value: the entry re-encoded
  // with topic id 0 (its CRC covers the id). A corrupt entry stops the move.
  Status delayed() {
    Status s = t_.scan(StoreTable::Delayed, {}, {}, [&](std::string_view k, std::string_view v) {
      if (k.size() != kDelayedKeyBytes) return true;
      const std::string* topic = topic_of(k.substr(16));
      if (topic == nullptr) return true;
      AppendRequest r;
      if (Status d = decode_delayed(k, v, &r); !d.ok()) {
        err_ = Status(Code::Corruption, "topic " + quoted(*topic) + ": " + std::string(d.message()) +
                                            " (run `lanebus verify`; nothing was moved)");
        return false;
      }
      r.topic_id = 0;
      std::string rest(k.substr(0, 16));
      rest.append(k.substr(20));
      return run(Item{MoveTable::Delayed, k, v, lk(*topic, {}, rest), encode_delayed(r), {}});
    });
    return after(s);
  }

  // DLQ entries (by origin topic name) and poison bookkeeping ("o"/"m" + be32 topic + be32 group + ...).
  Status dlq() {
    Status s = t_.scan(StoreTable::Dlq, "e", "e", [&](std::string_view k, std::string_view v) {
      auto e = decode_dlq_entry(v);
      if (!e.ok()) {
        err_ = e.status();
        return false;
      }
      if (!scope_.holds(e->topic)) return true;
      DlqEntry n = *e;
      n.id = 0;
      // The id of the origin topic only counts as "resolves to the same topic".
      auto it = side_.topic_ids.find(n.topic);
      n.topic_id = (n.topic_id != 0 && it != side_.topic_ids.end() && it->second == n.topic_id) ? 1 : 0;
      return run(Item{MoveTable::DlqEntries, k, v, lk(n.topic, n.group, {}), encode_dlq_entry(n), std::move(*e)});
    });
    if (Status r = after(s); !r.ok()) return r;
    for (char kind : {'o', 'm'}) {
      std::string mp(1, kind);
      s = t_.scan(StoreTable::Dlq, mp, mp, [&](std::string_view k, std::string_view v) {
        if (k.size() < 9) return true;
        const std::string* topic = topic_of(k.substr(1));
        if (topic == nullptr) return true;
        const std::string* g = group_of(get_be32(k.data() + 1), get_be32(k.data() + 5));
        if (g == nullptr) return true;  // bookkeeping of a group that no longer exists: left alone
        return run(Item{MoveTable::DlqMarks, k, v, lk(*topic, *g, std::string(1, kind) + std::string(k.substr(9))),
                        std::string(v), {}});
      });
      if (Status r = after(s); !r.ok()) return r;
    }
    return Status();
  }

  // Idempotency scopes: u16 BE scope length + scope + ...
  Status idempotency() {
    for (StoreTable tb : {StoreTable::Idempotency, StoreTable::IdempotencyAge}) {
      Status s = t_.scan(tb, {}, {}, [&](std::string_view k, std::string_view v) {
        if (k.size() < 2) return true;
        const std::size_t n = (static_cast<unsigned char>(k[0]) << 8) | static_cast<unsigned char>(k[1]);
        if (k.size() < 2 + n || !scope_.holds(k.substr(2, n))) return true;
        return run(Item{tb == StoreTable::Idempotency ? MoveTable::Idempotency : MoveTable::IdempotencyAge, k, v,
                        std::string(k), std::string(v), {}});
      });
      if (Status r = after(s); !r.ok()) return r;
    }
    return Status();
  }

  // User tables (table \0 key), then the schema registry records of the
  // namespace's topics ("m"+topic, "v"/"d"/"c"/"u"+topic+\0...); the audit
  // log ("a", "n") stays.
  Status user_and_schema() {
    Status s = t_.scan(StoreTable::User, {}, {}, [&](std::string_view k, std::string_view v) {
      const std::size_t z = k.find('\0');
      if (z == std::string_view::npos || !scope_.holds(k.substr(0, z))) return true;
      return run(Item{MoveTable::User, k, v, std::string(k), std::string(v), {}});
    });
    if (Status r = after(s); !r.ok()) return r;
    s = t_.scan(StoreTable::Schema, {}, {}, [&](std::string_view k, std::string_view v) {
      if (k.empty() || std::string_view("mvdcu").find(k[0]) == std::string_view::npos) return true;
      std::string_view rest = k.substr(1);
      std::string_view topic = k[0] == 'm' ? rest : rest.substr(0, rest.find('\0'));
      if (!scope_.holds(topic)) return true;
      return run(Item{MoveTable::Schema, k, v, std::string(k), std::string(v), {}});
    });
    return after(s);
  }

  // Usage by minute ("u/" + ns + \0 + minute) and the policy ("n/" + ns): the namespace itself only.
  Status tenancy() {
    Status s = t_.scan(StoreTable::Tenancy, "u/", "u/", [&](std::string_view k, std::string_view v) {
      std::string ns;
      std::uint64_t minute = 0;
      if (!parse_usage_key(k, &ns, &minute) || ns != scope_.ns) return true;
      return run(Item{MoveTable::Usage, k, v, std::string(k), std::string(v), {}});
    });
    if (Status r = after(s); !r.ok()) return r;
    const std::string pk = "n/" + scope_.ns;
    auto pol = t_.get(StoreTable::Tenancy, pk);
    if (pol.ok()) {
      Item item{MoveTable::Policy, pk, *pol, pk, std::string(*pol), {}};
      return visit_(item);
    }
    if (pol.code() != Code::NotFound) return pol.status();
    return Status();
  }

 private:
  // One topic's lanes, log, groups, cursors, claims, and the fence high-water
  // and dedupe records of its fenced lanes ('L'/'D' + be32 topic + rest).
  Status topic_tables(std::uint32_t tid, const std::string& name) {
    std::string prefix;
    put_be32(prefix, tid);
    Status s = t_.core_scan(Core::Lanes, prefix, prefix, [&](std::string_view k, std::string_view v) {
      return run(Item{MoveTable::Lanes, k, v, lk(name, {}, k.substr(4)), std::string(v), {}});
    });
    if (Status r = after(s); !r.ok()) return r;
    s = t_.core_scan(Core::Log, prefix, prefix, [&](std::string_view k, std::string_view v) {
      return run(Item{MoveTable::Log, k, v, lk(name, {}, k.substr(4)), std::string(v), {}});
    });
    if (Status r = after(s); !r.ok()) return r;
    s = t_.core_scan(Core::Groups, prefix, prefix, [&](std::string_view k, std::string_view v) {
      std::string lv(v);
      put_le32(lv.data() + 4, 0);
      return run(Item{MoveTable::Groups, k, v, lk(name, k.substr(4), {}), std::move(lv), {}});
    });
    if (Status r = after(s); !r.ok()) return r;
    for (Core c : {Core::Cursors, Core::Inflight}) {
      s = t_.core_scan(c, prefix, prefix, [&](std::string_view k, std::string_view v) {
        if (k.size() < 12) return true;
        const std::string* g = group_of(tid, get_be32(k.data() + 4));
        if (g == nullptr) {
          err_ = Status(Code::Corruption, "topic " + quoted(name) + ": a cursor or claim of an unknown group " +
                                              std::to_string(get_be32(k.data() + 4)));
          return false;
        }
        return run(Item{c == Core::Cursors ? MoveTable::Cursors : MoveTable::Inflight, k, v,
                        lk(name, *g, k.substr(8)), std::string(v), {}});
      });
      if (Status r = after(s); !r.ok()) return r;
    }
    for (char kind : {'L', 'D'}) {
      std::string fp(1, kind);
      fp += prefix;
      s = t_.scan(StoreTable::Fence, fp, fp, [&](std::string_view k, std::string_view v) {
        return run(Item{MoveTable::Fence, k, v, lk(name, {}, std::string(1, kind) + std::string(k.substr(5))),
                        std::string(v), {}});
      });
      if (Status r = after(s); !r.ok()) return r;
    }
    return Status();
  }

  bool run(Item&& item) {
    err_ = visit_(item);
    return err_.ok();
  }
  // A scan's own error, else the error a visit stopped it with.
  Status after(const Status& scan) const { return scan.ok() ? err_ : scan; }
  const std::string* topic_of(std::string_view k) const {
    if (k.size() < 4) return nullptr;
    auto it = side_.topics.find(get_be32(k.data()));
    return it == side_.topics.end() ? nullptr : &it->second;
  }
  const std::string* group_of(std::uint32_t tid, std::uint32_t gid) const {
    auto it = side_.groups.find({tid, gid});
    return it == side_.groups.end() ? nullptr : &it->second;
  }

  StoreTxn& t_;
  const Scope& scope_;
  const Side& side_;
  const std::function<Status(Item&)>& visit_;
  Status err_;
};

// Visit every record of the namespace in the store of `t`.
Status walk(StoreTxn& t, const Scope& scope, const Side& side, const std::function<Status(Item&)>& visit) {
  Walker w(t, scope, side, visit);
  if (Status s = w.topics(); !s.ok()) return s;
  if (Status s = w.delayed(); !s.ok()) return s;
  if (Status s = w.dlq(); !s.ok()) return s;
  if (Status s = w.idempotency(); !s.ok()) return s;
  if (Status s = w.user_and_schema(); !s.ok()) return s;
  return w.tenancy();
}

Result<MoveSums> sums_of(StoreTxn& t, const Scope& scope, bool with_policy) {
  Side side;
  Status s = load_side(t, scope, &side);
  if (!s.ok()) return s;
  MoveSums sums{};
  s = walk(t, scope, side, [&](Item& it) {
    if (it.table == MoveTable::Policy && !with_policy) return Status();
    MoveTableSum& m = sums[static_cast<int>(it.table)];
    m.count += 1;
    m.checksum += record_hash(it.lkey, it.lval);
    return Status();
  });
  if (!s.ok()) return s;
  return sums;
}

// ---------------------------------------------------------------- move records

// tenancy "m/" + ns: "v1 phase=P other=PATH" (SRC: copying | moved-out, other = DST;
// DST: copied | done, other = SRC).
struct MoveRecord {
  bool present = false;
  std::string phase, other;
};

std::string move_key(std::string_view ns) { return "m/" + std::string(ns); }

Result<MoveRecord> read_record(DurableStore& store, std::string_view ns) {
  MoveRecord r;
  Status s = store.read([&](StoreTxn& t) -> Status {
    auto v = t.get(StoreTable::Tenancy, move_key(ns));
    if (!v.ok()) return v.code() == Code::NotFound ? Status() : v.status();
    std::string_view text = *v;
    const std::string_view head = "v1 phase=";
    const std::size_t sp = text.find(" other=");
    if (text.substr(0, head.size()) != head || sp == std::string_view::npos) {
      return Status(Code::Corruption, "store " + quoted(store.directory()) + ": the move record of namespace " + quoted(ns) +
                                          " is unreadable");
    }
    r.present = true;
    r.phase = std::string(text.substr(head.size(), sp - head.size()));
    r.other = std::string(text.substr(sp + 7));
    return Status();
  });
  if (!s.ok()) return s;
  return r;
}

std::string encode_record(std::string_view phase, std::string_view other) {
  return "v1 phase=" + std::string(phase) + " other=" + std::string(other);
}

Status write_record(DurableStore& store, std::string_view ns, std::string_view phase, std::string_view other) {
  const std::string v = encode_record(phase, other);
  return store.write([&](StoreTxn& t) { return t.put(StoreTable::Tenancy, move_key(ns), v); });
}

std::string real_path(const std::string& dir) {
  char buf[PATH_MAX];
  if (::realpath(dir.c_str(), buf) != nullptr) return buf;
  return dir;
}

std::string describe(const MoveSums& sums) {
  std::string o;
  for (int i = 0; i < kMoveTables; ++i) {
    if (sums[static_cast<std::size_t>(i)].count == 0) continue;
    if (!o.empty()) o += ", ";
    o += std::to_string(sums[static_cast<std::size_t>(i)].count) + " " + move_table_name(static_cast<MoveTable>(i));
  }
  return o.empty() ? "nothing" : o;
}

Result<std::unique_ptr<DurableStore>> open_rw(const std::string& dir) {
  StoreOptions o;
  o.directory = dir;
  o.durability = Durability::Sync;
  o.maintenance_interval = std::chrono::hours(24);  // no retention pass while the move runs
  return DurableStore::open(o);
}

}  // namespace

const char* move_table_name(MoveTable t) noexcept {
  static const char* const kNames[kMoveTables] = {
      "topics", "lanes", "log", "groups", "cursors", "inflight", "dlq", "dlq-marks", "idem", "idem-age",
      "user", "fence", "schema", "usage", "policy", "delayed"};
  const int i = static_cast<int>(t);
  return i >= 0 && i < kMoveTables ? kNames[i] : "?";
}

Result<MoveSums> namespace_sums(DurableStore& store, std::string_view name) {
  if (Status s = check_name(name, "namespace"); !s.ok()) return s;
  Scope scope;
  scope.ns = std::string(name);
  MoveSums sums{};
  Status s = store.read([&](StoreTxn& t) -> Status {
    scope.inner.clear();
    if (Status r = add_declared(t, &scope); !r.ok()) return r;
    auto r = sums_of(t, scope, true);
    if (!r.ok()) return r.status();
    sums = *r;
    return Status();
  });
  if (!s.ok()) return s;
  return sums;
}

Status check_not_moved(DurableStore& store, std::string_view name) {
  Status found;
  Status s = store.read([&](StoreTxn& t) -> Status {
    found = Status();
    return t.scan(StoreTable::Tenancy, "m/", "m/", [&](std::string_view k, std::string_view v) {
      const std::string_view ns = k.substr(2);
      if (!prefix_covers(ns, name)) return true;
      const std::size_t sp = v.find(" other=");
      const std::string_view phase = v.substr(0, sp == std::string_view::npos ? 0 : sp);
      const std::string other(sp == std::string_view::npos ? std::string_view() : v.substr(sp + 7));
      const std::string head = "\"" + std::string(name) + "\": namespace " + quoted(ns) + " ";
      if (phase == "v1 phase=moved-out") {
        found = Status(Code::Conflict, head + "was moved to the store " + quoted(other) +
                                           ": use it through a bus on that store (doc/tenancy.md)");
      } else if (phase == "v1 phase=copying" || phase == "v1 phase=copied") {
        found = Status(Code::Conflict, head + "is being moved between " + quoted(store.directory()) + " and " + quoted(other) +
                                           ": finish it with `lanebus namespace move` first");
      }
      return found.ok();
    });
  });
  if (!s.ok()) return s;
  return found;
}

Status check_store_not_open(const std::string& dir) {
  const std::string lock = dir + "/lock.mdb";
  const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status();  // no lock file: no process has it open
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 1;
  const int rc = ::fcntl(fd, F_GETLK, &fl);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Status(Code::IOError, "store " + quoted(dir) + ": fcntl(F_GETLK) on lock.mdb: " + std::strerror(err));
  if (fl.l_type == F_UNLCK) return Status();
  return Status(Code::Busy, "store " + quoted(dir) + " is open by process " + std::to_string(fl.l_pid) +
                                " (a live bus or a tool): close it first; a namespace moves with the bus closed");
}

namespace {

// The checks before anything is opened for writing: both paths, SRC a
// lanebus store, and neither store open by a process.
Status check_move_dirs(const NamespaceMoveOptions& opt) {
  if (opt.src_dir.empty() || opt.dst_dir.empty()) return Status(Code::InvalidArgument, "SRC_DIR and DST_DIR are needed");
  struct stat st {};
  if (::stat(opt.src_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status(Code::NotFound, "source store " + quoted(opt.src_dir) + " is not a directory");
  }
  if (::stat((opt.src_dir + "/data.mdb").c_str(), &st) != 0) {
    return Status(Code::NotFound, "source " + quoted(opt.src_dir) + " holds no lanebus store (no data.mdb)");
  }
  struct stat dst_st {};
  if (::stat(opt.dst_dir.c_str(), &dst_st) == 0) {
    if (!S_ISDIR(dst_st.st_mode)) return Status(Code::InvalidArgument, "destination " + quoted(opt.dst_dir) + " is not a directory");
    struct stat src_st {};
    ::stat(opt.src_dir.c_str(), &src_st);
    if (src_st.st_dev == dst_st.st_dev && src_st.st_ino == dst_st.st_ino) {
      return Status(Code::InvalidArgument, "source and destination are the same store " + quoted(opt.src_dir));
    }
  }
  // Probe each store read-only first: proves SRC is a lanebus store without
  // creating anything, and is Busy when this process has a store open (then
  // check_store_not_open must not run: closing its descriptor of lock.mdb
  // would drop this process's LMDB locks).
  for (const std::string* dir : {&opt.src_dir, &opt.dst_dir}) {
    if (dir == &opt.dst_dir && ::stat((*dir + "/data.mdb").c_str(), &st) != 0) continue;
    StoreOptions ro;
    ro.directory = *dir;
    ro.read_only = true;
    auto probe = DurableStore::open(ro);
    // DST may be an empty environment left by a move killed while creating it.
    if (!probe.ok() && !(dir == &opt.dst_dir && probe.code() == Code::NotFound)) return probe.status();
  }
  if (Status s = check_store_not_open(opt.src_dir); !s.ok()) return s;
  return check_store_not_open(opt.dst_dir);
}

// True when any table but the policy holds records.
bool holds_data(const MoveSums& sums) {
  for (int i = 0; i < kMoveTables; ++i) {
    if (i != static_cast<int>(MoveTable::Policy) && sums[static_cast<std::size_t>(i)].count != 0) return true;
  }
  return false;
}

// Nothing of the namespace in SRC and no move under way: refused before DST is created.
Status check_something_to_move(DurableStore& src, const std::string& ns, const std::string& src_dir) {
  auto rs0 = read_record(src, ns);
  if (!rs0.ok()) return rs0.status();
  if (rs0->present) return Status();
  auto here = namespace_sums(src, ns);
  if (!here.ok()) return here.status();
  if (!holds_data(*here)) {
    return Status(Code::NotFound, "namespace " + quoted(ns) + " has nothing in " + quoted(real_path(src_dir)) + " to move");
  }
  return Status();
}

// The namespace's sums in `store`, in one read transaction.
Result<MoveSums> read_sums(DurableStore& store, const Scope& scope, bool with_policy) {
  MoveSums sums{};
  Status s = store.read([&](StoreTxn& t) -> Status {
    auto r = sums_of(t, scope, with_policy);
    if (!r.ok()) return r.status();
    sums = *r;
    return Status();
  });
  if (!s.ok()) return s;
  return sums;
}

// One run of move_namespace: its options, both stores, and what each store's
// move record says.
struct MoveRun {
  explicit MoveRun(const NamespaceMoveOptions& o) : opt(o) {}
  const NamespaceMoveOptions& opt;
  std::unique_ptr<DurableStore> src, dst;
  std::string src_path, dst_path;  // real paths, as the move records name them
  Scope scope;
  MoveRecord rs, rd;  // the move records of SRC and DST

  void say(const std::string& line) const {
    if (opt.progress) opt.progress(line);
  }
  void point(std::string_view p) const {
    if (opt.at_point) opt.at_point(p);
  }
};

// Open both stores, learn the declared namespaces inside this one and read
// both move records.
Status open_stores(MoveRun& m) {
  auto src = open_rw(m.opt.src_dir);
  if (!src.ok()) return src.status();
  m.src = std::move(*src);
  if (Status s = check_something_to_move(*m.src, m.opt.name, m.opt.src_dir); !s.ok()) return s;
  auto dst = open_rw(m.opt.dst_dir);
  if (!dst.ok()) return dst.status();
  m.dst = std::move(*dst);
  m.src_path = real_path(m.opt.src_dir);
  m.dst_path = real_path(m.opt.dst_dir);
  m.scope.ns = m.opt.name;
  for (DurableStore* s : {m.src.get(), m.dst.get()}) {
    Status r = s->read([&](StoreTxn& t) { return add_declared(t, &m.scope); });
    if (!r.ok()) return r;
  }
  auto rs = read_record(*m.src, m.opt.name);
  if (!rs.ok()) return rs.status();
  m.rs = std::move(*rs);
  auto rd = read_record(*m.dst, m.opt.name);
  if (!rd.ok()) return rd.status();
  m.rd = std::move(*rd);
  return Status();
}

// The two move records, if any, must name each other's store.
Status check_move_records(const MoveRun& m) {
  const std::string& ns = m.opt.name;
  if (m.rs.present && m.rs.other != m.dst_path) {
    const bool out = m.rs.phase == "moved-out";
    return Status(Code::Conflict, "namespace " + quoted(ns) + " of " + quoted(m.src_path) + " is " +
                                      (out ? "already moved" : "being moved") + " to " + quoted(m.rs.other) +
                                      ", not " + quoted(m.dst_path) + (out ? "" : ": rerun with that DST_DIR"));
  }
  if (m.rd.present && m.rd.other != m.src_path) {
    return Status(Code::Conflict, "destination " + quoted(m.dst_path) + " holds namespace " + quoted(ns) + " moved from " +
                                      quoted(m.rd.other) + ", not from " + quoted(m.src_path));
  }
  return Status();
}

// Mark DST done (once).
Status finish(const MoveRun& m) {
  if (!m.rd.present || m.rd.phase != "done") {
    if (Status s = write_record(*m.dst, m.opt.name, "done", m.src_path); !s.ok()) return s;
  }
  m.point("done");
  return Status();
}

Status close_stores(MoveRun& m) {
  if (Status s = m.src->close(); !s.ok()) return s;
  return m.dst->close();
}

// SRC says the namespace moved out: finish DST's side if an earlier run stopped before it.
Result<NamespaceMoveResult> complete_moved_out(MoveRun& m, NamespaceMoveResult result) {
  const std::string& ns = m.opt.name;
  if (!m.rd.present) {
    return Status(Code::Conflict, "source " + quoted(m.src_path) + " says namespace " + quoted(ns) + " moved to " +
                                      quoted(m.dst_path) + ", but that store has no record of it (was it replaced?)");
  }
  result.already_done = m.rd.phase == "done";
  result.resumed = !result.already_done;
  auto sums = read_sums(*m.dst, m.scope, true);
  if (!sums.ok()) return sums.status();
  result.sums = *sums;
  if (Status s = finish(m); !s.ok()) return s;
  m.say(result.already_done ? "namespace " + quoted(ns) + " was already moved to " + quoted(m.dst_path)
                            : "finished the move of namespace " + quoted(ns) + " (the source was already emptied)");
  if (Status s = close_stores(m); !s.ok()) return s;
  return result;
}

// ---------------------------------------------------------------- the copy

// The DST ids of the namespace's topics (by name) and groups (by topic and group name).
struct IdMap {
  std::map<std::string, std::uint32_t, std::less<>> topics;
  std::map<std::pair<std::string, std::string>, std::uint32_t> groups;
};

// A `meta` id counter of DST (1 when absent).
Result<std::uint64_t> meta_counter(StoreTxn& d, std::string_view key) {
  auto v = d.core_get(Core::Meta, key);
  if (!v.ok()) return v.code() == Code::NotFound ? Result<std::uint64_t>(std::uint64_t{1}) : v.status();
  if (v->size() != 8) return Status(Code::Corruption, "meta record " + std::string(key) + " is malformed");
  return get_le64(v->data());
}

// Give SRC's topics and groups fresh DST ids and advance DST's counters past them.
Result<IdMap> assign_dst_ids(StoreTxn& d, const Side& sside) {
  auto next_topic = meta_counter(d, "next_topic_id");
  if (!next_topic.ok()) return next_topic.status();
  auto next_group = meta_counter(d, "next_group_id");
  if (!next_group.ok()) return next_group.status();
  std::uint64_t nt = *next_topic, ng = *next_group;
  IdMap ids;
  for (const auto& [id, name] : sside.topics) ids.topics[name] = static_cast<std::uint32_t>(nt++);
  for (const auto& [key, name] : sside.groups) {
    ids.groups[{sside.topics.at(key.first), name}] = static_cast<std::uint32_t>(ng++);
  }
  if (nt > UINT32_MAX || ng > UINT32_MAX) return Status(Code::InvalidArgument, "destination topic or group ids exhausted");
  if (Status r = d.core_put(Core::Meta, "next_topic_id", le64(nt)); !r.ok()) return r;
  if (Status r = d.core_put(Core::Meta, "next_group_id", le64(ng)); !r.ok()) return r;
  return ids;
}

// Message ids stay as they are: DST's high-water must be above them all.
Status raise_id_high_water(StoreTxn& s, StoreTxn& d) {
  auto src_ids = s.core_get(Core::Meta, "id_next");
  auto dst_ids = d.core_get(Core::Meta, "id_next");
  if (!src_ids.ok() && src_ids.code() != Code::NotFound) return src_ids.status();
  if (!dst_ids.ok() && dst_ids.code() != Code::NotFound) return dst_ids.status();
  const std::uint64_t a = src_ids.ok() && src_ids->size() == 8 ? get_le64(src_ids->data()) : 1;
  const std::uint64_t b = dst_ids.ok() && dst_ids->size() == 8 ? get_le64(dst_ids->data()) : 1;
  if (a > b) return d.core_put(Core::Meta, "id_next", le64(a));
  return Status();
}

// A logical key's parts: topic \0 group \0 rest.
void split_lkey(std::string_view l, std::string_view* topic, std::string_view* group, std::string_view* rest) {
  const std::size_t z1 = l.find('\0');
  const std::size_t z2 = l.find('\0', z1 + 1);
  *topic = l.substr(0, z1);
  *group = l.substr(z1 + 1, z2 - z1 - 1);
  *rest = l.substr(z2 + 1);
}

// Write one SRC record into DST, its topic and group ids replaced by DST's.
Status put_remapped(StoreTxn& d, const Item& it, const IdMap& ids, const Side& sside) {
  std::string_view topic, group, rest;
  std::string key;
  auto gid = [&] { return ids.groups.at({std::string(topic), std::string(group)}); };
  switch (it.table) {
    case MoveTable::Topics: {
      std::string v(it.value);
      put_le32(v.data() + 4, ids.topics.at(it.lkey));
      return d.core_put(Core::Topics, it.key, v);
    }
    case MoveTable::Lanes:
    case MoveTable::Log:
      split_lkey(it.lkey, &topic, &group, &rest);
      put_be32(key, ids.topics.find(topic)->second);
      key.append(rest);
      return d.core_put(it.table == MoveTable::Lanes ? Core::Lanes : Core::Log, key, it.value);
    case MoveTable::Groups: {
      split_lkey(it.lkey, &topic, &group, &rest);
      put_be32(key, ids.topics.find(topic)->second);
      key.append(group);
      std::string v(it.value);
      put_le32(v.data() + 4, gid());
      return d.core_put(Core::Groups, key, v);
    }
    case MoveTable::Cursors:
    case MoveTable::Inflight:
      split_lkey(it.lkey, &topic, &group, &rest);
      put_be32(key, ids.topics.find(topic)->second);
      put_be32(key, gid());
      key.append(rest);
      return d.core_put(it.table == MoveTable::Cursors ? Core::Cursors : Core::Inflight, key, it.value);
    case MoveTable::Fence:
      split_lkey(it.lkey, &topic, &group, &rest);
      key.push_back(rest[0]);
      put_be32(key, ids.topics.find(topic)->second);
      key.append(rest.substr(1));
      return d.put(StoreTable::Fence, key, it.value);
    case MoveTable::DlqMarks:
      split_lkey(it.lkey, &topic, &group, &rest);
      key.push_back(rest[0]);
      put_be32(key, ids.topics.find(topic)->second);
      put_be32(key, gid());
      key.append(rest.substr(1));
      return d.put(StoreTable::Dlq, key, it.value);
    case MoveTable::DlqEntries: {
      DlqEntry e = it.entry;
      auto tm = ids.topics.find(e.topic);
      auto st_id = sside.topic_ids.find(e.topic);
      const bool resolves = e.topic_id != 0 && st_id != sside.topic_ids.end() && st_id->second == e.topic_id;
      e.topic_id = resolves ? tm->second : 0;
      return DlqStore::import_in(d, std::move(e)).status();
    }
    case MoveTable::Idempotency: return d.put(StoreTable::Idempotency, it.key, it.value);
    case MoveTable::IdempotencyAge: return d.put(StoreTable::IdempotencyAge, it.key, it.value);
    case MoveTable::User: return d.put(StoreTable::User, it.key, it.value);
    case MoveTable::Schema: return d.put(StoreTable::Schema, it.key, it.value);
    case MoveTable::Usage:
    case MoveTable::Policy: return d.put(StoreTable::Tenancy, it.key, it.value);
    case MoveTable::Delayed: {
      // The walk decoded it already (a corrupt entry stops the walk).
      AppendRequest r;
      if (Status s = decode_delayed(it.key, it.value, &r); !s.ok()) return s;
      split_lkey(it.lkey, &topic, &group, &rest);
      r.topic_id = ids.topics.find(topic)->second;
      key.assign(rest.substr(0, 16));
      put_be32(key, r.topic_id);
      key.append(rest.substr(16));
      return d.put(StoreTable::Delayed, key, encode_delayed(r));
    }
  }
  return Status();
}

// Inside one DST write transaction `d` and one SRC read transaction `s`:
// every record of the namespace, remapped, and DST's move record `copied`.
Status copy_records(const MoveRun& m, StoreTxn& s, StoreTxn& d, const std::string& copied) {
  Side sside;
  if (Status r = load_side(s, m.scope, &sside); !r.ok()) return r;
  auto ids = assign_dst_ids(d, sside);
  if (!ids.ok()) return ids.status();
  if (Status r = raise_id_high_water(s, d); !r.ok()) return r;
  std::uint64_t written = 0;
  Status w = walk(s, m.scope, sside, [&](Item& it) -> Status {
    Status r = put_remapped(d, it, *ids, sside);
    if (r.ok() && (++written & 1023) == 0) m.point("copying");
    return r;
  });
  if (!w.ok()) return d.abort_batch(w);
  m.point("copying");
  if (Status r = d.put(StoreTable::Tenancy, move_key(m.opt.name), copied); !r.ok()) return d.abort_batch(r);
  return Status();
}

// Nothing copied yet: refuse an empty namespace and a DST that already holds
// some of it, mark SRC "copying", and copy in one DST transaction.
Status copy_namespace(MoveRun& m, const MoveSums& src_sums) {
  const std::string& ns = m.opt.name;
  if (!holds_data(src_sums)) {
    return Status(Code::NotFound, "namespace " + quoted(ns) + " has nothing in " + quoted(m.src_path) + " to move");
  }
  auto there = read_sums(*m.dst, m.scope, false);
  if (!there.ok()) return there.status();
  for (int i = 0; i < kMoveTables; ++i) {
    if ((*there)[static_cast<std::size_t>(i)].count != 0) {
      return Status(Code::Conflict, "destination " + quoted(m.dst_path) + " already holds data of namespace " + quoted(ns) +
                                        " (" + describe(*there) + "): move into a store without it");
    }
  }
  if (!m.rs.present) {
    if (Status s = write_record(*m.src, ns, "copying", m.dst_path); !s.ok()) return s;
  }
  m.point("src-marked");
  m.say("copying namespace " + quoted(ns) + " from " + quoted(m.src_path) + " to " + quoted(m.dst_path) + ": " +
        describe(src_sums));
  const std::string copied = encode_record("copied", m.src_path);
  Status cs = m.dst->write([&](StoreTxn& d) -> Status {
    return m.src->read([&](StoreTxn& s) -> Status { return copy_records(m, s, d, copied); });
  });
  if (!cs.ok()) return cs;
  m.rd.present = true;
  m.rd.phase = "copied";
  m.rd.other = m.src_path;
  m.point("copied");
  return Status();
}

// ---------------------------------------------------------------- verify and delete

// SRC against DST, table by table.
Status verify_copy(const MoveRun& m, const MoveSums& src_sums, const MoveSums& dst_sums) {
  for (int i = 0; i < kMoveTables; ++i) {
    const MoveTableSum& a = src_sums[static_cast<std::size_t>(i)];
    const MoveTableSum& b = dst_sums[static_cast<std::size_t>(i)];
    if (!(a == b)) {
      return Status(Code::Conflict, "verify failed for namespace " + quoted(m.opt.name) + ", table " +
                                        move_table_name(static_cast<MoveTable>(i)) + ": " + std::to_string(a.count) +
                                        " records in " + quoted(m.src_path) + ", " + std::to_string(b.count) + " in " +
                                        quoted(m.dst_path) + (a.count == b.count ? " (checksums differ)" : "") +
                                        "; nothing was deleted. Was the source changed after the copy?");
    }
  }
  return Status();
}

// Delete one record of SRC by its table and physical key (DLQ entries and the policy are not deleted here).
Status delete_key(StoreTxn& t, MoveTable table, const std::string& key) {
  switch (table) {
    case MoveTable::Topics: return t.core_del(Core::Topics, key);
    case MoveTable::Lanes: return t.core_del(Core::Lanes, key);
    case MoveTable::Log: return t.core_del(Core::Log, key);
    case MoveTable::Groups: return t.core_del(Core::Groups, key);
    case MoveTable::Cursors: return t.core_del(Core::Cursors, key);
    case MoveTable::Inflight: return t.core_del(Core::Inflight, key);
    case MoveTable::Fence: return t.del(StoreTable::Fence, key);
    case MoveTable::DlqMarks: return t.del(StoreTable::Dlq, key);
    case MoveTable::Idempotency: return t.del(StoreTable::Idempotency, key);
    case MoveTable::IdempotencyAge: return t.del(StoreTable::IdempotencyAge, key);
    case MoveTable::User: return t.del(StoreTable::User, key);
    case MoveTable::Schema: return t.del(StoreTable::Schema, key);
    case MoveTable::Usage: return t.del(StoreTable::Tenancy, key);
    case MoveTable::Delayed: return t.del(StoreTable::Delayed, key);
    case MoveTable::DlqEntries:
    case MoveTable::Policy: break;
  }
  return Status();
}

// Delete the namespace from SRC (the policy stays: the bus on SRC keeps
// enforcing it) and mark SRC "moved-out", in one transaction.
Status delete_from_src(const MoveRun& m) {
  const std::string done_src = encode_record("moved-out", m.dst_path);
  return m.src->write([&](StoreTxn& t) -> Status {
    Side side;
    if (Status r = load_side(t, m.scope, &side); !r.ok()) return r;
    std::vector<std::pair<MoveTable, std::string>> keys;
    std::vector<std::uint64_t> dlq_ids;
    Status w = walk(t, m.scope, side, [&](Item& it) -> Status {
      if (it.table == MoveTable::DlqEntries) {
        dlq_ids.push_back(it.entry.id);
      } else if (it.table != MoveTable::Policy) {
        keys.emplace_back(it.table, std::string(it.key));
      }
      return Status();
    });
    if (!w.ok()) return w;
    m.point("deleting");
    for (const auto& [table, key] : keys) {
      if (Status r = delete_key(t, table, key); !r.ok() && r.code() != Code::NotFound) return t.abort_batch(r);
    }
    for (std::uint64_t id : dlq_ids) {
      if (Status r = DlqStore::remove_in(t, id); !r.ok() && r.code() != Code::NotFound) return t.abort_batch(r);
    }
    if (Status r = t.put(StoreTable::Tenancy, move_key(m.opt.name), done_src); !r.ok()) return t.abort_batch(r);
    return Status();
  });
}

}  // namespace

// The steps, each its own function above: check, open, copy (unless an
// earlier run did), verify, delete from SRC, mark DST done. Every step can be
// resumed by running the move again (doc/tenancy.md "Moving a namespace").
Result<NamespaceMoveResult> move_namespace(const NamespaceMoveOptions& opt) {
  const std::string& ns = opt.name;
  if (Status s = check_name(ns, "namespace"); !s.ok()) return s;
  if (Status s = check_move_dirs(opt); !s.ok()) return s;
  MoveRun m(opt);
  m.point("start");
  if (Status s = open_stores(m); !s.ok()) return s;
  if (Status s = check_move_records(m); !s.ok()) return s;
  NamespaceMoveResult result;
  result.resumed = m.rs.present && m.rs.phase != "moved-out";
  if (m.rs.present && m.rs.phase == "moved-out") return complete_moved_out(m, result);

  auto src_sums = read_sums(*m.src, m.scope, true);  // what SRC holds of the namespace
  if (!src_sums.ok()) return src_sums.status();
  if (!m.rd.present) {
    if (Status s = copy_namespace(m, *src_sums); !s.ok()) return s;
  } else {
    m.say("resuming the move of namespace " + quoted(ns) + ": the copy in " + quoted(m.dst_path) + " is complete");
    result.resumed = true;
  }
  auto dst_sums = read_sums(*m.dst, m.scope, true);
  if (!dst_sums.ok()) return dst_sums.status();
  if (Status s = verify_copy(m, *src_sums, *dst_sums); !s.ok()) return s;
  m.say("verified " + describe(*dst_sums) + " (counts and checksums per table)");
  m.point("verified");

  m.say("removing namespace " + quoted(ns) + " from " + quoted(m.src_path));
  if (Status s = delete_from_src(m); !s.ok()) return s;
  m.point("src-deleted");
  if (Status s = finish(m); !s.ok()) return s;
  result.sums = *dst_sums;
  m.say("moved namespace " + quoted(ns) + " to " + quoted(m.dst_path) + ": " + describe(*dst_sums));
  if (Status s = close_stores(m); !s.ok()) return s;
  return result;
}

}  // namespace lanebus::detail

namespace lanebus {

Status move_namespace(const std::string& src_dir, const std::string& dst_dir, std::string_view name) {
  detail::NamespaceMoveOptions o;
  o.src_dir = src_dir;
  o.dst_dir = dst_dir;
  o.name = std::string(name);
  return detail::move_namespace(o).status();
}

}  // namespace lanebus
