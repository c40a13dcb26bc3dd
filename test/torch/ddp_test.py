"""gradcomp's DDP hook on 4 gloo processes (torch.multiprocessing):

- every registered compressor trains, and the replicas stay bitwise equal;
- a bucket's hook result is bitwise what gradcomp's allreducer gives the same
  flat buffers over local_group (in-process ranks), for compressors whose sums
  are exact in any order; so is a bf16 or fp16 model's, rounded back;
- a state saved at iteration N and loaded into fresh processes continues
  bitwise; the state also pickles without its process group;
- DDP's bucket rebuild after the first iteration (different buckets) is
  handled;
- host buckets reduced on 1, 2 or 3 lanes train bitwise alike, and a state
  saved on 2 lanes continues bitwise on 3.

Its errors are ddp_errors_test.py's, and "auto" is ddp_auto_test.py's.

    PYTHONPATH=build/python:build/test/torch python3 test/torch/ddp_test.py
"""

import copy
import itertools
import os
import pickle
import sys
import tempfile

import torch
import torch.distributed as dist
from gloo_ranks import RANKS, Checks, init, launch

SHAPES = (64, 256, 256, 10)


class Net(torch.nn.Module):
    """An MLP whose layers are registered in another order than the forward
    pass uses them when `shuffled`: DDP's rebuilt buckets then differ from its
    first ones."""

    def __init__(self, shuffled=False):
        super().__init__()
        layers = [torch.nn.Linear(a, b) for a, b in itertools.pairwise(SHAPES)]
        order = [1, 2, 0] if shuffled else [0, 1, 2]
        self.names = [f"l{i}" for i in order]
        for name, i in zip(self.names, order, strict=True):
            self.add_module(name, layers[i])
        self.forward_order = [f"l{i}" for i in range(len(layers))]

    def forward(self, x):
        for k, name in enumerate(self.forward_order):
            x = getattr(self, name)(x)
            if k + 1 < len(self.forward_order):
                x = torch.relu(x)
        return x


def model(seed=0, shuffled=False, dtype=torch.float32):
    torch.manual_seed(seed)
    net = Net(shuffled).to(dtype)
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.15)
    return net, ddp


def batch(rank, iteration):
    g = torch.Generator().manual_seed(1000 * iteration + rank)
    return torch.randn(32, SHAPES[0], generator=g), torch.randint(0, SHAPES[-1], (32,), generator=g)


