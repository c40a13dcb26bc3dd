"""gradcomp's reduce-scatter in FSDP2 (fully_shard) on 4 gloo processes, CPU:

- each rank's reduced shard is bitwise the slice of gradcomp's all-reduce of
  the same (padded) bucket over local_group, step after step (THC, QSGD:
  integer lanes), and within bf16 roundings for bf16 and TopK-Chunked (gloo
  rounds bf16 sums after each addition, local_group once);
- a compressor that cannot reduce-scatter is refused;
- a NaN in one rank's gradients makes backward() raise gradcomp's
  NonfiniteError on every rank.

    PYTHONPATH=build/python:build/test/torch python3 test/torch/fsdp_test.py
"""

import os
import sys

import torch
import torch.distributed as dist
from gloo_ranks import RANKS, Checks, init, launch


def shards_match(rank, path, results):
    import gradcomp.torch as gct
    import gradcomp_c10d_tests
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    init(rank, path)
    mesh = init_device_mesh("cpu", (RANKS,))
    out = {}
    # (TopK-Chunked with every chunk chosen: gloo rounds its bf16 chunk scores
    # after each addition, local_group once, so the chosen chunks could differ.)
    for spec in ("thc", "qsgd", "bf16", "topkc:fraction=1"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 130), torch.nn.ReLU(), torch.nn.Linear(130, 10))
        fully_shard(model, mesh=mesh)
        calls = []  # (input, output) of every call

        class Recording(gct.ReduceScatter):
            def __call__(self, output_tensor, input_tensor, group, op, async_op=False, calls=calls):
                before = input_tensor.clone()
                result = super().__call__(output_tensor, input_tensor, group, op, async_op)
                calls.append((before, output_tensor.clone()))
                return result

        comm = Recording(spec)
        model.set_custom_reduce_scatter(comm)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for it in range(3):
            g = torch.Generator().manual_seed(100 * it + rank)
            x, y = torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        block = calls[0][1].numel()
        padded = comm._impl.padded_block
        history = []
        for before, _ in calls:
            padded_input = torch.zeros(RANKS, padded)
            padded_input[:, :block] = before.view(RANKS, block)
            everyone = [torch.empty_like(padded_input) for _ in range(RANKS)]
            dist.all_gather(everyone, padded_input)
            history.append([e.flatten() for e in everyone])
        same, worst = True, 0.0
        for step in range(len(calls)):
            mean = gradcomp_c10d_tests.local_allreduce(spec, [[RANKS * padded]], 0, history[: step + 1], rank)
            expected = mean[rank * padded : rank * padded + block]
            got = calls[step][1]
            same = same and torch.equal(expected, got)
            worst = max(worst, ((expected - got).abs().max() / expected.abs().max().clamp_min(1e-30)).item())
        out[spec] = (same, worst, len(calls), block, padded, comm.wire_bytes)
    results[rank] = out
    dist.destroy_process_group()


def refused(rank, path, results):
    import gradcomp.torch as gct

    init(rank, path)
    try:
        gct.ReduceScatter("powersgd")
        results[rank] = "accepted"
    except ValueError as e:
        results[rank] = str(e)
    dist.destroy_process_group()


def nan_on_one_rank(rank, path, results):
    import gradcomp.torch as gct
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    init(rank, path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 130), torch.nn.ReLU(), torch.nn.Linear(130, 10))
    fully_shard(model, mesh=init_device_mesh("cpu", (RANKS,)))
    gct.shard(model, "thc")
    x = torch.randn(16, 64)
    if rank == 1:
        x[0, 0] = float("nan")
    try:
        torch.nn.functional.cross_entropy(model(x), torch.zeros(16, dtype=torch.long)).backward()
        results[rank] = ("none", "")
    except gct.Error as e:
        results[rank] = (type(e).__name__, str(e))
    except Exception as e:
        results[rank] = (f"untyped {type(e).__name__}", str(e))
    os._exit(0)  # FSDP is left mid-backward: skip its teardown


def main():
    check = Checks()

    # shard() refuses a model without FSDP2 modules, naming what to do.
    import gradcomp.torch as gct

    try:
        gct.shard(torch.nn.Linear(2, 2), "thc")
        check(False, "shard(a module without fully_shard) raises TypeError")
    except TypeError as e:
        check("fully_shard" in str(e), f"shard(a module without fully_shard) raises TypeError naming fully_shard: {e}")

    results = launch(shards_match)
    for spec, (_, worst, calls, block, padded, wire) in results[0].items():
        exact = spec in ("thc", "qsgd")
        ok = (
            all(results[r][spec][0] for r in range(RANKS))
            if exact
            else max(results[r][spec][1] for r in range(RANKS)) <= 2**-6
        )
        check(
            ok and calls == 3 and wire > 0,
            f"{spec}: {calls} reduce-scatters of blocks of {block} (padded to {padded}), each rank's shard "
            f"{'bitwise' if exact else f'within {worst:.1e} of'} the slice of the all-reduce, {wire} wire bytes",
        )
    results = launch(refused)
    check(all("cannot reduce-scatter" in results[r] for r in range(RANKS)), f"PowerSGD is refused: {results[0][:90]}")
    results = launch(nan_on_one_rank)
    for r in range(RANKS):
        check(results[r][0] == "NonfiniteError", f"rank {r}: a NaN on rank 1: backward() raises {results[r]}"[:160])
    return 1 if check.failed() else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
