"""gradcomp's DDP hook under torch.compile, on 4 gloo processes: a small
model (embedding, LayerNorm, linear layers) compiled by TorchDynamo and
Inductor (C++ for the CPU), DDP's graph split at its buckets
(DDPOptimizer), trained with TopK-Chunked (error feedback) for a few steps:
the hook runs on every step, the replicas stay bitwise equal, and the
weights are the eager run's within float rounding (compiled kernels round
differently, and a top-k selection can flip on a near tie; a hook that saw
other gradients, or none, would be far off), as PyTorch's own
``bf16_compress_hook`` compiled is to its eager run. Under compiled
autograd's DDP reducer (``optimize_ddp = "python_reducer"``) registration is
refused on every rank with a message that names the setting.

    PYTHONPATH=build/python:build/test/torch python3 test/torch/ddp_compile_test.py
"""

import sys

import torch
import torch.distributed as dist
from gloo_ranks import RANKS, Checks, init, launch

STEPS = 4
SPEC = "topkc:fraction=0.25"


class Tiny(torch.nn.Module):
    """Bytes in, bytes out: an embedding, a LayerNorm and an MLP, 2.6 MB of
    parameters (three DDP buckets at a 1 MiB cap: DDPOptimizer needs the
    first bucket no larger than the others, and DDP's first is 1 MiB)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(256, 256)
        self.norm = torch.nn.LayerNorm(256)
        self.up = torch.nn.Linear(256, 1024)
        self.down = torch.nn.Linear(1024, 256)
        self.head = torch.nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embed(x))
        return self.head(h + self.down(torch.nn.functional.gelu(self.up(h))))


def train(rank, path, spec, backend, results):
    """STEPS steps with gradcomp's hook (spec; "torch-bf16": PyTorch's
    bf16_compress_hook), compiled with `backend` (None: eager); leaves the
    flat weights and the hook's iteration count (PyTorch's: None)."""
    import gradcomp.torch as gct
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    init(rank, path)
    torch._dynamo.reset()
    ddp = torch.nn.parallel.DistributedDataParallel(Tiny(), bucket_cap_mb=1)
    if spec == "torch-bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        state = None
    else:
        state = gct.register(ddp, spec, warmup=2)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    forward = ddp if backend is None else torch.compile(ddp, backend=backend)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randint(0, 256, (8, 16), generator=g)
        y = torch.randint(0, 256, (8, 16), generator=g)
        loss = torch.nn.functional.cross_entropy(forward(x).reshape(-1, 256), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    flat = torch.cat([p.detach().flatten() for p in ddp.parameters()])
    results[rank] = (flat, state.iterations if state is not None else None)
    dist.destroy_process_group()


def python_reducer(rank, path, results):
    """Registration under compiled autograd's reducer: the error, if any."""
    import gradcomp.torch as gct

    init(rank, path)
    torch._dynamo.config.optimize_ddp = "python_reducer"
    ddp = torch.nn.parallel.DistributedDataParallel(Tiny(), bucket_cap_mb=1)
    try:
        gct.register(ddp, SPEC)
        results[rank] = None
    except gct.InvalidArgument as e:
        results[rank] = str(e)
    dist.destroy_process_group()


def main() -> int:
    check = Checks()
    eager = launch(train, SPEC, None)
    compiled = launch(train, SPEC, "inductor")
    weights = [compiled[r][0] for r in range(RANKS)]
    check(all(torch.equal(w, weights[0]) for w in weights), "torch.compile: the replicas are bitwise equal")
    check(
        compiled[0][1] == eager[0][1] == STEPS,
        f"torch.compile: the hook ran every step ({compiled[0][1]} iterations, eager {eager[0][1]})",
    )
    gap = (weights[0] - eager[0][0]).abs().max().item()
    moved = (eager[0][0] - torch.cat([p.detach().flatten() for p in Tiny().parameters()])).abs().max().item()
    torch_gap = (launch(train, "torch-bf16", "inductor")[0][0] - launch(train, "torch-bf16", None)[0][0]).abs().max()
    check(
        gap < 1e-3 < moved,
        f"torch.compile: within 1e-3 of the eager run's weights ({gap:.2e}; PyTorch's bf16 hook: "
        f"{torch_gap.item():.2e}; training moved them {moved:.2e})",
    )
    refusals = launch(python_reducer)
    check(
        all(refusals[r] is not None and '"python_reducer"' in refusals[r] for r in range(RANKS)),
        f"compiled autograd's python_reducer: registration refused on every rank ({refusals[0]})",
    )
    return check.failed()


if __name__ == "__main__":
    sys.exit(main())
