// lanebus — MIT License.
// all_groups_acked(bus, n): every group of the bus's first topic has acked n
// messages. An ack is counted after its handler returns, so a test that saw
// its handlers' own counts complete waits for this before it reads the
// counters (the last ack may still be on its way: seen under TSan in CI).
#pragma once

#include <cstdint>

#include "lanebus/bus.hpp"
#include "wait.hpp"

namespace lanebus::test {

inline bool all_groups_acked(const Bus& bus, std::uint64_t n) {
  return wait_until([&] {
    const BusStats now = bus.stats();  // a named object: the loop reads into it
    if (now.topics.empty()) return false;
    for (const auto& g : now.topics.front().groups)
      if (g.total.acked != n) return false;
    return true;
  });
}

}  // namespace lanebus::test
