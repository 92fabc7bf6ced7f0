// lanebus — MIT License.
// `lanebus leases PATH`: list a lease table's entries (name, owner, token, state, time left).
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.hpp"
#include "lanebus/lease.hpp"

namespace lanebus::tool {
namespace {

void leases_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: lanebus leases [--epoch-file FILE] PATH\n\n"
               "Lists every name in the lease table segment at PATH: owner (pid:start_time:nonce),\n"
               "last token, state (held, released, expired) and time left on the table's clock\n"
               "(CLOCK_BOOTTIME). Never creates a segment. Attaching keeps the epoch file\n"
               "(default PATH.epoch) at least at the segment's epoch.\n");
}

}  // namespace

int cmd_leases(int argc, char** argv) {
  LeaseTableOptions options;
  options.create_if_missing = false;
  // Inspecting never issues tokens; it only re-records the segment's epoch.
  options.allow_volatile_epoch = true;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      leases_usage(stdout);
      return 0;
    }
    if (std::strcmp(argv[i], "--epoch-file") == 0 && i + 1 < argc) {
      options.epoch_path = argv[++i];
      continue;
    }
    if (argv[i][0] == '-' || !path.empty()) {
      std::fprintf(stderr, "lanebus leases: unexpected argument \"%s\"\n", argv[i]);
      leases_usage(stderr);
      return 2;
    }
    path = argv[i];
  }
  if (path.empty()) {
    leases_usage(stderr);
    return 2;
  }
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
