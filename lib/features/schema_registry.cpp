// lanebus — MIT License.
// The schema registry (lib/features/schema_registry.hpp, doc/schemas.md): versions,
// compatibility, contracts, deprecations, the usage audit and the audit log,
// kept in the store's `schema` table (doc/storage-format.md).
#include "schema_registry.hpp"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <set>

#include "access.hpp"
#include "coding.hpp"
#include "bus_impl.hpp"
#include "names.hpp"
#include "record_codec.hpp"
#include "schema_usage.hpp"

namespace lanebus::detail {

namespace {

// ---- key and value encoding (doc/storage-format.md, `schema` table)

// Big-endian integers as strings, for keys built by concatenation (coding.hpp).
template <typename U>
std::string be_string(U v, void (*put)(std::string&, U)) {
  std::string s;
  put(s, v);
  return s;
}
std::string be16(std::uint16_t v) { return be_string<std::uint16_t>(v, put_be16); }
std::string be32(std::uint32_t v) { return be_string<std::uint32_t>(v, put_be32); }
std::string be64(std::uint64_t v) { return be_string<std::uint64_t>(v, put_be64); }

std::string mode_key(std::string_view topic) { return "m" + std::string(topic); }
std::string version_prefix(std::string_view topic) { return "v" + std::string(topic) + '\0'; }
std::string version_key(std::string_view topic, std::uint16_t v) { return version_prefix(topic) + be16(v); }
std::string deprecation_prefix(std::string_view topic) { return "d" + std::string(topic) + '\0'; }
std::string contract_prefix(std::string_view topic) { return "c" + std::string(topic) + '\0'; }
std::string usage_prefix(std::string_view topic, std::string_view field) {
  return "u" + std::string(topic) + '\0' + std::string(field) + '\0';
}
constexpr std::string_view kAuditNext = "n";

// Records: ByteWriter / ByteReader (coding.hpp).

Status corrupt(std::string_view what) { return Status(Code::Corruption, "schema registry: bad " + std::string(what) + " record"); }

std::string day_text(std::int64_t ns) {
  if (ns <= 0) return "never";
  const std::time_t t = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof(b), "%Y-%m-%d %H:%M UTC", &tm);
  return b;
}

Status check_topic_name(std::string_view topic) { return check_name(topic, "topic"); }

// ---- the two transaction kinds

class StoreKv final : public SchemaKv {
 public:
  explicit StoreKv(StoreTxn& t) : t_(t) {}
  Result<std::string> get(std::string_view key) override {
    auto r = t_.get(StoreTable::Schema, key);
    if (!r.ok()) return r.status();
    return std::string(*r);
  }
  Status put(std::string_view key, std::string_view value) override { return t_.put(StoreTable::Schema, key, value); }
  Status del(std::string_view key) override { return t_.del(StoreTable::Schema, key); }
  Status scan(std::string_view prefix, std::string_view from,
              const std::function<bool(std::string_view, std::string_view)>& visit) override {
    return t_.scan(StoreTable::Schema, from.empty() ? prefix : from, prefix, visit);
  }

 private:
  StoreTxn& t_;
};

class MemKv final : public SchemaKv {
 public:
  explicit MemKv(std::map<std::string, std::string, std::less<>>& m) : m_(m) {}
  Result<std::string> get(std::string_view key) override {
    auto it = m_.find(key);
    if (it == m_.end()) return Status(Code::NotFound);
    return it->second;
  }
  Status put(std::string_view key, std::string_view value) override {
    m_.insert_or_assign(std::string(key), std::string(value));
    return Status();
  }
  Status del(std::string_view key) override {
    auto it = m_.find(key);
    if (it == m_.end()) return Status(Code::NotFound);
    m_.erase(it);
    return Status();
  }
  Status scan(std::string_view prefix, std::string_view from,
              const std::function<bool(std::string_view, std::string_view)>& visit) override {
    for (auto it = m_.lower_bound(from.empty() ? prefix : from); it != m_.end(); ++it) {
      if (it->first.compare(0, prefix.size(), prefix) != 0) break;
      if (!visit(it->first, it->second)) break;
    }
    return Status();
  }

