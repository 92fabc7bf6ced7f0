// lanebus — MIT License.
// TopicImpl::acquire_room: the topic's backpressure (Block / FailFast /
// DropOldest) around any resource publish needs — a message slot
// (acquire_slot, publish.cpp) or a payload block (acquire_block,
// large_payload.cpp).
#pragma once

#include <chrono>
#include <thread>

#include "bus_impl.hpp"

namespace lanebus::detail {

/// `take()` returns the resource or `none`; DropOldest drops queued messages
/// (freeing their slots and blocks) and takes again.
template <typename Take, typename T>
T TopicImpl::acquire_room(std::uint32_t lane, bool may_block, Take take, T none) noexcept {
  T s = take();
  if (s != none) return s;
  switch (options.backpressure) {
    case Backpressure::FailFast:
      return none;
    case Backpressure::DropOldest: {
      // A drop frees a slot (and its block) unless another group or a worker still holds the
      // message; keep dropping (bounded by the pool size) until one is free.
      for (std::uint32_t tries = 0; tries <= capacity; ++tries) {
        if (!drop_oldest(lane)) break;
        if ((s = take()) != none) return s;
      }
      if ((s = take()) != none) return s;
      if (!may_block) return none;
      [[fallthrough]];
    }
    case Backpressure::Block: {
      if (!may_block) return none;
      // Workers free slots in batches within microseconds: spin, then yield,
      // then sleep in short steps until the deadline. The deadline is taken
      // when the spinning ends, not on entry: a clock read costs 80-100 ns on
      // a VM (perf: a third of a blocked publisher's time), more than the
      // spin usually lasts; block_timeout is then late by the spin (< 50 µs).
      std::chrono::steady_clock::time_point deadline{};
      for (std::uint32_t spin = 0;; ++spin) {
        if ((s = take()) != none) return s;
        if (bus->closing()) return none;
        if (spin < 256) {
          cpu_relax();
        } else if (spin < 2048) {
          if (spin == 256) deadline = std::chrono::steady_clock::now() + options.block_timeout;
          std::this_thread::yield();
        } else {
          if (std::chrono::steady_clock::now() >= deadline) return none;
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
    }
  }
  return none;
}

}  // namespace lanebus::detail
