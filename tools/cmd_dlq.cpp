// lanebus — MIT License.
// `lanebus dlq list|show|replay|archive|purge|audit|stats DIR ...`: review the
// dead-letter queue of a durable store. Reads open the store
// read-only; mutations open it read-write (alongside a live process) and are
// audited under the --operator name.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "dlq.hpp"
#include "durable_store.hpp"
#include "text.hpp"

namespace lanebus::tool {
namespace {

const CommandSpec kSpec{
    "dlq",
    "list|show|replay|archive|purge|audit|stats DIR [IDS...]",
    2,
    static_cast<std::size_t>(-1),
    {{"--operator", "NAME", "who does it (required by replay, archive and purge; written to the audit log)"},
     {"--topic", "T", "filter: entries of topic T"},
     {"--group", "G", "filter: entries of group G"},
     {"--class", "CLASS", "filter: transient, permanent or poison"},
     {"--state", "STATE", "filter: pending, replayed or archived"},
     {"--older-than", "AGE", "filter: dead longer ago than AGE (a number with ms, s, m, h or d: 10m, 1h)"},
     {"--newer-than", "AGE", "filter: dead more recently than AGE"},
     {"--limit", "N", "list: at most N entries"}},
    "subcommands:\n"
    "  list DIR [filters] [--limit N]   entries: id class state topic lane offset group attempts age reason\n"
    "  show DIR ID...                   every field of the entries, payload escaped\n"
    "  replay DIR --operator NAME (IDS... | filters)\n"
    "                                   append each original message to its origin topic again\n"
    "                                   (same key and idempotency key) and mark it replayed\n"
    "  archive DIR --operator NAME (IDS... | filters)   set entries aside (never replayed)\n"
    "  purge DIR --operator NAME (IDS... | filters)     delete entries\n"
    "  audit DIR                        who replayed / archived / purged / expired what, when\n"
    "  stats DIR                        depth, oldest pending age, arrivals per class, totals\n"
    "A batch is all-or-nothing: one unknown id, or one entry in the wrong state, changes nothing.\n"
    "Reads open the store read-only; replay/archive/purge open it read-write (safe while\n"
    "the owning process runs) and record an audit entry naming --operator.\n"
    "Exit codes: 0 done, 1 failed (the error is printed), 2 usage error.\n"};

bool parse_age(std::string_view s, std::chrono::milliseconds* out) {
  std::size_t i = 0;
  std::uint64_t v = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    if (v > 1'000'000'000'000ull) return false;
    v = v * 10 + static_cast<std::uint64_t>(s[i] - '0');
    ++i;
  }
  if (i == 0) return false;
  std::string_view unit = s.substr(i);
  std::uint64_t mult = 0;
  if (unit == "ms") mult = 1;
  else if (unit == "s") mult = 1000;
  else if (unit == "m") mult = 60'000;
  else if (unit == "h") mult = 3'600'000;
  else if (unit == "d") mult = 86'400'000;
  else return false;
  *out = std::chrono::milliseconds(static_cast<std::int64_t>(v * mult));
  return true;
}

std::string fmt_time(std::int64_t ns) {
  if (ns == 0) return "-";
  std::time_t t = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>((ns / 1'000'000) % 1000));
  return buf;
}

std::string fmt_age(std::int64_t ns) {
  if (ns < 0) ns = 0;
  std::int64_t s = ns / 1'000'000'000;
  char buf[32];
  if (s < 120) std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  else if (s < 7200) std::snprintf(buf, sizeof buf, "%lldm", static_cast<long long>(s / 60));
  else if (s < 172800) std::snprintf(buf, sizeof buf, "%lldh", static_cast<long long>(s / 3600));
  else std::snprintf(buf, sizeof buf, "%lldd", static_cast<long long>(s / 86400));
  return buf;
}

std::int64_t wall_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int fail(const char* sub, const Status& s) {
  std::fprintf(stderr, "lanebus dlq %s: %s\n", sub, s.to_string().c_str());
  return 1;
}

// Opens DIR. A mutation first proves DIR is a lanebus store with a read-only
// open (which creates nothing), so a wrong directory never becomes a new store.
Result<std::unique_ptr<detail::DurableStore>> open_store(const std::string& dir, bool write) {
  StoreOptions o;
  o.directory = dir;
  o.read_only = true;
  auto ro = detail::DurableStore::open(o);
  if (!ro.ok() || !write) return ro;
  (void)(*ro)->close();
  ro->reset();
  o.read_only = false;
  o.durability = Durability::Sync;
  return detail::DurableStore::open(o);
}

void print_entry_line(const DlqEntry& e, std::int64_t now) {
  std::printf("%-6" PRIu64 " %-9s %-8s %-20s %4u %8" PRIu64 " %-16s %3u %6s %s\n", e.id, to_string(e.error_class),
              to_string(e.state), e.topic.c_str(), e.lane, e.offset, e.group.c_str(), e.attempts,
              fmt_age(now - e.dead_at_ns).c_str(), escape(e.reason).c_str());
}