 private:
  std::map<std::string, std::string, std::less<>>& m_;
};

Result<Contract> decode_contract(std::string_view group, std::string_view v) {
  ByteReader r(v);
  Contract c;
  c.group = std::string(group);
  c.updated_ns = r.i64();
  const std::uint64_t n = r.u64();
  for (std::uint64_t i = 0; i < n && r.ok(); ++i) c.fields.push_back(r.str32());
  if (!r.ok()) return corrupt("contract");
  return c;
}

Result<Deprecation> decode_deprecation(std::string_view field, std::string_view v) {
  ByteReader r(v);
  Deprecation d;
  d.field = std::string(field);
  d.since_ns = r.i64();
  d.window_ns = r.i64();
  d.replacement = r.str32();
  d.who = r.str32();
  d.why = r.str32();
  if (!r.ok()) return corrupt("deprecation");
  return d;
}

Status read_contracts(SchemaKv& kv, std::string_view topic, std::vector<Contract>* out) {
  out->clear();
  const std::string p = contract_prefix(topic);
  Status bad;
  Status s = kv.scan(p, {}, [&](std::string_view k, std::string_view v) {
    auto c = decode_contract(k.substr(p.size()), v);
    if (!c.ok()) {
      bad = c.status();
      return false;
    }
    out->push_back(std::move(*c));
    return true;
  });
  return s.ok() ? bad : s;
}

// Reads of one field (all groups) from day `since_day` on, per group.
struct GroupReads {
  std::uint64_t reads = 0;
  std::int64_t last_ns = 0;
  bool outside = false;
  std::set<std::uint16_t> versions;
};
Status read_usage(SchemaKv& kv, std::string_view topic, std::string_view field, std::uint32_t since_day,
                  std::map<std::string, GroupReads>* out) {
  const std::string p = usage_prefix(topic, field);
  Status bad;
  Status s = kv.scan(p, p + be32(since_day), [&](std::string_view k, std::string_view v) {
    // key: prefix, be32 day, group, '\0', be16 version
    std::string_view rest = k.substr(p.size());
    if (rest.size() < 4 + 1 + 2) {
      bad = corrupt("usage");
      return false;
    }
    const std::string_view group = rest.substr(4, rest.size() - 4 - 3);
    const std::uint16_t version = get_be16(rest.data() + rest.size() - 2);
    ByteReader r(v);
    const std::uint64_t n = r.u64();
    const std::int64_t last = r.i64();
    const std::uint8_t flags = r.u8();
    if (!r.ok()) {
      bad = corrupt("usage");
      return false;
    }
    GroupReads& g = (*out)[std::string(group)];
    g.reads += n;
    g.last_ns = std::max(g.last_ns, last);
    g.outside = g.outside || (flags & 1) != 0;
    g.versions.insert(version);
    return true;
  });
  return s.ok() ? bad : s;
}

}  // namespace

// ---------------------------------------------------------------- basics

SchemaRegistry::SchemaRegistry(BusCore* core, DurableStore* store) : core_(core), store_(store) {}

std::int64_t SchemaRegistry::now() const {
  std::function<std::int64_t()> c;
  {
    MutexLock l(&mu_);
    c = clock_;
  }
  return c ? c() : now_ns();
}

void SchemaRegistry::set_clock(std::function<std::int64_t()> clock) {
  MutexLock l(&mu_);
  clock_ = std::move(clock);
}

Status SchemaRegistry::write(const std::function<Status(SchemaKv&)>& fn) {
  if (store_ != nullptr) {
    return store_->write([&](StoreTxn& t) {
      StoreKv kv(t);
      return fn(kv);
    });
  }
  MutexLock w(&mem_write_mu_);
  // Run against a copy and swap it in on success: a failed call writes nothing.
  std::map<std::string, std::string, std::less<>> copy;
  {
    MutexLock l(&mu_);
    copy = mem_;
  }
  MemKv kv(copy);
  Status s = fn(kv);
  if (!s.ok()) return s;
  MutexLock l(&mu_);
  mem_.swap(copy);
  return s;
}

Status SchemaRegistry::read(const std::function<Status(SchemaKv&)>& fn) {
  if (store_ != nullptr) {
    return store_->read([&](StoreTxn& t) {
      StoreKv kv(t);
      return fn(kv);
    });
  }
  MutexLock w(&mem_write_mu_);
  std::map<std::string, std::string, std::less<>> copy;
  {
    MutexLock l(&mu_);
    copy = mem_;
  }
  MemKv kv(copy);
  return fn(kv);
}

Status SchemaRegistry::load(SchemaKv& kv, std::string_view topic, std::vector<SchemaVersion>* versions,
                            Compatibility* mode) {
  versions->clear();
  *mode = Compatibility::Backward;
  auto m = kv.get(mode_key(topic));
  if (m.ok()) {
    if (m->size() != 1 || static_cast<std::uint8_t>((*m)[0]) > static_cast<std::uint8_t>(Compatibility::None))
      return corrupt("compatibility mode");
    *mode = static_cast<Compatibility>((*m)[0]);
  } else if (m.code() != Code::NotFound) {
    return m.status();
  }
  const std::string p = version_prefix(topic);
  Status bad;
  Status s = kv.scan(p, {}, [&](std::string_view k, std::string_view v) {
    auto sv = SchemaVersion::from_json(v);
    if (!sv.ok() || k.size() != p.size() + 2) {
      bad = Status(Code::Corruption, "schema registry: topic \"" + std::string(topic) + "\": a stored version does not parse");
      return false;
    }
    sv->version_ = get_be16(k.data() + p.size());
    versions->push_back(std::move(*sv));
    return true;
  });
  return s.ok() ? bad : s;
}

