#!/usr/bin/env python3
"""The host benchmark guard: run before landing a change to a hot path.

    bench/guard.py [path/to/gradcomp_bench]      (default: build/bench/gradcomp_bench)

Runs a handful of rows of the host benchmark in one process, three
repetitions each, every repetition beside a copy of the same gradient timed
just before it (bench/common/bandwidth.hpp), and checks relations that hold on
any machine in one run:

  - bf16 is no slower than bf16 with error feedback (which does strictly
    more work), at 1M and 64M elements;
  - fp16 is no slower than 1.5x bf16, at 1M and 64M;
  - each row's copy fraction (the copy's time over the row's, median of the
    repetitions) is at or above its floor.

A floor sits below what the row reaches today on a quiet machine by more than
the run-to-run range, so that only a regression fails it; the target column
is what the host-performance work aims at. Timed tests cannot do this job
(these machines are noisy, and a test must not fail on a busy one), so the
guard does not run in CI: check `vmstat 1` for steal time first, and cite its
output when a change touches a hot path. Exit status 1 when a check fails.
"""

import json
import re
import subprocess
import sys

M1, M64 = 1 << 20, 1 << 26
TRANSFORMER = 113_319_936  # bench/common/layouts.hpp: transformer_layout()

# (row, elements, floor, target): copy fractions.
ROWS = [
    ("copy", M1, None, None),
    ("copy", M64, None, None),
    ("fp32", M64, 0.30, None),
    ("bf16", M1, 0.25, None),
    ("bf16", M64, 0.45, 0.50),
    ("bf16:ef=on", M1, None, None),
    ("bf16:ef=on", M64, 0.30, 0.35),
    ("fp16", M1, None, None),
    ("fp16", M64, 0.45, 0.45),
    ("topkc:fraction=0.01", M64, 0.28, 0.30),
    ("topk:fraction=0.01", M64, 0.15, 0.15),
    ("thc:bits=4,block=1024", M64, 0.15, 0.20),
    ("intsgd", M64, 0.25, 0.25),
    ("global_randk:bits=4,k=10000", M64, 0.55, 0.25),
    ("qsgd_multiscale", M64, 0.15, 0.20),
    ("bf16", TRANSFORMER, None, None),
    ("powersgd:matrix_rank=4", TRANSFORMER, 0.15, 0.20),
]

# (faster row, slower row, factor): median time of the first <= factor x the second's.
RELATIONS = [(a, b, f, d) for d in (M1, M64) for a, b, f in (("bf16", "bf16:ef=on", 1.0), ("fp16", "bf16", 1.5))]


def run(binary):
    names = sorted({f"host/{row}/{elements}/" for row, elements, _, _ in ROWS})
    pattern = "^(" + "|".join(re.escape(n) for n in names) + ")"
    out = subprocess.run(
        [binary, f"--benchmark_filter={pattern}", "--benchmark_repetitions=3", "--benchmark_format=json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        name = b["run_name"].removeprefix("host/").removesuffix("/manual_time")
        row, _, elements = name.rpartition("/")
        r = rows.setdefault((row, int(elements)), {"ms": [], "fraction": []})
        r["ms"].append(b["real_time"] * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")])
        r["fraction"].append(b["copy_fraction"])
    return rows


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "build/bench/gradcomp_bench"
    rows = run(binary)
    failed = []
    print(f"{'row':34} {'elements':>9} {'ms (median, range)':>24} {'copy fraction':>14} {'floor':>6} {'target':>6}")
    for row, elements, floor, target in ROWS:
        r = rows.get((row, elements))
        if r is None:
            failed.append(f"{row} at {elements}: no such row in {binary}")
            continue
        ms, fraction = median(r["ms"]), median(r["fraction"])
        spread = f"{ms:8.3f} ({min(r['ms']):.3f}-{max(r['ms']):.3f})"
        verdict = ""
        if floor is not None and fraction < floor:
            verdict = "  BELOW FLOOR"
            failed.append(f"{row} at {elements}: copy fraction {fraction:.3f} below its floor {floor}")
        elif target is not None and fraction < target:
            verdict = "  (below target)"
        print(f"{row:34} {elements:>9} {spread:>24} {fraction:>14.3f} {floor or '':>6} {target or '':>6}{verdict}")
    for a, b, factor, elements in RELATIONS:
        ta, tb = median(rows[(a, elements)]["ms"]), median(rows[(b, elements)]["ms"])
        ok = ta <= factor * tb
        print(f"{a} {ta:.3f} ms <= {factor} x {b} {tb:.3f} ms at {elements}: {'ok' if ok else 'FAILED'}")
        if not ok:
            failed.append(f"{a} slower than {factor} x {b} at {elements} ({ta:.3f} ms against {tb:.3f})")
    for f in failed:
        print("guard:", f, file=sys.stderr)
    print("guard:", "FAILED" if failed else "passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
