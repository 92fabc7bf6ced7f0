// lanebus — MIT License.
// ScratchDir (a fresh directory under /tmp, removed afterwards, as a
// std::filesystem::path) and store_bus() (BusOptions with a store in it) for
// the tests that open a Bus on a durable store.
#pragma once

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "lanebus/options.hpp"

namespace lanebus::test {

struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    std::string tmpl = "/tmp/lanebus-test-XXXXXX";
    path = ::mkdtemp(tmpl.data());
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

/// Two workers, the store in DIR/store, a fast poller.
inline BusOptions store_bus(const std::filesystem::path& dir,
                            std::chrono::milliseconds poll = std::chrono::milliseconds(10)) {
  BusOptions o;
  o.workers = 2;
  o.store.directory = (dir / "store").string();
  o.durable_poll = poll;
  return o;
}

}  // namespace lanebus::test
