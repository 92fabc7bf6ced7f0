// lanebus — MIT License.
// `lanebus schema list|show|diff|check|register|deprecate|usage|remove|audit DIR ...`:
// the schema registry of a durable store (issue 12, doc/schemas.md). Reads open
// the store read-only; changes open it read-write (safe alongside a live
// process) and are audited under --operator.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "durable_store.hpp"
#include "lanebus/schema.hpp"
#include "schema_registry.hpp"

namespace lanebus::tool {
namespace {

const CommandSpec kSpec{
    "schema",
    "COMMAND DIR [args]",
    1,
    static_cast<std::size_t>(-1),
    {{"--operator", "NAME", "who (required by register, deprecate and remove; written to the audit log)"},
     {"--why", "TEXT", "why, for the audit log"},
     {"--replacement", "FIELD", "deprecate: the field that replaces the deprecated one"},
     {"--days", "N", "deprecate: the deprecation window; usage: the last N days (default 30)"},
     {"--version", "N", "show: this version (default the latest)"}},
    "commands:\n"
    "  list DIR                          topics with a schema: latest version, mode, deprecations\n"
    "  show DIR TOPIC [--version N]      the version as JSON, deprecations and contracts\n"
    "  diff DIR TOPIC V1 V2              fields added, removed and changed between two versions\n"
    "  check DIR TOPIC FILE              would FILE be accepted as the next version? (registers nothing)\n"
    "  register DIR TOPIC FILE --operator NAME [--why TEXT]\n"
    "  deprecate DIR TOPIC FIELD --days N [--replacement FIELD] --operator NAME [--why TEXT]\n"
    "  usage DIR TOPIC FIELD [--days N]  audited reads per group in the last N days (default 30)\n"
    "  remove DIR TOPIC FIELD --operator NAME [--why TEXT]\n"
    "  audit DIR                         every registration, deprecation and removal: who, when, why\n"
    "FILE is a schema file (JSON, doc/schemas.md); a \"compatibility\" member in it is ignored\n"
    "by check/register. Exit codes: 0 done (check: compatible), 1 failed or refused (the\n"
    "reason is printed), 2 usage error.\n"};

std::string fmt_time(std::int64_t ns) {
  if (ns <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int fail(const Status& s) {
  std::fprintf(stderr, "lanebus schema: %s\n", s.to_string().c_str());
  return 1;
}

struct Opts {
  std::vector<std::string> pos;  // positional arguments after the subcommand
  std::string op, why, replacement;
  std::uint64_t days = 0, version = 0;
  bool has_days = false, has_version = false;
};

// argv[0] is the subcommand; its operands and options follow.
int parse(int argc, char** argv, Opts* o, bool* help, std::string* error) {
  ParsedArgs p;
  if (int rc = parse_options(kSpec, argc, argv, &p, error); rc != 0) return rc;
  *help = p.help;
  o->pos = p.operands;
  if (const std::string* v = p.get("--operator")) o->op = *v;
  if (const std::string* v = p.get("--why")) o->why = *v;
  if (const std::string* v = p.get("--replacement")) o->replacement = *v;
  if (const std::string* v = p.get("--days")) {
    if (!parse_u64(v->c_str(), &o->days)) {
      *error = "bad --days \"" + *v + "\"";
      return 2;
    }
    o->has_days = true;
  }
  if (const std::string* v = p.get("--version")) {
    if (!parse_u64(v->c_str(), &o->version) || o->version == 0 || o->version > 65535) {
      *error = "bad --version \"" + *v + "\" (1 to 65535)";
      return 2;
    }
    o->has_version = true;
  }
  return 0;
}

struct Registry {
  std::unique_ptr<detail::DurableStore> store;
  std::unique_ptr<detail::SchemaRegistry> reg;
};

Result<Registry> open_registry(const std::string& dir, bool writable) {
  StoreOptions so;
  so.directory = dir;
  so.read_only = !writable;
  auto st = detail::DurableStore::open(so);
  if (!st.ok()) return st.status();
  Registry r;
  r.store = std::move(*st);
  r.reg = std::make_unique<detail::SchemaRegistry>(nullptr, r.store.get());
  return r;
}

Result<SchemaVersion> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status(Code::NotFound, "cannot read schema file \"" + path + "\"");
  std::stringstream ss;
  ss << f.rdbuf();
  auto v = SchemaVersion::from_json(ss.str());
  if (!v.ok()) return Status(v.code(), "\"" + path + "\": " + std::string(v.status().message()));
  return v;
}

std::string type_text(const FieldDef& f) {
  std::string t = to_string(f.type);
  if (f.type == FieldType::List) t += std::string("<") + to_string(f.element) + ">";
  return t;
}

void diff_fields(const std::vector<FieldDef>& a, const std::vector<FieldDef>& b, const std::string& prefix, int* n) {
  for (const FieldDef& f : b) {
    const FieldDef* o = nullptr;
    for (const FieldDef& x : a)
      if (x.id == f.id) o = &x;
    if (o == nullptr) {
      std::printf("+ %s%s (id %u, %s%s)\n", prefix.c_str(), f.name.c_str(), f.id, type_text(f).c_str(),
                  f.has_default ? ", default" : ", required");
      ++*n;
      continue;
    }
    if (o->name != f.name || o->type != f.type || o->element != f.element) {
      std::printf("~ %s%s (id %u): %s %s -> %s %s\n", prefix.c_str(), f.name.c_str(), f.id, o->name.c_str(),
                  type_text(*o).c_str(), f.name.c_str(), type_text(f).c_str());
      ++*n;
    } else if (o->has_default != f.has_default) {
      std::printf("~ %s%s (id %u): %s\n", prefix.c_str(), f.name.c_str(), f.id,
                  f.has_default ? "now has a default" : "no longer has a default");
      ++*n;
    }
    if (!f.fields.empty() || !o->fields.empty()) diff_fields(o->fields, f.fields, prefix + f.name + ".", n);
  }
  for (const FieldDef& o : a) {
    bool kept = false;
    for (const FieldDef& x : b)
      if (x.id == o.id) kept = true;
    if (!kept) {
      std::printf("- %s%s (id %u, %s)\n", prefix.c_str(), o.name.c_str(), o.id, type_text(o).c_str());
      ++*n;
    }
  }
}

}  // namespace

int cmd_schema(int argc, char** argv) {
  if (argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    return print_help(kSpec);
  }
  if (argc < 2) return usage_error(kSpec, "needs a COMMAND");
  const std::string cmd = argv[1];
  Opts o;
  bool help = false;
  std::string error;
  if (parse(argc - 1, argv + 1, &o, &help, &error) != 0) return usage_error(kSpec, error);
  if (help) return print_help(kSpec);
  auto need = [&](std::size_t n) {
    if (o.pos.size() == n) return true;
    (void)usage_error(kSpec, "schema " + cmd + " takes " + std::to_string(n) + " operand" + (n == 1 ? "" : "s"));
    return false;
  };
  const bool writes = cmd == "register" || cmd == "deprecate" || cmd == "remove";
  if (writes && o.op.empty()) {
    std::fprintf(stderr, "lanebus schema %s: --operator NAME is required (it goes to the audit log)\n", cmd.c_str());
    return 2;
  }
  const std::string& dir = o.pos[0];
  const ChangeInfo who{o.op, o.why};

  if (cmd == "list") {
    if (!need(1)) return 2;
    auto r = open_registry(dir, false);
    if (!r.ok()) return fail(r.status());
    auto topics = r->reg->topics();
    if (!topics.ok()) return fail(topics.status());
    std::printf("%-32s %7s %-20s %s\n", "TOPIC", "VERSION", "MODE", "DEPRECATED");
    for (const std::string& t : *topics) {
      auto v = r->reg->get(t, 0);
      auto m = r->reg->compatibility(t);
      auto d = r->reg->deprecations(t);
      if (!v.ok() || !m.ok() || !d.ok()) return fail(!v.ok() ? v.status() : !m.ok() ? m.status() : d.status());
      std::string dep;
      for (const Deprecation& x : *d) dep += (dep.empty() ? "" : ",") + x.field;
      std::printf("%-32s %7u %-20s %s\n", t.c_str(), v->version(), to_string(*m), dep.empty() ? "-" : dep.c_str());
    }
    return 0;
  }
  if (cmd == "show") {
    if (!need(2)) return 2;
    auto r = open_registry(dir, false);
    if (!r.ok()) return fail(r.status());
    auto v = r->reg->get(o.pos[1], o.has_version ? static_cast<std::uint16_t>(o.version) : 0);
    if (!v.ok()) return fail(v.status());
    auto m = r->reg->compatibility(o.pos[1]);
    std::printf("topic %s, version %u, compatibility %s\n%s", o.pos[1].c_str(), v->version(),
                m.ok() ? to_string(*m) : "?", v->to_json().c_str());
    auto d = r->reg->deprecations(o.pos[1]);
    if (!d.ok()) return fail(d.status());
    for (const Deprecation& x : *d) {
      std::printf("deprecated %s since %s for %" PRId64 " days%s%s (by %s: %s)\n", x.field.c_str(),
                  fmt_time(x.since_ns).c_str(), x.window_ns / detail::SchemaRegistry::kDayNs,
                  x.replacement.empty() ? "" : ", replaced by ", x.replacement.c_str(), x.who.c_str(), x.why.c_str());
    }
    auto c = r->reg->contracts(o.pos[1]);
    if (!c.ok()) return fail(c.status());
    for (const Contract& x : *c) {
      std::string f;
      for (const std::string& s : x.fields) f += (f.empty() ? "" : ",") + s;
      std::printf("contract %s reads %s (since %s)\n", x.group.c_str(), f.c_str(), fmt_time(x.updated_ns).c_str());
    }
    return 0;
  }
  if (cmd == "diff") {
    if (!need(4)) return 2;
    std::uint64_t a = 0, b = 0;
    if (!parse_u64(o.pos[2].c_str(), &a) || !parse_u64(o.pos[3].c_str(), &b) || a == 0 || b == 0 || a > 65535 ||
        b > 65535) {
      return usage_error(kSpec, "V1 and V2 are versions from 1 to 65535");
    }
    auto r = open_registry(dir, false);
    if (!r.ok()) return fail(r.status());
    auto va = r->reg->get(o.pos[1], static_cast<std::uint16_t>(a));
    auto vb = r->reg->get(o.pos[1], static_cast<std::uint16_t>(b));
    if (!va.ok()) return fail(va.status());
    if (!vb.ok()) return fail(vb.status());
    int n = 0;
    diff_fields(va->fields(), vb->fields(), "", &n);
    if (n == 0) std::printf("no difference\n");
    return 0;
  }
  if (cmd == "check" || cmd == "register") {
    if (!need(3)) return 2;
    auto file = read_file(o.pos[2]);
    if (!file.ok()) return fail(file.status());
    auto r = open_registry(dir, cmd == "register");
    if (!r.ok()) return fail(r.status());
    if (cmd == "check") {
      Status s = r->reg->check(o.pos[1], *file);
      if (!s.ok()) return fail(s);
      std::printf("compatible: \"%s\" would be accepted for topic %s\n", o.pos[2].c_str(), o.pos[1].c_str());
      return 0;
    }
    auto v = r->reg->register_schema(o.pos[1], *file, who);
    if (!v.ok()) return fail(v.status());
    std::printf("topic %s: version %u\n", o.pos[1].c_str(), *v);
    return 0;
  }
  if (cmd == "deprecate") {
    if (!need(3)) return 2;
    if (!o.has_days) {
      std::fprintf(stderr, "lanebus schema deprecate: --days N (the window) is required\n");
      return 2;
    }
    auto r = open_registry(dir, true);
    if (!r.ok()) return fail(r.status());
    Status s = r->reg->deprecate(o.pos[1], o.pos[2], static_cast<std::int64_t>(o.days) * detail::SchemaRegistry::kDayNs,
                                 o.replacement, who);
    if (!s.ok()) return fail(s);
    std::printf("topic %s: %s deprecated for %" PRIu64 " days\n", o.pos[1].c_str(), o.pos[2].c_str(), o.days);
    return 0;
  }
  if (cmd == "usage") {
    if (!need(3)) return 2;
    auto r = open_registry(dir, false);
    if (!r.ok()) return fail(r.status());
    const std::uint64_t days = o.has_days ? o.days : 30;
    const std::int64_t since = r->reg->now() - static_cast<std::int64_t>(days) * detail::SchemaRegistry::kDayNs;
    auto u = r->reg->usage(o.pos[1], o.pos[2], since);
    if (!u.ok()) return fail(u.status());
    std::printf("%-24s %12s %-22s %-9s %s\n", "GROUP", "READS", "LAST READ", "CONTRACT", "VERSIONS");
    for (const FieldUsage& x : *u) {
      std::string vs;
      for (std::uint16_t v : x.versions) vs += (vs.empty() ? "" : ",") + std::to_string(v);
      std::printf("%-24s %12" PRIu64 " %-22s %-9s %s%s\n", x.group.c_str(), x.reads, fmt_time(x.last_read_ns).c_str(),
                  x.in_contract ? "declared" : "-", vs.empty() ? "-" : vs.c_str(),
                  x.outside_contract ? "  OUTSIDE CONTRACT" : "");
    }
    if (u->empty()) std::printf("(no reads in the last %" PRIu64 " days and no contract declares it)\n", days);
    return 0;
  }
  if (cmd == "remove") {
    if (!need(3)) return 2;
    auto r = open_registry(dir, true);
    if (!r.ok()) return fail(r.status());
    auto v = r->reg->remove(o.pos[1], o.pos[2], who);
    if (!v.ok()) return fail(v.status());
    std::printf("topic %s: %s removed, version %u\n", o.pos[1].c_str(), o.pos[2].c_str(), *v);
    return 0;
  }
  if (cmd == "audit") {
    if (!need(1)) return 2;
    auto r = open_registry(dir, false);
    if (!r.ok()) return fail(r.status());
    auto log = r->reg->audit_log();
    if (!log.ok()) return fail(log.status());
    for (const SchemaAuditEntry& e : *log) {
      std::printf("%s %-14s %-24s %s  by %s%s%s\n", fmt_time(e.at_ns).c_str(), e.action.c_str(), e.topic.c_str(),
                  e.detail.c_str(), e.who.empty() ? "-" : e.who.c_str(), e.why.empty() ? "" : ": ", e.why.c_str());
    }
    return 0;
  }
  return usage_error(kSpec, "unknown command \"" + cmd + "\"");
}

}  // namespace lanebus::tool
