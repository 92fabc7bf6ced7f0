// lanebus — MIT License.
// The lanebus command-line tool: `lanebus <command> ...`. Adding a command = one line in
// kCommands plus its function in tools/commands.hpp.
#include <cstdio>
#include <cstring>

#include "commands.hpp"
#include "lanebus/version.hpp"

namespace {

struct Command {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* summary;
};

constexpr Command kCommands[] = {
#ifdef LANEBUS_HAVE_BRIDGE
    {"bridge", lanebus::tool::cmd_bridge, "mirror durable topics to and from NATS JetStream (standalone process)"},
#endif
    {"dlq", lanebus::tool::cmd_dlq, "review the dead-letter queue: list, show, replay, archive, purge, audit"},
    {"leases", lanebus::tool::cmd_leases, "list the leases of a lease table (name, owner, token, time left)"},
    {"namespace", lanebus::tool::cmd_namespace, "move a namespace to a store of its own (bus closed; resumable)"},
    {"resume", lanebus::tool::cmd_resume, "end a durable consumer group's outage pause (the live process obeys)"},
    {"schema", lanebus::tool::cmd_schema, "schema registry: list, show, diff, check, deprecate, usage, remove"},
    {"serve", lanebus::tool::cmd_serve, "serve a store's /metrics, /stats.json, /healthz and dashboard over HTTP"},
    {"stats", lanebus::tool::cmd_stats, "lag, oldest unprocessed age, rates and drain time of a live store (--watch)"},
    {"stat", lanebus::tool::cmd_stat, "topics, lanes, end offsets, groups, committed offsets and lag of a store"},
    {"usage", lanebus::tool::cmd_usage, "per-namespace usage (msgs/bytes in and out, throttled, refused) by time"},
    {"tail", lanebus::tool::cmd_tail, "print the messages of a durable topic or queue"},
    {"verify", lanebus::tool::cmd_verify, "check every page and record of a store; exit 1 on damage"},
};

void usage(std::FILE* out) {
  std::fprintf(out, "usage: lanebus <command> [args...]\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out, "\n`lanebus <command> --help` describes a command.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::printf("lanebus %s\n", LANEBUS_VERSION_STRING);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "lanebus: unknown command \"%s\"\n\n", argv[1]);
  usage(stderr);
  return 2;
}
