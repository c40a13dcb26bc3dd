"""The training example's task in PyTorch: the same MLP on Fashion-MNIST
(widths, initialization, batch, SGD with momentum, data order, evaluation and
summary line as examples/train), a small CNN on the same data (--model cnn)
or a byte-level GPT on the Python documentation's text (--model gpt, AdamW),
trained in DistributedDataParallel over gloo, with PyTorch's own
communication hooks or gradcomp's, in one program (tasks.py holds the
models, their data and their scores):

    PYTHONPATH=build/python python3 examples/torch/train.py --hook gradcomp:topkc:fraction=0.1
    python3 examples/torch/train.py --hook torch-powersgd --warmup 2

--hook none (fp32 all-reduce), torch-bf16 (bf16_compress_hook), torch-powersgd
(powerSGD_hook: rank --powersgd-rank, error feedback, warm start) or
gradcomp:<spec> (any gradcomp compressor spec); with --fsdp, the model is
sharded by FSDP2 instead and --hook none, torch-bf16 or gradcomp:<spec> is
its reduce-scatter (fp32, bf16, or gradcomp's). It starts --ranks processes
itself, or runs as one rank under torchrun (RANK, WORLD_SIZE, MASTER_ADDR set).
"""

import argparse
import datetime
import hashlib
import math
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.tensor import DTensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402  (beside this file)


def options(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hook", default="none", help="none | torch-bf16 | torch-powersgd | gradcomp:<spec>")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--batch", type=int, default=None, help="examples per rank per step (default: 64; gpt 8)")
    p.add_argument("--lr", type=float, default=None, help="SGD's (default 0.05), gpt: AdamW's (default 0.003)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--epochs", type=float, default=3)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--model", choices=["mlp", "cnn", "gpt"], default="mlp")
    p.add_argument("--hidden", default="512,256", help="the MLP's hidden widths")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="test accuracy (default: 0.85 mlp, 0.88 cnn), gpt: validation bits per byte (default 4.0)",
    )
    p.add_argument("--stop-at-target", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bucket-kb", type=int, default=256, help="DDP's bucket cap")
    p.add_argument(
        "--min-compress",
        type=int,
        default=4096,
        help="smaller buckets (and PowerSGD's smaller matrices) travel uncompressed or as bf16",
    )
    p.add_argument("--warmup", type=int, default=0, help="iterations of plain fp32 all-reduce first")
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--data", default=tasks.FASHION_MNIST, help="Fashion-MNIST's folder")
    p.add_argument("--text", default=tasks.PYTHON_DOCS, help="gpt: the folder of reST sources")
    p.add_argument("--compile", action="store_true", help="torch.compile the DDP model")
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="FSDP2 (fully_shard) instead of DDP: --hook none (fp32 reduce-scatter), torch-bf16 "
        "(reduce_dtype bf16) or gradcomp:<spec> (gradcomp.torch.shard)",
    )
    o = p.parse_args(argv)
    defaults = tasks.task_class(o.model)
    o.batch = o.batch or defaults.default_batch
    o.lr = o.lr or defaults.default_lr
    return o


def wire_bytes(o, model, state):
    """Bytes a rank sends per step, as each hook encodes a bucket (FSDP2: its
    reduce-scatters' input; the parameters' all-gather is the same for all)."""
    params = list(model.parameters())
    if o.hook.startswith("gradcomp:"):
        return sum(comm.wire_bytes for comm in state) if o.fsdp else state.wire_bytes
    if o.hook == "torch-bf16":
        return sum(2 * p.numel() for p in params)
    if o.hook == "torch-powersgd":  # PyTorch's rule: a matrix is compressed where P and Q are smaller by 2x
        total = 0
        for p in params:
            n, m = p.shape[0], p[0].numel() if p.dim() > 1 else 1
            r = min(n, m, o.powersgd_rank)
            compress = p.dim() > 1 and n * m >= 2 * (n + m) * r and p.numel() >= o.min_compress
            total += 4 * ((n + m) * r if compress else p.numel())
        return total
    return sum(4 * p.numel() for p in params)


def serialized(hook):
    """PyTorch's powerSGD_hook issues a bucket's second all-reduce from a
    callback of its first; over gloo that callback races the next bucket's
    first all-reduce, the ranks' collectives mismatch and gloo aborts
    ("Received data size doesn't match expected size"). Each bucket here
    starts once the previous one is done."""
    previous = []

    def wrapper(state, bucket):
        if previous:
            previous.pop().wait()
        future = hook(state, bucket)
        if not bucket.is_last():
            previous.append(future)
        return future

    wrapper.__name__ = wrapper.__qualname__ = hook.__name__
    return wrapper


