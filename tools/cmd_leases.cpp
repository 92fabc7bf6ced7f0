// lanebus — MIT License.
// `lanebus leases PATH`: list a lease table's entries (name, owner, token, state, time left).
#include <cstdio>
#include <cstring>
#include <string>

#include "args.hpp"
#include "commands.hpp"
#include "lanebus/lease.hpp"

namespace lanebus::tool {
namespace {

const CommandSpec kSpec{
    "leases",
    "PATH",
    1,
    1,
    {{"--epoch-file", "FILE", "the segment's epoch file (default PATH.epoch)"}},
    "Lists every name in the lease table segment at PATH: owner (pid:start_time:nonce),\n"
    "last token, state (held, released, expired) and time left on the table's clock\n"
    "(CLOCK_BOOTTIME). Never creates a segment. Attaching keeps the epoch file\n"
    "at least at the segment's epoch.\n"};

}  // namespace

int cmd_leases(int argc, char** argv) {
  LeaseTableOptions options;
  options.create_if_missing = false;
  // Inspecting never issues tokens; it only re-records the segment's epoch.
  options.allow_volatile_epoch = true;
  ParsedArgs args;
  std::string error;
  if (parse_options(kSpec, argc, argv, &args, &error) != 0) return usage_error(kSpec, error);
  if (args.help) return print_help(kSpec);
  if (const std::string* f = args.get("--epoch-file")) options.epoch_path = *f;
  const std::string& path = args.operands[0];
  auto table = LeaseTable::open(path, options);
  if (!table.ok()) {
    std::fprintf(stderr, "lanebus leases: %s\n", table.status().to_string().c_str());
    return 1;
  }
  auto entries = (*table)->list();
  if (!entries.ok()) {
    std::fprintf(stderr, "lanebus leases: %s\n", entries.status().to_string().c_str());
    return 1;
  }
  std::printf("%-32s %-40s %-20s %-9s %s\n", "NAME", "OWNER", "TOKEN", "STATE", "TIME_LEFT");
  for (const LeaseInfo& e : *entries) {
    const char* state = e.held ? "held" : (e.expires_at_ns == 0 ? "released" : "expired");
    char left[32] = "-";
    if (e.held) {
      std::snprintf(left, sizeof(left), "%.3fs", static_cast<double>(e.time_left().count()) / 1e9);
    }
    std::printf("%-32s %-40s %-20llu %-9s %s\n", e.name.c_str(), e.owner.to_string().c_str(),
                static_cast<unsigned long long>(e.token), state, left);
  }
  std::printf("# %zu names, capacity %u, epoch %llu\n", entries->size(), (*table)->capacity(),
              static_cast<unsigned long long>((*table)->epoch()));
  return 0;
}

}  // namespace lanebus::tool
