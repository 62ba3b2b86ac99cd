#!/usr/bin/env python3
"""The architecture's rules, checked on the sources (docs/architecture.md, "Layout").

Rules (each selectable with --rule; all by default):
  includes  a module includes only the modules it depends on; nothing includes abi/
  clock     the system clocks are read in core/clock.cpp only (core/clock.hpp)
  size      no source file over 800 lines
  getenv    the environment is read in core/env.cpp only (core/env.hpp), and the
            launcher's own variables (SOFTVERBS_LIBDIR, LD_LIBRARY_PATH) in
            tools/launcher_env.cpp

Each violation is printed as FILE:LINE: rule: what to do. Exit status 1 if any.
--self-test checks the checker itself on a small tree with known violations.
Comments are ignored; string literals are ignored except for include paths.
"""

import argparse
import os
import re
import sys
import tempfile

# The product's modules: top-level folders of the source tree. Missing ones are skipped.
MODULES = ("core", "abi", "emu", "hw", "faults", "wire", "fabric", "tools")
SOURCE_SUFFIXES = (".cpp", ".hpp", ".h", ".c")

# Which modules each module may include (itself included). include/softverbs (the
# public headers, "softverbs/...") is open to all.
ALLOWED_INCLUDES = {
    "core": {"core"},
    "abi": {"abi", "core"},
    "wire": {"wire", "core"},
    "faults": {"faults", "core", "wire"},
    "hw": {"hw", "core", "faults"},
    "fabric": {"fabric", "core", "wire", "faults"},
    "emu": {"emu", "core", "wire", "faults", "fabric"},
    "tools": {"tools", "core", "wire", "faults", "fabric", "emu", "hw"},
}
# Folders outside the product that must not include abi/ either.
OTHER_FOLDERS = ("tests", "benchmarks")
INTERNAL_ROOTS = set(MODULES) | set(OTHER_FOLDERS)

MAX_LINES = 800
CLOCK_FILE = "core/clock.cpp"
ENV_FILE = "core/env.cpp"
# The launcher is a program of its own, not the library: its own variables are
# no library variables (core/env.cpp's table), so they are read in one file of it.
LAUNCHER_ENV_FILE = "tools/launcher_env.cpp"

CLOCK_READS = re.compile(
    r"steady_clock\s*::\s*now|system_clock\s*::\s*now|high_resolution_clock"
    r"|\bgettimeofday\b|\bclock_gettime\b"
    r"|(?<![\w.>:])(?:std\s*::\s*|::\s*)?time\s*\(\s*(?:nullptr|NULL|0)\s*\)")
GETENV = re.compile(r"getenv")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def strip(text):
    """Returns (code, code_no_strings): text with comments blanked, and also with the
    contents of string and character literals blanked. Line breaks are kept, so line
    numbers stay right."""
    code, bare = [], []
    i, n = 0, len(text)

    def put(s, keep_in_bare):
        code.append(s)
        bare.append(s if keep_in_bare else re.sub(r"[^\n]", " ", s))

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            put(" " * (j - i), True)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank = re.sub(r"[^\n]", " ", text[i:j])
            put(blank, True)
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() and text[i - 1] not in "uUL8")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                put(c, True)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            put(text[i:i + 2], True)
            put(text[i + 2:end], False)
            i = end
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):
            # A ' after a digit or letter is a digit separator (1'000), not a literal.
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            put(c, True)
            put(text[i + 1:j - 1], False)
            put(text[j - 1:j] if j - 1 > i else "", True)
            i = j
        else:
            j = i + 1
            while j < n and text[j] not in "/\"'R":
                j += 1
            put(text[i:j], True)
            i = j
    return "".join(code), "".join(bare)


def sources(root, folders):
    for folder in folders:
        top = os.path.join(root, folder)
        if not os.path.isdir(top):
            continue  # a module that does not exist (yet)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES):
                    path = os.path.join(dirpath, name)
                    yield os.path.relpath(path, root), path


def lines_matching(text, pattern):
    for number, line in enumerate(text.split("\n"), 1):
        m = pattern.search(line)
        if m:
            yield number, m.group(0)


