#!/usr/bin/env bash
# The README's test command: install packages, build, run the whole suite.
#   scripts/test.sh            normal build in build/
#   scripts/test.sh asan       ASan+UBSan build in build-asan/
#   scripts/test.sh tsan       TSan build in build-tsan/
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
mode="${1:-plain}"
case "$mode" in
  plain) dir=build;      extra=() ;;
  asan)  dir=build-asan; extra=(-Db_sanitize=address,undefined -Db_lundef=false) ;;
  tsan)  dir=build-tsan; extra=(-Db_sanitize=thread -Db_lundef=false) ;;
  *) echo "usage: $0 [plain|asan|tsan]" >&2; exit 2 ;;
esac
werror=()
if [ "${CI:-}" = "true" ]; then werror=(-Dwerror=true); fi
if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" "${extra[@]}" "${werror[@]}"
fi
meson compile -C "$dir"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
meson test -C "$dir" --print-errorlogs --num-processes 2
if [ "$mode" = plain ]; then
  # Consumer test: install to a temporary prefix, build examples/tour against lanebus.pc.
  scripts/consumer_check.sh "$dir"
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