Status SchemaRegistry::audit(SchemaKv& kv, std::string_view topic, std::string_view action, std::string_view detail,
                             const ChangeInfo& who) {
  std::uint64_t seq = 1;
  auto n = kv.get(kAuditNext);
  if (n.ok()) {
    if (n->size() != 8) return corrupt("audit counter");
    seq = get_le64(n->data());
  } else if (n.code() != Code::NotFound) {
    return n.status();
  }
  ByteWriter w;
  w.i64(now());
  w.str32(topic);
  w.str32(action);
  w.str32(detail);
  w.str32(who.who);
  w.str32(who.why);
  if (Status s = kv.put("a" + be64(seq), w.bytes()); !s.ok()) return s;
  ByteWriter c;
  c.u64(seq + 1);
  return kv.put(kAuditNext, c.bytes());
}

const SchemaVersion* SchemaRegistry::publish_latest(std::string_view topic, const SchemaVersion& v) {
  const SchemaVersion* p = nullptr;
  {
    MutexLock l(&mu_);
    auto it = latest_.find(topic);
    if (it != latest_.end() && it->second->version() >= v.version()) return it->second;  // not newer
    kept_.push_back(std::make_unique<SchemaVersion>(v));
    p = kept_.back().get();
    latest_.insert_or_assign(std::string(topic), p);
  }
  if (core_ == nullptr) return p;  // the CLI: no bus
  if (TopicImpl* t = core_->find(topic)) t->schema.store(p, std::memory_order_release);
  return p;
}

Status SchemaRegistry::refresh(std::string_view topic) {
  std::vector<SchemaVersion> versions;
  Compatibility mode;
  Status s = read([&](SchemaKv& kv) { return load(kv, topic, &versions, &mode); });
  if (!s.ok()) return s;
  if (!versions.empty()) publish_latest(topic, versions.back());
  return Status();
}

void SchemaRegistry::bind(TopicImpl* t) {
  {
    MutexLock l(&mu_);
    auto it = latest_.find(t->name);
    if (it != latest_.end()) {
      t->schema.store(it->second, std::memory_order_release);
      return;
    }
  }
  (void)refresh(t->name);
}

void SchemaRegistry::refresh_all() noexcept {
  try {
    std::vector<std::string> names;
    Status s = read([&](SchemaKv& kv) {
      names.clear();
      return kv.scan("m", {}, [&](std::string_view k, std::string_view) {
        names.emplace_back(k.substr(1));
        return true;
      });
    });
    if (!s.ok()) return;
    for (const std::string& n : names) (void)refresh(n);
  } catch (...) {
  }
}

// ---------------------------------------------------------------- versions

Status SchemaRegistry::check_in(SchemaKv& kv, std::string_view topic, const std::vector<SchemaVersion>& versions,
                                Compatibility mode, const SchemaVersion& candidate) {
  if (mode != Compatibility::None || !versions.empty()) {
    if (Status s = check_compatibility(mode, versions, candidate); !s.ok())
      return Status(Code::Incompatible, "topic \"" + std::string(topic) + "\": " + std::string(s.message()));
  }
  if (versions.empty()) return Status();
  // Live contracts: a declared field may not be removed or retyped.
  std::vector<Contract> contracts;
  if (Status s = read_contracts(kv, topic, &contracts); !s.ok()) return s;
  const SchemaVersion& latest = versions.back();
  for (const Contract& c : contracts) {
    for (const std::string& f : c.fields) {
      const FieldDef* old = latest.field(f);
      if (old == nullptr) continue;
      const FieldDef* now = candidate.field(f);
      if (now == nullptr)
        return Status(Code::Incompatible, "topic \"" + std::string(topic) + "\": field \"" + f +
                                              "\" is removed, but the contract of group \"" + c.group +
                                              "\" declares it (GroupOptions::reads)");
      if (!readable_as(old->type, now->type) || (now->type == FieldType::List && old->element != now->element))
        return Status(Code::Incompatible, "topic \"" + std::string(topic) + "\": field \"" + f + "\" changes type from " +
                                              to_string(old->type) + " to " + to_string(now->type) +
                                              ", but the contract of group \"" + c.group + "\" declares it");
    }
  }
  return Status();
}

Result<std::uint16_t> SchemaRegistry::register_schema(std::string_view topic, const SchemaVersion& schema,
                                                      const ChangeInfo& who) {
  if (Status s = check_topic_name(topic); !s.ok()) return s;
  std::uint16_t version = 0;
  SchemaVersion stored;
  Status s = write([&](SchemaKv& kv) -> Status {
    version = 0;
    std::vector<SchemaVersion> versions;
    Compatibility mode;
    if (Status ls = load(kv, topic, &versions, &mode); !ls.ok()) return ls;
    if (!versions.empty() && versions.back().same_as(schema)) {
      version = versions.back().version();  // identical: no-op
      stored = versions.back();
      return Status();
    }
    if (versions.size() >= 65535) return Status(Code::Incompatible, "topic \"" + std::string(topic) + "\": 65535 versions");
    if (Status cs = check_in(kv, topic, versions, mode, schema); !cs.ok()) return cs;
    version = static_cast<std::uint16_t>(versions.empty() ? 1 : versions.back().version() + 1);
    stored = schema;
    stored.version_ = version;
    if (Status ps = kv.put(version_key(topic, version), stored.to_json()); !ps.ok()) return ps;
    if (versions.empty()) {
      if (Status ms = kv.put(mode_key(topic), std::string(1, static_cast<char>(mode))); !ms.ok()) return ms;
    }
    return audit(kv, topic, "register", "version " + std::to_string(version), who);
  });
  if (!s.ok()) return s;
  publish_latest(topic, stored);
  return version;
}

