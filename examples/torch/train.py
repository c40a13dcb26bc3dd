"""The training example's task in PyTorch: the same MLP on Fashion-MNIST
(widths, initialization, batch, SGD with momentum, data order, evaluation and
summary line as examples/train), or a small CNN on the same data (--model
cnn), trained in DistributedDataParallel over gloo, with PyTorch's own
communication hooks or gradcomp's, in one program:

    PYTHONPATH=build/python python3 examples/torch/train.py --hook gradcomp:topkc:fraction=0.1
    python3 examples/torch/train.py --hook torch-powersgd --warmup 2

--hook none (fp32 all-reduce), torch-bf16 (bf16_compress_hook), torch-powersgd
(powerSGD_hook: rank --powersgd-rank, error feedback, warm start) or
gradcomp:<spec> (any gradcomp compressor spec). It starts --ranks processes
itself, or runs as one rank under torchrun (RANK, WORLD_SIZE, MASTER_ADDR set).
"""

import argparse
import datetime
import gzip
import hashlib
import itertools
import math
import os
import struct
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

DATA = "/usr/share/datasets/fashion-mnist"


def options(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hook", default="none", help="none | torch-bf16 | torch-powersgd | gradcomp:<spec>")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--batch", type=int, default=64, help="examples per rank per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--epochs", type=float, default=3)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--hidden", default="512,256", help="the MLP's hidden widths")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--target", type=float, default=None, help="test accuracy (default: 0.85 mlp, 0.88 cnn)")
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
    p.add_argument("--data", default=DATA)
    o = p.parse_args(argv)
    if o.target is None:
        o.target = {"mlp": 0.85, "cnn": 0.88}[o.model]
    return o


def load(data, train):
    prefix = os.path.join(data, "train" if train else "t10k")
    with gzip.open(prefix + "-images-idx3-ubyte.gz") as f:
        magic, count, rows, cols = struct.unpack(">IIII", f.read(16))
        images = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).reshape(count, rows * cols)
    with gzip.open(prefix + "-labels-idx1-ubyte.gz") as f:
        f.read(8)
        labels = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    return (images.float() / 255.0 - 0.2860) / 0.3530, labels


def mlp(sizes, seed):
    """He-uniform weights and zero biases, as examples/train's mlp."""
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        linear = torch.nn.Linear(a, b)
        bound = math.sqrt(6.0 / a)
        with torch.no_grad():
            linear.weight.uniform_(-bound, bound)
            linear.bias.zero_()
        layers.append(linear)
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def cnn(seed):
    """Three 3x3 convolutions (16, 32 and 64 channels), each with BatchNorm
    and ReLU, the first two max-pooled, and a linear head (3136-512-10):
    1.6M parameters, most in the head's first layer, as in the conv nets
    PyTorch users train on small images; PyTorch's default initialization."""
    torch.manual_seed(seed)

    def block(a, b):
        return [torch.nn.Conv2d(a, b, 3, padding=1, bias=False), torch.nn.BatchNorm2d(b), torch.nn.ReLU()]

    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 28, 28)),
        *block(1, 16),
        torch.nn.MaxPool2d(2),
        *block(16, 32),
        torch.nn.MaxPool2d(2),
        *block(32, 64),
        torch.nn.Flatten(),
        torch.nn.Linear(64 * 7 * 7, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )


def accuracy_of(model, images, labels, rank, ranks):
    """Test accuracy, each rank scoring its share of the test set (in
    eval mode: BatchNorm's running statistics)."""
    model.eval()
    mine = torch.arange(rank, images.shape[0], ranks)
    correct = torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        for chunk in mine.split(1000):
            correct += (model(images[chunk]).argmax(1) == labels[chunk]).sum()
    dist.all_reduce(correct)
    model.train()
    return correct.item() / images.shape[0]


def wire_bytes(o, model, state):
    """Bytes a rank sends per step, as each hook encodes a bucket."""
    params = list(model.parameters())
    if o.hook.startswith("gradcomp:"):
        return state.wire_bytes
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
    images, labels = load(o.data, True)
    test_images, test_labels = load(o.data, False)
    if o.model == "cnn":
        model = cnn(o.seed)
    else:
        model = mlp([images.shape[1]] + [int(h) for h in o.hidden.split(",")] + [10], o.seed)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=o.bucket_kb / 1024)
    state = register(o, ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=o.lr, momentum=o.momentum)

    shard = torch.arange(rank, images.shape[0], ranks)
    steps_per_epoch = shard.numel() // o.batch
    total = int(o.epochs * steps_per_epoch)
    if o.max_steps:
        total = min(total, o.max_steps)
    order = shard
    wall, to_target, steps_to, accuracy, diverged = 0.0, None, None, 0.0, False
    step = 0
    while step < total:
        in_epoch = step % steps_per_epoch
        if in_epoch == 0:
            g = torch.Generator().manual_seed(o.seed * 7919 + (step // steps_per_epoch) * 131 + rank)
            order = shard[torch.randperm(shard.numel(), generator=g)]
        batch = order[in_epoch * o.batch : (in_epoch + 1) * o.batch]
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(ddp(images[batch]), labels[batch])
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
        wall += time.perf_counter() - start
        step += 1
        if step % o.eval_every == 0 or step == total:
            accuracy = accuracy_of(model, test_images, test_labels, rank, ranks)
            if not math.isfinite(loss.item()):
                diverged = True
            if accuracy >= o.target and to_target is None:
                to_target, steps_to = wall, step
            if rank == 0:
                print(f"step {step} loss {loss.item():.4f} test_acc {accuracy:.4f} wall_s {wall:.3f}", flush=True)
            if diverged or (o.stop_at_target and to_target is not None):
                break
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(ranks)]
    dist.all_gather(everyone, flat)
    same = all(torch.equal(everyone[0], w) for w in everyone)
    if rank == 0:
        weights = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
        print(
            f"summary: model={o.model} compressor={o.hook} ranks={ranks} backend=gloo-ddp bucket_kb={o.bucket_kb} "
            f"target={o.target:.3f} time_to_target_s={'not-reached' if to_target is None else f'{to_target:.6f}'} "
            f"steps_to_target={'not-reached' if steps_to is None else steps_to} final_accuracy={accuracy:.4f} "
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
