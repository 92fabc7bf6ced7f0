#!/usr/bin/env bash
# Consumer test (fmt's find-package-test): install the build into a temporary
# prefix (meson install --destdir) and use it as a program outside the tree would:
#   1. every installed public header compiles on its own (-Werror; lanebus.h
#      as C11 and as C++), and no public declaration outside a private
#      section names a detail:: type;
#   2. every example in examples/ (C++ and C) builds against the installed
#      package through the generated lanebus.pc, and runs (payments_dlq with
#      the installed `lanebus` CLI);
#   3. the same through CMake: find_package(lanebus CONFIG REQUIRED) and
#      lanebus::lanebus from the installed lanebusConfig.cmake;
#   4. the same as a Meson subproject of a scratch project: a copy of this
#      tree under subprojects/ found through contrib/meson/lanebus.wrap and
#      dependency('lanebus') (meson.override_dependency);
#   5. Python, when the build has the binding (python/README.md): the
#      installed extension module imported by Debian's /usr/bin/python3 from
#      the staged site-packages, running python/examples/orders.py against
#      the staged liblanebus.
# Ways 3 and 4 compile at -O0 with two jobs (way 2 keeps the warnings and
# -O1): they check the packaging, not the code again. Each way prints its
# seconds. LANEBUS_CONSUMER_WAYS=pkgconfig,cmake,subproject picks ways.
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
# The C API header: C11 (strict, no extensions) and C++.
cc=${CC:-cc}
printf '#include <lanebus/lanebus.h>\n#include <lanebus/lanebus.h>\nint main(void) { return lanebus_version() == 0; }\n' >"$out/h_lanebus_h.c"
"$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only "${cflags[@]}" "$out/h_lanebus_h.c" ||
  { echo "consumer_check: installed header lanebus/lanebus.h does not compile as C11" >&2; exit 1; }
cp "$out/h_lanebus_h.c" "$out/h_lanebus_h.cpp"
"$cxx" "${warn[@]}" -fsyntax-only "${cflags[@]}" "$out/h_lanebus_h.cpp" ||
  { echo "consumer_check: installed header lanebus/lanebus.h does not compile as C++" >&2; exit 1; }
echo "consumer_check: ${#headers[@]} installed C++ headers and lanebus.h (C11, C++) compile on their own; no detail:: type in a public declaration"

