#!/usr/bin/env python3
"""Turns a `make bench` log (and peer lines) into SVG charts (make bench-report).

    tests/bench/report.py OUT_DIR BENCH_LOG [PEER_LOG...]

Writes OUT_DIR/sdpa.svg (every sdpa and mha case against the FMA peak measured with it),
OUT_DIR/peers.svg (the cases a peer also ran: attnd, the peers, the peak), OUT_DIR/decode.svg
(K and V read rate against the memory's) and OUT_DIR/goodput.svg (when the log has goodput
lines). A chart with no data is skipped with a line saying so. Peer lines are JSON objects with
"impl", B, H, LQ, LK, D, causal and gflops_useful, as ggml_fa_bench prints them, found in the
bench log and in every PEER_LOG. Each title names the CPU and the date: the log's `# cpu:` and
`# date:` lines, else the CPU of its engine start-up line or of this machine, and the log
file's date.
"""
import datetime
import json
import os
import re
import sys

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "attnd",
                            "font.size": 9, "axes.titlesize": 10})

written = 0  # charts saved by this run
PAIR = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)")


def fields(line):
    """key=value pairs of a bench line, numbers as floats where they parse."""
    out = {}
    for k, v in PAIR.findall(line):
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = v
    return out


def read_lines(paths):
    lines = []
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as f:
            lines += [line.rstrip("\n") for line in f]
    return lines


def machine_cpu():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + " (the machine of this report)"
    except OSError:
        pass
    return "unknown CPU"


def provenance(path, lines):
    """(cpu, date) of the log, for the titles."""
    cpu = date = None
    for line in lines:
        if line.startswith("# cpu:") and cpu is None:
            cpu = line.split(":", 1)[1].strip()
        elif line.startswith("# date:") and date is None:
            date = line.split(":", 1)[1].strip()
        elif cpu is None and "engine kernels" in line:
            m = re.search(r"engine kernels \S+ on (.+?) \(", line)
            if m:
                cpu = m.group(1)
    if date is None:
        date = datetime.date.fromtimestamp(os.path.getmtime(path)).isoformat()
    return cpu or machine_cpu(), date


def case_label(f, kind):
    if kind == "mha":
        label = f"mha E={int(f['e'])} H={int(f['h'])} L={int(f['l'])}"
    else:
        label = "({},{},{},{},{})".format(*(int(f[k]) for k in ("b", "h", "l", "s", "d")))
    if f.get("causal") == 1:
        label += " causal"
    if f.get("precision") == "bf16":
        label += " bf16"
    return label


def compute_cases(lines):
    """sdpa and mha lines with a peak (not decode: those go to the bandwidth chart)."""
    cases = []
    for line in lines:
        kind = line.split(" ", 1)[0]
        if kind not in ("sdpa", "mha"):
            continue
        f = fields(line)
        if "gflops" not in f or "peak_gflops" not in f or "kv_gbps" in f:
            continue
        cases.append({"label": case_label(f, kind), "kind": kind, "f": f})
    return cases


def peer_series(lines):
    """{series name: {(B, H, LQ, LK, D, causal): useful GFLOPS}} from JSON peer lines."""
    series = {}
    for line in lines:
        line = line.strip()
        if not line.startswith("{") or '"impl"' not in line:
            continue
        try:
            p = json.loads(line)
            key = tuple(int(p[k]) for k in ("B", "H", "LQ", "LK", "D", "causal"))
            value = float(p["gflops_useful"])
        except (ValueError, KeyError, TypeError):
            continue
        name = p["impl"].replace("_flash_attn_ext_cpu", "")
        if p.get("kv_type"):
            name += f" {p['kv_type']} K/V"
        series.setdefault(name, {})[key] = value
    return series


def case_key(case):
    f = case["f"]
    if case["kind"] != "sdpa" or f.get("precision") == "bf16":
        return None
    return tuple(int(f[k]) for k in ("b", "h", "l", "s", "d")) + (int(f.get("causal", 0)),)


def barh_groups(ax, labels, groups):
    """Horizontal bars, one group per label; groups: [(name, values, style)]."""
    n = len(groups)
    height = 0.8 / n
    for i, (name, values, style) in enumerate(groups):
        ys = [y + (i - (n - 1) / 2) * height for y in range(len(labels))]
        pts = [(y, v) for y, v in zip(ys, values) if v is not None]
        if not pts:
            continue
        bars = ax.barh([p[0] for p in pts], [p[1] for p in pts], height=height, label=name,
                       **style)
        ax.bar_label(bars, fmt="%.0f", padding=2, fontsize=7)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)


def save(fig, out_dir, name):
    global written
    written += 1
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
    print("wrote", path)