Status SchemaRegistry::check(std::string_view topic, const SchemaVersion& schema) {
  if (Status s = check_topic_name(topic); !s.ok()) return s;
  return read([&](SchemaKv& kv) -> Status {
    std::vector<SchemaVersion> versions;
    Compatibility mode;
    if (Status ls = load(kv, topic, &versions, &mode); !ls.ok()) return ls;
    if (!versions.empty() && versions.back().same_as(schema)) return Status();
    return check_in(kv, topic, versions, mode, schema);
  });
}

Status SchemaRegistry::set_compatibility(std::string_view topic, Compatibility mode, const ChangeInfo& who) {
  if (Status s = check_topic_name(topic); !s.ok()) return s;
  return write([&](SchemaKv& kv) -> Status {
    if (Status s = kv.put(mode_key(topic), std::string(1, static_cast<char>(mode))); !s.ok()) return s;
    return audit(kv, topic, "compatibility", to_string(mode), who);
  });
}

Result<Compatibility> SchemaRegistry::compatibility(std::string_view topic) {
  Compatibility mode = Compatibility::Backward;
  Status s = read([&](SchemaKv& kv) {
    std::vector<SchemaVersion> versions;
    return load(kv, topic, &versions, &mode);
  });
  if (!s.ok()) return s;
  return mode;
}

Result<std::vector<SchemaVersion>> SchemaRegistry::history(std::string_view topic) {
  std::vector<SchemaVersion> versions;
  Status s = read([&](SchemaKv& kv) {
    Compatibility mode;
    return load(kv, topic, &versions, &mode);
  });
  if (!s.ok()) return s;
  return versions;
}

Result<SchemaVersion> SchemaRegistry::get(std::string_view topic, std::uint16_t version) {
  auto h = history(topic);
  if (!h.ok()) return h.status();
  if (h->empty()) return Status(Code::NotFound, "topic \"" + std::string(topic) + "\" has no schema");
  if (version == 0) {
    publish_latest(topic, h->back());
    return h->back();
  }
  for (const SchemaVersion& v : *h) {
    if (v.version() == version) return v;
  }
  return Status(Code::NotFound, "topic \"" + std::string(topic) + "\" has no schema version " + std::to_string(version));
}

Result<std::vector<std::string>> SchemaRegistry::topics() {
  std::vector<std::string> names;
  Status s = read([&](SchemaKv& kv) {
    names.clear();
    return kv.scan("m", {}, [&](std::string_view k, std::string_view) {
      names.emplace_back(k.substr(1));
      return true;
    });
  });
  if (!s.ok()) return s;
  return names;
}

// ---------------------------------------------------------------- deprecation and removal

Status SchemaRegistry::deprecate(std::string_view topic, std::string_view field, std::int64_t window_ns,
                                 std::string_view replacement, const ChangeInfo& who) {
  if (Status s = check_topic_name(topic); !s.ok()) return s;
  if (window_ns < 0) return Status(Code::InvalidArgument, "deprecate: the window is negative");
  return write([&](SchemaKv& kv) -> Status {
    std::vector<SchemaVersion> versions;
    Compatibility mode;
    if (Status ls = load(kv, topic, &versions, &mode); !ls.ok()) return ls;
    if (versions.empty()) return Status(Code::NotFound, "deprecate: topic \"" + std::string(topic) + "\" has no schema");
    const SchemaVersion& latest = versions.back();
    if (latest.field(field) == nullptr)
      return Status(Code::NotFound, "deprecate: topic \"" + std::string(topic) + "\" version " +
                                        std::to_string(latest.version()) + " has no field \"" + std::string(field) + "\"");
    if (!replacement.empty() && (latest.field(replacement) == nullptr || replacement == field))
      return Status(Code::NotFound, "deprecate: the replacement \"" + std::string(replacement) +
                                        "\" is not another field of version " + std::to_string(latest.version()) +
                                        " (register it first)");
    ByteWriter w;
    w.i64(now());
    w.i64(window_ns);
    w.str32(replacement);
    w.str32(who.who);
    w.str32(who.why);
    if (Status s = kv.put(deprecation_prefix(topic) + std::string(field), w.bytes()); !s.ok()) return s;
    std::string detail = std::string(field) + " for " + std::to_string(window_ns / kDayNs) + " days";
    if (!replacement.empty()) detail += ", replaced by " + std::string(replacement);
    return audit(kv, topic, "deprecate", detail, who);
  });
}

Result<std::vector<Deprecation>> SchemaRegistry::deprecations(std::string_view topic) {
  std::vector<Deprecation> out;
  Status s = read([&](SchemaKv& kv) {
    out.clear();
    const std::string p = deprecation_prefix(topic);
    Status bad;
    Status ss = kv.scan(p, {}, [&](std::string_view k, std::string_view v) {
      auto d = decode_deprecation(k.substr(p.size()), v);
      if (!d.ok()) {
        bad = d.status();
        return false;
      }
      out.push_back(std::move(*d));
      return true;
    });
    return ss.ok() ? bad : ss;
  });
  if (!s.ok()) return s;
  return out;
}

