#!/usr/bin/env bash
# Run the benchmarks in a release build at modest sizes (a few minutes on 2
# cores) and draw their plots into doc/img/ with scripts/bench_plot.py.
#   scripts/bench_report.sh [BUILD_DIR]      (default build-release)
# Writes doc/img/bench_results.txt (the raw key=value lines) and
# doc/img/bench_throughput_ratios.png, bench_latency.png, bench_durable_batch.png.
# Needs python3-matplotlib (scripts/deps.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-release}
OUT=doc/img
mkdir -p "$OUT"

if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" --buildtype=release -Dbenchmarks=enabled -Dtests=disabled >/dev/null
fi
nice -n 5 ninja -C "$BUILD" -j2 bench/inproc bench/durable bench/idempotency bench/leases >/dev/null

RAW=$(mktemp)
trap 'rm -f "$RAW"' EXIT
{
  echo "# lanebus benchmark report: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} >"$RAW"
run() {
  echo "== $*" >&2
  "$@" | tee -a "$RAW" >&2
}
run "$BUILD/bench/inproc" --msgs 300000 --repeats 3
run "$BUILD/bench/durable" --seconds 1 --repeats 3 --messages 20000
run "$BUILD/bench/durable" --run batch_sweep --seconds 1
run "$BUILD/bench/idempotency"
run "$BUILD/bench/leases" --seconds 1
cat "$RAW" >"$OUT/bench_results.txt"
# Debian's python3-matplotlib lives in /usr/bin/python3 (another python3 may come first in PATH).
PY=python3
if ! "$PY" -c "import matplotlib" 2>/dev/null && [ -x /usr/bin/python3 ]; then PY=/usr/bin/python3; fi
"$PY" scripts/bench_plot.py "$OUT/bench_results.txt" "$OUT"
