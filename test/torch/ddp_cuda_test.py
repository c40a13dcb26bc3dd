"""gradcomp's DDP hook on CUDA buckets over NCCL: one process per GPU (up to
4; one GPU is enough). Exits 77 (skipped) without a GPU or where the module
was built without CUDA.

- each compressor trains, and the replicas stay bitwise equal;
- every bucket's result on the device is the host path's (a gloo group in the
  same processes, same inputs, same order): bitwise for the integer lanes,
  and for the others on one or two ranks (a float sum of two values does not
  depend on the order), else within a few bf16 roundings; PowerSGD within
  1e-3 (cuBLAS rounds its products in another order);
- the hook does not make the host wait for the step: behind a half-second
  sleep kernel on the backward's stream, backward() returns long before the
  sleep is over;
- a NaN in one rank's gradients makes every rank's buckets NaN (device
  buckets propagate: raising would need the host to wait);
- a state saved after 4 iterations and loaded into fresh models continues
  bitwise.

    PYTHONPATH=build/python python3 test/torch/ddp_cuda_test.py
"""

import datetime
import gc
import itertools
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import Checks

SHAPES = (64, 256, 256, 10)
OPTIONS = dict(min_compression_elements=1000)  # this model's buckets are small
SPECS = ("bf16", "topkc:fraction=0.1", "powersgd:matrix_rank=4", "thc", "intsgd", "qsgd")
EXACT = ("thc", "intsgd", "qsgd")  # integer lanes: any order sums them exactly


def model(device, seed=0):
    torch.manual_seed(seed)
    layers = []
    for a, b in itertools.pairwise(SHAPES):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers[:-1]).to(device)
    return net, torch.nn.parallel.DistributedDataParallel(net, device_ids=[device], bucket_cap_mb=0.15)


def batch(rank, iteration, device):
    g = torch.Generator().manual_seed(1000 * iteration + rank)
    x, y = torch.randn(32, SHAPES[0], generator=g), torch.randint(0, SHAPES[-1], (32,), generator=g)
    return x.to(device), y.to(device)


def step(ddp, optimizer, rank, iteration, device):
    x, y = batch(rank, iteration, device)
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def replicas_equal(net, ranks):
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(ranks)]
    dist.all_gather(everyone, flat)
    return all(torch.equal(everyone[0], w) for w in everyone)


