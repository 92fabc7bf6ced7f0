// lanebus — MIT License.
// wait_until(pred, timeout): tests wait on conditions, never on sleeps.
#pragma once

#include <chrono>
#include <thread>

namespace lanebus::test {

template <typename Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace lanebus::test
