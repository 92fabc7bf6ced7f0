#!/usr/bin/env bash
# The README's test command: install packages, build, run the whole suite.
#   scripts/test.sh            normal build in build/
#   scripts/test.sh asan       ASan+UBSan build in build-asan/
#   scripts/test.sh tsan       TSan build in build-tsan/
#   scripts/test.sh --build-only MODE   only set up and build MODE's tree (.ci/run
#                                       builds the next stage's tree while a stage's tests run)
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [ "${1:-}" = "--build-only" ]; then
  build_only=1
  shift
fi
scripts/deps.sh
mode="${1:-plain}"
case "$mode" in
  plain) dir=build;      extra=() ;;
  # -g1 (line tables, no variable info; the last -g wins over debugoptimized's
  # -g): ASan's reports keep file and line, the code is the same, and the
  # build, the longest part of CI, takes about a fifth less. Not (yet) for
  # TSan: tests/tsan.supp matches frames by source file, not checked with -g1.
  asan)  dir=build-asan; extra=(-Db_sanitize=address,undefined -Db_lundef=false -Dcpp_args=-g1) ;;
  # -Wno-tsan: GCC 12 warns that TSan does not instrument std::atomic_thread_fence
  # (used by moodycamel's queue and by lib/features/lease_table.cpp's cross-process undo
  # log), which -Dwerror=true (CI) turns into a build error. The warning is
  # about TSan's coverage, not the code; what it means for TSan's reports is
  # handled in tests/tsan.supp.
  tsan)  dir=build-tsan; extra=(-Db_sanitize=thread -Db_lundef=false -Dcpp_args=-Wno-tsan) ;;
  *) echo "usage: $0 [plain|asan|tsan]" >&2; exit 2 ;;
esac
werror=()
if [ "${CI:-}" = "true" ]; then
  werror=(-Dwerror=true)
  # CI's plain tree at -g1 too (line tables: backtraces keep file and line;
  # nobody steps through CI's tree in gdb): a quarter less compile time
  # (2026-12-03, CPU seconds, -O2 -g against -O2 -g1: lib/core/scheduler.cpp
  # 7.7 / 5.8, lib/ops/metrics_server.cpp 24.8 / 17.1, tests/dlq_test.cpp
  # 9.3 / 6.9). A developer's build/ keeps full -g.
  if [ "$mode" = plain ]; then extra=(-Dcpp_args=-g1); fi
fi
if [ ! -f "$dir/build.ninja" ]; then
  # From inside the tree: Meson's CMake probe writes __cmake_systeminformation/
  # in the current directory, and .ci/run sets up the next tree while this
  # one is set up, so two probes from one directory removed each other's
  # files ("Unable to find cmake", reproduced 3 in 3 by two setups at once).
  mkdir -p "$dir"
  (cd "$dir" && meson setup "$PWD" "$OLDPWD" "${extra[@]}" "${werror[@]}")
fi
meson compile -C "$dir"
if [ "$build_only" -eq 1 ]; then exit 0; fi
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Every suppression in tests/tsan.supp says why.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
# A failing suite still gets its closing line below; the script then exits non-zero.
rc=0
meson test -C "$dir" --print-errorlogs --num-processes 2 || rc=$?
if [ "$mode" = plain ] && [ "$rc" -eq 0 ]; then
  # Consumer test: install to a temporary prefix; every public header alone, every example
  # built against lanebus.pc, through CMake's find_package and as a Meson subproject, and run.
  # Its output also goes to a log: on a failure its last lines are repeated
  # after the closing line, where .ci/run's summary picks them up (CI shows
  # only the end of its output; stop 46's failure here left no reason there).
  consumer_rc=0
  scripts/consumer_check.sh "$dir" 2>&1 | tee "$dir/meson-logs/consumer_check.log" || consumer_rc=$?
  [ "$consumer_rc" -eq 0 ] || rc=$consumer_rc
fi
# One plain closing line for readers (and CI): N passed, N failed.
python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, sys
results = [json.loads(line)["result"] for line in open(sys.argv[1]) if line.strip()]
passed = sum(r in ("OK", "EXPECTEDFAIL") for r in results)
failed = sum(r in ("FAIL", "TIMEOUT", "UNEXPECTEDPASS", "ERROR") for r in results)
skipped = sum(r == "SKIP" for r in results)
print(f"{passed} passed, {failed} failed, {skipped} skipped")
PY
if [ "${consumer_rc:-0}" -ne 0 ]; then
  echo "consumer check failed (exit status $consumer_rc); its last lines:"
  tail -n 25 "$dir/meson-logs/consumer_check.log" | sed 's/^/consumer check failed| /'
fi
exit "$rc"
