#!/usr/bin/env python3
"""Turns the trainer's per-run CSVs (named RATE__COMPRESSOR.csv, or
RATE__COMPRESSOR__rK.csv for repetition K) into the time-to-accuracy table
(medians over repetitions, with the range), a table of each compressor with
and without overlap (COMPRESSOR~no-overlap), a combined CSV and an
accuracy-versus-time plot.

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


def parse_name(path):
    """RATE__NAME.csv or RATE__NAME__rK.csv (repetition K) -> (rate, name)."""
    base = os.path.basename(path)[: -len(".csv")]
    parts = base.split("__")
    if len(parts) == 3 and parts[2].startswith("r"):
        parts = parts[:2]
    if len(parts) != 2:
        raise SystemExit(f"{path}: expected a name of the form RATE__COMPRESSOR.csv or RATE__COMPRESSOR__rK.csv")
    return parts[0], parts[1]


def load(paths):
    runs = []
    for path in paths:
        rate, name = parse_name(path)
        with open(path) as f:
            rows = [{k: float(v) for k, v in row.items() if k not in ("compressor",)} for row in csv.DictReader(f)]
        if not rows:
            raise SystemExit(f"{path}: no evaluations")
        runs.append({"rate": rate, "name": name, "rows": rows})
    return runs


def summarize(run, target):
    rows = run["rows"]
    last = rows[-1]
    hit = next((r for r in rows if r["test_acc"] >= target), None)
    wall = last["wall_s"]
    return {
        "rate": run["rate"],
        "name": run["name"],
        "tta": hit["wall_s"] if hit else None,
        "steps": hit["step"] if hit else None,
        "final_acc": last["test_acc"],
        "wire_per_step": last["wire_bytes"] / last["step"],
        "ms_per_step": 1e3 * wall / last["step"],
        "compress_share": last["compress_s"] / wall if wall > 0 else 0.0,
        "comm_share": last["comm_s"] / wall if wall > 0 else 0.0,
    }


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def group(summaries):
    """Repetitions of one configuration -> one summary: medians, and the ranges
    of the time and steps to target (None unless every repetition reached it)."""
    groups = {}
    for s in summaries:
        groups.setdefault((s["rate"], s["name"]), []).append(s)
    out = []
    for (rate, name), reps in groups.items():
        reached = [r["tta"] for r in reps if r["tta"] is not None]
        g = {"rate": rate, "name": name, "runs": len(reps)}
        for key in ("final_acc", "wire_per_step", "ms_per_step", "compress_share", "comm_share"):
            g[key] = median([r[key] for r in reps])
        whole = len(reached) == len(reps)
        g["tta"] = median(reached) if whole else None
        g["tta_range"] = (min(reached), max(reached)) if whole else None
        steps = [r["steps"] for r in reps]
        g["steps"] = median(steps) if whole else None
        g["steps_range"] = (min(steps), max(steps)) if whole else None
        g["reached"] = len(reached)
        out.append(g)
    return out


def variant(name):
    """A configuration's variant: what follows '~' (e.g. 'no-overlap'), or ''."""
    return name.split("~", 1)[1] if "~" in name else ""


def baseline_of(name):
    v = variant(name)
    return "bf16" + ("~" + v if v else "")


def table(summaries, target):
    lines = [
        f"| network | compressor | time to {target:.0%} (s) | speedup vs bf16 | final accuracy | wire MB/step "
        "| compression share | communication share | runs | steps to target | ms/step |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    groups = group(summaries)
    base = {(g["rate"], g["name"]): g["tta"] for g in groups}
    for g in sorted(groups, key=lambda g: (rate_key(g["rate"]), g["name"])):
        if g["tta"] is None:
            tta = "not reached" if g["reached"] == 0 else f"{g['reached']} of {g['runs']} reached"
        elif g["runs"] > 1:
            tta = f"{g['tta']:.1f} ({g['tta_range'][0]:.1f}-{g['tta_range'][1]:.1f})"
        else:
            tta = f"{g['tta']:.1f}"
        b = base.get((g["rate"], baseline_of(g["name"])))
        speedup = f"{b / g['tta']:.2f}x" if (b is not None and g["tta"]) else "-"
        if g["steps"] is None:
            steps = "-"
        elif g["steps_range"][0] == g["steps_range"][1]:
            steps = f"{g['steps']:.0f}"
        else:  # repetitions train with different seeds, so their steps differ too
            steps = f"{g['steps']:.0f} ({g['steps_range'][0]:.0f}-{g['steps_range'][1]:.0f})"
        lines.append(
            f"| {g['rate']} | {g['name']} | {tta} | {speedup} | {g['final_acc']:.4f} | "
            f"{g['wire_per_step'] / 1e6:.3f} | {g['compress_share']:.1%} | {g['comm_share']:.1%} | {g['runs']} | "
            f"{steps} | {g['ms_per_step']:.1f} |"
        )
    return "\n".join(lines)


def overlap_table(summaries, target):
    """Each compressor with overlap (NAME) beside without (NAME~no-overlap):
    median time per step and to the target; empty where no pair exists."""
    groups = {(g["rate"], g["name"]): g for g in group(summaries)}
    pairs = sorted(
        ((rate, name) for rate, name in groups if not variant(name) and (rate, name + "~no-overlap") in groups),
        key=lambda k: (rate_key(k[0]), k[1]),
    )
    if not pairs:
        return ""
    lines = [
        f"| network | compressor | ms/step, no overlap | ms/step, overlap | step time | time to {target:.0%}, "
        "no overlap (s) | time to target, overlap (s) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for rate, name in pairs:
        on, off = groups[(rate, name)], groups[(rate, name + "~no-overlap")]
        change = on["ms_per_step"] / off["ms_per_step"] - 1
        t = lambda g: f"{g['tta']:.1f}" if g["tta"] is not None else "not reached"  # noqa: E731
        lines.append(
            f"| {rate} | {name} | {off['ms_per_step']:.1f} | {on['ms_per_step']:.1f} | {change:+.1%} | {t(off)} | "
            f"{t(on)} |"
        )
    return "\n".join(lines)


def write_csv(path, runs):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["network", "compressor", "step", "wall_s", "compress_s", "comm_s", "wire_bytes", "test_acc"])
        for run in runs:
            for r in run["rows"]:
                w.writerow(
                    [
                        run["rate"],
                        run["name"],
                        int(r["step"]),
                        r["wall_s"],
                        r["compress_s"],
                        r["comm_s"],
                        int(r["wire_bytes"]),
                        r["test_acc"],
                    ]
                )


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
                        f.write(f"{r['wall_s']} {r['test_acc']}\n")
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
    summaries = [summarize(r, a.target) for r in runs]
    print(table(summaries, a.target))
    overlap = overlap_table(summaries, a.target)
    if overlap:
        print()
        print(overlap)
    if a.csv:
        write_csv(a.csv, runs)
    if a.plot:
        plot(a.plot, runs, a.target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
