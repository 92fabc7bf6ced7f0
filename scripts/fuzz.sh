#!/usr/bin/env bash
# Build the libFuzzer targets (fuzz/) with clang, ASan and UBSan in build-fuzz/,
# then run each one on its committed seed corpus (fuzz/corpus/<target>/) for the
# given seconds (default 30), two at a time (FUZZ_JOBS). New inputs go to a scratch
# corpus, never into the repository. Prints per target the executions and
# crashes, then 'N passed, N failed'; exits non-zero if any target crashed.
#   scripts/fuzz.sh [SECONDS]         every target
#   FUZZ_TARGETS="record_fuzz" scripts/fuzz.sh 60    some of them
#   FUZZ_RUNS=1000000 scripts/fuzz.sh 3600           stop a target at N executions
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
dir=build-fuzz
CXX="${CLANG:-clang++}"
if ! command -v "$CXX" >/dev/null; then
  echo "fuzz: $CXX not found (apt-get install clang libclang-rt-14-dev)" >&2
  exit 1
fi
if [ ! -f "$dir/build.ninja" ]; then
  # From inside the tree, as scripts/test.sh does: Meson's CMake probe writes
  # in the current directory, and another tree may be set up at the same time.
  mkdir -p "$dir"
  cd "$dir"
  CXX="$CXX" meson setup "$PWD" "$OLDPWD" -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
    -Dtests=disabled -Dexamples=false -Dbenchmarks=disabled -Dtools=false -Dnats=disabled -Dbuildtype=debugoptimized
  cd "$OLDPWD"
fi
meson compile -C "$dir" $(ls fuzz/*_fuzz.cpp | xargs -n1 basename | sed 's/\.cpp$//')
# FUZZ_BUILD_ONLY=1: build the targets and stop (.ci/run builds them while the TSan tests run).
if [ -n "${FUZZ_BUILD_ONLY:-}" ]; then exit 0; fi
targets="${FUZZ_TARGETS:-$(ls fuzz/*_fuzz.cpp | xargs -n1 basename | sed 's/\.cpp$//')}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# LMDB (not instrumented) may read a damaged page in the verify child: that
# child dies by the signal (lib/ops/verify.cpp resets the handlers).
export ASAN_OPTIONS="allow_user_segv_handler=1:detect_leaks=1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Targets run FUZZ_JOBS at a time (default: the number of CPUs, at most 2):
# each is single-threaded and runs its full SECONDS either way, so on a 2-core
# machine two at a time halve the stage (8 x 30 s: 4 min -> 2 min).
jobs="${FUZZ_JOBS:-$(nproc)}"
if [ "$jobs" -gt 2 ] && [ -z "${FUZZ_JOBS:-}" ]; then jobs=2; fi
run_target() {
  local t="$1"
  mkdir -p "$work/$t" "$work/$t-artifacts"
  local extra=()
  if [ -f "fuzz/$t.options" ]; then read -r -a extra <"fuzz/$t.options"; fi
  local runs=()
  if [ -n "${FUZZ_RUNS:-}" ]; then runs=(-runs="$FUZZ_RUNS"); fi
  local rc=0
  nice -n 5 "$dir/fuzz/$t" -max_total_time="$secs" "${runs[@]}" "${extra[@]}" -print_final_stats=1 \
    -artifact_prefix="$work/$t-artifacts/" "$work/$t" "fuzz/corpus/$t" >"$work/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t.rc"
}
for t in $targets; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  echo "=== fuzz $t: ${secs} s ==="
  run_target "$t" &
done
wait
passed=0
failed=0
report=()
for t in $targets; do
  rc=$(cat "$work/$t.rc" 2>/dev/null || echo 1)
  execs=$(grep -E '^stat::number_of_executed_units:' "$work/$t.log" | awk '{print $2}' | tail -n 1)
  crashes=$(ls "$work/$t-artifacts" | wc -l)
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    failed=$((failed + 1))
    echo "=== fuzz $t: exit $rc, ${crashes} crashing input(s); the end of its log ==="
    tail -n 60 "$work/$t.log"
    for a in "$work/$t-artifacts"/*; do
      [ -e "$a" ] || continue
      mkdir -p fuzz/crashes
      cp "$a" "fuzz/crashes/$t-$(basename "$a")"
      echo "fuzz $t: crashing input kept as fuzz/crashes/$t-$(basename "$a")"
    done
    report+=("$t: ${execs:-?} executions, FAILED (exit $rc, ${crashes} crashing input(s))")
  else
    passed=$((passed + 1))
    report+=("$t: ${execs:-?} executions, 0 crashes")
  fi
done
echo "=== fuzz summary (${secs} s per target) ==="
printf '%s\n' "${report[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
