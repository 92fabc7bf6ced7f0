// lanebus — MIT License.
// `lanebus namespace move SRC_DIR DST_DIR NAMESPACE`: move a namespace's
// records to another store with the bus closed, resumable if killed
// (lib/features/namespace_move.hpp; manual: doc/tenancy.md "Moving a namespace").
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "args.hpp"
#include "commands.hpp"
#include "namespace_move.hpp"

namespace lanebus::tool {

namespace {

const CommandSpec kMoveSpec{
    "namespace move",
    "SRC_DIR DST_DIR NAMESPACE",
    3,
    3,
    {},
    "Move every record of NAMESPACE (topics, logs, group offsets and claims, DLQ\n"
    "entries, idempotency records, user tables, schemas, usage) from the store in\n"
    "SRC_DIR to the store in DST_DIR (created if needed), verify the copy (counts and\n"
    "checksums per table), then remove it from SRC_DIR. Run it with the bus closed:\n"
    "a store another process has open is refused. Killed at any point, rerun the same\n"
    "command: it finishes the move. Then map the namespace to DST_DIR in BusOptions\n"
    "(doc/tenancy.md). Exit 0 moved (or already moved), 1 failed, 2 usage error.\n"};

// Test hook (tests/namespace_move_test.cpp): LANEBUS_TEST_MOVE_KILL_AT=POINT[:N]
// makes the tool kill itself (SIGKILL, as `kill -9`) at the N-th (default 1st) pass of POINT.
struct KillAt {
  std::string point;
  long nth = 1;
  long seen = 0;
};

}  // namespace

int cmd_namespace(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "move") != 0) {
    if (argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
      return print_help(kMoveSpec);
    }
    return usage_error(kMoveSpec, argc >= 2 ? "unknown subcommand \"" + std::string(argv[1]) + "\""
                                            : std::string("needs a subcommand: move"));
  }
  ParsedArgs args;
  std::string error;
  if (parse_options(kMoveSpec, argc - 1, argv + 1, &args, &error) != 0) return usage_error(kMoveSpec, error);
  if (args.help) return print_help(kMoveSpec);
  detail::NamespaceMoveOptions o;
  o.src_dir = args.operands[0];
  o.dst_dir = args.operands[1];
  o.name = args.operands[2];
  o.progress = [](const std::string& line) { std::fprintf(stderr, "lanebus namespace move: %s\n", line.c_str()); };
  static KillAt kill_at;
  if (const char* k = std::getenv("LANEBUS_TEST_MOVE_KILL_AT"); k != nullptr && *k != '\0') {
    std::string_view spec(k);
    const std::size_t colon = spec.find(':');
    kill_at.point = std::string(spec.substr(0, colon));
    if (colon != std::string_view::npos) kill_at.nth = std::strtol(k + colon + 1, nullptr, 10);
    o.at_point = [](std::string_view p) {
      if (p == kill_at.point && ++kill_at.seen >= kill_at.nth) {
        std::fflush(stderr);
        std::raise(SIGKILL);
      }
    };
  }
  auto r = detail::move_namespace(o);
  if (!r.ok()) {
    std::fprintf(stderr, "lanebus namespace move: %s\n", r.status().to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace lanebus::tool
