#!/usr/bin/env bash
# Instruction counts per message of the in-process hot path (doc/performance.md):
# runs bench/hotpath under callgrind and prints the inclusive Ir of
# Publisher::publish (the whole call), TopicImpl::publish_via (its work past
# the API's checks), publish_batch and run_lane divided by the message
# (delivery) count.
# Usage: scripts/hotpath_counts.sh [BUILD_DIR] [hotpath args...]
#   e.g. scripts/hotpath_counts.sh build --msgs 50000 --batch 64 --groups 4
set -euo pipefail
build=${1:-build}
shift || true
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--msgs 50000 --batch 1)
msgs=50000 groups=1
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --msgs) msgs=${args[i + 1]} ;;
    --groups) groups=${args[i + 1]} ;;
  esac
done
out=$(mktemp /tmp/hotpath-cg.XXXXXX)
trap 'rm -f "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out" "$build/bench/hotpath" "${args[@]}" >/dev/null 2>&1
# A function's inclusive cost is split by source file (its own lines and each
# header inlined into it); the largest entry is the whole function's (with
# callgrind 3.19 the one marked "[object]"; it used to be the one without).
callgrind_annotate --inclusive=yes "$out" 2>/dev/null |
  awk -v m="$msgs" -v g="$groups" '
    match($0, /:lanebus::(Publisher::publish|detail::TopicImpl::publish_batch|detail::TopicImpl::publish_via|detail::TopicImpl::publish|detail::LaneRunner::run_lane)\(/) {
      name = substr($0, RSTART + 10, RLENGTH - 11);
      sub(/^detail::/, "", name);
      ir = $1; gsub(",", "", ir);
      if (!(name in best)) order[n++] = name;
      if (ir + 0 > best[name] + 0) { best[name] = ir; shown[name] = $1 }
    }
    END {
      for (i = 0; i < n; ++i) {
        name = order[i]; per = (name ~ /run_lane/) ? m * g : m;
        printf "%-38s %12s Ir  %7.1f Ir per %s\n", name, shown[name], best[name] / per, (name ~ /run_lane/) ? "delivery" : "message";
      }
    }'
