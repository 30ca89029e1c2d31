#!/usr/bin/env python3
"""Checks make bench-report (tests/bench/report.py) on the committed Zen 5 log.

    tests/bench/check_report.py

The charts of docs/bench/zen5-2026-12-02.log are written, carry the log's CPU and date in their
titles, and say what the committed docs/img charts say (the same texts: labels, values,
titles); goodput lines give a goodput chart; a log without bench lines writes nothing and
fails. Ends with "N passed, N failed".
"""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
REPORT = os.path.join(ROOT, "tests", "bench", "report.py")
LOG = os.path.join(ROOT, "docs", "bench", "zen5-2026-12-02.log")
COMMITTED = {"sdpa.svg": "sdpa-zen5-2026-12-02.svg", "peers.svg": "peers-zen5-2026-12-02.svg",
             "decode.svg": "decode-zen5-2026-12-02.svg"}

passed = 0
failed = 0


def check(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print(f"ok {what}")
    else:
        failed += 1
        print(f"FAIL {what}" + (f"\n    {detail}" if detail else ""))


def report(out, *logs):
    return subprocess.run([sys.executable, REPORT, out, *logs], capture_output=True, text=True)


def texts(path):
    with open(path, encoding="utf-8") as f:
        return sorted(t.strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", f.read())
                      if t.strip())


def main():
    with tempfile.TemporaryDirectory() as out:
        r = report(out, LOG)
        check(r.returncode == 0, "the committed log gives charts", r.stdout + r.stderr)
        for made, committed in COMMITTED.items():
            path = os.path.join(out, made)
            if not os.path.exists(path):
                check(False, f"{made} is written")
                continue
            got = texts(path)
            title = " ".join(got)
            check("AMD EPYC Zen 5" in title and "2026-12-02" in title,
                  f"{made}: the title names the log's CPU and date", title[:300])
            want = texts(os.path.join(ROOT, "docs", "img", committed))
            check(got == want, f"{made} says what docs/img/{committed} says",
                  f"differ: {sorted(set(got) ^ set(want))[:20]}")
        check("goodput.svg" not in os.listdir(out) and "no goodput lines" in r.stdout,
              "no goodput lines: a skip line, no goodput chart", r.stdout)

        with open(os.path.join(out, "goodput.log"), "w") as f:
            for x, y in ((1, 0.97), (2, 0.9), (4, 0.8)):
                f.write(f"goodput mix=long offered={x} goodput_ratio={y} p99_ms=310\n")
        g = os.path.join(out, "g")
        r = report(g, os.path.join(out, "goodput.log"))
        check(r.returncode == 0 and os.path.exists(os.path.join(g, "goodput.svg")),
              "goodput lines give goodput.svg", r.stdout + r.stderr)

        e = os.path.join(out, "e")
        r = report(e, os.devnull)
        check(r.returncode != 0 and not os.listdir(e), "a log without bench lines fails, no chart",
              r.stdout + r.stderr)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
