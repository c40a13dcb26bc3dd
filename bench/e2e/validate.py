#!/usr/bin/env python3
"""The planner's predictions against measured steps (validate.sh's runs).

Each run is RATE__LABEL__rK.log and .csv in the folder: LABEL "auto" is the
planner's choice (its log holds the "prediction: spec=S ms=T" lines of every
candidate and of the choice), "cI" the I-th candidate trained alone. The
measured time per step is that of the reductions (compress_s + comm_s of the
CSV, between its first and last evaluation). Medians over repetitions, with
the range.

The pick is judged by what was picked: where every run chose one candidate
in every bucket (the plan's "<- chosen" lines), the choice trains that
candidate's bits, and its step is that candidate's measured step; a mix of
candidates is judged by the choice's own runs.

    validate.py --candidates "SPEC SPEC ..." [--out table.md] FOLDER...

Several folders (one layout each, e.g. one node and two) make one table:
each row's rate is then named with its folder's, and the summary counts
them all.
"""

import argparse
import csv
import glob
import os
import re
import statistics
import sys

from report import rate_key


def measured_ms(path):
    """Reductions per step between the first and the last evaluation (ms)."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if len(rows) < 2:
        raise ValueError(f"{path}: fewer than two evaluations")
    first, last = rows[0], rows[-1]
    steps = int(last["step"]) - int(first["step"])
    seconds = (float(last["compress_s"]) + float(last["comm_s"])) - (
        float(first["compress_s"]) + float(first["comm_s"])
    )
    return seconds / steps * 1e3


def predictions(path):
    """{spec: predicted ms} from an auto run's log ("auto": the choice)."""
    out = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"prediction: spec=(\S+) ms=([0-9.]+)", line)
            if m:
                out[m.group(1)] = float(m.group(2))
    return out


def chosen(path):
    """The specs an auto run's plan chose, one per planned bucket."""
    with open(path) as f:
        return tuple(m.group(1) for m in re.finditer(r"^  (\S+)\s.*<- chosen$", f.read(), re.M))


def median_range(values):
    return statistics.median(values), min(values), max(values)


def fmt(values):
    m, lo, hi = median_range(values)
    return f"{m:.2f} ({lo:.2f}-{hi:.2f})" if len(values) > 1 else f"{m:.2f}"


def canonical(spec, known):
    """The planner prints canonical spec strings: match a candidate by its
    name and keys, whatever their order."""

    def keyset(s):
        name, _, keys = s.partition(":")
        return name, frozenset(k for k in keys.split(",") if k)

    for k in known:
        if keyset(k)[0] == keyset(spec)[0] and keyset(spec)[1] <= keyset(k)[1]:
            return k
    return None


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", required=True)
    parser.add_argument("--out")
    parser.add_argument("folders", nargs="+")
    a = parser.parse_args(argv)
    candidates = a.candidates.split()
    runs = {}  # ((folder's index, rate), label) -> [(k, measured ms, (predictions, choices) or None)]
    paths = [
        (i, path) for i, folder in enumerate(a.folders) for path in glob.glob(os.path.join(folder, "*__*__r*.csv"))
    ]
    for i, path in paths:
        rate, label, rk = os.path.basename(path)[: -len(".csv")].split("__")
        log = path[: -len(".csv")] + ".log"
        runs.setdefault(((i, rate), label), []).append(
            (int(rk[1:]), measured_ms(path), (predictions(log), chosen(log)) if label == "auto" else None)
        )
    places = sorted({p for p, _ in runs}, key=lambda p: (p[0], rate_key(p[1])))
    layout = [os.path.basename(os.path.normpath(f)) + " " if len(a.folders) > 1 else "" for f in a.folders]
    lines = ["| rate | compressor | predicted ms | measured ms | error |", "|---|---|---:|---:|---:|"]
    errors, picks = [], []
    for place in places:
        rate = layout[place[0]] + place[1]
        auto = runs.get((place, "auto"), [])
        if not auto:
            continue
        predicted = {}  # candidate or "auto" -> [ms per repetition]
        for _, _, (p, _) in auto:
            for spec, ms in p.items():
                key = "auto" if spec == "auto" else canonical(spec, candidates)
                if key:
                    predicted.setdefault(key, []).append(ms)
        measured = {c: [m for _, m, _ in runs.get((place, f"c{i}"), [])] for i, c in enumerate(candidates)}
        measured["auto"] = [m for _, m, _ in auto]
        for c in candidates + ["auto"]:
            if not predicted.get(c) or not measured.get(c):
                continue
            p, m = statistics.median(predicted[c]), statistics.median(measured[c])
            error = (p - m) / m
            errors.append(abs(error))
            name = "the planner's choice" if c == "auto" else c
            lines.append(f"| {rate} | {name} | {fmt(predicted[c])} | {fmt(measured[c])} | {error:+.0%} |")
        fixed = {c: statistics.median(v) for c, v in measured.items() if v and c != "auto"}
        best = min(fixed, key=fixed.get)
        picked = {canonical(spec, candidates) for _, _, (_, specs) in auto for spec in specs}
        own = statistics.median(measured["auto"]) / fixed[best]
        if not picked or None in picked:
            ratio, how = own, "not read from the logs: its own runs"
        elif len(picked) > 1:
            ratio, how = own, "a mix: its own runs"
        elif next(iter(picked)) in fixed:
            (one,) = picked
            ratio, how = fixed[one] / fixed[best], f"{one} in every bucket: its step"
        else:
            ratio, how = own, f"{next(iter(picked))} in every bucket, not run alone: its own runs"
        picks.append(ratio <= 1.05)  # (the printed ratio rounds: 1.05 may be just past it)
        lines.append(f"| {rate} | *fastest measured: {best}; the choice ({how}) at {ratio:.2f}x it* | | | |")
    summary = (
        f"\nMedian absolute error: {statistics.median(errors):.0%} over {len(errors)} rows; "
        f"the choice within 5% of the measured fastest at {sum(picks)} of {len(picks)} "
        f"{'rates' if len(a.folders) == 1 else 'rates and layouts'}.\n"
    )
    text = "\n".join(lines) + "\n" + summary
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
