// lanebus — MIT License.
// `lanebus verify DIR [--quiet] [--progress N]`: walk every page and record of a
// durable store (lib/ops/verify.hpp) in a child process and report what it found.
#include <cstdio>
#include <cstring>
#include <string>

#include "args.hpp"
#include "commands.hpp"
#include "verify.hpp"

namespace lanebus::tool {
namespace {

void verify_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: lanebus verify DIR [--quiet] [--progress N]\n\n"
               "Reads every page and every record of the durable store in DIR and checks it:\n"
               "every LMDB database (the free list included) and LMDB's page accounting;\n"
               "every message record's CRC-32C and lengths; lane bounds against the log keys,\n"
               "message counts and bytes; topic, group, cursor and in-flight records; DLQ\n"
               "entries, marks and audit records; idempotency records.\n"
               "The walk runs in a child process: a page LMDB cannot read kills the child,\n"
               "and is reported as damage. Safe while another process uses the store (it\n"
               "reads one snapshot).\n"
               "  --quiet       print only problems and the summary\n"
               "  --progress N  a progress line every N records of a database (default 50000)\n"
               "Exit status: 0 intact, 1 damaged (or the store cannot be read), 2 usage error.\n");
}

}  // namespace

int cmd_verify(int argc, char** argv) {
  if (argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    verify_usage(stdout);
    return 0;
  }
  VerifyArgs args;
  std::string error;
  if (parse_verify_args(argc, argv, &args, &error) != 0) {
    std::fprintf(stderr, "lanebus verify: %s\n\n", error.c_str());
    verify_usage(stderr);
    return 2;
  }
  detail::VerifyOptions o;
  o.progress_every = args.progress_every;
  o.progress = [&](std::string_view line) {
    const bool is_problem = line.substr(0, 9) == "problem: ";
    if (args.quiet && !is_problem) return;
    std::fprintf(is_problem ? stdout : stderr, "verify: %.*s\n", static_cast<int>(line.size()), line.data());
  };
  std::fprintf(stderr, "verify: walking %s\n", args.dir.c_str());
  auto report = detail::verify_store_in_child(args.dir, o);
  if (!report.ok()) {
    std::fprintf(stderr, "lanebus verify: %s\n", report.status().to_string().c_str());
    return 1;
  }
  std::printf("verify %s: %s\n", args.dir.c_str(), report->summary().c_str());
  return report->ok() ? 0 : 1;
}

}  // namespace lanebus::tool