def run(rank, ranks, path, folder, results):
    import gradcomp.torch as gct

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl",
        store=dist.FileStore(path, ranks),
        rank=rank,
        world_size=ranks,
        timeout=datetime.timedelta(seconds=60),
        device_id=device,
    )
    gloo = dist.new_group(backend="gloo")
    out = {}
    for spec in SPECS:
        net, ddp = model(device)
        state = gct.GradcompState(ddp.process_group, spec, warmup=1, seed=7, **OPTIONS)
        seen = []  # (index, shapes, input, output) of every bucket after warm-up

        def recording(state, bucket, seen=seen):
            entry = (bucket.index(), [list(p.shape) for p in bucket.parameters()], bucket.buffer().clone())
            warm = state.iterations >= state.warmup

            def keep(fut):
                if warm:
                    seen.append((*entry, fut.value().clone()))
                return fut.value()

            return gct.hook(state, bucket).then(keep)

        ddp.register_comm_hook(state, recording)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        loss = [step(ddp, optimizer, rank, it, device) for it in range(6)][-1].item()

        # The host path on the same inputs, in the same order.
        host = gct.GradcompState(gloo, spec, warmup=0, seed=7, **OPTIONS)
        same, worst = True, 0.0
        for index, shapes, before, after in seen:
            expected = before.cpu()
            host._impl.reduce(index, expected, [], shapes, False).wait()
            same = same and torch.equal(expected, after.cpu())
            worst = max(worst, ((expected - after.cpu()).abs().max() / expected.abs().max().clamp(min=1e-30)).item())

        # Behind a sleep on the backward's stream, backward() returns at once
        # (nothing left for the garbage collector to free meanwhile: freeing
        # device memory waits for the device).
        gc.collect()
        torch.cuda.synchronize()
        x, y = batch(rank, 6, device)
        loss7 = torch.nn.functional.cross_entropy(ddp(x), y)
        start = time.perf_counter()
        torch.cuda._sleep(10**9)  # cycles: about half a second
        loss7.backward()
        returned = time.perf_counter() - start
        torch.cuda.synchronize()
        finished = time.perf_counter() - start

        # A NaN on rank 0 only: every rank's every bucket comes back NaN.
        x, y = batch(rank, 7, device)
        if rank == 0:
            x = x * float("nan")
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        nan_everywhere = all(bool(torch.isnan(p.grad).all()) for p in net.parameters())
        out[spec] = dict(
            finite=loss == loss and abs(loss) < 100,
            replicas=replicas_equal(net, ranks),
            wire=state.wire_bytes,
            seen=len(seen),
            same=same,
            worst=worst,
            returned=returned,
            finished=finished,
            nan_everywhere=nan_everywhere,
            descriptions=sorted({state.description(i) for i in range(8)} - {""}),
        )

    # Saved after 4 iterations and loaded into a fresh model: bitwise the same.
    weights = {}
    for phase in ("whole", "first", "resumed"):
        net, ddp = model(device)
        state = gct.GradcompState(ddp.process_group, "topkc:fraction=0.1", warmup=1, seed=7, model=net, **OPTIONS)
        ddp.register_comm_hook(state, gct.hook)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        saved = os.path.join(folder, f"rank{rank}.pt")
        if phase == "resumed":
            checkpoint = torch.load(saved, weights_only=False)
            net.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            state.load_state_dict(checkpoint["gradcomp"])
        first, last = {"whole": (0, 8), "first": (0, 4), "resumed": (4, 8)}[phase]
        for it in range(first, last):
            step(ddp, optimizer, rank, it, device)
        if phase == "first":
            torch.save(
                {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "gradcomp": state.state_dict()}, saved
            )
        weights[phase] = torch.cat([p.detach().flatten() for p in net.parameters()]).cpu()
        dist.barrier()
    out["resumed bitwise"] = torch.equal(weights["whole"], weights["resumed"])
    results[rank] = out
    dist.destroy_process_group()


def main():
    import gradcomp.torch as gct

    if not torch.cuda.is_available() or not gct.device_buckets:
        print(
            "skipped: "
            + ("no CUDA device" if not torch.cuda.is_available() else "the gradcomp module was built without CUDA")
        )
        return 77
    ranks = min(torch.cuda.device_count(), 4)
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(run, args=(ranks, os.path.join(tmp, "store"), tmp, results), nprocs=ranks, join=True)
        results = dict(results)
    check = Checks()

    for spec in SPECS:
        r0 = results[0][spec]
        check(
            all(results[r][spec]["finite"] and results[r][spec]["replicas"] for r in range(ranks))
            and r0["wire"] > 0
            and r0["seen"] > 0,
            f"{spec} on {ranks} GPU(s): trains, replicas bitwise equal, {r0['wire']} wire bytes, {r0['descriptions']}",
        )
        worst = max(results[r][spec]["worst"] for r in range(ranks))
        if spec.startswith("powersgd"):
            check(worst <= 1e-3, f"{spec}: every bucket's device result is the host path's within {worst:.1e}")
        elif spec in EXACT or ranks <= 2:
            check(
                all(results[r][spec]["same"] for r in range(ranks)),
                f"{spec}: every bucket's device result is the host path's, bitwise ({r0['seen']} buckets)",
            )
        else:
            check(worst <= 2**-6, f"{spec}: every bucket's device result is the host path's within {worst:.1e}")
        returned = max(results[r][spec]["returned"] for r in range(ranks))
        finished = min(results[r][spec]["finished"] for r in range(ranks))
        check(
            all(results[r][spec]["nan_everywhere"] for r in range(ranks)),
            f"{spec}: a NaN in rank 0's gradients makes every bucket NaN on every rank",
        )
        check(
            returned < 0.5 * finished,
            f"{spec}: backward() returned after {returned * 1e3:.1f} ms, the stream "
            f"finished after {finished * 1e3:.1f} ms: the host did not wait",
        )
    check(
        all(results[r]["resumed bitwise"] for r in range(ranks)),
        "topkc: saved at iteration 4 and loaded into fresh models, iteration 8 is bitwise the same",
    )
    return 1 if check.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