Result<std::uint16_t> SchemaRegistry::remove(std::string_view topic, std::string_view field, const ChangeInfo& who) {
  if (Status s = check_topic_name(topic); !s.ok()) return s;
  if (Status s = flush_usage(); !s.ok()) return s;  // this process's reads count too
  const std::int64_t t_now = now();
  std::uint16_t version = 0;
  SchemaVersion stored;
  Status s = write([&](SchemaKv& kv) -> Status {
    version = 0;
    std::vector<SchemaVersion> versions;
    Compatibility mode;
    if (Status ls = load(kv, topic, &versions, &mode); !ls.ok()) return ls;
    const std::string head = "remove \"" + std::string(field) + "\" from topic \"" + std::string(topic) + "\": ";
    if (versions.empty() || versions.back().field(field) == nullptr)
      return Status(Code::NotFound, head + "the latest version has no such field");
    auto dv = kv.get(deprecation_prefix(topic) + std::string(field));
    if (!dv.ok()) {
      if (dv.code() != Code::NotFound) return dv.status();
      return Status(Code::Incompatible, head + "refused: the field is not deprecated (deprecate it with a window first)");
    }
    auto dep = decode_deprecation(field, *dv);
    if (!dep.ok()) return dep.status();
    std::vector<std::string> reasons;
    const std::int64_t ends = dep->since_ns + dep->window_ns;
    if (t_now < ends) {
      reasons.push_back("the deprecation window is open until " + day_text(ends) + " (" +
                        std::to_string((ends - t_now + kDayNs - 1) / kDayNs) + " days left)");
    }
    // Audited reads in the audit window: the last kQuietNs, never before the
    // deprecation (Schemas::remove documents the rule).
    const std::int64_t quiet_from = std::max(dep->since_ns, t_now - kQuietNs);
    std::map<std::string, GroupReads> reads;
    if (Status us = read_usage(kv, topic, field, static_cast<std::uint32_t>(std::max<std::int64_t>(0, quiet_from) / kDayNs),
                               &reads);
        !us.ok())
      return us;
    std::string readers;
    for (const auto& [g, r] : reads) {
      if (r.reads == 0 || r.last_ns < quiet_from) continue;
      readers += (readers.empty() ? "" : ", ") + ("group \"" + g + "\" (last read " + day_text(r.last_ns) + ")");
    }
    if (!readers.empty()) reasons.push_back("still read by " + readers);
    std::vector<Contract> contracts;
    if (Status cs = read_contracts(kv, topic, &contracts); !cs.ok()) return cs;
    std::string declared;
    for (const Contract& c : contracts) {
      if (std::find(c.fields.begin(), c.fields.end(), field) == c.fields.end()) continue;
      std::string last = "no audited read";
      if (auto it = reads.find(c.group); it != reads.end()) last = "last read " + day_text(it->second.last_ns);
      declared += (declared.empty() ? "" : ", ") + ("group \"" + c.group + "\" (" + last + ")");
    }
    if (!declared.empty()) reasons.push_back("declared by the contract of " + declared);
    if (!reasons.empty()) {
      std::string msg = head + "refused: ";
      for (std::size_t i = 0; i < reasons.size(); ++i) msg += (i ? "; " : "") + reasons[i];
      return Status(Code::Incompatible, msg);
    }
    SchemaVersion candidate = versions.back();
    auto& fs = candidate.fields_;
    fs.erase(std::remove_if(fs.begin(), fs.end(), [&](const FieldDef& f) { return f.name == field; }), fs.end());
    if (Status cs = check_in(kv, topic, versions, mode, candidate); !cs.ok()) return cs;
    version = static_cast<std::uint16_t>(versions.back().version() + 1);
    stored = candidate;
    stored.version_ = version;
    if (Status ps = kv.put(version_key(topic, version), stored.to_json()); !ps.ok()) return ps;
    if (Status ds = kv.del(deprecation_prefix(topic) + std::string(field)); !ds.ok()) return ds;
    return audit(kv, topic, "remove", std::string(field) + " (version " + std::to_string(version) + ")", who);
  });
  if (!s.ok()) return s;
  publish_latest(topic, stored);
  return version;
}

// ---------------------------------------------------------------- contracts

Status SchemaRegistry::set_contract(std::string_view topic, std::string_view group,
                                    const std::vector<std::string>& fields) {
  ByteWriter w;
  w.i64(now());
  w.u64(fields.size());
  for (const std::string& f : fields) w.str32(f);
  return write([&](SchemaKv& kv) -> Status {
    const std::string key = contract_prefix(topic) + std::string(group);
    auto old = kv.get(key);
    if (old.ok()) {
      auto c = decode_contract(group, *old);
      if (c.ok() && c->fields == fields) return Status();  // unchanged
    }
    return kv.put(key, w.bytes());
  });
}

