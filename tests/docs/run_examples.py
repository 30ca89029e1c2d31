#!/usr/bin/env python3
"""Runs every example block of README.md and docs/*.md against a real daemon.

    tests/docs/run_examples.py ATTND_BIN [FILE.md...]

A block is an example when its fence's info string is `sh example` (or `bash example`) or
`python example`; a word `fails` after it says the block shows an error reply. The daemon
starts on 127.0.0.1 with ephemeral ports, and every `localhost:8080` / `127.0.0.1:8080` of a
block (`:9090`, the admin port) is turned into them. Each block runs in a scratch folder of its
own that links the repository's files, `build/` being the folder of ATTND_BIN. Shell blocks run under `bash -e -o pipefail`,
their curl with `--fail-with-body` unless it writes the status itself (`-w`), and a `fails`
block must print an "error" reply; Python blocks run with this interpreter and must exit 0.
A Python block that imports a module this machine lacks (numpy, requests, tritonclient) prints
a skip line naming it. Triton's client is the one python3 imports, or else the sources in
$ATTND_PEERS/tritonclient when that is set.

Also checked: every `--flag` written as code and every ATTND_* variable in those files is one
that `ATTND_BIN --help` lists, and every relative link leads to a file and heading that exist.
Ends with "N passed, N failed".
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FENCE = re.compile(r"^```(sh|bash|python)\s+example\b(.*)$")
BLOCK_TIMEOUT_S = 120
# ATTND_* variables that are not a flag's: ATTND_BF16 (a variable only) and the test harness's.
OTHER_VARIABLES = {"ATTND_BF16", "ATTND_BIN", "ATTND_TEST_QUICK", "ATTND_NGINX", "ATTND_PEERS"}
# Flags of other tools the docs show as code: perf_analyzer's, apt-get's.
OTHER_FLAGS = {"--input-data", "--measurement-interval", "--request-parameter",
               "--stability-percentage", "--concurrency-range", "--no-install-recommends"}

# A curl of an example fails on an HTTP error, unless it writes the status itself (-w), which
# the example then shows or checks.
CURL_WRAPPER = """curl() {
    case " $* " in
    *" -w "* | *" --write-out "*) command curl "$@" ;;
    *) command curl --fail-with-body "$@" ;;
    esac
}
"""

passed = 0
failed = 0


def ok(what):
    global passed
    passed += 1
    print(f"ok {what}")


def fail(what, detail=""):
    global failed
    failed += 1
    print(f"FAIL {what}")
    if detail:
        print("    " + detail.rstrip().replace("\n", "\n    "))


def skip(what, why):
    print(f"skip {what}: {why}")


def blocks(path):
    """(line, language, flags, text) of each example block of a Markdown file."""
    out = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i + 1
        j = start
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        out.append((start, m.group(1), m.group(2).split(), "\n".join(lines[start:j]) + "\n"))
        i = j + 1
    return out


def start_daemon(binary, work):
    port_file = os.path.join(work, "port")
    admin_file = os.path.join(work, "admin_port")
    log = open(os.path.join(work, "attnd.log"), "w")
    proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", "0", "--port-file",
                             port_file, "--admin-port", "0", "--admin-port-file", admin_file,
                             "--log-level", "warn"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
            with open(port_file) as f:
                port = f.read().strip()
            with open(admin_file) as f:
                admin = f.read().strip()
            return proc, port, admin
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    return None, None, None


def tritonclient_path(work):
    """A folder holding Triton's Python client unpacked from $ATTND_PEERS/tritonclient, or None."""
    peers = os.environ.get("ATTND_PEERS")
    tgz = glob.glob(os.path.join(peers, "tritonclient", "tritonclient-*.tgz")) if peers else []
    if not tgz:
        return None
    dest = os.path.join(work, "tritonclient")
    with tarfile.open(tgz[0]) as t:
        t.extractall(dest)
    return dest


def imported_modules(text):
    mods = []
    for line in text.split("\n"):
        m = re.match(r"^(?:import|from)\s+([A-Za-z_][\w.]*)", line)
        if m:
            mods.append(m.group(1))
    return mods


def missing_module(text, env):
    for mod in imported_modules(text):
        r = subprocess.run([sys.executable, "-c", f"import {mod}"], env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().split("\n") or [""])[-1]
            return f"python module {mod} is not importable here ({last})"
    return None


def scratch_folder(work, binary):
    """A folder that looks like the repository (its entries linked, build/ the binary's folder)
    and keeps what a block writes out of it."""
    scratch = tempfile.mkdtemp(dir=work)
    for name in os.listdir(ROOT):
        if name not in ("build", ".git"):
            os.symlink(os.path.join(ROOT, name), os.path.join(scratch, name))
    os.symlink(os.path.dirname(binary), os.path.join(scratch, "build"))
    return scratch


