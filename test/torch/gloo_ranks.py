"""What the PyTorch tests share: RANKS gloo processes over a FileStore, each
running a target and leaving its result in a dict keyed by rank; and a
checklist that prints each check and counts the failures.

With GRADCOMP_EXPECT_INSTALLED=1 (CI's installed-package run), importing this
module fails unless gradcomp comes from the interpreter's site-packages, so a
test cannot pass on a build tree found by accident."""

import datetime
import multiprocessing
import os
import sysconfig
import tempfile

import torch.distributed as dist
import torch.multiprocessing as mp

RANKS = 4


def check_gradcomp_origin() -> None:
    """Where GRADCOMP_EXPECT_INSTALLED is set, exits unless gradcomp.torch was
    imported from the interpreter's site-packages."""
    import gradcomp.torch

    origin = os.path.realpath(gradcomp.torch.__file__)
    if os.environ.get("GRADCOMP_EXPECT_INSTALLED") == "1":
        site = {os.path.realpath(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
        if not any(origin.startswith(path + os.sep) for path in site):
            raise SystemExit(
                f"gradcomp.torch was imported from {origin}, not from the installed package "
                f"(site-packages: {', '.join(sorted(site))})"
            )


check_gradcomp_origin()

# Ranks are forked from a server process that imported torch and gradcomp once,
# rather than spawned: a spawned rank imports torch again, and four of them
# doing so on every launch took most of a test's time on a 2-core machine.
multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "gradcomp.torch"])


def init(rank, path, timeout_s=60):
    """This process as rank `rank` of a gloo group over the FileStore at `path`."""
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(path, RANKS),
        rank=rank,
        world_size=RANKS,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def launch(target, *args):
    """Runs target(rank, store_path, *args, results) in RANKS processes; returns results."""
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(
            target, args=(os.path.join(tmp, "store"), *args, results), nprocs=RANKS, start_method="forkserver"
        )
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
