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
int cmd_verify(int argc, char** argv) {
  if (argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    return print_help(verify_spec());
  }
  VerifyArgs args;
  std::string error;
  if (parse_verify_args(argc, argv, &args, &error) != 0) return usage_error(verify_spec(), error);
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
