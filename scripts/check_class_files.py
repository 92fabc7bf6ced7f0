#!/usr/bin/env python3
# lanebus — MIT License.
# Keeps each class of lib/ readable in one place (issue 24, lib/README.md): the
# out-of-line definitions of a class's members (`Ret Class::member(...) {`)
# are in at most LIMIT files. A class whose concerns outgrow that is taken
# apart into objects that own their state (doc/architecture.md: "The bus's
# objects", "The durable store's parts"), not spread over more files. Bodies
# written inside the class itself (its header) are not counted.
#
# The scan is check_function_length.py's: comments, literals and preprocessor
# lines blanked, every function body found with its qualified name. Run by
# the Meson test `lib_class_files`, with a negative control (--self-test)
# that plants a class defined in three files.
#
# usage: check_class_files.py REPO_ROOT [--self-test] [--list]
import collections
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_function_length  # noqa: E402  (the shared scanner)

LIMIT = 2


def class_files(root):
    """{class name: set of files under lib/ defining its members out of line}."""
    out = collections.defaultdict(set)
    lib = os.path.join(root, 'lib')
    for dirpath, _, names in os.walk(lib):
        for name in sorted(names):
            if not name.endswith(('.cpp', '.hpp')):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            for fname, _first, _body, _comment in check_function_length.functions(path):
                parts = fname.split('::')
                if len(parts) < 2:
                    continue
                out[parts[-2]].add(rel)
    return out


def scan(root):
    for cls, files in sorted(class_files(root).items()):
        if len(files) > LIMIT:
            yield f'{cls}: members defined in {len(files)} files (limit {LIMIT}): ' + ', '.join(sorted(files))


def self_test(root):
    """The check must see a class planted in three files and accept one planted in two."""
    import shutil
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(root, 'lib'), os.path.join(tmp, 'lib'))
        for k in range(3):
            with open(os.path.join(tmp, 'lib', 'util', f'planted{k}.cpp'), 'w') as f:
                f.write(f'namespace a {{\nint Spread::f{k}() const {{ return {k}; }}\n'
                        f'int Pair::g{k}() {{ return {k}; }}\n}}\n' if k < 2 else
                        f'namespace a {{\nint Spread::f{k}() const {{ return {k}; }}\n}}\n')
        problems = list(scan(tmp))
        if not any(p.startswith('Spread:') for p in problems):
            print('check_class_files: the self-test planted Spread in three files and the check did not see it',
                  file=sys.stderr)
            return 1
        if any(p.startswith('Pair:') for p in problems):
            print('check_class_files: the self-test\'s Pair (two files) was reported', file=sys.stderr)
            return 1
    return 0


def main():
    if len(sys.argv) < 2:
        print(__doc__ or 'usage: check_class_files.py REPO_ROOT [--self-test] [--list]', file=sys.stderr)
        return 2
    root = sys.argv[1]
    if '--list' in sys.argv:
        for cls, files in sorted(class_files(root).items(), key=lambda kv: -len(kv[1])):
            print(f'{len(files)}  {cls}: ' + ', '.join(sorted(files)))
        return 0
    if '--self-test' in sys.argv and self_test(root) != 0:
        return 1
    problems = list(scan(root))
    for p in problems:
        print('check_class_files: ' + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
