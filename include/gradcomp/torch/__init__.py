"""gradcomp in PyTorch: every gradcomp compressor as a DDP communication hook.

    import gradcomp.torch
    state = gradcomp.torch.register(ddp_model, "topkc:fraction=0.1", warmup=2)

Each DDP bucket is reduced by the compressor the spec names (small buckets and
buckets of 1-D tensors by ``small``, bf16 by default), over the process group
DDP uses, in C++ on a worker thread while the backward pass goes on. The spec
strings and their keys are gradcomp's registry's (``compressors()``).
"""

import concurrent.futures
import threading

import torch
import torch.distributed as dist

from . import _C
from ._C import CollectiveError, Error, InvalidArgument, NonfiniteError, compressors, parse_spec

__version__ = _C.__version__
__all__ = ["GradcompState", "register", "hook", "compressors", "parse_spec", "Error", "InvalidArgument",
           "CollectiveError", "NonfiniteError"]


class GradcompState:
    """The hook's state: the compressor spec and every bucket's reduction.

    ``state_dict()``/``load_state_dict()`` save and restore this rank's part
    (residuals and compressor state, as gradcomp's checkpoint bytes); pickling
    leaves out the process group, which the unpickled state takes from the
    default group, as PyTorch's ``PowerSGDState`` does.
    """

    def __init__(self, process_group=None, compressor="topkc", *, small="bf16", min_compression_elements=65536,
                 warmup=0, seed=None, nonfinite="raise"):
        self.compressor = parse_spec(compressor)
        self.small = parse_spec(small)
        self.min_compression_elements = int(min_compression_elements)
        self.warmup = int(warmup)
        self.seed = seed
        self.nonfinite = nonfinite
        self._bind(process_group)

    def _bind(self, process_group):
        self.process_group = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
        self._impl = _C.HookState(self.process_group, self.compressor, self.small, self.min_compression_elements,
                                  self.warmup, self.seed, self.nonfinite)
        # One worker: buckets reduce in DDP's order on every rank, while the
        # autograd thread computes the next gradients.
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gradcomp")
        self._lock = threading.Lock()

    @property
    def iterations(self):
        """Iterations completed (warm-up included)."""
        return self._impl.iterations

    @property
    def wire_bytes(self):
        """Bytes the compressed buckets of the last iteration put on the wire."""
        return self._impl.wire_bytes

    def description(self, index):
        """Bucket ``index``'s compressor, e.g. ``topkc<bf16>``."""
        return self._impl.description(index)

    def state_dict(self):
        """This rank's state: iterations and each bucket's checkpoint bytes."""
        self._worker.submit(lambda: None).result()  # every submitted bucket is done
        iterations, buckets = self._impl.save()
        return {"gradcomp": __version__, "compressor": self.compressor, "small": self.small,
                "iterations": iterations, "buckets": buckets}

    def load_state_dict(self, state):
        """Restores what ``state_dict()`` saved on this rank (every rank loads
        its own before the next step). A checkpoint of another configuration
        fails every rank with gradcomp's message when its bucket is built."""
        self._worker.submit(lambda: None).result()
        if state.get("compressor") != self.compressor or state.get("small") != self.small:
            raise InvalidArgument(f"gradcomp state: a checkpoint of compressor {state.get('compressor')!r} / small "
                                  f"{state.get('small')!r} cannot be loaded into {self.compressor!r} / {self.small!r}")
        self._impl.load(int(state["iterations"]), dict(state["buckets"]))

    def __getstate__(self):
        saved = self.state_dict()
        keep = {k: v for k, v in self.__dict__.items() if k not in ("process_group", "_impl", "_worker", "_lock")}
        return {"config": keep, "saved": saved}

    def __setstate__(self, state):
        self.__dict__.update(state["config"])
        self._bind(None)
        self.load_state_dict(state["saved"])


def hook(state: GradcompState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook: bucket ``bucket.index()`` reduced to the
    mean by gradcomp, on the state's worker thread."""
    buffer = bucket.buffer()
    index = bucket.index()
    shapes = [list(p.shape) for p in bucket.parameters()]
    last = bucket.is_last()
    future = torch.futures.Future()

    def run():
        try:
            state._impl.reduce(index, buffer, shapes)
            if last:
                state._impl.end_iteration()
            future.set_result(buffer)
        except BaseException as e:  # delivered to DDP's wait(), on the training thread
            future.set_exception(e)

    state._worker.submit(run)
    return future


def register(model, compressor="topkc", *, process_group=None, **options):
    """Registers gradcomp's hook on the DDP ``model``, reducing by the
    ``compressor`` spec; returns its GradcompState. ``options``: ``small``,
    ``min_compression_elements``, ``warmup`` (iterations of plain fp32 means,
    like ``start_powerSGD_iter``), ``seed`` and ``nonfinite``
    (``"raise"`` or ``"propagate"``)."""
    state = GradcompState(process_group if process_group is not None else model.process_group, compressor, **options)
    model.register_comm_hook(state, hook)
    return state
