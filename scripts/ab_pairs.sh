#!/usr/bin/env bash
# Interleaved A/B of two bench/hotpath binaries (doc/performance.md, "Eighth
# round"). This VM moves its two vCPUs between a near and a far placement
# for seconds to minutes at a time, which halves some rates, so two binaries
# compared in separate sittings compare placements. This runs A then B,
# ROUNDS times, and compares only the pairs whose rates are within 40 % of
# each other (both ran in the same placement).
# Usage: scripts/ab_pairs.sh BIN_A BIN_B ROUNDS [hotpath args...]
#   e.g. scripts/ab_pairs.sh /tmp/hotpath-before build-rel/bench/hotpath 10 --stream 1 --msgs 10000000
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 BIN_A BIN_B ROUNDS [hotpath args...]" >&2
  exit 2
fi
a=$1 b=$2 rounds=$3
shift 3
rate() { "$1" "${@:2}" | grep -o 'msgs_per_sec=[0-9]*' | cut -d= -f2; }
for ((r = 1; r <= rounds; r++)); do
  echo "$(rate "$a" "$@") $(rate "$b" "$@")"
done | python3 -c '
import statistics, sys
pairs = [tuple(map(float, l.split())) for l in sys.stdin if l.strip()]
print("pairs (A/B, M msg/s):", " ".join(f"{x/1e6:.1f}/{y/1e6:.1f}" for x, y in pairs))
same = [y / x for x, y in pairs if min(x, y) > 0.6 * max(x, y)]
if same:
    print(f"same-placement pairs: {len(same)} of {len(pairs)}; median B/A: {statistics.median(same):.3f}")
else:
    print(f"same-placement pairs: 0 of {len(pairs)}")
'
