// lanebus — MIT License.
// Counts every operator new and malloc-family call in the process while enabled
// (replacements live in alloc_counter.cpp). Not usable under sanitizers, which
// own malloc: tests call skip_if_sanitized() first (exit 77 = SKIP in Meson).
#pragma once

#include <cstdint>

namespace lanebus::test {

void alloc_counting(bool on);
std::uint64_t alloc_count();
/// Sets the count back to zero (the control case, which allocates on purpose).
void alloc_count_reset();
void skip_if_sanitized();
/// True in a sanitized build (nothing is counted). A test file whose other
/// cases must still run there returns from its allocation case on it
/// instead of calling skip_if_sanitized (whose exit would also hide the
/// results of the cases before it).
bool sanitized() noexcept;

}  // namespace lanebus::test