def chart_sdpa(cases, title, out_dir):
    if not cases:
        print("no sdpa or mha lines with peak_gflops: sdpa.svg skipped")
        return
    labels = [c["label"] for c in cases]
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(cases) + 1.4))
    barh_groups(ax, labels, [
        ("FMA peak (bf16 lines: the bf16 path's)", [c["f"]["peak_gflops"] for c in cases],
         {"color": "#dddddd", "edgecolor": "#888888"}),
        ("attnd", [c["f"]["gflops"] for c in cases], {"color": "#1f77b4"}),
    ])
    ax.set_xlabel("GFLOPS (useful work: 4·B·H·L·S·D, halved for causal self-attention)")
    ax.set_title(f"attnd per case against the FMA peak\n{title}")
    save(fig, out_dir, "sdpa.svg")


def chart_peers(cases, peers, title, out_dir):
    matched = [c for c in cases if case_key(c) and any(case_key(c) in s for s in peers.values())]
    if not matched:
        print("no peer line matches a case of the log: peers.svg skipped")
        return
    labels = [c["label"] for c in matched]
    groups = [("FMA peak", [c["f"]["peak_gflops"] for c in matched],
               {"color": "#dddddd", "edgecolor": "#888888"}),
              ("attnd", [c["f"]["gflops"] for c in matched], {"color": "#1f77b4"})]
    colors = ["#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
    for i, (name, values) in enumerate(sorted(peers.items())):
        groups.append((name, [values.get(case_key(c)) for c in matched],
                       {"color": colors[i % len(colors)]}))
    fig, ax = plt.subplots(figsize=(10, 0.9 * len(matched) + 1.6))
    barh_groups(ax, labels, groups)
    ax.set_xlabel("GFLOPS, (B,H,L,S,D) float32 (useful work: causal counts half)")
    ax.set_title(f"attnd against its peers and the FMA peak\n{title}")
    save(fig, out_dir, "peers.svg")


def chart_decode(lines, title, out_dir):
    rows = []
    for line in lines:
        kind = line.split(" ", 1)[0]
        if kind not in ("sdpa", "session"):
            continue
        f = fields(line)
        kv = f.get("kv_gbps", f.get("kv_read_gbps"))
        mem = f.get("mem_gbps", f.get("stream_gbps"))
        if kv is None or mem is None:
            continue
        if kind == "sdpa":
            label = "sdpa decode h={} kv_heads={} s={}".format(
                int(f["h"]), int(f.get("kv_heads", f["h"])), int(f["s"]))
        else:
            words = line.split()
            label = "session {} {}={} kv_heads={} {}".format(
                words[1], "seqs" if "seqs" in f else "sessions",
                int(f.get("seqs", f.get("sessions", 1))), int(f.get("kv_heads", f.get("h", 0))),
                f.get("cache", f.get("dtype", "")))
            if "steps_per_s" in f:
                label += " (HTTP)"
        rows.append((label, kv, mem))
    if not rows:
        print("no lines with kv_gbps and mem_gbps: decode.svg skipped")
        return
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.4))
    barh_groups(ax, [r[0] for r in rows], [
        ("memory's streaming read", [r[2] for r in rows],
         {"color": "#dddddd", "edgecolor": "#888888"}),
        ("K and V read by attnd", [r[1] for r in rows], {"color": "#1f77b4"}),
    ])
    ax.set_xlabel("GB/s")
    ax.set_title(f"Decode: K and V read rate against the memory's\n{title}")
    save(fig, out_dir, "decode.svg")


def chart_goodput(lines, title, out_dir):
    points = {}
    xkeys = ("offered_x", "offered", "offer", "load", "multiple", "x")
    for line in lines:
        if not line.startswith("goodput"):
            continue
        f = fields(line)
        xk = next((k for k in xkeys if isinstance(f.get(k), float)), None)
        yk = next((k for k in f if "goodput" in k and isinstance(f[k], float)), None)
        if xk is None or yk is None:
            continue
        series = " ".join(f"{k}={f[k]}" for k in ("mix", "kind", "case") if k in f) or yk
        points.setdefault(series, []).append((f[xk], f[yk]))
    if not points:
        print("no goodput lines: goodput.svg skipped")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, pts in sorted(points.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel("offered load (x capacity)")
    ax.set_ylabel("goodput (/ capacity)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Goodput under overload\n{title}")
    save(fig, out_dir, "goodput.svg")


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out_dir, log, peer_logs = argv[1], argv[2], argv[3:]
    lines = read_lines([log])
    cpu, date = provenance(log, lines)
    title = f"{cpu}, {date}"
    os.makedirs(out_dir, exist_ok=True)
    cases = compute_cases(lines)
    chart_sdpa(cases, title, out_dir)
    chart_peers(cases, peer_series(lines + read_lines(peer_logs)), title, out_dir)
    chart_decode(lines, title, out_dir)
    chart_goodput(lines, title, out_dir)
    if written == 0:
        print(f"{log}: no line of make bench found, no chart written", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