Status SchemaRegistry::drop_contract(std::string_view topic, std::string_view group, const ChangeInfo& who) {
  return write([&](SchemaKv& kv) -> Status {
    Status s = kv.del(contract_prefix(topic) + std::string(group));
    if (!s.ok()) {
      if (s.code() == Code::NotFound)
        return Status(Code::NotFound, "group \"" + std::string(group) + "\" of topic \"" + std::string(topic) +
                                          "\" has no contract");
      return s;
    }
    return audit(kv, topic, "drop_contract", std::string(group), who);
  });
}

Result<std::vector<Contract>> SchemaRegistry::contracts(std::string_view topic) {
  std::vector<Contract> out;
  Status s = read([&](SchemaKv& kv) { return read_contracts(kv, topic, &out); });
  if (!s.ok()) return s;
  return out;
}

Result<std::vector<DeprecatedField>> SchemaRegistry::deprecated_fields() {
  std::vector<DeprecatedField> out;
  Status s = read([&](SchemaKv& kv) -> Status {
    out.clear();
    std::vector<Deprecation> deps;
    std::vector<std::string> topics;
    Status bad;
    Status ss = kv.scan("d", {}, [&](std::string_view k, std::string_view v) {
      // key: 'd', topic, '\0', field
      const std::size_t nul = k.find('\0');
      if (nul == std::string_view::npos) {
        bad = corrupt("deprecation");
        return false;
      }
      auto d = decode_deprecation(k.substr(nul + 1), v);
      if (!d.ok()) {
        bad = d.status();
        return false;
      }
      topics.emplace_back(k.substr(1, nul - 1));
      deps.push_back(std::move(*d));
      return true;
    });
    if (!ss.ok()) return ss;
    if (!bad.ok()) return bad;
    for (std::size_t i = 0; i < deps.size(); ++i) {
      DeprecatedField f;
      f.topic = topics[i];
      f.field = deps[i].field;
      f.replacement = deps[i].replacement;
      f.since_ns = deps[i].since_ns;
      f.window_ends_ns = deps[i].since_ns + deps[i].window_ns;
      std::map<std::string, GroupReads> reads;
      const auto since_day = static_cast<std::uint32_t>(std::max<std::int64_t>(0, f.since_ns) / kDayNs);
      if (Status us = read_usage(kv, f.topic, f.field, since_day, &reads); !us.ok()) return us;
      std::vector<Contract> contracts;
      if (Status cs = read_contracts(kv, f.topic, &contracts); !cs.ok()) return cs;
      std::map<std::string, DeprecatedFieldReader> by_group;
      for (const auto& [g, r] : reads) {
        DeprecatedFieldReader& e = by_group[g];
        e.group = g;
        e.reads = r.reads;
        e.last_read_ns = r.last_ns;
      }
      for (const Contract& c : contracts) {
        if (std::find(c.fields.begin(), c.fields.end(), f.field) == c.fields.end()) continue;
        DeprecatedFieldReader& e = by_group[c.group];
        e.group = c.group;
        e.contract_declares = true;
      }
      for (auto& [g, e] : by_group) f.readers.push_back(std::move(e));
      out.push_back(std::move(f));
    }
    return Status();
  });
  if (!s.ok()) return s;
  return out;
}

Result<std::vector<SchemaAuditEntry>> SchemaRegistry::audit_log() {
  std::vector<SchemaAuditEntry> out;
  Status s = read([&](SchemaKv& kv) {
    out.clear();
    Status bad;
    Status ss = kv.scan("a", {}, [&](std::string_view, std::string_view v) {
      ByteReader r(v);
      SchemaAuditEntry e;
      e.at_ns = r.i64();
      e.topic = r.str32();
      e.action = r.str32();
      e.detail = r.str32();
      e.who = r.str32();
      e.why = r.str32();
      if (!r.ok()) {
        bad = corrupt("audit");
        return false;
      }
      out.push_back(std::move(e));
      return true;
    });
    return ss.ok() ? bad : ss;
  });
  if (!s.ok()) return s;
  return out;
}

// ---------------------------------------------------------------- usage audit

Result<std::vector<FieldUsage>> SchemaRegistry::usage(std::string_view topic, std::string_view field,
                                                      std::int64_t since_ns) {
  if (Status s = flush_usage(); !s.ok()) return s;
  std::map<std::string, GroupReads> reads;
  std::vector<Contract> contracts;
  Status s = read([&](SchemaKv& kv) {
    reads.clear();
    if (Status us = read_usage(kv, topic, field, static_cast<std::uint32_t>(std::max<std::int64_t>(0, since_ns) / kDayNs),
                               &reads);
        !us.ok())
      return us;
    return read_contracts(kv, topic, &contracts);
  });
  if (!s.ok()) return s;
  std::vector<FieldUsage> out;
  for (auto& [g, r] : reads) {
    FieldUsage u;
    u.group = g;
    u.reads = r.reads;
    u.last_read_ns = r.last_ns;
    u.outside_contract = r.outside;
    u.versions.assign(r.versions.begin(), r.versions.end());
    out.push_back(std::move(u));
  }
  for (const Contract& c : contracts) {
    // Declaring a record ("zone") covers its nested fields ("zone.region").
    const bool declares = std::any_of(c.fields.begin(), c.fields.end(), [&](const std::string& f) {
      return f == field || (field.size() > f.size() && field.compare(0, f.size(), f) == 0 && field[f.size()] == '.');
    });
    if (!declares) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const FieldUsage& u) { return u.group == c.group; });
    if (it == out.end()) {
      FieldUsage u;
      u.group = c.group;
      out.push_back(std::move(u));
      it = out.end() - 1;
    }
    it->in_contract = true;
  }
  return out;
}

