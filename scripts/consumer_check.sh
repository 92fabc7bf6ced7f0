#!/usr/bin/env bash
# Consumer test (fmt's find-package-test): install the build into a temporary
# prefix and build examples/tour.cpp against the generated lanebus.pc only.
#   scripts/consumer_check.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
meson install -C "$build" --destdir "$prefix" --quiet >/dev/null
root="$prefix$(meson introspect "$build" --buildoptions | python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')"
pcdir=$(dirname "$(find "$root" -name lanebus.pc | head -n1)")
# The .pc file names the real prefix; point pkg-config at the staged one.
export PKG_CONFIG_PATH="$pcdir"
flags=$(pkg-config --define-variable=prefix="$root" --cflags --libs lanebus)
c++ -std=c++20 -O1 examples/tour.cpp $flags -Wl,-rpath,"$root/lib/x86_64-linux-gnu" -Wl,-rpath,"$root/lib" -o "$prefix/tour"
"$prefix/tour" >/dev/null
echo "consumer_check: examples/tour.cpp built against the installed lanebus.pc ($(pkg-config --define-variable=prefix="$root" --modversion lanebus)) and ran"
