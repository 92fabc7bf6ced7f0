#!/usr/bin/env python3
# lanebus — MIT License.
# Keeps lib/'s functions short enough to read (lib/README.md): no function
# body in lib/**/*.cpp|hpp is longer than LIMIT lines, unless the comment right
# before the function says why it must be, with a line containing
#
#   long function: <the reason>
#
# A body's length is the number of lines from its opening brace to its closing
# brace, both included; lambdas and local classes count toward the function
# that holds them. The scan is a brace matcher over the text with comments,
# string and character literals and preprocessor lines blanked out: a `{` at
# namespace or class scope opens a function body when the text before it ends
# in a parameter list (plus qualifiers, a trailing return type or a
# constructor's initializer list).
#
# The long functions of lib/core/ that exist today are listed in KNOWN (they
# are split when BusCore is taken apart); the list may only shrink: an entry
# that is no longer long, or no longer exists, fails the check. Run by the
# Meson test `lib_function_length`, with a negative control (--self-test).
#
# usage: check_function_length.py REPO_ROOT [--self-test] [--list]
import os
import re
import sys

LIMIT = 100
REASON = re.compile(r'long function:\s*\S')

# (file under lib/, function name as the scan prints it): why it is allowed
# for now. Empty since run_durable_topic_batch was split (issue 24): a new
# long function says why in its comment, or is split.
KNOWN = {}

SCOPE_KEYWORD = re.compile(r'^(?:template\s*<.*>\s*)?(?:(?:inline|export)\s+)?'
                           r'(?:namespace|class|struct|union|enum|extern)\b', re.S)
# What may stand between a function's parameter list and its body.
AFTER_PARAMS = re.compile(r'^(?:\s|const\b|volatile\b|noexcept\b(?:\s*\(\s*[^()]*\))?|override\b|final\b|mutable\b|'
                          r'&&|&|->[^{};=]*|requires\b[^{};]*|'
                          r'(?:REQUIRES|EXCLUDES|ACQUIRE|RELEASE|NO_THREAD_SAFETY_ANALYSIS|LANEBUS_\w+)\b'
                          r'(?:\s*\([^()]*\))?)*$')


def blank(text):
    """Comments, literals and preprocessor lines replaced by spaces (newlines kept)."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != '\n':
                out[k] = ' '

    while i < n:
        c = text[i]
        if line_start and c == '#':
            j = i
            while j < n and text[j] != '\n':
                if text[j] == '\\' and j + 1 < n and text[j + 1] == '\n':
                    j += 2
                    continue
                j += 1
            wipe(i, j)
            i = j
            continue
        if c == '\n':
            line_start = True
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            wipe(i, j)
            i = j
        elif c == 'R' and i + 1 < n and text[i + 1] == '"' and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == '_')
                                                                or text[i - 1] in 'uUL8'):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(')' + m.group(1) + '"', i + m.end())
            j = n if end < 0 else end + len(m.group(1)) + 2
            wipe(i, j)
            i = j
        elif c == '"' or (c == "'" and not (i > 0 and (text[i - 1].isalnum() or text[i - 1] == '_'))):
            # A ' after a digit or letter is a digit separator (1'000'000), not a literal.
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            wipe(i + 1, j)  # keep the quotes: "" still reads as an expression
            i = j + 1
        else:
            i += 1
    return ''.join(out)


def matching(text, i, open_c, close_c, step):
    """Index of the bracket matching text[i], scanning by step (+1 forward, -1 back)."""
    depth = 0
    while 0 <= i < len(text):
        if text[i] == open_c:
            depth += 1
        elif text[i] == close_c:
            depth -= 1
            if depth == 0:
                return i
        i += step
    return -1


def clean(stmt):
    """The statement without what never names a function: access labels, attributes, whole-line macro calls."""
    s = re.sub(r'^(?:\s*(?:public|private|protected)\s*:(?!:))+', '', stmt)
    s = re.sub(r'^\s*[A-Z][A-Z0-9_]*\s*\([^;{}]*\)[ \t]*$', '', s, flags=re.M)
    s = re.sub(r'__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)|\[\[[^\]]*\]\]|\balignas\s*\([^()]*\)', ' ', s)
    return s.strip()


def function_header(stmt):
    """The function's name when `stmt` (the text before a `{`) ends a function header, else None."""
    s = clean(stmt)
    if not s or SCOPE_KEYWORD.match(s) or '=' in re.sub(r'operator\s*(?:\(\s*\)|[^\s(]+)', 'operator', s).split('(')[0]:
        return None  # a scope, or a variable's initializer (a lambda, a braced list)
    if any(s.count(o) != s.count(c) for o, c in ('()', '[]', '{}')):
        return None  # inside an expression: a lambda or braced list in an argument
    s = re.sub(r'operator\s*\(\s*\)', 'operator_call_', s)
    # Find the parameter list: the first top-level (...) after the name.
    depth = 0
    for k, ch in enumerate(s):
        if ch == '(' and depth == 0:
            close = matching(s, k, '(', ')', 1)
            if close < 0:
                return None
            rest = s[close + 1:]
            name = re.search(r'((?:[\w~]+\s*::\s*)*(?:operator\s*(?:\(\s*\)|[^\s(]+)|~?\w+))\s*$', s[:k])
            if not name:
                return None
            # A constructor's initializer list, `X::X(args) : a_(x), b_{y}`, ends in ) or }.
            if AFTER_PARAMS.match(rest) or (re.match(r'^\s*(?:noexcept\s*)?:[^:]', rest) and s[-1] in ')}'):
                return re.sub(r'\s+', '', name.group(1)).replace('operator_call_', 'operator()')
            return None
        if ch in '([{':
            depth += 1
        elif ch in ')]}':
            depth -= 1
    return None


