// lanebus — MIT License.
// real_sync_count(): the fsync/fdatasync/msync(MS_SYNC)/sync_file_range calls
// this process really made, read from the LD_PRELOAD shim in
// tests/support/fsync_counter.cpp. A test that calls it without the shim
// preloaded fails with a message that says how to run it.
#pragma once

#include <dlfcn.h>

#include <doctest/doctest.h>

namespace lanebus::test {

using FsyncCountFn = unsigned long long (*)();

/// The shim's counter function, or nullptr when it is not preloaded.
inline FsyncCountFn fsync_counter() {
  return reinterpret_cast<FsyncCountFn>(dlsym(RTLD_DEFAULT, "lanebus_test_fsync_count"));
}

/// Real sync calls so far. REQUIREs the shim.
inline unsigned long long real_sync_count() {
  static FsyncCountFn fn = fsync_counter();
  const bool preloaded = fn != nullptr;
  REQUIRE_MESSAGE(preloaded,
                  "the fsync counter shim is not preloaded: run through `meson test` (which sets "
                  "LD_PRELOAD=<build>/tests/libfsync_counter.so), or set LD_PRELOAD yourself "
                  "(plus ASAN_OPTIONS=verify_asan_link_order=0 under ASan)");
  return fn();
}

}  // namespace lanebus::test
