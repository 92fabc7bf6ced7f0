#!/usr/bin/env python3
# lanebus — MIT License.
# Keeps lib/'s layers honest (lib/README.md): every folder of lib/ is a layer,
# lowest first
#
#   util → store → features → core → ops → bridge → capi
#
# and a file may include files of its own layer and of the layers below it,
# never of a layer above. Includes name files without their folder (every
# folder is on the include path), so an include is resolved by its file name.
# The few inversions that exist today are listed in KNOWN with the reason and
# the way out; any other upward include fails, and so does a KNOWN entry that
# no longer happens (the list only shrinks). Run by the Meson test
# `lib_layers`, with a negative control (--self-test).
#
# usage: check_layers.py REPO_ROOT [--self-test]
import os
import re
import sys

LAYERS = ['util', 'store', 'features', 'core', 'ops', 'bridge', 'capi']
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

# (including file, included file): why it is allowed for now.
KNOWN = {
    ('store/durable_store.cpp', 'ops/verify.hpp'):
        'verify_on_open runs the verifier from DurableStore::open; the verifier belongs beside the store',
    ('features/fence.cpp', 'core/bus_impl.hpp'):
        'Bus::fenced_* are implemented against BusCore; they move to core/ when BusCore is taken apart',
    ('core/registry.cpp', 'ops/store_stats.hpp'):
        'Bus::stats reads the store figures that ops/store_stats.cpp gathers for the CLI and metrics',
    ('features/schema_registry.cpp', 'core/bus_impl.hpp'):
        'the registry binds schemas to TopicImpl and reads the running lane; same way out',
}


def scan(root):
    lib = os.path.join(root, 'lib')
    where = {}  # file name -> layer
    files = []
    for layer in LAYERS:
        d = os.path.join(lib, layer)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            if name.endswith(('.hpp', '.cpp', '.h')):
                if name in where:
                    yield f'lib/{layer}/{name}: the name is also lib/{where[name]}/{name} (names must be unique)'
                where[name] = layer
                files.append((layer, name))
    for name in os.listdir(lib):
        if name.endswith(('.hpp', '.cpp', '.h')):
            yield f'lib/{name}: every file of lib/ belongs in a layer folder ({", ".join(LAYERS)})'
    seen = set()
    for layer, name in files:
        with open(os.path.join(lib, layer, name), encoding='utf-8') as f:
            text = f.read()
        for inc in INCLUDE.findall(text):
            if '/' in inc:
                continue  # a public header (lanebus/...) or a system one
            base = inc
            target = where.get(base)
            if target is None:
                continue  # a public header, a generated file, or a test's
            if LAYERS.index(target) > LAYERS.index(layer):
                pair = (f'{layer}/{name}', f'{target}/{base}')
                if pair in KNOWN:
                    seen.add(pair)
                    continue
                yield (f'lib/{layer}/{name} includes "{inc}" from lib/{target}/: {layer} may include only '
                       f'{", ".join(LAYERS[:LAYERS.index(layer) + 1])}')
    for pair in sorted(set(KNOWN) - seen):
        yield f'KNOWN lists lib/{pair[0]} -> lib/{pair[1]}, which no longer happens: remove the entry'


def self_test(root):
    """The check must fail on an upward include: plant one in a scratch copy of the layout."""
    import shutil
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(root, 'lib'), os.path.join(tmp, 'lib'))
        with open(os.path.join(tmp, 'lib', 'util', 'planted.cpp'), 'w') as f:
            f.write('#include "bus_impl.hpp"\n')
        problems = list(scan(tmp))
        if not any('planted.cpp' in p for p in problems):
            print('check_layers: the self-test planted util -> core and the check did not see it', file=sys.stderr)
            return 1
    return 0


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else '.'
    if '--self-test' in sys.argv and self_test(root):
        return 1
    problems = list(scan(root))
    for p in problems:
        print('check_layers: ' + p, file=sys.stderr)
    if not problems:
        print(f'check_layers: lib/ keeps its layers ({" → ".join(LAYERS)}), {len(KNOWN)} known inversions')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
