// lanebus — MIT License.
// `lanebus stat DIR`: topics, lanes, end offsets, groups, committed offsets and
// lag of a durable store, and the in-flight and overdue claims of its queues,
// read through a read-only open (works on a live store).
#include <cstdio>
#include <cstring>
#include <string>

#include "args.hpp"
#include "commands.hpp"
#include "guarded.hpp"
#include "durable_store.hpp"

namespace lanebus::tool {
namespace {

const CommandSpec kSpec{
    "stat",
    "DIR",
    1,
    1,
    {},
    "Prints every durable topic and queue of the store in DIR: lanes with their\n"
    "earliest retained offset, end offset, message count and bytes; every consumer\n"
    "group with its committed offset and lag (messages) per lane, and for queues the\n"
    "messages in flight and, of those, the overdue ones: claims whose deadline has passed,\n"
    "held by a consumer that died with them or by a handler that overran attempt_timeout.\n"
    "A lane with overdue claims is marked 'overdue: stuck or dead consumer'. The counters\n"
    "of the processes using the store (stuck handlers, set-aside messages, latency) are\n"
    "not in the store: the in-process Monitor exports them. Opens the store read-only;\n"
    "safe while another process uses it.\n"};

}  // namespace

static int stat_main(const char* dir);

int cmd_stat(int argc, char** argv) {
  ParsedArgs args;
  std::string error;
  if (parse_options(kSpec, argc, argv, &args, &error) != 0) return usage_error(kSpec, error);
  if (args.help) return print_help(kSpec);
  const std::string& dir = args.operands[0];
  // The reads run in a child: a damaged LMDB page kills it, not the tool.
  return run_guarded("stat", dir, [&] { return stat_main(dir.c_str()); });
}

static int stat_main(const char* dir) {
  StoreOptions o;
  o.directory = dir;
  o.read_only = true;
  auto store = detail::DurableStore::open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "lanebus stat: %s\n", store.status().to_string().c_str());
    return 1;
  }
  auto topics = (*store)->list_topics();
  if (!topics.ok()) {
    std::fprintf(stderr, "lanebus stat: %s\n", topics.status().to_string().c_str());
    return 1;
  }
  std::printf("store %s: %zu topic(s)\n", dir, topics->size());
  for (const detail::TopicRef& t : *topics) {
    std::printf("%s %s lanes=%u retention(age_ms=%lld bytes=%llu count=%llu)\n", t.is_queue ? "queue" : "topic",
                t.name.c_str(), t.lanes, static_cast<long long>(t.retention.max_age.count()),
                static_cast<unsigned long long>(t.retention.max_bytes),
                static_cast<unsigned long long>(t.retention.max_count));
    std::printf("  %-6s %12s %12s %12s %14s\n", "lane", "first", "end", "messages", "bytes");
    std::vector<detail::LaneInfo> lanes;
    for (std::uint32_t lane = 0; lane < t.lanes; ++lane) {
      auto li = (*store)->lane_info(t, lane);
      if (!li.ok()) {
        std::fprintf(stderr, "lanebus stat: %s\n", li.status().to_string().c_str());
        return 1;
      }
      lanes.push_back(*li);
      std::printf("  %-6u %12llu %12llu %12llu %14llu\n", lane, static_cast<unsigned long long>(li->first_offset),
                  static_cast<unsigned long long>(li->end_offset), static_cast<unsigned long long>(li->count),
                  static_cast<unsigned long long>(li->bytes));
    }
    auto groups = (*store)->list_groups(t);
    if (!groups.ok()) {
      std::fprintf(stderr, "lanebus stat: %s\n", groups.status().to_string().c_str());
      return 1;
    }
    for (const detail::GroupRef& g : *groups) {
      auto info = (*store)->group_info(g);
      if (!info.ok()) {
        std::fprintf(stderr, "lanebus stat: %s\n", info.status().to_string().c_str());
        return 1;
      }
      unsigned long long total = 0;
      for (std::uint32_t lane = 0; lane < t.lanes; ++lane) {
        const auto& l = (*info)[lane];
        std::uint64_t from = std::max(l.committed, lanes[lane].first_offset);
        total += lanes[lane].end_offset > from ? lanes[lane].end_offset - from : 0;
      }
      std::printf("  group %s lag=%llu\n", g.name.c_str(), total);
      std::printf("    %-6s %12s %12s %12s%s\n", "lane", "committed", "lag", "skipped",
                  t.is_queue ? "    in_flight      overdue" : "");
      for (std::uint32_t lane = 0; lane < t.lanes; ++lane) {
        const auto& l = (*info)[lane];
        std::uint64_t from = std::max(l.committed, lanes[lane].first_offset);
        std::uint64_t lag = lanes[lane].end_offset > from ? lanes[lane].end_offset - from : 0;
        std::printf("    %-6u %12llu %12llu %12llu", lane, static_cast<unsigned long long>(l.committed),
                    static_cast<unsigned long long>(lag), static_cast<unsigned long long>(l.skipped));
        if (t.is_queue)
          std::printf(" %12llu %12llu", static_cast<unsigned long long>(l.in_flight),
                      static_cast<unsigned long long>(l.overdue));
        std::printf("%s\n", l.overdue > 0 ? "  overdue: stuck or dead consumer" : "");
      }
    }
  }
  return 0;
}

}  // namespace lanebus::tool
