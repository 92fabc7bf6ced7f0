// lanebus — MIT License.
// Opening a DurableStore in a test: small map sizes (map growth is exercised
// early) and a short maintenance interval; a store that does not open fails
// the test with its status.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>

#include "durable_store.hpp"

namespace lanebus::test {

inline StoreOptions store_options_for(const std::string& dir) {
  StoreOptions o;
  o.directory = dir;
  o.map_size_initial = 4ull << 20;
  o.map_size_max = 256ull << 20;
  o.maintenance_interval = std::chrono::milliseconds(50);
  return o;
}

inline std::unique_ptr<detail::DurableStore> must_open_store(const StoreOptions& o) {
  auto s = detail::DurableStore::open(o);
  INFO(s.status().to_string());
  REQUIRE(s.ok());
  return std::move(*s);
}

}  // namespace lanebus::test
