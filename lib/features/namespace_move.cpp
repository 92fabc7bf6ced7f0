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

// Visit every record of the namespace in the store of `t`.
Status walk(StoreTxn& t, const Scope& scope, const Side& side, const std::function<Status(Item&)>& visit) {
  Status err;
  auto run = [&](Item&& item) {
    err = visit(item);
    return err.ok();
  };
  auto topic_of = [&](std::string_view k) -> const std::string* {
    if (k.size() < 4) return nullptr;
    auto it = side.topics.find(get_be32(k.data()));
    return it == side.topics.end() ? nullptr : &it->second;
  };
  auto group_of = [&](std::uint32_t tid, std::uint32_t gid) -> const std::string* {
    auto it = side.groups.find({tid, gid});
    return it == side.groups.end() ? nullptr : &it->second;
  };
  Status s;
  // topics
  s = t.core_scan(Core::Topics, {}, {}, [&](std::string_view k, std::string_view v) {
    if (!scope.holds(k)) return true;
    std::string lv(v);
    put_le32(lv.data() + 4, 0);
    return run(Item{MoveTable::Topics, k, v, std::string(k), std::move(lv), {}});
  });
  if (!s.ok() || !err.ok()) return s.ok() ? err : s;
  // per topic: lanes, log, groups, cursors, inflight
  for (const auto& topic : side.topics) {
    const std::uint32_t tid = topic.first;  // not a binding: captured below
    const std::string& name = topic.second;
    std::string prefix;
    put_be32(prefix, tid);
    s = t.core_scan(Core::Lanes, prefix, prefix, [&](std::string_view k, std::string_view v) {
      return run(Item{MoveTable::Lanes, k, v, lk(name, {}, k.substr(4)), std::string(v), {}});
    });
    if (!s.ok() || !err.ok()) return s.ok() ? err : s;
    s = t.core_scan(Core::Log, prefix, prefix, [&](std::string_view k, std::string_view v) {
      return run(Item{MoveTable::Log, k, v, lk(name, {}, k.substr(4)), std::string(v), {}});
    });
    if (!s.ok() || !err.ok()) return s.ok() ? err : s;
    s = t.core_scan(Core::Groups, prefix, prefix, [&](std::string_view k, std::string_view v) {
      std::string lv(v);
      put_le32(lv.data() + 4, 0);
      return run(Item{MoveTable::Groups, k, v, lk(name, k.substr(4), {}), std::move(lv), {}});
    });
    if (!s.ok() || !err.ok()) return s.ok() ? err : s;
    for (Core c : {Core::Cursors, Core::Inflight}) {
      s = t.core_scan(c, prefix, prefix, [&](std::string_view k, std::string_view v) {
        if (k.size() < 12) return true;
        const std::string* g = group_of(tid, get_be32(k.data() + 4));
        if (g == nullptr) {
          err = Status(Code::Corruption, "topic " + quoted(name) + ": a cursor or claim of an unknown group " +
                                             std::to_string(get_be32(k.data() + 4)));
          return false;
        }
        return run(Item{c == Core::Cursors ? MoveTable::Cursors : MoveTable::Inflight, k, v,
                        lk(name, *g, k.substr(8)), std::string(v), {}});
      });
      if (!s.ok() || !err.ok()) return s.ok() ? err : s;
    }
    // fence high-water and dedupe records of fenced lanes: 'L'/'D' + be32 topic + rest
    for (char kind : {'L', 'D'}) {
      std::string fp(1, kind);
      fp += prefix;
      s = t.scan(StoreTable::Fence, fp, fp, [&](std::string_view k, std::string_view v) {
        return run(Item{MoveTable::Fence, k, v, lk(name, {}, std::string(1, kind) + std::string(k.substr(5))),
                        std::string(v), {}});
      });
      if (!s.ok() || !err.ok()) return s.ok() ? err : s;
    }
  }
  // DLQ entries (by origin topic name) and poison bookkeeping ("o"/"m" + be32 topic + be32 group + ...)
  s = t.scan(StoreTable::Dlq, "e", "e", [&](std::string_view k, std::string_view v) {
    auto e = decode_dlq_entry(v);
    if (!e.ok()) {
      err = e.status();
      return false;
    }
    if (!scope.holds(e->topic)) return true;
    DlqEntry n = *e;
    n.id = 0;
    // The id of the origin topic only counts as "resolves to the same topic".
    auto it = side.topic_ids.find(n.topic);
    n.topic_id = (n.topic_id != 0 && it != side.topic_ids.end() && it->second == n.topic_id) ? 1 : 0;
    return run(Item{MoveTable::DlqEntries, k, v, lk(n.topic, n.group, {}), encode_dlq_entry(n), std::move(*e)});
  });
  if (!s.ok() || !err.ok()) return s.ok() ? err : s;
  for (char kind : {'o', 'm'}) {
    std::string mp(1, kind);
    s = t.scan(StoreTable::Dlq, mp, mp, [&](std::string_view k, std::string_view v) {
      if (k.size() < 9) return true;
      const std::string* topic = topic_of(k.substr(1));
      if (topic == nullptr) return true;
      const std::string* g = group_of(get_be32(k.data() + 1), get_be32(k.data() + 5));
      if (g == nullptr) return true;  // bookkeeping of a group that no longer exists: left alone
      return run(Item{MoveTable::DlqMarks, k, v, lk(*topic, *g, std::string(1, kind) + std::string(k.substr(9))),
                      std::string(v), {}});
    });
    if (!s.ok() || !err.ok()) return s.ok() ? err : s;
  }
  // idempotency scopes: u16 BE scope length + scope + ...
  for (StoreTable tb : {StoreTable::Idempotency, StoreTable::IdempotencyAge}) {
    s = t.scan(tb, {}, {}, [&](std::string_view k, std::string_view v) {
      if (k.size() < 2) return true;
      const std::size_t n = (static_cast<unsigned char>(k[0]) << 8) | static_cast<unsigned char>(k[1]);
      if (k.size() < 2 + n || !scope.holds(k.substr(2, n))) return true;
      return run(Item{tb == StoreTable::Idempotency ? MoveTable::Idempotency : MoveTable::IdempotencyAge, k, v,
                      std::string(k), std::string(v), {}});
    });
    if (!s.ok() || !err.ok()) return s.ok() ? err : s;
  }
  // user tables: table \0 key
  s = t.scan(StoreTable::User, {}, {}, [&](std::string_view k, std::string_view v) {
    const std::size_t z = k.find('\0');
    if (z == std::string_view::npos || !scope.holds(k.substr(0, z))) return true;
    return run(Item{MoveTable::User, k, v, std::string(k), std::string(v), {}});
  });
  if (!s.ok() || !err.ok()) return s.ok() ? err : s;
  // schema registry records of the namespace's topics ("m"+topic, "v"/"d"/"c"/"u"+topic+\0...);
  // the audit log ("a", "n") stays.
  s = t.scan(StoreTable::Schema, {}, {}, [&](std::string_view k, std::string_view v) {
    if (k.empty() || std::string_view("mvdcu").find(k[0]) == std::string_view::npos) return true;
    std::string_view rest = k.substr(1);
    std::string_view topic = k[0] == 'm' ? rest : rest.substr(0, rest.find('\0'));
    if (!scope.holds(topic)) return true;
    return run(Item{MoveTable::Schema, k, v, std::string(k), std::string(v), {}});
  });
  if (!s.ok() || !err.ok()) return s.ok() ? err : s;
  // usage by minute ("u/" + ns + \0 + minute) and the policy ("n/" + ns): the namespace itself only
  s = t.scan(StoreTable::Tenancy, "u/", "u/", [&](std::string_view k, std::string_view v) {
    std::string ns;
    std::uint64_t minute = 0;
    if (!parse_usage_key(k, &ns, &minute) || ns != scope.ns) return true;
    return run(Item{MoveTable::Usage, k, v, std::string(k), std::string(v), {}});
  });
  if (!s.ok() || !err.ok()) return s.ok() ? err : s;
  const std::string pk = "n/" + scope.ns;
  auto pol = t.get(StoreTable::Tenancy, pk);
  if (pol.ok()) {
    Item item{MoveTable::Policy, pk, *pol, pk, std::string(*pol), {}};
    return visit(item);
  }
  if (pol.code() != Code::NotFound) return pol.status();
  return Status();
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
      "user", "fence", "schema", "usage", "policy"};
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