def register(o, ddp):
    if o.hook == "none":
        return None
    if o.hook == "torch-bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        return None
    if o.hook == "torch-powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=o.powersgd_rank,
            start_powerSGD_iter=max(2, o.warmup),
            min_compression_rate=2,
            use_error_feedback=True,
            warm_start=True,
            random_seed=o.seed,
        )
        ddp.register_comm_hook(state, serialized(powerSGD_hook.powerSGD_hook))
        return state
    if o.hook.startswith("gradcomp:"):
        import gradcomp.torch

        return gradcomp.torch.register(
            ddp, o.hook[len("gradcomp:") :], warmup=o.warmup, min_compression_elements=o.min_compress
        )
    raise SystemExit(f"--hook {o.hook}: not none, torch-bf16, torch-powersgd or gradcomp:<spec>")


def shard(o, task, model):
    """FSDP2 over the ranks: each of the task's units (the GPT's blocks) and
    then the whole model sharded, their gradients reduce-scattered in fp32
    (--hook none), in bf16 (torch-bf16: ``MixedPrecisionPolicy(reduce_dtype=
    torch.bfloat16)``) or by gradcomp (its ReduceScatter, one per unit);
    returns gradcomp's ReduceScatters, if any."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if o.hook not in ("none", "torch-bf16") and not o.hook.startswith("gradcomp:"):
        raise SystemExit(f"--fsdp --hook {o.hook}: not none, torch-bf16 or gradcomp:<spec>")
    if o.compile:
        raise SystemExit("--fsdp --compile: not supported by this example")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16 if o.hook == "torch-bf16" else None)
    for unit in [*task.shard_units(model), model]:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    if not o.hook.startswith("gradcomp:"):
        return None
    import gradcomp.torch

    return gradcomp.torch.shard(model, o.hook[len("gradcomp:") :], seed=o.seed)


def run(rank, o, store_path):
    torch.set_num_threads(1)  # the ranks share the cores
    if store_path is None:
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
    else:
        dist.init_process_group(
            "gloo",
            store=dist.FileStore(store_path, o.ranks),
            rank=rank,
            world_size=o.ranks,
            timeout=datetime.timedelta(minutes=5),
        )
    rank, ranks = dist.get_rank(), dist.get_world_size()
    task = tasks.task_of(o.model, o.data, o.hidden, o.text)
    target = task.default_target if o.target is None else o.target
    model = task.model(o.seed)
    if o.fsdp:
        state = shard(o, task, model)
        forward = model
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=o.bucket_kb / 1024)
        state = register(o, ddp)
        forward = torch.compile(ddp) if o.compile else ddp
    optimizer = task.optimizer(forward.parameters(), o.lr, o.momentum)

    total = int(o.epochs * task.steps_per_epoch(rank, ranks, o.batch))
    if o.max_steps:
        total = min(total, o.max_steps)
    wall, to_target, steps_to, score, diverged = 0.0, None, None, math.nan, False
    step = 0
    while step < total:
        inputs, targets = task.batch(step, rank, ranks, o.batch, o.seed)
        start = time.perf_counter()
        loss = task.loss(forward(inputs), targets)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
        wall += time.perf_counter() - start
        step += 1
        if step % o.eval_every == 0 or step == total:
            score = task.score(model, rank, ranks)
            if not math.isfinite(loss.item()):
                diverged = True
            if task.reached(score, target) and to_target is None:
                to_target, steps_to = wall, step
            if rank == 0:
                print(f"step {step} loss {loss.item():.4f} {task.metric} {score:.4f} wall_s {wall:.3f}", flush=True)
            if diverged or (o.stop_at_target and to_target is not None):
                break
    # (FSDP2's parameters are shards, DTensors, where not gathered for a forward.)
    full = [p.full_tensor() if isinstance(p, DTensor) else p for p in model.parameters()]
    flat = torch.cat([p.detach().flatten() for p in full])
    everyone = [torch.empty_like(flat) for _ in range(ranks)]
    dist.all_gather(everyone, flat)
    same = all(torch.equal(everyone[0], w) for w in everyone)
    if rank == 0:
        weights = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
        setup = "fsdp" if o.fsdp else "ddp"
        print(
            f"summary: model={o.model} compressor={o.hook} ranks={ranks} backend=gloo-{setup} bucket_kb={o.bucket_kb} "
            f"target={target:.3f} time_to_target_s={'not-reached' if to_target is None else f'{to_target:.6f}'} "
            f"steps_to_target={'not-reached' if steps_to is None else steps_to} final_{task.metric}={score:.4f} "
            f"steps={step} wire_bytes_per_step={wire_bytes(o, model, state)} replicas={'equal' if same else 'DIFFER'} "
            f"weights={weights} status={'diverged' if diverged else 'trained'}",
            flush=True,
        )
    dist.destroy_process_group()
    if not same:
        sys.exit(4)


def main():
    o = options()
    if "RANK" in os.environ:  # torchrun
        run(int(os.environ["RANK"]), o, None)
        return
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(run, args=(o, os.path.join(folder, "store")), nprocs=o.ranks, join=True)


if __name__ == "__main__":
    main()
