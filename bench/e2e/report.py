#!/usr/bin/env python3
"""Turns the trainer's per-run CSVs (named RATE__COMPRESSOR.csv) into the
time-to-accuracy table, a combined CSV and an accuracy-versus-time plot.

    report.py [--target 0.85] [--csv out.csv] [--plot out.png] RUN.csv ...

Speedup is the bf16 baseline's time-to-accuracy divided by the compressor's,
on the same network; above 1 the compressor reaches the target sooner.
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile

RATE_ORDER = {"unshaped": 0}


def rate_key(rate):
    """Fastest network first: unshaped, then by decreasing bit rate."""
    if rate in RATE_ORDER:
        return (RATE_ORDER[rate], 0)
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return (1, -float(rate[: -len(unit)]) * scale)
    return (2, rate)


def load(paths):
    runs = []
    for path in paths:
        base = os.path.basename(path)[: -len(".csv")]
        if "__" not in base:
            raise SystemExit(f"{path}: expected a name of the form RATE__COMPRESSOR.csv")
        rate, name = base.split("__", 1)
        with open(path) as f:
            rows = [
                {k: float(v) for k, v in row.items() if k not in ("compressor",)} for row in csv.DictReader(f)
            ]
        if not rows:
            raise SystemExit(f"{path}: no evaluations")
        runs.append({"rate": rate, "name": name, "rows": rows})
    return runs


def summarize(run, target):
    rows = run["rows"]
    last = rows[-1]
    reached = next((r["wall_s"] for r in rows if r["test_acc"] >= target), None)
    return {
        "rate": run["rate"],
        "name": run["name"],
        "tta": reached,
        "final_acc": last["test_acc"],
        "wire_per_step": last["wire_bytes"] / last["step"],
        "compress_share": last["compress_s"] / last["wall_s"] if last["wall_s"] > 0 else 0.0,
        "comm_share": last["comm_s"] / last["wall_s"] if last["wall_s"] > 0 else 0.0,
    }


def table(summaries, target):
    lines = [
        f"| network | compressor | time to {target:.0%} (s) | speedup vs bf16 | final accuracy | wire MB/step "
        "| compression share | communication share |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = {s["rate"]: s["tta"] for s in summaries if s["name"] == "bf16"}
    for s in sorted(summaries, key=lambda s: (rate_key(s["rate"]), s["name"])):
        tta = f'{s["tta"]:.1f}' if s["tta"] is not None else "not reached"
        b = base.get(s["rate"])
        speedup = f'{b / s["tta"]:.2f}x' if (b is not None and s["tta"]) else "-"
        lines.append(
            f'| {s["rate"]} | {s["name"]} | {tta} | {speedup} | {s["final_acc"]:.4f} | '
            f'{s["wire_per_step"] / 1e6:.3f} | {s["compress_share"]:.1%} | {s["comm_share"]:.1%} |'
        )
    return "\n".join(lines)


def write_csv(path, runs):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["network", "compressor", "step", "wall_s", "compress_s", "comm_s", "wire_bytes", "test_acc"])
        for run in runs:
            for r in run["rows"]:
                w.writerow([run["rate"], run["name"], int(r["step"]), r["wall_s"], r["compress_s"], r["comm_s"],
                            int(r["wire_bytes"]), r["test_acc"]])


def plot(path, runs, target):
    rates = sorted({r["rate"] for r in runs}, key=rate_key)
    names = sorted({r["name"] for r in runs})
    with tempfile.TemporaryDirectory() as tmp:
        script = [
            f"set terminal pngcairo size {420 * len(rates)},380 font ',9'",
            f"set output '{path}'",
            f"set multiplot layout 1,{len(rates)}",
            "set xlabel 'training time (s)'",
            "set ylabel 'test accuracy'",
            "set yrange [0.6:0.9]",
            "set key bottom right",
            "set grid",
        ]
        for rate in rates:
            plots = []
            for name in names:
                run = next((r for r in runs if r["rate"] == rate and r["name"] == name), None)
                if run is None:
                    continue
                data = os.path.join(tmp, f"{rate}__{name}.dat")
                with open(data, "w") as f:
                    for r in run["rows"]:
                        f.write(f'{r["wall_s"]} {r["test_acc"]}\n')
                plots.append(f"'{data}' using 1:2 with linespoints pt 7 ps 0.5 title '{name}'")
            script.append(f"set title '{rate}'")
            plots.append(f"{target} with lines dt 2 lc rgb 'gray' title 'target'")
            script.append("plot " + ", ".join(plots))
        script.append("unset multiplot")
        subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--csv")
    p.add_argument("--plot")
    p.add_argument("runs", nargs="+")
    a = p.parse_args(argv)
    runs = load(a.runs)
    print(table([summarize(r, a.target) for r in runs], a.target))
    if a.csv:
        write_csv(a.csv, runs)
    if a.plot:
        plot(a.plot, runs, a.target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