Status SchemaRegistry::flush_usage() {
  if (core_ == nullptr) return Status();  // the CLI: no bus, nothing counted here
  MutexLock fl(&flush_mu_);
  struct Delta {
    std::string topic, group;
    std::uint64_t path;  // up to 3 field ids of 16 bits, outermost highest (UsageTap::key_of)
    std::uint16_t version;
    std::uint64_t n, total;
    const void* slot;
  };
  std::vector<Delta> deltas;
  auto* flushed = &flushed_;  // flush_mu_ is held: the lambda runs inside this call
  core_->for_each_usage_tap([&](const TopicImpl& t, const GroupImpl& g, const UsageTap& tap) {
    for (const UsageTap::Slot& s : tap.slots) {
      const std::uint64_t key = s.key.load(std::memory_order_relaxed);
      if (key == 0) continue;
      const std::uint64_t c = s.count.load(std::memory_order_relaxed);
      auto it = flushed->find(&s);
      const std::uint64_t before = it == flushed->end() ? 0 : it->second;
      if (c > before)
        deltas.push_back({t.name, g.name, key & 0xffff'ffff'ffffULL, static_cast<std::uint16_t>(key >> 48), c - before,
                          c, &s});
    }
  });
  if (deltas.empty()) return Status();
  const std::int64_t t_now = now();
  const std::uint32_t day = static_cast<std::uint32_t>(std::max<std::int64_t>(0, t_now) / kDayNs);
  Status s = write([&](SchemaKv& kv) -> Status {
    std::map<std::string, std::vector<SchemaVersion>> schemas;
    std::map<std::string, std::vector<Contract>> contracts;
    for (const Delta& d : deltas) {
      auto sit = schemas.find(d.topic);
      if (sit == schemas.end()) {
        std::vector<SchemaVersion> versions;
        Compatibility mode;
        if (Status ls = load(kv, d.topic, &versions, &mode); !ls.ok()) return ls;
        sit = schemas.emplace(d.topic, std::move(versions)).first;
        if (Status cs = read_contracts(kv, d.topic, &contracts[d.topic]); !cs.ok()) return cs;
      }
      // The field's name ("a", or "a.b" / "a.b.c" for nested reads) in the
      // newest version that knows the whole path.
      std::vector<std::uint32_t> ids;
      for (int shift = 32; shift >= 0; shift -= 16) {
        const auto id = static_cast<std::uint32_t>((d.path >> shift) & 0xffff);
        if (id != 0 || !ids.empty()) ids.push_back(id);
      }
      std::string name;
      for (auto v = sit->second.rbegin(); v != sit->second.rend() && name.empty(); ++v) {
        const std::vector<FieldDef>* level = &v->fields();
        std::string path;
        for (std::uint32_t id : ids) {
          const FieldDef* f = level != nullptr ? detail::find_field(*level, id) : nullptr;
          if (f == nullptr) {
            path.clear();
            break;
          }
          path += (path.empty() ? "" : ".") + f->name;
          level = &f->fields;
        }
        name = path;
      }
      if (name.empty()) {
        for (std::uint32_t id : ids) name += (name.empty() ? "#" : ".#") + std::to_string(id);
      }
      // In the contract: it declares the field or an enclosing record ("a" covers "a.b").
      bool outside = true;
      for (const Contract& c : contracts[d.topic]) {
        if (c.group != d.group) continue;
        outside = std::none_of(c.fields.begin(), c.fields.end(), [&](const std::string& f) {
          return f == name || (name.size() > f.size() && name.compare(0, f.size(), f) == 0 && name[f.size()] == '.');
        });
      }
      const std::string key = usage_prefix(d.topic, name) + be32(day) + d.group + '\0' + be16(d.version);
      std::uint64_t n = d.n;
      std::uint8_t flags = outside ? 1 : 0;
      auto old = kv.get(key);
      if (old.ok()) {
        ByteReader r(*old);
        n += r.u64();
        (void)r.i64();
        flags |= r.u8();
      } else if (old.code() != Code::NotFound) {
        return old.status();
      }
      ByteWriter w;
      w.u64(n);
      w.i64(t_now);
      w.u8(flags);
      if (Status ps = kv.put(key, w.bytes()); !ps.ok()) return ps;
    }
    return Status();
  });
  if (!s.ok()) return s;
  for (const Delta& d : deltas) flushed_[d.slot] = d.total;
  return Status();
}

// ---------------------------------------------------------------- data path

