"""One 25 MiB DDP bucket's local work through each communication hook, on
the CPU, in one run: PyTorch's bf16_compress_hook and powerSGD_hook (rank 4,
error feedback, warm start) against gradcomp's hook with bf16 and PowerSGD
rank 4. One rank (gloo), so the collectives move nothing and the time is the
hook's own: compression, decompression and the adapter. Medians of --repeats
calls after warm-up, with their range, and a copy of the bucket timed beside
them.

    PYTHONPATH=build/python python3 bench/torch_hooks.py [--repeats 15] [--threads 2]
"""

import argparse
import os
import statistics
import tempfile
import time

import gradcomp.torch as gct
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

SIDE = 2560  # a 2560 x 2560 fp32 weight: 25 MiB, one bucket


def timed(o, hook, state):
    torch.manual_seed(0)
    model = torch.nn.Linear(SIDE, SIDE, bias=False)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=26)
    times = []

    def timing(state, bucket):
        start = time.perf_counter()
        future = hook(state, bucket)
        future.wait()
        times.append(time.perf_counter() - start)
        return future

    ddp.register_comm_hook(state, timing)
    x = torch.randn(8, SIDE)
    for _ in range(o.repeats + 3):  # the first iterations: DDP's bucket rebuild, the hooks' warm-up
        ddp(x).sum().backward()
    return [t * 1e3 for t in times[3:]]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    o = p.parse_args()
    torch.set_num_threads(o.threads)
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "store"), 1), rank=0, world_size=1)
        rows = [
            ("torch bf16_compress_hook", lambda: (default_hooks.bf16_compress_hook, None)),
            ("gradcomp bf16", lambda: (gct.hook, gct.GradcompState(None, "bf16", min_compression_elements=0))),
            (
                "torch powerSGD_hook rank 4",
                lambda: (
                    powerSGD_hook.powerSGD_hook,
                    powerSGD_hook.PowerSGDState(
                        process_group=None,
                        matrix_approximation_rank=4,
                        start_powerSGD_iter=2,
                        use_error_feedback=True,
                        warm_start=True,
                    ),
                ),
            ),
            (
                "gradcomp powersgd rank 4",
                lambda: (
                    gct.hook,
                    gct.GradcompState(None, "powersgd:matrix_rank=4", min_compression_elements=0, warmup=2),
                ),
            ),
        ]
        buffer = torch.randn(SIDE * SIDE)
        target = torch.empty_like(buffer)
        print(
            f"one {SIDE * SIDE * 4 / 2**20:.0f} MiB bucket, 1 gloo rank, {o.threads} threads, "
            f"median of {o.repeats} (range)"
        )
        print(f"{'hook':<30} {'ms':>8} {'range':>17} {'x copy':>8} {'x bf16 (torch)':>15}")
        results = {}
        for name, make in rows:
            copies = []
            for _ in range(o.repeats):
                start = time.perf_counter()
                target.copy_(buffer)
                copies.append((time.perf_counter() - start) * 1e3)
            times = timed(o, *make())
            results[name] = statistics.median(times)
            copy = statistics.median(copies)
            base = results["torch bf16_compress_hook"]
            print(
                f"{name:<30} {results[name]:8.2f} {min(times):8.2f}-{max(times):8.2f} "
                f"{results[name] / copy:8.1f} {results[name] / base:15.2f}"
            )
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
