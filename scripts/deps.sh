#!/usr/bin/env bash
# The one list of Debian packages lanebus needs to build, test and benchmark.
# Used by the README's commands and by .ci/run. Run as root (or with sudo).
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PKGS=(
  g++ meson ninja-build pkg-config cmake      # toolchain; cmake: Meson finds doctest with it, the CMake package (consumer check)
  libconcurrentqueue-dev                      # moodycamel ConcurrentQueue
  libboost-dev                                # Boost.Intrusive (header-only)
  liblmdb-dev lmdb-utils                      # LMDB (durable layer) and mdb_stat for debugging
  doctest-dev                                 # tests
  libzmq3-dev                                 # bench/inproc baseline: ZeroMQ inproc PUSH/PULL
  libsqlite3-dev                              # bench baselines: SQLite (durable, leases)
  clang                                       # -Wthread-safety build
  libclang-rt-14-dev                          # libFuzzer runtime for scripts/fuzz.sh (clang 14)
  util-linux                                  # unshare / taskset used by some tests
  libnats-dev nats-server                     # bridge to NATS JetStream (nats.c 3.4, server 2.9); its tests
  chromium                                    # dashboard browser test (tests/browser, playwright-core)
  python3-matplotlib                          # scripts/bench_plot.py
  libssl-dev                                  # libcrypto: PBKDF2 hashes of credential secrets (doc/tenancy.md)
  pybind11-dev python3-dev python3-pytest     # the Python binding (python/, for /usr/bin/python3) and its pytest suite
  prometheus                                  # promtool check metrics (promtool_test) and a real scraping server (prometheus_test); ~19 MB, installs in ~7 s
)
# Node.js runs the browser test. The machine's own Node.js (NodeSource, with npm)
# is used when there is one: Debian's npm conflicts with it, so apt installs
# nodejs + npm only where no node exists.
if ! command -v node >/dev/null; then PKGS+=(nodejs npm); fi
if [ "${LANEBUS_SKIP_APT:-0}" != "1" ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
fi

# The browser test drives chromium through playwright-core (npm; its own
# browser downloads are never used: the test runs Debian's /usr/bin/chromium).
if [ "${LANEBUS_SKIP_NPM:-0}" != "1" ] && command -v npm >/dev/null; then
  ROOT="$(cd "$(dirname "$0")/.." && pwd)"
  if [ ! -d "$ROOT/tests/browser/node_modules/playwright-core" ]; then
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --no-save --no-audit --no-fund --silent \
      --prefix "$ROOT/tests/browser" playwright-core >/dev/null
  fi
fi