Result<NamespaceMoveResult> move_namespace(const NamespaceMoveOptions& opt) {
  auto say = [&](const std::string& line) {
    if (opt.progress) opt.progress(line);
  };
  auto point = [&](std::string_view p) {
    if (opt.at_point) opt.at_point(p);
  };
  const std::string& ns = opt.name;
  if (Status s = check_name(ns, "namespace"); !s.ok()) return s;
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
  if (Status s = check_store_not_open(opt.dst_dir); !s.ok()) return s;
  point("start");

  auto src = open_rw(opt.src_dir);
  if (!src.ok()) return src.status();
  {
    // Nothing of the namespace and no move under way: refuse before creating DST.
    auto rs0 = read_record(**src, ns);
    if (!rs0.ok()) return rs0.status();
    if (!rs0->present) {
      auto here = namespace_sums(**src, ns);
      if (!here.ok()) return here.status();
      bool any = false;
      for (int i = 0; i < kMoveTables; ++i) {
        if (i != static_cast<int>(MoveTable::Policy) && (*here)[static_cast<std::size_t>(i)].count != 0) any = true;
      }
      if (!any) return Status(Code::NotFound, "namespace " + quoted(ns) + " has nothing in " + quoted(real_path(opt.src_dir)) + " to move");
    }
  }
  auto dst = open_rw(opt.dst_dir);
  if (!dst.ok()) return dst.status();
  const std::string src_path = real_path(opt.src_dir), dst_path = real_path(opt.dst_dir);

  Scope scope;
  scope.ns = ns;
  for (DurableStore* s : {src->get(), dst->get()}) {
    Status r = s->read([&](StoreTxn& t) { return add_declared(t, &scope); });
    if (!r.ok()) return r;
  }

  auto rs = read_record(**src, ns);
  if (!rs.ok()) return rs.status();
  auto rd = read_record(**dst, ns);
  if (!rd.ok()) return rd.status();
  if (rs->present && rs->other != dst_path) {
    return Status(Code::Conflict, "namespace " + quoted(ns) + " of " + quoted(src_path) + " is " +
                                      (rs->phase == "moved-out" ? "already moved" : "being moved") + " to " + quoted(rs->other) +
                                      ", not " + quoted(dst_path) + (rs->phase == "moved-out" ? "" : ": rerun with that DST_DIR"));
  }
  if (rd->present && rd->other != src_path) {
    return Status(Code::Conflict, "destination " + quoted(dst_path) + " holds namespace " + quoted(ns) + " moved from " +
                                      quoted(rd->other) + ", not from " + quoted(src_path));
  }
  NamespaceMoveResult result;
  result.resumed = rs->present && rs->phase != "moved-out";

  auto finish = [&]() -> Status {
    if (!rd->present || rd->phase != "done") {
      if (Status s = write_record(**dst, ns, "done", src_path); !s.ok()) return s;
    }
    point("done");
    return Status();
  };

  if (rs->present && rs->phase == "moved-out") {
    if (!rd->present) {
      return Status(Code::Conflict, "source " + quoted(src_path) + " says namespace " + quoted(ns) + " moved to " + quoted(dst_path) +
                                        ", but that store has no record of it (was it replaced?)");
    }
    result.already_done = rd->phase == "done";
    result.resumed = !result.already_done;
    auto sums = (*dst)->read([&](StoreTxn& t) -> Status {
      auto r = sums_of(t, scope, true);
      if (!r.ok()) return r.status();
      result.sums = *r;
      return Status();
    });
    if (!sums.ok()) return sums;
    if (Status s = finish(); !s.ok()) return s;
    say(result.already_done ? "namespace " + quoted(ns) + " was already moved to " + quoted(dst_path)
                            : "finished the move of namespace " + quoted(ns) + " (the source was already emptied)");
    if (Status s = (*src)->close(); !s.ok()) return s;
    if (Status s = (*dst)->close(); !s.ok()) return s;
    return result;
  }

  // What SRC holds of the namespace.
  MoveSums src_sums{};
  if (Status s = (*src)->read([&](StoreTxn& t) -> Status {
        auto r = sums_of(t, scope, true);
        if (!r.ok()) return r.status();
        src_sums = *r;
        return Status();
      });
      !s.ok()) {
    return s;
  }

  if (!rd->present) {
    // Nothing copied yet. Refuse an empty namespace and a DST that already holds some of it.
    bool any = false;
    for (int i = 0; i < kMoveTables; ++i) {
      if (i != static_cast<int>(MoveTable::Policy) && src_sums[static_cast<std::size_t>(i)].count != 0) any = true;
    }
    if (!any) return Status(Code::NotFound, "namespace " + quoted(ns) + " has nothing in " + quoted(src_path) + " to move");
    MoveSums there{};
    if (Status s = (*dst)->read([&](StoreTxn& t) -> Status {
          auto r = sums_of(t, scope, false);
          if (!r.ok()) return r.status();
          there = *r;
          return Status();
        });
        !s.ok()) {
      return s;
    }
    for (int i = 0; i < kMoveTables; ++i) {
      if (there[static_cast<std::size_t>(i)].count != 0) {
        return Status(Code::Conflict, "destination " + quoted(dst_path) + " already holds data of namespace " + quoted(ns) + " (" +
                                          describe(there) + "): move into a store without it");
      }
    }
    if (!rs->present) {
      if (Status s = write_record(**src, ns, "copying", dst_path); !s.ok()) return s;
    }
    point("src-marked");
    say("copying namespace " + quoted(ns) + " from " + quoted(src_path) + " to " + quoted(dst_path) + ": " + describe(src_sums));

    // One DST transaction: every record, remapped, and the move record.
    const std::string copied = encode_record("copied", src_path);
    Status cs = (*dst)->write([&](StoreTxn& d) -> Status {
      return (*src)->read([&](StoreTxn& s) -> Status {
        Side sside;
        if (Status r = load_side(s, scope, &sside); !r.ok()) return r;
        // DST ids for the topics and groups.
        auto counter = [&](std::string_view key) -> Result<std::uint64_t> {
          auto v = d.core_get(Core::Meta, key);
          if (!v.ok()) return v.code() == Code::NotFound ? Result<std::uint64_t>(std::uint64_t{1}) : v.status();
          if (v->size() != 8) return Status(Code::Corruption, "meta record " + std::string(key) + " is malformed");
          return get_le64(v->data());
        };
        auto next_topic = counter("next_topic_id");
        if (!next_topic.ok()) return next_topic.status();
        auto next_group = counter("next_group_id");
        if (!next_group.ok()) return next_group.status();
        std::uint64_t nt = *next_topic, ng = *next_group;
        std::map<std::string, std::uint32_t, std::less<>> tmap;
        std::map<std::pair<std::string, std::string>, std::uint32_t> gmap;
        for (const auto& [id, name] : sside.topics) tmap[name] = static_cast<std::uint32_t>(nt++);
        for (const auto& [key, name] : sside.groups) gmap[{sside.topics.at(key.first), name}] = static_cast<std::uint32_t>(ng++);
        if (nt > UINT32_MAX || ng > UINT32_MAX) return Status(Code::InvalidArgument, "destination topic or group ids exhausted");
        if (Status r = d.core_put(Core::Meta, "next_topic_id", le64(nt)); !r.ok()) return r;
        if (Status r = d.core_put(Core::Meta, "next_group_id", le64(ng)); !r.ok()) return r;
        // Message ids stay as they are: DST's high-water must be above them all.
        auto src_ids = s.core_get(Core::Meta, "id_next");
        auto dst_ids = d.core_get(Core::Meta, "id_next");
        if (!src_ids.ok() && src_ids.code() != Code::NotFound) return src_ids.status();
        if (!dst_ids.ok() && dst_ids.code() != Code::NotFound) return dst_ids.status();
        const std::uint64_t a = src_ids.ok() && src_ids->size() == 8 ? get_le64(src_ids->data()) : 1;
        const std::uint64_t b = dst_ids.ok() && dst_ids->size() == 8 ? get_le64(dst_ids->data()) : 1;
        if (a > b) {
          if (Status r = d.core_put(Core::Meta, "id_next", le64(a)); !r.ok()) return r;
        }
        std::uint64_t written = 0;
        auto split = [](std::string_view l, std::string_view* topic, std::string_view* group, std::string_view* rest) {
          const std::size_t z1 = l.find('\0');
          const std::size_t z2 = l.find('\0', z1 + 1);
          *topic = l.substr(0, z1);
          *group = l.substr(z1 + 1, z2 - z1 - 1);
          *rest = l.substr(z2 + 1);
        };
        Status w = walk(s, scope, sside, [&](Item& it) -> Status {
          std::string_view topic, group, rest;
          std::string key;
          Status r;
          switch (it.table) {
            case MoveTable::Topics: {
              std::string v(it.value);
              put_le32(v.data() + 4, tmap.at(it.lkey));
              r = d.core_put(Core::Topics, it.key, v);
              break;
            }
            case MoveTable::Lanes:
            case MoveTable::Log:
              split(it.lkey, &topic, &group, &rest);
              put_be32(key, tmap.find(topic)->second);
              key.append(rest);
              r = d.core_put(it.table == MoveTable::Lanes ? Core::Lanes : Core::Log, key, it.value);
              break;
            case MoveTable::Groups: {
              split(it.lkey, &topic, &group, &rest);
              put_be32(key, tmap.find(topic)->second);
              key.append(group);
              std::string v(it.value);
              put_le32(v.data() + 4, gmap.at({std::string(topic), std::string(group)}));
              r = d.core_put(Core::Groups, key, v);
              break;
            }
            case MoveTable::Cursors:
            case MoveTable::Inflight:
              split(it.lkey, &topic, &group, &rest);
              put_be32(key, tmap.find(topic)->second);
              put_be32(key, gmap.at({std::string(topic), std::string(group)}));
              key.append(rest);
              r = d.core_put(it.table == MoveTable::Cursors ? Core::Cursors : Core::Inflight, key, it.value);
              break;
            case MoveTable::Fence:
              split(it.lkey, &topic, &group, &rest);
              key.push_back(rest[0]);
              put_be32(key, tmap.find(topic)->second);
              key.append(rest.substr(1));
              r = d.put(StoreTable::Fence, key, it.value);
              break;
            case MoveTable::DlqMarks:
              split(it.lkey, &topic, &group, &rest);
              key.push_back(rest[0]);
              put_be32(key, tmap.find(topic)->second);
              put_be32(key, gmap.at({std::string(topic), std::string(group)}));
              key.append(rest.substr(1));
              r = d.put(StoreTable::Dlq, key, it.value);
              break;
            case MoveTable::DlqEntries: {
              DlqEntry e = it.entry;
              auto tm = tmap.find(e.topic);
              auto st_id = sside.topic_ids.find(e.topic);
              const bool resolves = e.topic_id != 0 && st_id != sside.topic_ids.end() && st_id->second == e.topic_id;
              e.topic_id = resolves ? tm->second : 0;
              auto id = DlqStore::import_in(d, std::move(e));
              r = id.status();
              break;
            }
            case MoveTable::Idempotency: r = d.put(StoreTable::Idempotency, it.key, it.value); break;
            case MoveTable::IdempotencyAge: r = d.put(StoreTable::IdempotencyAge, it.key, it.value); break;
            case MoveTable::User: r = d.put(StoreTable::User, it.key, it.value); break;
            case MoveTable::Schema: r = d.put(StoreTable::Schema, it.key, it.value); break;
            case MoveTable::Usage:
            case MoveTable::Policy: r = d.put(StoreTable::Tenancy, it.key, it.value); break;
          }
          if (r.ok() && (++written & 1023) == 0) point("copying");
          return r;
        });
        if (!w.ok()) return d.abort_batch(w);
        point("copying");
        if (Status r = d.put(StoreTable::Tenancy, move_key(ns), copied); !r.ok()) return d.abort_batch(r);
        return Status();
      });
    });
    if (!cs.ok()) return cs;
    rd->present = true;
    rd->phase = "copied";
    rd->other = src_path;
    point("copied");
  } else {
    say("resuming the move of namespace " + quoted(ns) + ": the copy in " + quoted(dst_path) + " is complete");
    result.resumed = true;
  }

  // Verify: SRC against DST, table by table.
  MoveSums dst_sums{};
  if (Status s = (*dst)->read([&](StoreTxn& t) -> Status {
        auto r = sums_of(t, scope, true);
        if (!r.ok()) return r.status();
        dst_sums = *r;
        return Status();
      });
      !s.ok()) {
    return s;
  }
  for (int i = 0; i < kMoveTables; ++i) {
    const MoveTableSum& a = src_sums[static_cast<std::size_t>(i)];
    const MoveTableSum& b = dst_sums[static_cast<std::size_t>(i)];
    if (!(a == b)) {
      return Status(Code::Conflict, "verify failed for namespace " + quoted(ns) + ", table " +
                                        move_table_name(static_cast<MoveTable>(i)) + ": " + std::to_string(a.count) +
                                        " records in " + quoted(src_path) + ", " + std::to_string(b.count) + " in " +
                                        quoted(dst_path) + (a.count == b.count ? " (checksums differ)" : "") +
                                        "; nothing was deleted. Was the source changed after the copy?");
    }
  }
  say("verified " + describe(dst_sums) + " (counts and checksums per table)");
  point("verified");

  // Delete from SRC (the policy stays: the bus on SRC keeps enforcing it), in one transaction.
  say("removing namespace " + quoted(ns) + " from " + quoted(src_path));
  const std::string done_src = encode_record("moved-out", dst_path);
  Status ds = (*src)->write([&](StoreTxn& t) -> Status {
    Side side;
    if (Status r = load_side(t, scope, &side); !r.ok()) return r;
    std::vector<std::pair<MoveTable, std::string>> keys;
    std::vector<std::uint64_t> dlq_ids;
    Status w = walk(t, scope, side, [&](Item& it) -> Status {
      if (it.table == MoveTable::DlqEntries) {
        dlq_ids.push_back(it.entry.id);
      } else if (it.table != MoveTable::Policy) {
        keys.emplace_back(it.table, std::string(it.key));
      }
      return Status();
    });
    if (!w.ok()) return w;
    point("deleting");
    for (const auto& [table, key] : keys) {
      Status r;
      switch (table) {
        case MoveTable::Topics: r = t.core_del(Core::Topics, key); break;
        case MoveTable::Lanes: r = t.core_del(Core::Lanes, key); break;
        case MoveTable::Log: r = t.core_del(Core::Log, key); break;
        case MoveTable::Groups: r = t.core_del(Core::Groups, key); break;
        case MoveTable::Cursors: r = t.core_del(Core::Cursors, key); break;
        case MoveTable::Inflight: r = t.core_del(Core::Inflight, key); break;
        case MoveTable::Fence: r = t.del(StoreTable::Fence, key); break;
        case MoveTable::DlqMarks: r = t.del(StoreTable::Dlq, key); break;
        case MoveTable::Idempotency: r = t.del(StoreTable::Idempotency, key); break;
        case MoveTable::IdempotencyAge: r = t.del(StoreTable::IdempotencyAge, key); break;
        case MoveTable::User: r = t.del(StoreTable::User, key); break;
        case MoveTable::Schema: r = t.del(StoreTable::Schema, key); break;
        case MoveTable::Usage: r = t.del(StoreTable::Tenancy, key); break;
        case MoveTable::DlqEntries:
        case MoveTable::Policy: break;
      }
      if (!r.ok() && r.code() != Code::NotFound) return t.abort_batch(r);
    }
    for (std::uint64_t id : dlq_ids) {
      if (Status r = DlqStore::remove_in(t, id); !r.ok() && r.code() != Code::NotFound) return t.abort_batch(r);
    }
    if (Status r = t.put(StoreTable::Tenancy, move_key(ns), done_src); !r.ok()) return t.abort_batch(r);
    return Status();
  });
  if (!ds.ok()) return ds;
  point("src-deleted");
  if (Status s = finish(); !s.ok()) return s;
  result.sums = dst_sums;
  say("moved namespace " + quoted(ns) + " to " + quoted(dst_path) + ": " + describe(dst_sums));
  if (Status s = (*src)->close(); !s.ok()) return s;
  if (Status s = (*dst)->close(); !s.ok()) return s;
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