def check_includes(rel, module, code, out):
    for number, line in enumerate(code.split("\n"), 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        target = m.group(1).split("/")[0]
        if target not in INTERNAL_ROOTS or "/" not in m.group(1):
            continue
        if module is None:  # tests, benchmarks
            if target == "abi":
                out.append(f"{rel}:{number}: includes: includes \"{m.group(1)}\"; nothing outside abi/ may "
                           "include abi/ (call the library through its exported C API instead)")
            continue
        allowed = ALLOWED_INCLUDES[module]
        if target not in allowed:
            may = ", ".join(f"{a}/" for a in sorted(allowed))
            out.append(f"{rel}:{number}: includes: {module}/ includes \"{m.group(1)}\"; {module}/ may include "
                       f"only {may} and softverbs/ (move the code, or the interface it needs, to a module "
                       "both may use)")


def check(root, rules):
    """The violations of `rules` in the source tree at `root`, as printable lines."""
    out = []
    for rel, path in sources(root, MODULES):
        module = rel.split(os.sep)[0]
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        code, bare = strip(text)
        if "includes" in rules:
            check_includes(rel, module, code, out)
        if "clock" in rules and rel != CLOCK_FILE:
            for number, what in lines_matching(bare, CLOCK_READS):
                out.append(f"{rel}:{number}: clock: reads the system clock ({what}); only {CLOCK_FILE} may: "
                           "take a softverbs::Clock (core/clock.hpp) and call its now()/wall_now()")
        if "getenv" in rules and rel not in (ENV_FILE, LAUNCHER_ENV_FILE):
            for number, what in lines_matching(bare, GETENV):
                out.append(f"{rel}:{number}: getenv: reads the environment ({what}); only {ENV_FILE} may: add the "
                           "variable to its table and docs/configuration.md, and call its accessor (core/env.hpp)")
        if "size" in rules:
            count = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
            if count > MAX_LINES:
                out.append(f"{rel}:{MAX_LINES + 1}: size: {count} lines, over the limit of {MAX_LINES}: split the "
                           "file along a seam of its responsibilities")
    if "includes" in rules:
        for rel, path in sources(root, OTHER_FOLDERS):
            with open(path, encoding="utf-8", errors="replace") as f:
                code, _ = strip(f.read())
            check_includes(rel, None, code, out)
    return out


# A small tree with one violation of each kind, and look-alikes that are not
# violations (comments, strings, members named time, digit separators), so that
# a checker that silently finds nothing fails.
SELF_TEST_TREE = {
    "core/clock.cpp": "auto t = std::chrono::steady_clock::now();\n",
    "core/env.cpp": 'const char* v = std::getenv("A");\n',
    "tools/launcher_env.cpp": 'const char* p = std::getenv("LD_LIBRARY_PATH");\n',
    "tools/other.cpp": 'const char* q = std::getenv("B");\n',
    "abi/verbs/a.cpp": """#include "emu/x.hpp"
// #include "hw/y.hpp"
/* #include "hw/z.hpp"
   steady_clock::now() getenv */
#include "core/log.hpp"
#include <infiniband/verbs.h>
auto t = ::time(NULL);
auto w = obj.time(nullptr) + runtime(nullptr);
const char* s = "steady_clock::now and getenv in a string";
int big = 1'000'000; char q = '"'; const char* r = R"x(gettimeofday ")x";
auto z = secure_getenv("X");  // getenv
""",
    "wire/b.cpp": '#include "faults/engine.hpp"\n#include "softverbs/faults.h"\n'
                  "auto n = std::chrono::high_resolution_clock::now();\n",
    "emu/c.cpp": '#include "fabric/link.hpp"\n#include "hw/d.hpp"\nclock_gettime(CLOCK_REALTIME, &ts);\n',
    "emu/big.hpp": "x\n" * (MAX_LINES + 1),
    "emu/ok.hpp": "x\n" * MAX_LINES,
    "tests/unit/t.cpp": '#include "abi/common/export.hpp"\n#include "emu/x.hpp"\n',
}
SELF_TEST_EXPECTED = {
    ("abi/verbs/a.cpp", 1, "includes"),
    ("abi/verbs/a.cpp", 7, "clock"),
    ("abi/verbs/a.cpp", 11, "getenv"),
    ("tools/other.cpp", 1, "getenv"),
    ("wire/b.cpp", 1, "includes"),
    ("wire/b.cpp", 3, "clock"),
    ("emu/c.cpp", 2, "includes"),
    ("emu/c.cpp", 3, "clock"),
    ("emu/big.hpp", MAX_LINES + 1, "size"),
    ("tests/unit/t.cpp", 1, "includes"),
}


def self_test():
    with tempfile.TemporaryDirectory() as root:
        for rel, text in SELF_TEST_TREE.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
                f.write(text)
        lines = check(root, ("includes", "clock", "size", "getenv"))
    found = set()
    for line in lines:
        rel, number, rule = line.split(":")[:3]
        found.add((rel, int(number), rule.strip()))
    ok = found == SELF_TEST_EXPECTED
    for item in sorted(SELF_TEST_EXPECTED - found):
        print("self-test: missed %s:%d: %s" % item)
    for item in sorted(found - SELF_TEST_EXPECTED):
        print("self-test: wrongly reported %s:%d: %s" % item)
    print("layout: self-test " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."),
                        help="the source tree (default: this script's repository)")
    parser.add_argument("--rule", action="append", choices=("includes", "clock", "size", "getenv"),
                        help="a rule to check (repeatable; default: all)")
    parser.add_argument("--self-test", action="store_true", help="check the checker on a small tree of its own")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    rules = set(args.rule or ("includes", "clock", "size", "getenv"))
    root = os.path.abspath(args.root)
    if not os.path.isfile(os.path.join(root, CLOCK_FILE)):
        print(f"{root}: not a softverbs source tree (no {CLOCK_FILE})", file=sys.stderr)
        return 2

    out = check(root, rules)
    for line in out:
        print(line)
    checked = ", ".join(sorted(rules))
    if out:
        print(f"layout: {len(out)} violation(s) of: {checked}", file=sys.stderr)
        return 1
    print(f"layout: ok ({checked})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
