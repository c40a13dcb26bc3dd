#!/usr/bin/env python3
"""Tests the time-to-accuracy report of bench/e2e on recorded trainer CSVs
(test/data/e2e), without shaping a network."""

import contextlib
import io
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench", "e2e"))
import report  # noqa: E402
import validate  # noqa: E402

DATA = os.path.join(HERE, "data", "e2e")
RUNS = sorted(os.path.join(DATA, f) for f in os.listdir(DATA))


def run(*args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert report.main(list(args) + RUNS) == 0
    return out.getvalue().splitlines()


class ReportTest(unittest.TestCase):
    def test_time_to_accuracy_and_speedup_over_bf16(self):
        lines = run("--target", "0.8")
        rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in lines[2:]}
        # 1gbit: bf16 first reaches 0.80 at 2.56 s, TopK-Chunked at 0.54 s: 4.72x.
        topkc = [c.strip() for c in rows[("1gbit", "topkc-10%")].strip("|").split("|")]
        self.assertEqual(topkc[2], "0.5")
        self.assertEqual(topkc[3], "4.72x")
        self.assertEqual(topkc[4], "0.8126")
        self.assertEqual(topkc[5], "0.112")  # 11171600 bytes over 100 steps
        self.assertEqual(topkc[6], "6.6%")  # 0.0355 s of 0.542 s compressing
        self.assertEqual([c.strip() for c in rows[("1gbit", "topk-1%")].strip("|").split("|")][3], "0.85x")
        self.assertEqual([c.strip() for c in rows[("unshaped", "topkc-10%")].strip("|").split("|")][3], "0.57x")
        self.assertEqual([c.strip() for c in rows[("1gbit", "bf16")].strip("|").split("|")][3], "1.00x")
        # Fastest network first.
        networks = [line.split("|")[1].strip() for line in lines[2:]]
        self.assertEqual(networks, sorted(networks, key=report.rate_key))
        self.assertEqual(networks[0], "unshaped")

    def test_unreached_target(self):
        lines = run("--target", "0.9")
        for line in lines[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            self.assertEqual(cells[2], "not reached")
            self.assertEqual(cells[3], "-")

    def test_combined_csv_and_plot(self):
        with tempfile.TemporaryDirectory() as tmp:
            csv_path = os.path.join(tmp, "all.csv")
            png = os.path.join(tmp, "plot.png")
            args = ["--csv", csv_path] + (["--plot", png] if shutil.which("gnuplot") else [])
            run(*args)
            with open(csv_path) as f:
                lines = f.read().splitlines()
            self.assertEqual(lines[0], "network,compressor,step,wall_s,compress_s,comm_s,wire_bytes,test_acc")
            self.assertEqual(len(lines), 1 + 4 + 2 + 4 + 4 + 4)
            if shutil.which("gnuplot"):
                with open(png, "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


REPS = sorted(os.path.join(HERE, "data", "e2e-reps", f) for f in os.listdir(os.path.join(HERE, "data", "e2e-reps")))


class RepetitionsTest(unittest.TestCase):
    """Three recorded runs per configuration, with and without overlap."""

    def lines(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert report.main(["--target", "0.85"] + REPS) == 0
        return out.getvalue().splitlines()

    def test_medians_ranges_and_speedup_within_a_variant(self):
        lines = self.lines()
        rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in lines[2:6]}
        cells = [c.strip() for c in rows[("1gbit", "topkc-10%~no-overlap")].strip("|").split("|")]
        # The three runs reach 85% at 3.616, 3.717 and 3.439 s, all at step 275.
        self.assertEqual(cells[2], "3.6 (3.4-3.7)")
        # bf16~no-overlap (its own variant's baseline): median 8.339 s; 8.339 / 3.616 = 2.31.
        self.assertEqual(cells[3], "2.31x")
        self.assertEqual(cells[8], "3")
        self.assertEqual(cells[9], "275")

    def test_overlap_table_pairs_each_compressor(self):
        lines = self.lines()
        start = lines.index("") + 1
        overlap = {c[1]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in lines[start + 2 :])}
        self.assertEqual(set(overlap), {"bf16", "topkc-10%"})
        self.assertEqual(overlap["topkc-10%"][2], "13.1")  # median ms/step without overlap
        self.assertEqual(overlap["topkc-10%"][3], "16.1")
        self.assertEqual(overlap["topkc-10%"][4], "+22.2%")

    def test_a_configuration_not_always_reaching_the_target(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            report.main(["--target", "0.8525"] + REPS)  # bf16 ends at 0.8527, TopK-Chunked at 0.8521
        cells = {
            tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in out.getvalue().splitlines()[2:6]
        }
        self.assertIn("| 1gbit | bf16 |", cells[("1gbit", "bf16")])
        self.assertIn("not reached", cells[("1gbit", "topkc-10%")])


class SeedsTest(unittest.TestCase):
    """Repetitions with different seeds reach the target at different steps:
    the table gives their median and range."""

    def test_steps_to_target_median_and_range(self):
        with tempfile.TemporaryDirectory() as tmp:
            # Each run crosses 0.85 at its own step (50, 100, 75), at 0.1 s a step.
            for k, hit in ((1, 50), (2, 100), (3, 75)):
                with open(os.path.join(tmp, f"1gbit__bf16__r{k}.csv"), "w") as f:
                    f.write("step,wall_s,compress_s,comm_s,wire_bytes,test_acc\n")
                    for step in range(25, 125, 25):
                        f.write(f"{step},{step / 10},0,0,{step * 1000},{0.86 if step >= hit else 0.80}\n")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                report.main(["--target", "0.85"] + sorted(os.path.join(tmp, f) for f in os.listdir(tmp)))
        cells = [c.strip() for c in out.getvalue().splitlines()[2].strip("|").split("|")]
        self.assertEqual(cells[2], "7.5 (5.0-10.0)")
        self.assertEqual(cells[9], "75 (50-100)")


class ValidateTest(unittest.TestCase):
    """validate.py on made-up runs whose answer is known."""

    def write(self, folder, rate, label, k, ms_per_step, predictions=(), chosen=()):
        with open(os.path.join(folder, f"{rate}__{label}__r{k}.csv"), "w") as f:
            f.write("compressor,ranks,step,epoch,wall_s,compress_s,comm_s,exposed_s,wire_bytes,loss,test_acc\n")
            f.write("x,4,20,0.1,1.0,0.5,1.5,0,0,1,0.1\n")  # the first 20 steps are left out
            f.write(f"x,4,80,0.4,2.0,0.5,{1.5 + 0.06 * ms_per_step},0,0,1,0.2\n")
        with open(os.path.join(folder, f"{rate}__{label}__r{k}.log"), "w") as f:
            f.write("Network ...\n" + "".join(f"  {s}  0.1  0.2  0.3  100  0.90x  <- chosen\n" for s in chosen))
            f.write("".join(f"prediction: spec={s} ms={t}\n" for s, t in predictions))

    def test_errors_and_picks(self):
        with tempfile.TemporaryDirectory() as folder:
            for k, scale in ((1, 1.0), (2, 1.1), (3, 0.9)):
                self.write(
                    folder,
                    "1gbit",
                    "auto",
                    k,
                    10 * scale,
                    [("bf16", 12), ("topkc:chunk_size=256,fraction=0.1", 9), ("auto", 9)],
                    ["bf16", "topkc:chunk_size=256,fraction=0.1"],
                )
                self.write(folder, "1gbit", "c0", k, 10 * scale)
                self.write(folder, "1gbit", "c1", k, 12 * scale)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                validate.main(["--candidates", "bf16 topkc:fraction=0.1,chunk_size=256", folder])
            text = out.getvalue()
            self.assertIn("| 1gbit | bf16 | 12.00 (12.00-12.00) | 10.00 (9.00-11.00) | +20% |", text)
            self.assertIn(
                "| 1gbit | topkc:fraction=0.1,chunk_size=256 | 9.00 (9.00-9.00) | 12.00 (10.80-13.20) | -25% |", text
            )
            self.assertIn("fastest measured: bf16; the choice (a mix: its own runs) at 1.00x it", text)
            self.assertIn(
                "Median absolute error: 20% over 3 rows; the choice within 5% of the measured fastest at 1 of 1", text
            )

    def test_a_single_pick_is_judged_by_its_candidate(self):
        """The choice ran TopK-Chunked in every bucket of every run: its own runs
        (faster here, by the machine) do not count, TopK-Chunked's step does."""
        with tempfile.TemporaryDirectory() as folder:
            for k in (1, 2, 3):
                self.write(
                    folder,
                    "1gbit",
                    "auto",
                    k,
                    9,
                    [("bf16", 10), ("topkc:chunk_size=256,fraction=0.1", 9)],
                    ["topkc:chunk_size=256,fraction=0.1"] * 2,
                )
                self.write(folder, "1gbit", "c0", k, 10)
                self.write(folder, "1gbit", "c1", k, 12)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                validate.main(["--candidates", "bf16 topkc:fraction=0.1,chunk_size=256", folder])
            text = out.getvalue()
            self.assertIn(
                "fastest measured: bf16; the choice (topkc:fraction=0.1,chunk_size=256 in every bucket: "
                "its step) at 1.20x it",
                text,
            )
            self.assertIn("the choice within 5% of the measured fastest at 0 of 1", text)

    def test_a_pick_without_its_candidates_runs(self):
        """The logs name no choice, or one whose own runs are missing: the
        choice's own runs are the measure, and the row says why."""
        with tempfile.TemporaryDirectory() as folder:
            for k in (1, 2, 3):
                self.write(folder, "1gbit", "auto", k, 11, [("bf16", 10)])
                self.write(folder, "1gbit", "c0", k, 10)
                self.write(folder, "10gbit", "auto", k, 11, [("bf16", 10)], ["topkc:chunk_size=256,fraction=0.1"])
                self.write(folder, "10gbit", "c0", k, 10)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                validate.main(["--candidates", "bf16 topkc:fraction=0.1,chunk_size=256", folder])
            text = out.getvalue()
            self.assertIn(
                "| 1gbit | *fastest measured: bf16; the choice (not read from the logs: its own runs) at 1.10x it", text
            )
            self.assertIn(
                "| 10gbit | *fastest measured: bf16; the choice (topkc:fraction=0.1,chunk_size=256 in every "
                "bucket, not run alone: its own runs) at 1.10x",
                text,
            )

    def test_layouts_in_one_table(self):
        """Two folders, one layout each: rows named by folder, one summary over both."""
        with tempfile.TemporaryDirectory() as root:
            for layout, slow in (("one-node", 10), ("two-nodes", 20)):
                folder = os.path.join(root, layout)
                os.mkdir(folder)
                for k in (1, 2, 3):
                    self.write(folder, "1gbit", "auto", k, 10, [("bf16", 11)], ["bf16"])
                    self.write(folder, "1gbit", "c0", k, 10)
                    self.write(folder, "1gbit", "c1", k, slow)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                validate.main(
                    [
                        "--candidates",
                        "bf16 topkc:fraction=0.1,chunk_size=256",
                        os.path.join(root, "one-node"),
                        os.path.join(root, "two-nodes"),
                    ]
                )
            text = out.getvalue()
            self.assertIn("| one-node 1gbit | bf16 | 11.00 (11.00-11.00) | 10.00 (10.00-10.00) | +10% |", text)
            self.assertIn(
                "| two-nodes 1gbit | *fastest measured: bf16; the choice (bf16 in every bucket: its step)", text
            )
            self.assertIn("over 2 rows; the choice within 5% of the measured fastest at 2 of 2 rates and layouts", text)


if __name__ == "__main__":
    unittest.main()
