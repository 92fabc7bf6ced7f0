// lanebus — MIT License.
// fuzz/scratch_dir.hpp: the private tmpfs directory a file-writing fuzz target
// works in (fsync is free on tmpfs), removed at exit (libFuzzer ends with
// exit(); a verify child leaves with _exit and removes nothing).
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace lanebus::fuzz {

/// "/dev/shm/lanebus-fuzz-<name>-XXXXXX", made on first call. `name` must be
/// the same on every call of one target (the first one wins).
inline const std::string& scratch_dir(const char* name) {
  static std::string path;
  static const std::string dir = [name] {
    std::string tmpl = std::string("/dev/shm/lanebus-fuzz-") + name + "-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    path = tmpl;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    });
    return tmpl;
  }();
  return dir;
}

}  // namespace lanebus::fuzz
