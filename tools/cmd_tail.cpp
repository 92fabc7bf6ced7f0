// lanebus — MIT License.
// `lanebus tail DIR TOPIC [--from ...] [--lane N] [--count N]`: print messages of a
// durable topic or queue, read through a read-only open (works on a live store).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "args.hpp"
#include "commands.hpp"
#include "guarded.hpp"
#include "text.hpp"
#include "durable_store.hpp"

namespace lanebus::tool {

static int tail_main(const TailArgs& args);

int cmd_tail(int argc, char** argv) {
  if (argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    return print_help(tail_spec());
  }
  TailArgs args;
  std::string error;
  if (parse_tail_args(argc, argv, &args, &error) != 0) return usage_error(tail_spec(), error);
  // The reads run in a child: a damaged LMDB page kills it, not the tool.
  return run_guarded("tail", args.dir, [&] { return tail_main(args); });
}

static int tail_main(const TailArgs& args) {
  const StartPosition from = args.from;
  const long long only_lane = args.only_lane;
  const std::uint64_t count = args.count;
  StoreOptions o;
  o.directory = args.dir;
  o.read_only = true;
  auto store = detail::DurableStore::open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "lanebus tail: %s\n", store.status().to_string().c_str());
    return 1;
  }
  auto t = (*store)->find_topic(args.topic);
  if (t.code() == Code::NotFound) {
    // A damaged catalogue (an invalid topic name) says so instead of NotFound.
    if (auto all = (*store)->list_topics(); !all.ok()) t = all.status();
  }
  if (!t.ok()) {
    std::fprintf(stderr, "lanebus tail: %s\n", t.status().to_string().c_str());
    return 1;
  }
  if (only_lane >= static_cast<long long>(t->lanes)) {
    std::fprintf(stderr, "lanebus tail: --lane %lld out of range (topic has %u lanes)\n", only_lane, t->lanes);
    return 2;
  }
  for (std::uint32_t lane = 0; lane < t->lanes; ++lane) {
    if (only_lane >= 0 && lane != static_cast<std::uint32_t>(only_lane)) continue;
    auto li = (*store)->lane_info(*t, lane);
    if (!li.ok()) {
      std::fprintf(stderr, "lanebus tail: %s\n", li.status().to_string().c_str());
      return 1;
    }
    std::uint64_t pos = li->first_offset;
    switch (from.from) {
      case StartFrom::Earliest: break;
      case StartFrom::Latest: pos = li->end_offset; break;
      case StartFrom::Offset: pos = from.offset; break;
      case StartFrom::Timestamp: {
        auto o2 = (*store)->offset_for_time(*t, lane, from.timestamp_ns);
        if (!o2.ok()) {
          std::fprintf(stderr, "lanebus tail: %s\n", o2.status().to_string().c_str());
          return 1;
        }
        pos = *o2;
        break;
      }
    }
    std::uint64_t printed = 0;
    while (count == 0 || printed < count) {
      detail::ReadLimits lim;
      if (count != 0) lim.max_messages = static_cast<std::uint32_t>(std::min<std::uint64_t>(count - printed, 256));
      auto b = (*store)->read(*t, lane, pos, lim);
      if (!b.ok()) {
        std::fprintf(stderr, "lanebus tail: %s\n", b.status().to_string().c_str());
        return 1;
      }
      if (b->messages.empty()) break;
      for (const auto& m : b->messages) {
        // Headers last, only when the message has some: `headers={name="value" ...}`.
        const std::string headers = m.headers.empty() ? std::string() : " headers={" + headers_text(m.headers) + "}";
        std::printf("lane=%u offset=%llu id=%llu created_at=%lld attempt=%u key=\"%s\" payload=\"%s\"%s\n", lane,
                    static_cast<unsigned long long>(m.offset), static_cast<unsigned long long>(m.header.id),
                    static_cast<long long>(m.header.created_at_ns), m.header.attempt, escape(m.key).c_str(),
                    escape(m.payload).c_str(), headers.c_str());
      }
      printed += b->messages.size();
      pos = b->next_offset;
    }
  }
  return 0;
}

}  // namespace lanebus::tool