def functions(path, text=None):
    """Yield (name, first line of the declaration, body lines, comment before it) for every function of a file."""
    if text is None:
        with open(path, encoding='utf-8') as f:
            text = f.read()
    code = blank(text)
    lines = text.split('\n')
    line_of = []  # index -> line number (1-based)
    ln = 1
    for ch in code:
        line_of.append(ln)
        if ch == '\n':
            ln += 1
    stmt_start = 0
    i = 0
    n = len(code)
    while i < n:
        ch = code[i]
        if ch in ';':
            stmt_start = i + 1
        elif ch == '}':
            stmt_start = i + 1  # the end of a scope (namespace, class)
        elif ch == '{':
            stmt = code[stmt_start:i]
            name = function_header(stmt)
            close = matching(code, i, '{', '}', 1)
            if close < 0:
                return
            if name is not None:
                lead = len(stmt) - len(stmt.lstrip())
                first = line_of[stmt_start + lead] if stmt_start + lead < n else line_of[i]
                body = line_of[close] - line_of[i] + 1
                yield name, first, body, comment_before(lines, first)
                i = close + 1
                stmt_start = i
                continue
            s = clean(stmt)
            if SCOPE_KEYWORD.match(s) or s == '':
                stmt_start = i + 1  # enter the scope: its members are scanned
            else:
                i = close + 1  # an initializer: skip it, the statement goes on to its `;`
                continue
        i += 1


def comment_before(lines, first):
    """The comment lines right above line `first` (1-based), joined."""
    out = []
    k = first - 2
    in_block = False
    while k >= 0:
        t = lines[k].strip()
        if in_block:
            out.append(t)
            if t.startswith('/*'):
                in_block = False
        elif t.startswith('//'):
            out.append(t)
        elif t.endswith('*/'):
            out.append(t)
            in_block = not t.startswith('/*')
        elif t.startswith('template') and not out:
            pass  # template <...> on its own line belongs to the declaration
        else:
            break
        k -= 1
    return ' '.join(reversed(out))


def scan(root):
    """Yield one problem string per function over LIMIT without a reason, and per stale KNOWN entry."""
    lib = os.path.join(root, 'lib')
    seen = {}
    for dirpath, _, names in sorted(os.walk(lib)):
        for name in sorted(names):
            if not name.endswith(('.cpp', '.hpp')):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, lib).replace(os.sep, '/')
            for fn, first, body, comment in functions(path):
                if body <= LIMIT:
                    continue
                if REASON.search(comment):
                    continue
                key = (rel, fn)
                if key in KNOWN:
                    seen[key] = body
                    continue
                yield (f'lib/{rel}:{first}: {fn} is {body} lines (over {LIMIT}): split it into named steps, '
                       f'or say why it must be long in a "long function: <reason>" comment right before it')
    for key in sorted(set(KNOWN) - set(seen)):
        yield f'KNOWN lists lib/{key[0]} {key[1]}, which is no longer over {LIMIT} lines (or gone): remove the entry'


def self_test(root):
    """The check must see a planted long function, accept one with a reason, and not count a short one."""
    import shutil
    import tempfile
    body = '\n'.join(f'  x += {k};' for k in range(LIMIT + 5))
    planted = (f'namespace a {{\nstruct S {{ int f() const; }};\n'
               f'int S::f() const {{\n  int x = 0;\n{body}\n  return x;\n}}\n'
               f'// long function: a reason the self-test gives\n'
               f'int allowed(int y) noexcept {{\n  int x = y;\n{body}\n  return x;\n}}\n'
               f'int short_one() {{ auto l = [] {{ return 1; }}; return l(); }}\n}}\n')
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(root, 'lib'), os.path.join(tmp, 'lib'))
        with open(os.path.join(tmp, 'lib', 'util', 'planted.cpp'), 'w') as f:
            f.write(planted)
        problems = list(scan(tmp))
        if not any('planted.cpp' in p and 'S::f ' in p for p in problems):
            print('check_function_length: the self-test planted a long S::f and the check did not see it',
                  file=sys.stderr)
            return 1
        if any('allowed' in p or 'short_one' in p for p in problems):
            print('check_function_length: the self-test\'s allowed or short function was reported', file=sys.stderr)
            return 1
    return 0


def main():
    root = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith('--') else '.'
    if '--list' in sys.argv:  # every function over LIMIT, reasons and KNOWN included
        for dirpath, _, names in sorted(os.walk(os.path.join(root, 'lib'))):
            for name in sorted(names):
                if name.endswith(('.cpp', '.hpp')):
                    path = os.path.join(dirpath, name)
                    for fn, first, body, comment in functions(path):
                        if body > LIMIT:
                            print(f'{body:5} {os.path.relpath(path, root)}:{first} {fn}'
                                  f'{"  (reason given)" if REASON.search(comment) else ""}')
        return 0
    if '--self-test' in sys.argv and self_test(root):
        return 1
    problems = list(scan(root))
    for p in problems:
        print('check_function_length: ' + p, file=sys.stderr)
    if not problems:
        print(f'check_function_length: no function in lib/ is over {LIMIT} lines without a reason, '
              f'{len(KNOWN)} listed in KNOWN')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
