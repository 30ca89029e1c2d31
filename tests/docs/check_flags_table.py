#!/usr/bin/env python3
"""Holds docs/operations.md's flags table to `attnd --help`.

    tests/docs/check_flags_table.py ATTND_BIN [OPERATIONS.md]

Every entry of `ATTND_BIN --help` (a flag such as `--port`, a mode such as `--healthcheck`, or a
variable without a flag such as ATTND_BF16) must be a row of the first table under "## Flags"
with the same variable and the same default, and every row of that table must be an entry of
--help. A row names one flag (or none, for a variable without a flag) in backticks in its
first cell, its variable in the second and its default in the third: the first text in
backticks, or "none" where --help says "(none)". Prints an "ok" or "FAIL" line per entry and
per row, and ends with "N passed, N failed" (exit 1 when anything failed).
"""
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# An entry of --help: two blanks, then the flag (and its placeholder) or VARIABLE=PLACEHOLDER.
ENTRY = re.compile(r"^  (--[a-z][a-z0-9-]*|ATTND_[A-Z0-9_]+)(?:[ =].*)?$")

passed = 0
failed = 0


def ok(what):
    global passed
    passed += 1
    print(f"ok {what}")


def fail(what):
    global failed
    failed += 1
    print(f"FAIL {what}")


def help_entries(text):
    """{name: (flag, variable, default)} of every entry of --help; the name is the flag, or the
    variable for an entry without one; variable and default are None where --help gives none."""
    entries = {}
    name = None
    for line in text.split("\n"):
        m = ENTRY.match(line)
        if m:
            name = m.group(1)
            flag = name if name.startswith("--") else None
            entries[name] = [flag, None if flag else name, None]
            continue
        if not line.startswith("      ") and line.strip():
            name = None  # a paragraph of its own, not part of an entry
        if name is None or not line.strip().startswith("default: "):
            continue
        parts = line.strip().split("; ")
        entries[name][2] = parts[0][len("default: "):]
        for part in parts[1:]:
            if part.startswith("env: "):
                entries[name][1] = part[len("env: "):]
    return {k: tuple(v) for k, v in entries.items()}


def cells(line):
    """The cells of a Markdown table row; a pipe escaped as \\| stays in its cell."""
    parts = re.split(r"(?<!\\)\|", line.strip())
    return [c.strip().replace("\\|", "|") for c in parts[1:-1]]


def table_rows(text):
    """[(line number, flag or None, variable or None, default or None)] of the first table
    under "## Flags", or None when there is no such table."""
    lines = text.split("\n")
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == "## Flags")
    except StopIteration:
        return None
    rows = []
    in_table = False
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.startswith("#"):
            break
        if not line.startswith("|"):
            if in_table:
                break
            continue
        if not in_table:
            in_table = True  # the header row
            continue
        c = cells(line)
        if len(c) < 3 or set("".join(c[:3])) <= set("-: "):
            continue  # the delimiter row
        flags = re.findall(r"`(--[a-z][a-z0-9-]*)", c[0])
        variables = re.findall(r"`(ATTND_[A-Z0-9_]+)`", c[1])
        default = re.search(r"`([^`]*)`", c[2])
        if len(flags) > 1 or len(variables) > 1:
            rows.append((i + 1, flags, variables, None))
            continue
        rows.append((i + 1, flags[0] if flags else None, variables[0] if variables else None,
                     default.group(1) if default else (c[2] or None)))
    return rows if in_table else None


def same_default(doc, helps):
    if helps is None:
        return doc is None
    if helps == "(none)":
        return doc is not None and doc.lower() == "none"
    return doc == helps


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    binary = argv[1]
    doc_path = argv[2] if len(argv) > 2 else os.path.join(ROOT, "docs", "operations.md")
    name = os.path.relpath(doc_path, ROOT)
    r = subprocess.run([binary, "--help"], capture_output=True, text=True)
    entries = help_entries(r.stdout)
    if r.returncode != 0 or not entries:
        fail(f"{binary} --help exits 0 and lists its options (exit {r.returncode})")
        print(f"{passed} passed, {failed} failed")
        return 1
    with open(doc_path, encoding="utf-8") as f:
        rows = table_rows(f.read())
    if rows is None:
        fail(f"{name} has a table under \"## Flags\"")
        print(f"{passed} passed, {failed} failed")
        return 1

    by_name = {}
    for line, flag, variable, default in rows:
        if isinstance(flag, list):
            fail(f"{name}:{line}: one flag and one variable per row, not {flag} {variable}")
            continue
        key = flag or variable
        if key is None:
            fail(f"{name}:{line}: a row without a flag or an ATTND_* variable in backticks")
            continue
        if key in by_name:
            fail(f"{name}:{line}: {key} has a row already (line {by_name[key][0]})")
            continue
        by_name[key] = (line, flag, variable, default)

    for key, (flag, variable, default) in entries.items():
        row = by_name.get(key)
        if row is None:
            fail(f"{key}: in --help, not in {name}'s flags table")
            continue
        line, row_flag, row_variable, row_default = row
        problems = []
        if row_flag != flag:
            problems.append(f"flag {row_flag or '(none)'} in the table, {flag or '(none)'} in --help")
        if row_variable != variable:
            problems.append(f"variable {row_variable or '(none)'} in the table, "
                            f"{variable or '(none)'} in --help")
        if not same_default(row_default, default):
            problems.append(f"default {row_default!r} in the table, {default!r} in --help")
        if problems:
            fail(f"{key} ({name}:{line}): " + "; ".join(problems))
        else:
            ok(f"{key}: {variable or 'no variable'}, default {default or 'none'}")

    for key, (line, _, _, _) in sorted(by_name.items(), key=lambda kv: kv[1][0]):
        if key not in entries:
            fail(f"{key} ({name}:{line}): a row of the table, not in --help")

    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