def train(ddp, optimizer, first, last, rank):
    for it in range(first, last):
        x, y = batch(rank, it)
        loss = torch.nn.functional.cross_entropy(ddp(x.to(next(ddp.parameters()).dtype)).float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def weights(net):
    return torch.cat([p.detach().flatten() for p in net.parameters()])


def replicas_equal(net):
    flat = weights(net)
    everyone = [torch.empty_like(flat) for _ in range(RANKS)]
    dist.all_gather(everyone, flat)
    return all(torch.equal(everyone[0], w) for w in everyone)


OPTIONS = dict(min_compression_elements=1000)  # this model's buckets are small


def every_compressor(rank, path, results):
    import gradcomp.torch as gct

    init(rank, path)
    out = {}
    for name in gct.compressors():
        spec = {"global_randk": "global_randk:k=2000"}.get(name, name)  # k within the buckets
        net, ddp = model()
        state = gct.register(ddp, spec, warmup=1, **OPTIONS)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        loss = train(ddp, optimizer, 0, 4, rank)
        out[name] = (
            loss == loss and abs(loss) < 100,
            replicas_equal(net),
            state.iterations,
            state.wire_bytes,
            sorted({state.description(i) for i in range(8)} - {""}),
        )
    results[rank] = out
    dist.destroy_process_group()


def hook_equals_allreducer(rank, path, results):
    import gradcomp.torch as gct
    import gradcomp_c10d_tests

    init(rank, path)
    out = {}
    cases = [(spec, torch.float32) for spec in ("bf16", "thc", "intsgd", "qsgd", "topkc:fraction=1")]
    cases += [("thc", torch.bfloat16), ("bf16", torch.bfloat16), ("intsgd", torch.float16)]  # 16-bit models
    for spec, dtype in cases:
        net, ddp = model(dtype=dtype)
        state = gct.GradcompState(ddp.process_group, spec, warmup=0, **OPTIONS)
        seen = []  # (iteration, index, shapes, input, output) of every bucket

        def recording(state, bucket, seen=seen):
            entry = [
                state.iterations,
                bucket.index(),
                [list(p.shape) for p in bucket.parameters()],
                bucket.buffer().clone(),
            ]

            def keep(fut):
                seen.append((*entry, fut.value().clone()))
                return fut.value()

            return gct.hook(state, bucket).then(keep)

        ddp.register_comm_hook(state, recording)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
        train(ddp, optimizer, 0, 2, rank)
        seen.sort(key=lambda e: (e[0], e[1]))  # (lanes complete buckets in any order; every rank replays in one)
        same, worst = True, 0.0
        for iteration, index, shapes, before, after in seen:
            # Replay every step this bucket's reducer made, on every rank's inputs.
            history = []
            steps = [e for e in seen if e[1] == index and e[2] == shapes and e[0] <= iteration]
            for step in steps:
                b = step[3].float()
                everyone = [torch.empty_like(b) for _ in range(RANKS)]
                dist.all_gather(everyone, b)
                history.append(everyone)
            n = before.numel()
            compressed = any(len(s) > 1 for s in shapes) and n >= OPTIONS["min_compression_elements"]
            expected = gradcomp_c10d_tests.local_allreduce(
                spec if compressed else "bf16", shapes, index, history, rank
            ).to(dtype)
            same = same and after.dtype == dtype and torch.equal(expected, after)
            worst = max(worst, ((expected - after).abs().max() / expected.abs().max()).item())
        out[(spec, str(dtype).removeprefix("torch."))] = (same, worst, replicas_equal(net))
    results[rank] = out
    dist.destroy_process_group()


def checkpointed(rank, path, phase, spec, folder, results):
    """Trains 8 iterations whole, or 4 then saves ("first"), or loads and
    trains the last 4 ("resumed"); also what an automatic spec chose, and
    whether every rank chose the same."""
    import gradcomp.torch as gct

    init(rank, path)
    net, ddp = model(seed=3)
    state = gct.register(ddp, spec, warmup=2, **OPTIONS)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    file = os.path.join(folder, f"rank{rank}.pt")
    if phase == "whole":
        train(ddp, optimizer, 0, 8, rank)
    elif phase == "first":
        train(ddp, optimizer, 0, 4, rank)
        torch.save(
            {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "gradcomp": state.state_dict()}, file
        )
    else:
        saved = torch.load(file, weights_only=False)
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state.load_state_dict(saved["gradcomp"])
        train(ddp, optimizer, 4, 8, rank)
    copy = pickle.loads(pickle.dumps(state))  # without its process group; takes the default one
    choices = state.choices()
    everyone = [None] * RANKS
    dist.all_gather_object(everyone, choices)
    results[rank] = dict(
        weights=weights(net),
        replicas_equal=replicas_equal(net),
        pickles=copy.state_dict()["buckets"].keys() == state.state_dict()["buckets"].keys()
        and copy.iterations == state.iterations,
        choices=choices,
        same_choices=all(c == choices for c in everyone),
        descriptions={i: state.description(i) for i in choices},
    )
    dist.destroy_process_group()


def rebuilt(rank, path, results):
    import gradcomp.torch as gct

    init(rank, path)
    net, ddp = model(shuffled=True)
    state = gct.register(ddp, "topkc", warmup=0, **OPTIONS)  # the first buckets are built, then rebuilt
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    train(ddp, optimizer, 0, 4, rank)
    results[rank] = (replicas_equal(net), state.iterations)
    dist.destroy_process_group()


def lanes(rank, path, results):
    """Six iterations on 1, 2 and 3 lanes; and 3 on 2 lanes, saved, loaded
    into a fresh DDP (whose first bucket spans reductions of several lanes)
    on 3 lanes, and 3 more."""
    import gradcomp.torch as gct

    init(rank, path)

    def trained(n, first, last, saved=None):
        net, ddp = model(seed=5)
        state = gct.register(ddp, "topkc", warmup=1, lanes=n, **OPTIONS)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        if saved is not None:
            net.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            state.load_state_dict(saved["gradcomp"])
        train(ddp, optimizer, first, last, rank)
        return net, optimizer, state

    out = {}
    for n in (1, 2, 3):
        net, _, state = trained(n, 0, 6)
        out[n] = (weights(net), state.lanes, replicas_equal(net))
    net, optimizer, state = trained(2, 0, 3)
    saved = copy.deepcopy(
        {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "gradcomp": state.state_dict()}
    )
    net, _, state = trained(3, 3, 6, saved)
    out["resumed"] = weights(net)
    results[rank] = out
    dist.destroy_process_group()


def main():
    check = Checks()

    # register() checks what it is given before anything else.
    import gradcomp.torch as gct

    for given, wanted in ((torch.nn.Linear(2, 2), "DistributedDataParallel"), (3, "DistributedDataParallel")):
        try:
            gct.register(given, "bf16")
            check(False, f"register({type(given).__name__}) raises TypeError")
        except TypeError as e:
            check(wanted in str(e), f"register({type(given).__name__}) raises TypeError naming {wanted}: {e}")

    results = launch(every_compressor)
    for name, (finite, same, iterations, wire, descriptions) in results[0].items():
        agree = all(results[r][name][:4] == results[0][name][:4] for r in range(RANKS))
        check(
            finite and same and iterations == 4 and wire > 0 and agree,
            f"{name}: trains 4 iterations, replicas bitwise equal, {wire} wire bytes, buckets {descriptions}",
        )

    results = launch(hook_equals_allreducer)
    for spec, dtype in results[0]:
        # Integer lanes sum exactly: bitwise. gloo adds bf16 values rounding
        # after each addition, local_group once: within a few bf16 roundings.
        case = (spec, dtype)
        what = f"{spec}, {dtype} model: each bucket's hook result is gradcomp's allreducer's over local_group"
        check(all(results[r][case][2] for r in range(RANKS)), f"{spec}, {dtype} model: replicas bitwise equal")
        if spec in ("thc", "intsgd", "qsgd"):
            check(
                all(results[r][case][0] for r in range(RANKS)),
                what + (", bitwise" if dtype == "float32" else f", rounded to {dtype}: bitwise"),
            )
        else:
            worst = max(results[r][case][1] for r in range(RANKS))
            check(worst <= 2**-6, f"{what}, within {worst:.1e} of the largest value")

    for spec in ("topkc", "powersgd"):
        with tempfile.TemporaryDirectory() as folder:
            whole = launch(checkpointed, "whole", spec, folder)
            launch(checkpointed, "first", spec, folder)
            resumed = launch(checkpointed, "resumed", spec, folder)
        check(
            all(torch.equal(whole[r]["weights"], resumed[r]["weights"]) for r in range(RANKS)),
            f"{spec}: saved at iteration 4 and loaded into fresh processes, iteration 8 is bitwise the same",
        )
        check(all(resumed[r]["pickles"] for r in range(RANKS)), f"{spec}: the state pickles without its process group")

    results = launch(rebuilt)
    check(all(results[r] == (True, 4) for r in range(RANKS)), "DDP's rebuilt buckets get reductions of their own")

    results = launch(lanes)
    check(
        all(
            results[r][n][1:] == (n, True) and torch.equal(results[r][n][0], results[r][1][0])
            for r in range(RANKS)
            for n in (1, 2, 3)
        ),
        "host buckets on 1, 2 and 3 lanes (each lane made) train bitwise alike, replicas equal",
    )
    check(
        all(torch.equal(results[r]["resumed"], results[r][1][0]) for r in range(RANKS)),
        "a state saved on 2 lanes at iteration 3 and loaded on 3 lanes continues bitwise",
    )

    return 1 if check.failed() else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
