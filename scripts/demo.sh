#!/usr/bin/env bash
# The README's demo command: install packages, build, run examples/tour.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
[ -f build/build.ninja ] || meson setup build
meson compile -C build tour
./build/examples/tour
