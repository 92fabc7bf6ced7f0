#!/usr/bin/env bash
# The one list of Debian packages lanebus needs to build, test and benchmark.
# Used by the README's commands and by .ci/run. Run as root (or with sudo).
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PKGS=(
  g++ meson ninja-build pkg-config cmake      # toolchain; cmake lets Meson find doctest
  libconcurrentqueue-dev                      # moodycamel ConcurrentQueue
  libboost-dev                                # Boost.Intrusive (header-only)
  liblmdb-dev lmdb-utils                      # LMDB (durable layer) and mdb_stat for debugging
  doctest-dev                                 # tests
  libzmq3-dev                                 # bench/inproc baseline: ZeroMQ inproc PUSH/PULL
  libsqlite3-dev                              # bench baselines: SQLite (durable, leases)
  clang                                       # -Wthread-safety build
  libclang-rt-14-dev                          # libFuzzer runtime for scripts/fuzz.sh (clang 14)
  util-linux                                  # unshare / taskset used by some tests
)
if [ "${LANEBUS_SKIP_APT:-0}" != "1" ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
fi
