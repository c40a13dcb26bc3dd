#!/usr/bin/env python3
"""Prints Google Benchmark JSON from gradcomp's benchmark binaries as one
markdown table: time per step, gradient bytes per second, fraction of the
copy bandwidth measured in the same run, wire bytes per element, and the
time relative to the bf16 baseline row of the same space and size. With
--benchmark_repetitions the time is the median and its range (the fastest
and slowest repetition) follows it.

    table.py results.json [more.json ...]
"""

import json
import sys


def milliseconds(b):
    return b.get("real_time", 0.0) * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]


def rows(paths):
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        benchmarks = data.get("benchmarks", [])
        # With --benchmark_repetitions keep the median of each row, and the
        # range of its repetitions.
        repeats = {}
        for b in benchmarks:
            if b.get("run_type") == "iteration" and b.get("repetitions", 1) > 1 and not b.get("error_occurred"):
                repeats.setdefault(b.get("run_name", b["name"]), []).append(milliseconds(b))
        for b in benchmarks:
            if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
                continue
            if b.get("run_type") == "iteration" and b.get("repetitions", 1) > 1:
                continue
            parts = b["name"].split("/")
            if len(parts) < 3:
                continue
            space, what, size = parts[0], parts[1], parts[2]
            yield {
                "space": space,
                "what": what,
                "elements": int(size),
                "skipped": b.get("error_occurred", False),
                "message": b.get("error_message", ""),
                "ms": milliseconds(b),
                "range": repeats.get(b.get("run_name", b["name"]), []),
                "gbps": b.get("bytes_per_second", 0.0) / 1e9,
                "copy_fraction": b.get("copy_fraction", 0.0),
                "wire": b.get("wire_B_per_elem", 0.0),
                "error": b.get("step_rel_error"),
            }


def main(paths):
    table = list(rows(paths))
    if not table:
        print("no benchmark rows found")
        return 1
    bf16 = {(r["space"], r["elements"]): r["ms"] for r in table if r["what"] == "bf16" and not r["skipped"]}
    print(
        "| row | elements | ms/step (range) | GB/s (gradient) | copy fraction | wire B/elem | time vs bf16 "
        "| one-step rel. error |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in table:
        name = f"{r['space']}/{r['what']}"
        if r["skipped"]:
            print(f"| {name} | {r['elements']:,} | skipped: {r['message']} | | | | | |")
            continue
        base = bf16.get((r["space"], r["elements"]))
        ratio = f"{r['ms'] / base:.2f}x" if base else "-"
        error = f"{r['error']:.2e}" if r["error"] is not None else "-"
        spread = f" ({min(r['range']):.3f}-{max(r['range']):.3f})" if r["range"] else ""
        print(
            f"| {name} | {r['elements']:,} | {r['ms']:.3f}{spread} | {r['gbps']:.1f} | {r['copy_fraction']:.2f} "
            f"| {r['wire']:.2f} | {ratio} | {error} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
