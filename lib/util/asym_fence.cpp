// lanebus — MIT License.
// AsymmetricFence (asym_fence.hpp): membarrier registration and the heavy side.
#include "asym_fence.hpp"

#include <cstdlib>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace lanebus::detail {

namespace {
bool register_membarrier() noexcept {
  const long cmds = ::syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (cmds < 0 || (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}
}  // namespace

bool AsymmetricFence::available() noexcept {
  // LANEBUS_NO_MEMBARRIER=1 takes the symmetric path (tests of the fallback).
  static const bool ok = [] {
    const char* off = ::getenv("LANEBUS_NO_MEMBARRIER");
    if (off != nullptr && off[0] == '1') return false;
    return register_membarrier();
  }();
  return ok;
}

void AsymmetricFence::heavy() noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!available() || ::syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0)
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace lanebus::detail
