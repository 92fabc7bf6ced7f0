#!/usr/bin/env python3
# lanebus — MIT License.
# Keeps the manual honest: every relative link in README.md and doc/*.md must name a file of the
# repository (and, with #anchor, a heading of that page), and every repository path quoted in
# backticks (`tests/powercut_test.cpp`, `lib/core/lane_ring.hpp`, ...) must exist, so a claim cannot keep
# pointing at a test or file that was renamed or removed. Run by the Meson test `doc_links`.
#
# usage: check_links.py REPO_ROOT     exit 0 when every link resolves, 1 with one line per broken link
import os
import re
import sys
import tempfile

LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
CODE = re.compile(r'`([^`\n]+)`')
# Top-level folders of the repository whose paths, quoted in backticks, must exist.
REPO_DIRS = ('bench/', 'contrib/', 'doc/', 'examples/', 'fuzz/', 'include/', 'lib/', 'scripts/',
             'tests/', 'tools/', '.ci/')
PLACEHOLDER = set('<>*{}[]|$ ')


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r'`', '', heading.strip()).lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def anchors(path):
    seen = {}
    out = set()
    fence = False
    with open(path, encoding='utf-8') as f:
        for line in f:
            if line.startswith('```'):
                fence = not fence
                continue
            m = re.match(r'(#{1,6})\s+(.*?)\s*#*\s*$', line)
            if fence or not m:
                continue
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f'{s}-{n}')
    return out


def outside_fences(text):
    """The lines of a Markdown text that are not inside ``` code blocks, with their numbers."""
    fence = False
    for number, line in enumerate(text.split('\n'), 1):
        if line.startswith('```'):
            fence = not fence
            continue
        if not fence:
            yield number, line


def quoted_path_exists(root, code):
    """A quoted path names a file or folder, a program built from `path.cpp` (`bench/durable`,
    `examples/tour`), or something the build or a run makes that .gitignore lists (`fuzz/crashes/`)."""
    path = code.rstrip('/')
    if os.path.exists(os.path.join(root, path)) or os.path.exists(os.path.join(root, path + '.cpp')):
        return True
    ignore = os.path.join(root, '.gitignore')
    if os.path.exists(ignore):
        with open(ignore, encoding='utf-8') as f:
            return any(line.strip().rstrip('/') == path for line in f)
    return False


def check_file(root, path, problems):
    rel = os.path.relpath(path, root)
    with open(path, encoding='utf-8') as f:
        text = f.read()
    for number, line in outside_fences(text):
        for target in LINK.findall(line):
            if re.match(r'^[a-z]+:', target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition('#')
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.realpath(dest).startswith(os.path.realpath(root) + os.sep):
                problems.append(f'{rel}:{number}: link "{target}" leaves the repository')
                continue
            if not os.path.exists(dest):
                problems.append(f'{rel}:{number}: link "{target}": no such file')
                continue
            if anchor and dest.endswith('.md') and anchor not in anchors(dest):
                problems.append(f'{rel}:{number}: link "{target}": no heading with anchor #{anchor}')
        for code in CODE.findall(line):
            if not code.startswith(REPO_DIRS) or PLACEHOLDER & set(code):
                continue
            if not quoted_path_exists(root, code):
                problems.append(f'{rel}:{number}: path `{code}`: no such file in the repository')


def check_tree(root):
    problems = []
    pages = [os.path.join(root, 'README.md')]
    doc = os.path.join(root, 'doc')
    if os.path.isdir(doc):
        pages += sorted(os.path.join(doc, n) for n in os.listdir(doc) if n.endswith('.md'))
    for page in pages:
        if os.path.exists(page):
            check_file(root, page, problems)
    return problems


def self_test():
    """The check must catch what it is for (a negative control): a missing file, a missing anchor and a
    quoted path that does not exist, in a small tree of its own."""
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, 'doc'))
        os.makedirs(os.path.join(root, 'tests'))
        with open(os.path.join(root, 'tests', 'real_test.cpp'), 'w') as f:
            f.write('')
        with open(os.path.join(root, 'doc', 'page.md'), 'w') as f:
            f.write('# A page\n\n## What "OK" means — here\n')
        with open(os.path.join(root, 'README.md'), 'w') as f:
            f.write('[ok](doc/page.md#what-ok-means--here) `tests/real_test.cpp` [web](https://example.org)\n'
                    '[gone](doc/missing.md)\n[bad anchor](doc/page.md#nowhere)\n`tests/gone_test.cpp`\n'
                    '```\n[in code](doc/ignored.md)\n```\n')
        problems = check_tree(root)
    expected = ['doc/missing.md', '#nowhere', 'tests/gone_test.cpp']
    if len(problems) != 3 or not all(any(e in p for p in problems) for e in expected):
        print('check_links self-test failed; found:', *problems, sep='\n  ')
        return False
    return True


def main():
    if len(sys.argv) != 2:
        print('usage: check_links.py REPO_ROOT', file=sys.stderr)
        return 2
    if not self_test():
        return 1
    problems = check_tree(sys.argv[1])
    for p in problems:
        print(p)
    if problems:
        print(f'{len(problems)} broken link(s) in README.md and doc/*.md')
        return 1
    print('every link and quoted path in README.md and doc/*.md resolves')
    return 0


if __name__ == '__main__':
    sys.exit(main())