def run_in_group(cmd, text, cwd, env):
    """(exit status or None on timeout, output) of cmd fed text, in a process group of its own:
    whatever it left running (a daemon a block started) is ended with it."""
    with tempfile.TemporaryFile(mode="w+") as out:
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                             cwd=cwd, env=env, text=True, start_new_session=True)
        p.stdin.write(text)
        p.stdin.close()
        try:
            code = p.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        p.wait()
        out.seek(0)
        return code, out.read()


def run_block(where, lang, flags, text, env, scratch):
    expect_error = "fails" in flags
    if lang == "python":
        why = missing_module(text, env)
        if why:
            skip(where, why)
            return
        cmd = [sys.executable, "-"]
    else:
        prelude = f'python3() {{ "{sys.executable}" "$@"; }}\n'
        if not expect_error:
            prelude += CURL_WRAPPER
        text = prelude + text
        cmd = ["bash", "-e", "-o", "pipefail", "-s"]
    code, output = run_in_group(cmd, text, scratch, env)
    if code is None:
        fail(where, f"still running after {BLOCK_TIMEOUT_S} s\n{output[-3000:]}")
        return
    if code != 0:
        fail(where, f"exit {code}\n{output[-3000:]}")
    elif expect_error and '"error"' not in output:
        fail(where, f"a `fails` block printed no error reply\n{output[-3000:]}")
    else:
        ok(where)


def check_flags(binary, files):
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    flags = set(re.findall(r"^\s+(--[a-z][a-z0-9-]*)", help_text, re.M))
    variables = set(re.findall(r"env: (ATTND_[A-Z0-9_]+)", help_text)) | OTHER_VARIABLES
    unknown = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        name = os.path.relpath(path, ROOT)
        # A flag as inline code of its own: `--flag` or `--flag VALUE` / `--flag=VALUE`.
        for flag in re.findall(r"`(--[a-z][a-z0-9-]*)(?:[ =][^`]*)?`", text):
            if flag not in flags and flag not in OTHER_FLAGS:
                unknown.append(f"{flag} ({name})")
        for var in re.findall(r"\bATTND_[A-Z0-9_]*[A-Z0-9]\b", text):
            if var not in variables:
                unknown.append(f"{var} ({name})")
    if unknown:
        fail("flags and ATTND_* variables of the docs exist in --help",
             "unknown: " + ", ".join(sorted(set(unknown))))
    else:
        ok("flags and ATTND_* variables of the docs exist in --help")


def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"^```.*?^```", "", f.read(), flags=re.M | re.S)
    return {slug(h) for h in re.findall(r"^#+\s+(.+)$", text, re.M)}


def check_links(files):
    """Every relative link of the docs names a file that exists, and a heading of it."""
    broken = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        base = os.path.dirname(path)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(base, file)) if file else path
            where = f"{target} ({os.path.relpath(path, ROOT)})"
            if not os.path.exists(dest):
                broken.append(where + ": no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                broken.append(where + ": no such heading")
    if broken:
        fail("relative links of the docs lead somewhere", "\n".join(broken))
    else:
        ok("relative links of the docs lead somewhere")


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    binary = os.path.abspath(argv[1])
    files = argv[2:] or [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "*.md")))
    check_flags(binary, files)
    check_links(files)
    work = tempfile.mkdtemp(prefix="attnd-docs-")
    proc, port, admin = start_daemon(binary, work)
    if proc is None:
        fail("the daemon starts", open(os.path.join(work, "attnd.log")).read())
        print(f"{passed} passed, {failed} failed")
        return 1
    env = dict(os.environ)
    triton = tritonclient_path(work)
    if triton:
        env["PYTHONPATH"] = triton + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        for path in files:
            name = os.path.relpath(path, ROOT)
            for line, lang, flags, text in blocks(path):
                text = re.sub(r"\b(localhost|127\.0\.0\.1):8080\b", f"127.0.0.1:{port}", text)
                text = re.sub(r"\b(localhost|127\.0\.0\.1):9090\b", f"127.0.0.1:{admin}", text)
                scratch = scratch_folder(work, binary)
                run_block(f"{name}:{line} ({lang})", lang, flags, text, env, scratch)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    if rc == 0:
        ok("the daemon drains and exits 0 after the examples")
    else:
        fail("the daemon drains and exits 0 after the examples",
             f"exit {rc}\n" + open(os.path.join(work, "attnd.log")).read()[-3000:])
    shutil.rmtree(work, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
