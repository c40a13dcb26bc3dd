"""What the PyTorch tests share: RANKS gloo processes over a FileStore, each
running a target and leaving its result in a dict keyed by rank; and a
checklist that prints each check and counts the failures.

With GRADCOMP_EXPECT_INSTALLED=1 (CI's installed-package run), importing this
module fails unless gradcomp comes from the interpreter's site-packages, so a
test cannot pass on a build tree found by accident."""

import datetime
import os
import sysconfig
import tempfile

import torch.distributed as dist
import torch.multiprocessing as mp

RANKS = 4


def gradcomp_origin() -> str:
    """Where gradcomp.torch was imported from; checked against site-packages
    where GRADCOMP_EXPECT_INSTALLED is set."""
    import gradcomp.torch

    origin = os.path.realpath(gradcomp.torch.__file__)
    if os.environ.get("GRADCOMP_EXPECT_INSTALLED") == "1":
        site = {os.path.realpath(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
        if not any(origin.startswith(path + os.sep) for path in site):
            raise SystemExit(
                f"gradcomp.torch was imported from {origin}, not from the installed package "
                f"(site-packages: {', '.join(sorted(site))})"
            )
    return origin


gradcomp_origin()


def init(rank, path):
    """This process as rank `rank` of a gloo group over the FileStore at `path`."""
    dist.init_process_group(
        "gloo", store=dist.FileStore(path, RANKS), rank=rank, world_size=RANKS, timeout=datetime.timedelta(seconds=60)
    )


def launch(target, *args):
    """Runs target(rank, store_path, *args, results) in RANKS processes; returns results."""
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(target, args=(os.path.join(tmp, "store"), *args, results), nprocs=RANKS, join=True)
        return dict(results)


class Checks:
    """check(ok, what) prints ok or FAIL and what; failed() is the number that failed."""

    def __init__(self):
        self.failures = []

    def __call__(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            self.failures.append(what)

    def failed(self):
        print(f"{len(self.failures)} failed")
        return len(self.failures)