Result<RecordView> SchemaRegistry::view(std::string_view topic, const MessageView& message) noexcept {
  const SchemaVersion* sv = nullptr;
  UsageTap* tap = nullptr;
  GroupLane* gl = tl_running_lane;
  if (gl != nullptr && gl->group->topic->name == topic) {
    sv = gl->group->topic->schema.load(std::memory_order_acquire);
    tap = &gl->usage;
  } else {
    MutexLock l(&mu_);
    auto it = latest_.find(topic);
    if (it != latest_.end()) sv = it->second;
  }
  if (sv == nullptr) return Status::from_literal(Code::NotFound, "view: the topic has no schema in this bus");
  // A message stamped with a schema version was validated at publish (or by
  // the outbox): it is not walked again here. Reads stay bounds-checked, so a
  // record damaged since reads as missing fields, never out of bounds.
  const std::string_view p = message.payload();
  if (message.schema_version() != 0 && !p.empty() && static_cast<std::uint8_t>(p[0]) == kRecordMagic)
    return Access::with_schema(Access::trusted(p), sv, &sv->fields_, tap, message.schema_version());
  auto r = RecordView::parse(p);
  if (!r.ok()) return r;
  return Access::with_schema(*r, sv, &sv->fields_, tap, message.schema_version());
}

Status SchemaRegistry::check_publish(TopicImpl* t, const SchemaVersion* latest, std::string_view payload,
                                     std::uint16_t requested, std::uint16_t* version) noexcept {
  if (requested == 0 || requested == latest->version()) {
    Status s = latest->validate(payload);
    if (s.ok()) {
      *version = latest->version();
      return s;
    }
  }
  // Cold path: another process may have registered a newer version.
  try {
    (void)refresh(t->name);
    latest = t->schema.load(std::memory_order_acquire);
    if (requested != 0 && requested != latest->version())
      return Status(Code::SchemaViolation, "publish to \"" + t->name + "\": the record claims schema version " +
                                               std::to_string(requested) + ", the topic's latest is " +
                                               std::to_string(latest->version()) +
                                               " (publish records of the latest version)");
    Status s = latest->validate(payload);
    if (!s.ok()) return Status(Code::SchemaViolation, "publish to \"" + t->name + "\" (schema version " +
                                                         std::to_string(latest->version()) + "): " +
                                                         std::string(s.message()));
    *version = latest->version();
    return s;
  } catch (...) {
    return Status::from_literal(Code::SchemaViolation, "publish: the record does not match the topic's schema");
  }
}


}  // namespace lanebus::detail

namespace lanebus {

using detail::SchemaRegistry;

void detail::Access::set_schema_clock_for_testing(Bus& bus, std::function<std::int64_t()> clock) {
  core(bus)->schemas()->set_clock(std::move(clock));
}

Result<std::uint16_t> Schemas::register_schema(std::string_view topic, const SchemaVersion& schema,
                                               const ChangeInfo& who) {
  return reg_->register_schema(topic, schema, who);
}
Status Schemas::check(std::string_view topic, const SchemaVersion& schema) const { return reg_->check(topic, schema); }
Status Schemas::set_compatibility(std::string_view topic, Compatibility mode, const ChangeInfo& who) {
  return reg_->set_compatibility(topic, mode, who);
}
Result<Compatibility> Schemas::compatibility(std::string_view topic) const { return reg_->compatibility(topic); }
Result<SchemaVersion> Schemas::latest(std::string_view topic) const { return reg_->get(topic, 0); }
Result<SchemaVersion> Schemas::get(std::string_view topic, std::uint16_t version) const {
  if (version == 0) return Status(Code::InvalidArgument, "schema versions start at 1");
  return reg_->get(topic, version);
}
Result<std::vector<SchemaVersion>> Schemas::versions(std::string_view topic) const { return reg_->history(topic); }
Result<std::vector<std::string>> Schemas::topics() const { return reg_->topics(); }
Status Schemas::deprecate(std::string_view topic, std::string_view field, std::chrono::seconds window,
                          std::string_view replacement, const ChangeInfo& who) {
  return reg_->deprecate(topic, field, std::chrono::duration_cast<std::chrono::nanoseconds>(window).count(),
                         replacement, who);
}
Result<std::vector<Deprecation>> Schemas::deprecations(std::string_view topic) const {
  return reg_->deprecations(topic);
}
Result<std::uint16_t> Schemas::remove(std::string_view topic, std::string_view field, const ChangeInfo& who) {
  return reg_->remove(topic, field, who);
}
Result<std::vector<FieldUsage>> Schemas::usage(std::string_view topic, std::string_view field,
                                               std::int64_t since_ns) const {
  return reg_->usage(topic, field, since_ns);
}
Result<std::vector<Contract>> Schemas::contracts(std::string_view topic) const { return reg_->contracts(topic); }
Status Schemas::drop_contract(std::string_view topic, std::string_view group, const ChangeInfo& who) {
  return reg_->drop_contract(topic, group, who);
}
Result<std::vector<SchemaAuditEntry>> Schemas::audit_log() const { return reg_->audit_log(); }
Result<RecordView> Schemas::view(std::string_view topic, const MessageView& message) const noexcept {
  return reg_->view(topic, message);
}
Status Schemas::flush_usage() { return reg_->flush_usage(); }

}  // namespace lanebus
