#!/usr/bin/env bash
# Consumer test (fmt's find-package-test): install the build into a temporary
# prefix (meson install --destdir) and use it as a program outside the tree would,
# through the generated lanebus.pc only:
#   1. every installed public header compiles on its own (-Werror), and no
#      public declaration outside a private section names a detail:: type;
#   2. every example in examples/ builds against the installed package;
#   3. every example runs (payments_dlq with the installed `lanebus` CLI).
#   scripts/consumer_check.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
meson install -C "$build" --destdir "$stage" --quiet >/dev/null
prefix=$(meson introspect "$build" --buildoptions | python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')
root="$stage$prefix"
pcdir=$(dirname "$(find "$root" -name lanebus.pc | head -n1)")
# The .pc file names the real prefix; point pkg-config at the staged one.
export PKG_CONFIG_PATH="$pcdir"
pc() { pkg-config --define-variable=prefix="$root" "$@" lanebus; }
read -r -a cflags <<<"$(pc --cflags)"
read -r -a libs <<<"$(pc --libs)"
libdir=$(pc --variable=libdir)
incdir=$(pc --variable=includedir)
cxx=${CXX:-c++}
warn=(-std=c++20 -Wall -Wextra -Wpedantic -Werror)
out="$stage/out"
mkdir -p "$out"

# 1. Public headers: each one alone, then the detail:: scan.
headers=("$incdir"/lanebus/*.hpp)
[ "${#headers[@]}" -gt 1 ] || { echo "consumer_check: no headers installed under $incdir/lanebus" >&2; exit 1; }
for h in "${headers[@]}"; do
  name=$(basename "$h")
  printf '#include <lanebus/%s>\n#include <lanebus/%s>\nint main() { return 0; }\n' "$name" "$name" >"$out/h_$name.cpp"
  "$cxx" "${warn[@]}" -fsyntax-only "${cflags[@]}" "$out/h_$name.cpp" ||
    { echo "consumer_check: installed header lanebus/$name does not compile on its own" >&2; exit 1; }
done
python3 - "${headers[@]}" <<'PY'
# A public declaration may name detail:: only where a user cannot reach it:
# forward declarations inside `namespace detail { ... }`, the private
# sections of classes (pimpl members, friends, library-only constructors),
# and the bodies of inline functions and templates (typed.hpp's TypedTopic<T>
# reaches the library through detail::TypedAccess there; a body is no part
# of a declaration a user can name).
import re, sys
bad = []
for path in sys.argv[1:]:
    access = []          # one entry per open class/struct brace: True = private
    depth_kind = []      # what each open brace is: 'class', 'ns-detail', 'other'
    for n, raw in enumerate(open(path, encoding="utf-8"), 1):
        line = re.sub(r"//.*", "", raw).strip()
        if not line:
            continue
        m = re.match(r"(?:template\s*<.*>\s*)?(class|struct)\s+(?:LANEBUS_API\s+)?\w+[^;]*\{", line)
        opened = line.count("{")
        closed = line.count("}")
        if re.match(r"(public|protected)\s*:", line) and access:
            access[-1] = False
        elif re.match(r"private\s*:", line) and access:
            access[-1] = True
        in_detail_ns = "ns-detail" in depth_kind
        body_re = r"\)\s*(const\s*)?(noexcept\s*)?(->\s*[\w:<>, ]+\s*)?\{"
        in_body = "body" in depth_kind or (
            re.search(body_re, line) is not None and "detail::" not in line.split("{")[0])
        private = any(access)
        if "detail::" in line and not in_detail_ns and not private and not in_body:
            bad.append(f"{path}:{n}: {raw.rstrip()}")
        # Track braces (one construct per line is enough for these headers).
        if opened > closed:
            if m:
                depth_kind.append("class")
                access.append(m.group(1) == "class")
            elif re.match(r"namespace\s+detail\s*\{", line):
                depth_kind.append("ns-detail")
            elif re.match(r"(inline\s+)?namespace\b", line) or re.match(r'extern\s+"C"', line):
                depth_kind.append("ns")
            elif re.search(body_re, line) and "detail::" not in line.split("{")[0]:
                # A function body opens (its signature names no detail:: type).
                depth_kind.append("body")
                for _ in range(opened - closed - 1):
                    depth_kind.append("other")
            else:
                for _ in range(opened - closed):
                    depth_kind.append("other")
        elif closed > opened:
            for _ in range(closed - opened):
                if depth_kind and depth_kind.pop() == "class":
                    access.pop()
if bad:
    print("consumer_check: detail:: in a public declaration (move it to a private section or lib/):", file=sys.stderr)
    print("\n".join(bad), file=sys.stderr)
    sys.exit(1)
PY
echo "consumer_check: ${#headers[@]} installed headers compile on their own; no detail:: type in a public declaration"

# 2. and 3. Every example, built against the installed package, then run.
tool="$root/bin/lanebus"
built=0
ran=()
for src in examples/*.cpp; do
  name=$(basename "$src" .cpp)
  extra=()
  if [ "$name" = edge_to_cloud ]; then
    # Built only when the library has the bridge (nats); it starts its own
    # nats-server through the tests' helper header.
    [ -f "$incdir/lanebus/bridge.hpp" ] || continue
    extra=(-Itests/support)
  fi
  "$cxx" "${warn[@]}" -O1 "$src" "${extra[@]}" "${cflags[@]}" "${libs[@]}" -Wl,-rpath,"$libdir" -o "$out/$name" ||
    { echo "consumer_check: examples/$name.cpp does not build against the installed lanebus.pc" >&2; exit 1; }
  built=$((built + 1))
  args=()
  if [ "$name" = payments_dlq ]; then
    [ -x "$tool" ] || continue  # built with -Dtools=false: nothing to drive
    args=("$tool")
  fi
  "$out/$name" "${args[@]}" >"$out/$name.log" 2>&1 ||
    { echo "consumer_check: examples/$name failed against the installed library:" >&2; cat "$out/$name.log" >&2; exit 1; }
  ran+=("$name")
done
# The examples must have used the installed library, not the build tree's.
if ! ldd "$out/tour" | grep liblanebus | grep -q "$stage"; then
  echo "consumer_check: examples/tour did not resolve liblanebus from the installed prefix:" >&2
  ldd "$out/tour" >&2; exit 1
fi
echo "consumer_check: $built examples built against the installed lanebus.pc ($(pc --modversion)); ran ${#ran[@]}: ${ran[*]}"
