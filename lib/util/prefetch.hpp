// lanebus — MIT License.
// Prefetch for writing: the line is asked for in the exclusive state.
//
// GCC and Clang compile __builtin_prefetch(p, 1) to a plain prefetcht0 unless
// the target has PRFCHW (-mprfchw; not in the x86-64 baseline we build for):
// the line then arrives shared, and the store that follows pays a second
// round trip between the cores to own it. A slot last read by a worker on
// another core costs that round trip at every publish (doc/performance.md
// "Prefetching for writing"). PREFETCHW has been on every x86-64 CPU since
// 2013 (Intel Broadwell, AMD K8), and the older ones decode its opcode as a
// no-op, so it is emitted directly.
#pragma once

namespace lanebus::detail {

inline void prefetch_for_write(const void* p) noexcept {
#if defined(__x86_64__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1);
#endif
}

}  // namespace lanebus::detail
