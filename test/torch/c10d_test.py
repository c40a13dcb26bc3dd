"""Runs gradcomp's c10d backend tests on 4 gloo ranks (torch.multiprocessing),
then checks that a rank that leaves, or never calls, makes its peers raise
gradcomp's CollectiveError within the timeout instead of hanging.

    PYTHONPATH=build/python:build/test/torch python3 test/torch/c10d_test.py [doctest options]
"""

import os
import sys
import time

import torch.distributed as dist
from gloo_ranks import RANKS, init, launch


def suite(rank, path, args, results):
    import gradcomp_c10d_tests

    init(rank, path)
    results[rank] = gradcomp_c10d_tests.run(dist.group.WORLD, args)
    dist.destroy_process_group()


def peer_fails(rank, path, mode, results):
    import gradcomp_c10d_tests

    init(rank, path)
    dist.barrier()
    if rank == RANKS - 1:
        if mode == "stalls":  # alive, but never makes the call
            time.sleep(12)
        os._exit(0)  # leaves without a word
    message, seconds = gradcomp_c10d_tests.failing_all_reduce(dist.group.WORLD, 3000)
    results[rank] = (message, seconds)
    os._exit(0)  # the group is broken: skip its orderly teardown


def main():
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    failed = launch(suite, sys.argv[1:])
    print(f"c10d suite: failed cases per rank {[failed.get(r) for r in range(RANKS)]}")
    ok = all(failed.get(r) == 0 for r in range(RANKS))
    for mode in ("leaves", "stalls"):
        results = launch(peer_fails, mode)
        for r in range(RANKS - 1):
            message, seconds = results.get(r, ("no result", float("inf")))
            good = "c10d_communicator" in message and seconds < 10
            print(f"a peer {mode}: rank {r} {'raised' if good else 'FAILED'} after {seconds:.1f} s: {message[:160]}")
            ok = ok and good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