void print_entry(const DlqEntry& e) {
  std::printf("entry %" PRIu64 "\n", e.id);
  std::printf("  state            %s", to_string(e.state));
  if (e.state != DlqState::Pending) {
    std::printf(" (by %s at %s)", e.state_changed_by.c_str(), fmt_time(e.state_changed_at_ns).c_str());
  }
  std::printf("\n");
  if (e.state == DlqState::Replayed && e.topic_id != 0) {
    std::printf("  replayed to      lane %u offset %" PRIu64 "\n", e.lane, e.replay_offset);
  }
  std::printf("  class            %s\n", to_string(e.error_class));
  std::printf("  reason           \"%s\"\n", escape(e.reason).c_str());
  std::printf("  error            \"%s\"\n", escape(e.error_text).c_str());
  std::printf("  attempts         %u\n", e.attempts);
  std::printf("  first failure    %s\n", fmt_time(e.first_failure_ns).c_str());
  std::printf("  last failure     %s\n", fmt_time(e.last_failure_ns).c_str());
  std::printf("  dead-lettered    %s\n", fmt_time(e.dead_at_ns).c_str());
  std::printf("  origin           topic %s%s lane %u offset %" PRIu64 " group %s\n", e.topic.c_str(),
              e.topic_id == 0 ? " (ephemeral)" : "", e.lane, e.offset, e.group.c_str());
  std::printf("  message id       %" PRIu64 "\n", e.header.id);
  std::printf("  created          %s\n", fmt_time(e.header.created_at_ns).c_str());
  std::printf("  correlation id   %" PRIu64 "\n", e.header.correlation_id);
  std::printf("  fencing token    %" PRIu64 "\n", e.header.fencing_token);
  std::printf("  header attempt   %u\n", e.header.attempt);
  std::printf("  content type     %u\n", e.header.content_type);
  std::printf("  schema version   %u\n", e.header.schema_version);
  std::printf("  key              \"%s\"\n", escape(e.key).c_str());
  std::printf("  idempotency key  \"%s\"\n", escape(e.idempotency_key).c_str());
  std::printf("  payload          %zu bytes \"%s\"\n", e.payload.size(), escape(e.payload).c_str());
  std::printf("  headers          %s\n", e.headers.empty() ? "none" : headers_text(e.headers).c_str());
}

std::string join_ids(const std::vector<std::uint64_t>& ids) {
  std::string s;
  for (std::uint64_t id : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(id);
  }
  return s;
}

}  // namespace

