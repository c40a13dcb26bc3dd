"""gradcomp's DDP hook with "auto" on 4 gloo processes:

- "auto:of=..." plans each compressed bucket once, on DDP's rebuilt buckets,
  the same on every rank, among the candidates; a loaded state keeps the
  saved choices;
- plain "auto" with every default, on a small CNN, prints nothing, and its
  report numbers the buckets as choices() does, weighs each bucket with its
  share of an iteration timed during warm-up, and prices the candidates
  other than bf16 at twice bf16's steps.

    PYTHONPATH=build/python:build/test/torch python3 test/torch/ddp_auto_test.py
"""

import os
import re
import sys
import tempfile

import torch
import torch.distributed as dist
from ddp_test import checkpointed, replicas_equal
from gloo_ranks import RANKS, Checks, init, launch

# The planner's choice: made on DDP's rebuilt buckets (warm-up 2), the same on
# every rank, one of the candidates; a loaded state keeps it. Not bf16 among
# them: the choice then has state to save.
AUTO = "auto:of=topkc:fraction=0.25+powersgd"


def auto_on_a_cnn(rank, path, results):
    """Plain "auto" with every default, on a small CNN (conv + BatchNorm +
    linear layers, one bucket above min_compression_elements): what it
    writes to standard output (the file descriptor, where C++ writes), its
    choices and its report."""
    import gradcomp.torch as gct

    init(rank, path)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1, stride=2),
        torch.nn.BatchNorm2d(32),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 8 * 8, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    state = gct.register(ddp, "auto")
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    with tempfile.TemporaryFile() as captured:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(captured.fileno(), 1)
        try:
            for it in range(4):
                g = torch.Generator().manual_seed(100 * it + rank)
                x, y = torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g)
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
                optimizer.step()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        captured.seek(0)
        printed = captured.read().decode()
    results[rank] = dict(printed=printed, choices=state.choices(), report=state.report(), same=replicas_equal(net))
    dist.destroy_process_group()


def main():
    check = Checks()

    with tempfile.TemporaryDirectory() as folder:
        first = launch(checkpointed, "first", AUTO, folder)
        resumed = launch(checkpointed, "resumed", AUTO, folder)
    choices = first[0]["choices"]
    import gradcomp.torch as gct

    candidates = {gct.parse_spec(s) for s in AUTO.removeprefix("auto:of=").split("+")}
    check(
        len(choices) > 0
        and set(choices.values()) <= candidates
        and all(first[r]["same_choices"] and first[r]["replicas_equal"] for r in range(RANKS)),
        f"auto: every compressed bucket planned, the same choice on every rank, among the candidates: {choices}",
    )
    check(
        all(
            resumed[r]["choices"] == choices
            and resumed[r]["replicas_equal"]
            and resumed[r]["descriptions"] == first[r]["descriptions"]
            for r in range(RANKS)
        ),
        f"auto: a loaded state keeps the saved choices: {resumed[0]['descriptions']}",
    )

    results = launch(auto_on_a_cnn)
    for r in range(RANKS):
        got = results[r]
        report = got["report"]
        numbered = sorted(int(line.split()[1]) for line in report.splitlines() if line.startswith("Bucket "))
        check(got["printed"] == "", f"rank {r}: auto on a CNN prints nothing: {got['printed'][:80]!r}")
        check(
            len(got["choices"]) > 0 and numbered == sorted(got["choices"]) and got["same"],
            f"rank {r}: auto on a CNN: choices {got['choices']} for the buckets its report numbers {numbered}",
        )
        other = re.search(r"the step's other ([0-9.]+) ms\), x steps to target: (.*)", report)
        check(
            other is not None and float(other.group(1)) > 0 and other.group(2) == "powersgd 2.00, topkc 2.00",
            f"rank {r}: auto weighs the timed iteration and unknown convergence: {other and other.group(0)!r}",
        )
    check(all(results[r]["choices"] == results[0]["choices"] for r in range(RANKS)), "auto: every rank chose alike")
    return 1 if check.failed() else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
