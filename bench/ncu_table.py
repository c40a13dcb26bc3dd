#!/usr/bin/env python3
"""Per-kernel table from Nsight Compute's raw CSV pages (test/gpu/check.sh profile).

    python3 bench/ncu_table.py <dir>/<row>.csv...

One section per file (a benchmark row at one size): each kernel's launches per
step, median time, DRAM bytes per launch and the bandwidth they amount to,
registers and launch shape; then the kernels' time per step. A step's count
is the fewest launches of any kernel (every kernel runs at least once a step).
"""

import csv
import re
import statistics
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"gradcomp::abi_v[0-9_a-z]+::", "", name)
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    return name if len(name) <= 90 else name[:87] + "..."


def launches(path):
    """Rows of the CSV as dicts (ncu's units row and the program's own output skipped)."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        return []
    header = rows[0]
    return [dict(zip(header, r, strict=False)) for r in rows[1:] if r and r[0].isdigit()]


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return float("nan")


def section(path):
    row = re.sub(r"^.*/|\.csv$", "", path)
    by_kernel = defaultdict(list)
    for launch in launches(path):
        by_kernel[launch["Kernel Name"]].append(launch)
    if not by_kernel:
        print(f"\n{row}: no kernels recorded")
        return
    steps = min(len(v) for v in by_kernel.values())
    print(f"\n### {row} (64M elements; {steps} steps profiled)\n")
    print("| kernel | launches/step | median us | DRAM MB/launch | GB/s | regs | grid x block |")
    print("|---|---:|---:|---:|---:|---:|---|")
    total = 0.0
    order = sorted(by_kernel.items(), key=lambda kv: -sum(number(launch["gpu__time_duration.sum"]) for launch in kv[1]))
    for name, ls in order:
        ns = [number(launch["gpu__time_duration.sum"]) for launch in ls]
        by = [number(launch["dram__bytes_read.sum"]) + number(launch["dram__bytes_write.sum"]) for launch in ls]
        t, b = statistics.median(ns), statistics.median(by)
        total += sum(ns) / steps
        print(
            f"| `{short(name)}` | {len(ls) / steps:.1f} | {t / 1e3:.1f} | {b / 1e6:.1f} | {b / t if t else 0:.0f} | "
            f"{ls[0].get('launch__registers_per_thread', '?')} | "
            f"{ls[0].get('launch__grid_size', '?')} x {ls[0].get('launch__block_size', '?')} |"
        )
    print(f"\nkernel time per step: {total / 1e6:.3f} ms")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        section(p)