int cmd_dlq(int argc, char** argv) {
  ParsedArgs args;
  std::string error;
  if (parse_options(kSpec, argc, argv, &args, &error) != 0) return usage_error(kSpec, error);
  if (args.help) return print_help(kSpec);
  const std::string sub = args.operands[0];
  const bool mutation = sub == "replay" || sub == "archive" || sub == "purge";
  if (!mutation && sub != "list" && sub != "show" && sub != "audit" && sub != "stats") {
    return usage_error(kSpec, "unknown subcommand \"" + sub + "\"");
  }
  const std::string dir = args.operands[1];
  DlqFilter filter;
  bool any_filter = false;
  std::string op;
  std::vector<std::uint64_t> ids;
  for (const auto& [a, value] : args.options) {
    const char* v = value.c_str();
    if (a == "--operator") {
      op = value;
      continue;
    }
    if (a == "--limit") {
      std::uint64_t n = 0;
      if (!parse_u64(v, &n) || n > UINT32_MAX) {
        std::fprintf(stderr, "lanebus dlq %s: bad --limit \"%s\"\n", sub.c_str(), v);
        return 2;
      }
      filter.limit = static_cast<std::uint32_t>(n);
      continue;
    }
    any_filter = true;
    if (a == "--topic") filter.topic = value;
    if (a == "--group") filter.group = value;
    if (a == "--class") {
      filter.error_class = parse_error_class(v);
      if (!filter.error_class) {
        std::fprintf(stderr, "lanebus dlq %s: --class must be transient, permanent or poison, not \"%s\"\n",
                     sub.c_str(), v);
        return 2;
      }
    }
    if (a == "--state") {
      filter.state = parse_dlq_state(v);
      if (!filter.state) {
        std::fprintf(stderr, "lanebus dlq %s: --state must be pending, replayed or archived, not \"%s\"\n",
                     sub.c_str(), v);
        return 2;
      }
    }
    if (a == "--older-than" || a == "--newer-than") {
      std::chrono::milliseconds age{};
      if (!parse_age(value, &age)) {
        std::fprintf(stderr, "lanebus dlq %s: bad age \"%s\" (use e.g. 500ms, 30s, 10m, 1h, 2d)\n", sub.c_str(), v);
        return 2;
      }
      (a == "--older-than" ? filter.older_than : filter.newer_than) = age;
    }
  }
  for (std::size_t k = 2; k < args.operands.size(); ++k) {
    std::uint64_t id = 0;
    if (!parse_u64(args.operands[k].c_str(), &id) || id == 0) {
      std::fprintf(stderr, "lanebus dlq %s: \"%s\" is not an entry id\n", sub.c_str(), args.operands[k].c_str());
      return 2;
    }
    ids.push_back(id);
  }
  if (mutation) {
    if (op.empty()) {
      std::fprintf(stderr, "lanebus dlq %s: --operator NAME is required (it is written to the audit log)\n",
                   sub.c_str());
      return 2;
    }
    if (ids.empty() == !any_filter) {
      std::fprintf(stderr, "lanebus dlq %s: give entry ids or filters (exactly one of them)\n", sub.c_str());
      return 2;
    }
  }
  if (sub == "show" && ids.empty()) {
    std::fprintf(stderr, "lanebus dlq show: give at least one entry id\n");
    return 2;
  }

  auto store = open_store(dir, mutation);
  if (!store.ok()) return fail(sub.c_str(), store.status());
  detail::DlqStore dlq(**store);
  const std::int64_t now = wall_now_ns();

  if (sub == "list") {
    auto entries = dlq.list(filter);
    if (!entries.ok()) return fail("list", entries.status());
    std::printf("%-6s %-9s %-8s %-20s %4s %8s %-16s %3s %6s %s\n", "id", "class", "state", "topic", "lane", "offset",
                "group", "att", "age", "reason");
    for (const DlqEntry& e : *entries) print_entry_line(e, now);
    std::printf("%zu entr%s\n", entries->size(), entries->size() == 1 ? "y" : "ies");
    return 0;
  }
  if (sub == "show") {
    for (std::uint64_t id : ids) {
      auto e = dlq.show(id);
      if (!e.ok()) return fail("show", e.status());
      print_entry(*e);
    }
    return 0;
  }
  if (sub == "audit") {
    auto records = dlq.audit();
    if (!records.ok()) return fail("audit", records.status());
    std::printf("%-6s %-24s %-12s %-16s %s\n", "seq", "when", "action", "operator", "entries");
    for (const DlqAuditRecord& r : *records) {
      std::printf("%-6" PRIu64 " %-24s %-12s %-16s %s\n", r.seq, fmt_time(r.at_ns).c_str(), to_string(r.action),
                  r.operator_name.c_str(), join_ids(r.ids).c_str());
    }
    std::printf("%zu record%s\n", records->size(), records->size() == 1 ? "" : "s");
    return 0;
  }
  if (sub == "stats") {
    auto c = dlq.counters();
    if (!c.ok()) return fail("stats", c.status());
    std::printf("pending=%" PRIu64 " replayed=%" PRIu64 " archived=%" PRIu64 " entries=%" PRIu64 " bytes=%" PRIu64
                "\n",
                c->pending, c->replayed, c->archived, c->entries, c->bytes);
    std::printf("oldest_pending_age_s=%.3f\n", static_cast<double>(c->oldest_pending_age_ns) / 1e9);
    std::printf("arrivals transient=%" PRIu64 " permanent=%" PRIu64 " poison=%" PRIu64 " expired=%" PRIu64 "\n",
                c->arrivals[0], c->arrivals[1], c->arrivals[2], c->arrivals[3]);
    std::printf("replays=%" PRIu64 " auto_replays=%" PRIu64 " purged=%" PRIu64 " expired=%" PRIu64
                " dropped=%" PRIu64 "\n",
                c->replays, c->auto_replays, c->purged, c->expired, c->dropped);
    return 0;
  }

  // Mutations. Filters select ids first; the batch then succeeds or fails as a whole.
  if (ids.empty()) {
    filter.limit = 0;
    if (sub == "purge") {
      auto n = dlq.purge(filter, op);
      if (!n.ok()) return fail("purge", n.status());
      std::printf("purged %" PRIu64 " entr%s\n", *n, *n == 1 ? "y" : "ies");
      return 0;
    }
    auto entries = dlq.list(filter);
    if (!entries.ok()) return fail(sub.c_str(), entries.status());
    for (const DlqEntry& e : *entries) ids.push_back(e.id);
    if (ids.empty()) {
      std::printf("no entries match; nothing %s\n", sub == "replay" ? "replayed" : "archived");
      return 0;
    }
  }
  if (sub == "replay") {
    auto r = dlq.replay(ids, op);
    if (!r.ok()) return fail("replay", r.status());
    for (const detail::DlqReplayed& x : *r) {
      std::printf("replayed entry %" PRIu64 " -> topic %s lane %u offset %" PRIu64 "\n", x.id, x.topic.c_str(), x.lane,
                  x.offset);
    }
    return 0;
  }
  if (sub == "archive") {
    Status s = dlq.archive(ids, op);
    if (!s.ok()) return fail("archive", s);
    std::printf("archived %zu entr%s: %s\n", ids.size(), ids.size() == 1 ? "y" : "ies", join_ids(ids).c_str());
    return 0;
  }
  auto n = dlq.purge(ids, op);
  if (!n.ok()) return fail("purge", n.status());
  std::printf("purged %" PRIu64 " entr%s\n", *n, *n == 1 ? "y" : "ies");
  return 0;
}

}  // namespace lanebus::tool