ways=",${LANEBUS_CONSUMER_WAYS:-pkgconfig,cmake,subproject,python},"
tool="$root/bin/lanebus"
have_bridge=0
[ -f "$incdir/lanebus/bridge.hpp" ] && have_bridge=1
examples=()
for src in examples/*.cpp examples/*.c; do
  name=$(basename "$src"); name=${name%.*}
  # edge_to_cloud needs the bridge (nats); it starts its own nats-server
  # through the tests' helper header.
  [ "$name" = edge_to_cloud ] && [ "$have_bridge" = 0 ] && continue
  examples+=("$src")
done

# run_examples WAY DIR: run every example DIR/<name> built by WAY.
run_examples() {
  local way=$1 dir=$2 src name args ran=0
  for src in "${examples[@]}"; do
    name=$(basename "$src"); name=${name%.*}
    args=()
    if [ "$name" = payments_dlq ]; then
      [ -x "$tool" ] || continue  # built with -Dtools=false: nothing to drive
      args=("$tool")
    fi
    # A time limit: a hung example is named here rather than stalling CI to
    # its own limit (each takes seconds; ticket_booking's own deadline is 60 s).
    local rc=0
    timeout --kill-after=10 300 "$dir/$name" "${args[@]}" >"$dir/$name.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
      [ "$rc" -eq 124 ] && echo "consumer_check ($way): examples/$name did not finish in 300 s" >&2
      echo "consumer_check ($way): examples/$name failed (exit status $rc):" >&2; cat "$dir/$name.log" >&2; exit 1
    fi
    ran=$((ran + 1))
  done
  echo "$ran"
}
# from_stage WAY EXE: the example must have used the installed library, not the build tree's.
from_stage() {
  if ! ldd "$2" | grep liblanebus | grep -q "$stage"; then
    echo "consumer_check ($1): $2 did not resolve liblanebus from the installed prefix:" >&2
    ldd "$2" >&2; exit 1
  fi
}

# 2. pkg-config: every example built with the compiler and lanebus.pc alone.
if [[ $ways == *,pkgconfig,* ]]; then
  t0=$SECONDS
  dir="$out/pkgconfig"; mkdir -p "$dir"
  for src in "${examples[@]}"; do
    name=$(basename "$src"); name=${name%.*}
    extra=()
    [ "$name" = edge_to_cloud ] && extra=(-Itests/support)
    if [[ $src == *.c ]]; then
      # A C program links the C++ library's shared object like any other.
      "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -O1 "$src" "${cflags[@]}" "${libs[@]}" \
        -Wl,-rpath,"$libdir" -o "$dir/$name"
    else
      "$cxx" "${warn[@]}" -O1 "$src" "${extra[@]}" "${cflags[@]}" "${libs[@]}" -Wl,-rpath,"$libdir" -o "$dir/$name"
    fi || { echo "consumer_check: examples/$(basename "$src") does not build against the installed lanebus.pc" >&2; exit 1; }
  done
  ran=$(run_examples pkg-config "$dir")
  from_stage pkg-config "$dir/tour"
  from_stage pkg-config "$dir/c_consumer"
  echo "consumer_check: pkg-config: ${#examples[@]} examples built against the installed lanebus.pc ($(pc --modversion)), ran $ran ($((SECONDS - t0)) s)"
fi

# 3. CMake: a scratch project that knows only find_package(lanebus CONFIG REQUIRED).
if [[ $ways == *,cmake,* ]]; then
  t0=$SECONDS
  command -v cmake >/dev/null || { echo "consumer_check: cmake not found (scripts/deps.sh installs it)" >&2; exit 1; }
  [ -n "$(find "$root" -name lanebusConfig.cmake)" ] ||
    { echo "consumer_check: lanebusConfig.cmake was not installed (was cmake missing at meson setup?)" >&2; exit 1; }
  proj="$stage/cmake-consumer"; mkdir -p "$proj"
  {
    echo 'cmake_minimum_required(VERSION 3.16)'
    echo 'project(lanebus_cmake_consumer C CXX)'
    echo 'find_package(lanebus CONFIG REQUIRED)'
    echo 'message(STATUS "lanebus ${lanebus_VERSION} from ${lanebus_DIR}")'
    for src in "${examples[@]}"; do
      name=$(basename "$src"); name=${name%.*}
      echo "add_executable($name \"$PWD/$src\")"
      echo "target_link_libraries($name PRIVATE lanebus::lanebus)"
      [[ $src == *.c ]] && echo "set_target_properties($name PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)"
      [ "$name" = edge_to_cloud ] && echo "target_include_directories($name PRIVATE \"$PWD/tests/support\")"
    done
  } >"$proj/CMakeLists.txt"
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$proj" -B "$proj/build" "${generator[@]}" -DCMAKE_PREFIX_PATH="$root" -DCMAKE_BUILD_TYPE= \
    -DCMAKE_C_FLAGS=-O0 -DCMAKE_CXX_FLAGS=-O0 >"$proj/configure.log" 2>&1 ||
    { echo "consumer_check (cmake): find_package(lanebus) failed:" >&2; cat "$proj/configure.log" >&2; exit 1; }
  cmake --build "$proj/build" -j 2 >"$proj/build.log" 2>&1 ||
    { echo "consumer_check (cmake): the examples do not build with lanebus::lanebus:" >&2; tail -n 40 "$proj/build.log" >&2; exit 1; }
  ran=$(run_examples cmake "$proj/build")
  from_stage cmake "$proj/build/tour"
  echo "consumer_check: cmake: ${#examples[@]} examples built with find_package(lanebus CONFIG REQUIRED) and lanebus::lanebus, ran $ran ($((SECONDS - t0)) s)"
fi

# 4. Meson subproject: a scratch project with this tree under subprojects/,
# found through the wrap file users copy (its [provide] names the dependency
# that lanebus's meson.override_dependency registers; the directory is
# there, so nothing is downloaded).
if [[ $ways == *,subproject,* ]]; then
  t0=$SECONDS
  proj="$stage/meson-consumer"; mkdir -p "$proj/subprojects/lanebus"
  cp contrib/meson/lanebus.wrap "$proj/subprojects/lanebus.wrap"
  # The working tree as git sees it (tracked and new files; no build dirs),
  # or, outside a git checkout, the tree without build*/ directories.
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$proj/subprojects/lanebus"
  else
    tar --exclude='./build*' --exclude='./tests/browser/node_modules' -cf - . | tar -xf - -C "$proj/subprojects/lanebus"
  fi
  {
    echo "project('lanebus_meson_consumer', 'cpp', 'c', default_options: ['cpp_std=c++20', 'c_std=c11'])"
    echo "lanebus_dep = dependency('lanebus')"
    echo "bridge_dep = dependency('libnats', required: false)"
    for src in "${examples[@]}"; do
      name=$(basename "$src"); name=${name%.*}
      cp "$src" "$proj/"
      if [ "$name" = edge_to_cloud ]; then
        cp -r tests/support "$proj/support"
        echo "executable('$name', '$(basename "$src")', dependencies: [lanebus_dep], include_directories: 'support')"
      else
        echo "executable('$name', '$(basename "$src")', dependencies: lanebus_dep)"
      fi
    done
  } >"$proj/meson.build"
  # --force-fallback-for: a lanebus installed on the machine must not stand in
  # for the subproject. Static and without the tool: the check is the
  # packaging, and that is the least to compile; -Dunity=subprojects compiles
  # the subproject's library eight files to a compiler run (the examples one
  # by one), as the sanitizer builds do (lib/meson.build).
  meson setup "$proj/build" "$proj" --buildtype=plain --force-fallback-for=lanebus -Dunity=subprojects -Dunity_size=8 \
    -Dlanebus:default_library=static -Dlanebus:tools=false >"$proj/setup.log" 2>&1 ||
    { echo "consumer_check (subproject): meson setup failed:" >&2; cat "$proj/setup.log" >&2; exit 1; }
  # "(overridden)": the dependency is the one lanebus's meson.override_dependency registered.
  grep -Eq "^Dependency lanebus found: YES .*\(overridden\)" "$proj/setup.log" ||
    { echo "consumer_check (subproject): dependency('lanebus') did not come from the subproject's override_dependency:" >&2
      cat "$proj/setup.log" >&2; exit 1; }
  meson compile -C "$proj/build" -j 2 >"$proj/build.log" 2>&1 ||
    { echo "consumer_check (subproject): the examples do not build:" >&2; tail -n 40 "$proj/build.log" >&2; exit 1; }
  ran=$(run_examples subproject "$proj/build")
  echo "consumer_check: subproject: ${#examples[@]} examples built with lanebus as a Meson subproject (static, -O0), ran $ran ($((SECONDS - t0)) s)"
