"""gradcomp's DDP hook on 4 gloo processes: its errors arrive where and as
gradcomp.torch's documentation says.

- register() refuses, on every rank and before any step, a value out of
  range for any key of any registered compressor (InvalidArgument, a
  ValueError, with the compressor's own message naming the key), a key the
  compressor does not take, an unknown compressor, and a spec this group's
  size cannot take; the DDP model is left without a hook;
- `except gradcomp.torch.<Error>` around backward() catches, on every rank
  and with gradcomp's message alone: a NaN on one rank (NonfiniteError), a
  spec that only the rebuilt buckets cannot take (InvalidArgument), and a
  peer that leaves (CollectiveError, within the group's timeout).

    PYTHONPATH=build/python:build/test/torch python3 test/torch/ddp_errors_test.py
"""

import os
import sys
import time

import torch
from ddp_test import OPTIONS, batch, model
from gloo_ranks import RANKS, Checks, init, launch

# Values out of each key's range, whatever the compressor; a key without an
# entry fails the test, so a new parameter needs one (registry_test.cpp
# holds the same for C++).
OUT_OF_RANGE = {
    "fraction": ("0", "2", "-0.5"),
    "chunk_size": ("0", "3"),
    "bits": ("0", "99"),
    "block": ("3", "8192"),
    "stages": ("-2", "99"),
    "k": ("0",),
    "matrix_rank": ("0",),
}
# Refused for another reason: the 4 ranks' sums overflow the int8 lane asked
# for, a key topkc does not take, no such compressor.
OTHER_BAD = {
    "thc:bits=7,lane=int8": "4 ranks x levels 0..127",
    "topkc:fraction=0.1,bits=4": "topkc takes no 'bits'",
    "nosuch": "unknown compressor 'nosuch'",
}


def bad_specs():
    import gradcomp.torch as gct

    specs = {}
    for name, keys in gct.compressors().items():
        for key in keys:
            if key not in ("ef", "lane"):
                specs.update({f"{name}:{key}={bad}": f"{name}: {key}={bad}" for bad in OUT_OF_RANGE[key]})
    return {**specs, **OTHER_BAD}


def refused_at_registration(rank, path, results):
    import gradcomp.torch as gct

    init(rank, path)
    out = {}
    for spec in bad_specs():
        net, ddp = model()
        try:
            gct.register(ddp, spec, **OPTIONS)
            out[spec] = ("accepted", "", False)
        except gct.Error as e:
            hooked = bool(ddp._get_ddp_logging_data().get("comm_hook"))
            out[spec] = (type(e).__name__ + (" (ValueError)" if isinstance(e, ValueError) else ""), str(e), hooked)
    results[rank] = out
    os._exit(0)


def attempt(ddp, rank, iterations, poisoned=None):
    """Trains `iterations` iterations; returns how backward() failed (the
    error's type, its message, the iteration), or that it did not."""
    import gradcomp.torch as gct

    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for it in range(iterations):
        x, y = batch(rank, it)
        if rank == poisoned:
            x[0, 0] = float("nan")
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        try:
            loss.backward()
        except gct.Error as e:
            return type(e).__name__, str(e), it
        except Exception as e:
            return f"untyped {type(e).__name__}", str(e), it
        optimizer.step()
    return "none", "", iterations


def step_errors(rank, path, results):
    import gradcomp.torch as gct

    init(rank, path)
    out = {}
    net, ddp = model()
    gct.register(ddp, "topkc", warmup=0, nonfinite="raise", **OPTIONS)
    out["nan"] = attempt(ddp, rank, 2, poisoned=1)
    net, ddp = model()
    # Registers (no bucket is known yet); DDP's rebuilt buckets, the first
    # compressed after one warm-up iteration, hold fewer values than k.
    gct.register(ddp, "global_randk:k=100000000", warmup=1, **OPTIONS)
    out["rebuilt"] = attempt(ddp, rank, 3)
    results[rank] = out
    os._exit(0)  # DDP's reducers are left mid-iteration: skip their teardown


def peer_leaves(rank, path, results):
    import gradcomp.torch as gct

    init(rank, path, timeout_s=20)
    net, ddp = model()
    gct.register(ddp, "topkc", warmup=0, **OPTIONS)
    # Two iterations first: DDP rebuilds its buckets in the second one's
    # forward pass, with a collective of its own (which would fail there).
    attempt(ddp, rank, 2)
    if rank == RANKS - 1:
        results[rank] = ("left", "", 0, 0.0)
        os._exit(0)
    start = time.monotonic()
    results[rank] = (*attempt(ddp, rank, 1), time.monotonic() - start)
    os._exit(0)


def main():
    check = Checks()

    results = launch(refused_at_registration)
    for spec, wanted in bad_specs().items():
        kind, message, hooked = results[0][spec]
        check(
            kind == "InvalidArgument (ValueError)" and wanted in message and not hooked,
            f"register(ddp, {spec!r}) raises InvalidArgument before any hook: {message[:110]}",
        )
        check(all(results[r][spec] == results[0][spec] for r in range(RANKS)), f"{spec}: the same on every rank")
    for spec, wanted in bad_specs().items():
        if spec not in OTHER_BAD:
            message = results[0][spec][1]
            check(message.startswith(wanted), f"{spec}: the compressor's own message, key first: {message[:60]}")

    results = launch(step_errors)
    cases = {
        "nan": ("NonfiniteError", "skipped this step", 0, "a NaN on rank 1"),
        "rebuilt": ("InvalidArgument", "k=100000000", 1, "a spec the rebuilt buckets cannot take"),
    }
    for case, (kind, words, iteration, what) in cases.items():
        for r in range(RANKS):
            got, message, at = results[r][case]
            check(
                got == kind and words in message and at == iteration and "Traceback" not in message,
                f"rank {r}: {what}: backward() raises {kind} at iteration {iteration}: {got}: {message[:100]}",
            )

    results = launch(peer_leaves)
    for r in range(RANKS - 1):
        got, message, at, seconds = results[r]
        check(
            got == "CollectiveError" and seconds < 30,
            f"rank {r}: a peer that left: backward() raises CollectiveError in {seconds:.1f} s: {message[:100]}",
        )
    return 1 if check.failed() else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