fi

# 5. Python: the installed module, when the build made one.
if [[ $ways == *,python,* ]]; then
  module=$(find "$root" -name 'lanebus.cpython-*.so' | head -n1)
  if [ -n "$module" ]; then
    t0=$SECONDS
    site=$(dirname "$module")
    # The installed module has no rpath (Meson drops the build tree's): it
    # finds liblanebus where the linker looks, here the staged libdir.
    PYTHONPATH="$site" LD_LIBRARY_PATH="$libdir" PYTHONDONTWRITEBYTECODE=1 \
      /usr/bin/python3 python/examples/orders.py >"$out/python.log" 2>&1 ||
      { echo "consumer_check (python): python/examples/orders.py failed with the installed module:" >&2
        cat "$out/python.log" >&2; exit 1; }
    PYTHONPATH="$site" LD_LIBRARY_PATH="$libdir" /usr/bin/python3 -c \
      'import lanebus, sys; maps = open("/proc/self/maps").read(); sys.exit(0 if sys.argv[1] in maps and sys.argv[2] in lanebus.__file__ else 1)' \
      "$libdir/liblanebus.so" "$stage" ||
      { echo "consumer_check (python): the module or liblanebus did not come from the installed prefix" >&2; exit 1; }
    echo "consumer_check: python: the installed module ($(basename "$module")) ran python/examples/orders.py ($((SECONDS - t0)) s)"
  fi
fi
