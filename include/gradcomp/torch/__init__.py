"""gradcomp in PyTorch: every gradcomp compressor as a DDP communication hook.

    import gradcomp.torch
    state = gradcomp.torch.register(ddp_model, "topkc:fraction=0.1", warmup=2)

Each DDP bucket is reduced by the compressor the spec names (small buckets and
buckets of 1-D tensors by ``small``, bf16 by default), over the process group
DDP uses, while the backward pass goes on: a host (gloo) bucket in C++ on a
worker thread, a CUDA (NCCL) bucket on a side stream, where the module was
built with CUDA (``device_buckets``), without the host waiting for the step. The spec
strings and their keys are gradcomp's registry's (``compressors()``).
``"auto:of=bf16+topkc+powersgd"`` lets gradcomp's planner choose among those,
bucket by bucket, on this group's network, when each bucket is first built
after warm-up (rank 0 prints its table; ``state.choices()`` says what it chose).
"""

import concurrent.futures
import threading

import torch
import torch.distributed as dist

from . import _C
from ._C import CollectiveError, Error, InvalidArgument, NonfiniteError, compressors, device_buckets, parse_spec

__version__ = _C.__version__
__all__ = ["GradcompState", "register", "hook", "ReduceScatter", "shard", "compressors", "parse_spec", "Error", "InvalidArgument",
           "CollectiveError", "NonfiniteError", "device_buckets"]


class GradcompState:
    """The hook's state: the compressor spec and every bucket's reduction.

    ``state_dict()``/``load_state_dict()`` save and restore this rank's part
    (residuals and compressor state, as gradcomp's checkpoint bytes); pickling
    leaves out the process group, which the unpickled state takes from the
    default group, as PyTorch's ``PowerSGDState`` does.
    """

    def __init__(self, process_group=None, compressor="topkc", *, small="bf16", min_compression_elements=65536,
                 warmup=0, seed=None, nonfinite="raise", model=None):
        # A parameter's position in the model names it across processes: a
        # loaded state finds its buckets in DDP's first (unrebuilt) bucket.
        self._positions = {id(p): i for i, p in enumerate(model.parameters())} if model is not None else {}
        self._units = {}  # reduction index -> the parameter positions it holds
        self.compressor = parse_spec(compressor)
        self.small = parse_spec(small)
        self.min_compression_elements = int(min_compression_elements)
        self.warmup = int(warmup)
        self.seed = seed
        self.nonfinite = nonfinite
        self._bind(process_group)

    def _bind(self, process_group):
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self._impl = _C.HookState(self.process_group, self.compressor, self.small, self.min_compression_elements,
                                  self.warmup, self.seed, self.nonfinite, torch.get_num_threads())
        # One worker: buckets reduce in DDP's order on every rank, while the
        # autograd thread computes the next gradients.
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gradcomp")
        self._lock = threading.Lock()
        self._streams = {}  # CUDA device -> the side stream its buckets are reduced on

    def _side_stream(self, device):
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

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

    def choices(self):
        """The planner's compressor of each bucket it planned, by index (a
        spec "auto:of=..."; empty otherwise)."""
        self._worker.submit(lambda: None).result()
        return self._impl.choices()

    def state_dict(self):
        """This rank's state: iterations, each bucket's checkpoint bytes, and
        the planner's choices (a loaded state keeps them)."""
        self._worker.submit(lambda: None).result()  # every submitted bucket is done
        iterations, buckets = self._impl.save()
        return {"gradcomp": __version__, "compressor": self.compressor, "small": self.small,
                "iterations": iterations, "buckets": buckets, "choices": self._impl.choices(),
                "units": {i: u for i, u in self._units.items() if i in buckets}}

    def load_state_dict(self, state):
        """Restores what ``state_dict()`` saved on this rank (every rank loads
        its own before the next step). A checkpoint of another configuration
        fails every rank with gradcomp's message when its bucket is built,
        among them host (gloo) buckets' checkpoints saved under ``"raise"``
        loaded into CUDA buckets (which always propagate)."""
        self._worker.submit(lambda: None).result()
        if state.get("compressor") != self.compressor or state.get("small") != self.small:
            raise InvalidArgument(f"gradcomp state: a checkpoint of compressor {state.get('compressor')!r} / small "
                                  f"{state.get('small')!r} cannot be loaded into {self.compressor!r} / {self.small!r}")
        self._impl.load(int(state["iterations"]), dict(state["buckets"]), dict(state.get("choices", {})))
        self._units = dict(state.get("units", {}))

    def __getstate__(self):
        saved = self.state_dict()
        keep = {k: v for k, v in self.__dict__.items()
                if k not in ("process_group", "_impl", "_worker", "_lock", "_positions", "_streams")}
        return {"config": keep, "saved": saved}

    def __setstate__(self, state):
        self.__dict__.update(state["config"])
        self._positions = {}
        self._bind(None)
        self.load_state_dict(state["saved"])


def _pieces(state, bucket):
    """The reductions a DDP bucket is made of, as (index, slices of the
    buffer, shapes): the bucket itself; or, where its parameters are exactly
    those of known reductions (a state loaded into a fresh DDP, whose first
    bucket holds every parameter, in another order), those reductions, each
    gathered in its own order, so a resumed run reduces as the saved one did."""
    params = bucket.parameters()
    shapes = [list(p.shape) for p in params]
    whole = [(bucket.index(), [(0, bucket.buffer().numel())], shapes)]
    positions = [state._positions.get(id(p), -1) for p in params]
    if not state._positions or -1 in positions:
        return whole
    key = tuple(positions)
    for index, unit in state._units.items():
        if unit == key:
            return [(index, whole[0][1], shapes)]
    where, offset = {}, 0
    for position, p in zip(positions, params):
        where[position] = (offset, offset + p.numel(), list(p.shape))
        offset += p.numel()
    covering = [(i, u) for i, u in sorted(state._units.items()) if set(u) <= where.keys()]
    covered = [position for _, u in covering for position in u]
    if sorted(covered) != sorted(positions):  # a new bucket (DDP rebuilt them): a reduction of its own
        state._units[bucket.index()] = key
        return whole
    return [(i, [where[q][:2] for q in u], [where[q][2] for q in u]) for i, u in covering]


def hook(state: GradcompState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook: bucket ``bucket.index()`` reduced to the
    mean by gradcomp, on the state's worker thread (host buckets) or its side
    stream (CUDA buckets)."""
    buffer = bucket.buffer()
    pieces = _pieces(state, bucket)
    last = bucket.is_last()
    if buffer.is_cuda:
        return _device_hook(state, buffer, pieces, last)
    future = torch.futures.Future()

    def run():
        try:
            _reduce(state, buffer, pieces, last)
            future.set_result(buffer)
        except Exception as e:
            future.set_result(e)

    state._worker.submit(run)
    return future.then(_raise_failure)


def _reduce(state, buffer, pieces, last):
    for index, slices, shapes in pieces:
        if len(slices) == 1:
            state._impl.reduce(index, buffer[slices[0][0]:slices[0][1]], shapes)
            continue
        gathered = torch.cat([buffer[a:b] for a, b in slices])  # (a resumed run's first iteration only)
        state._impl.reduce(index, gathered, shapes)
        at = 0
        for a, b in slices:
            buffer[a:b].copy_(gathered[at:at + b - a])
            at += b - a
    if last:
        state._impl.end_iteration()


def _device_hook(state, buffer, pieces, last):
    # The bucket's kernels and NCCL calls are enqueued on a side stream that
    # waits for the backward pass's stream up to now, so the backward goes on
    # computing. The future is bound to the device and completed on the side
    # stream: DDP's wait makes its own stream wait for the reduction, and the
    # host does not wait for the step. A failure raises here, on every rank (a
    # fault the device found: at that bucket's next step; bad values come back
    # as NaN instead).
    side = state._side_stream(buffer.device)
    side.wait_stream(torch.cuda.current_stream(buffer.device))
    future = torch.futures.Future(devices=[buffer.device])
    with torch.cuda.stream(side):
        _reduce(state, buffer, pieces, last)
        future.set_result(buffer)
    return future


def _raise_failure(future):
    # A failed reduction raises from the callback, which fails the future DDP
    # waits on with gradcomp's exception (set_exception would hand DDP the
    # exception object as the bucket's value).
    value = future.value()
    if isinstance(value, Exception):
        raise value
    return value


def register(model, compressor="topkc", *, process_group=None, **options):
    """Registers gradcomp's hook on the DDP ``model``, reducing by the
    ``compressor`` spec (or ``"auto:of=..."``, the planner's choice per
    bucket); returns its GradcompState. ``options``: ``small``,
    ``min_compression_elements``, ``warmup`` (iterations of plain fp32 means,
    like ``start_powerSGD_iter``), ``seed`` and ``nonfinite``
    (``"raise"`` or ``"propagate"``; CUDA buckets always propagate: a bad
    value makes the bucket NaN on every rank, as raising would need the host
    to wait)."""
    state = GradcompState(process_group if process_group is not None else model.process_group, compressor,
                          model=model.module, **options)
    model.register_comm_hook(state, hook)
    return state


def _fsdp_reduce_scatter_base():
    # FSDP2's Comm interface is not exported (PyTorch 2.15): its private
    # module path. Where it moved, ReduceScatter says so when it is made, and
    # the DDP hook is unaffected.
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as Base
        return Base
    except ImportError as e:
        reason = f"this PyTorch ({torch.__version__}) has no FSDP2 ReduceScatter interface where 2.15 has it ({e})"

        class Missing:
            def __init__(self, *args, **kwargs):
                raise ImportError("gradcomp.torch.ReduceScatter: " + reason)
        return Missing


class ReduceScatter(_fsdp_reduce_scatter_base()):
    """FSDP2's reduce-scatter through a gradcomp compressor that shards (every
    registered one but PowerSGD and classic TopK): each rank gets the mean of
    its shard, compressed on the wire. One per FSDP module
    (``module.set_custom_reduce_scatter``; ``shard()`` sets them all); its
    residuals are the module's."""

    def __init__(self, compressor="thc", *, seed=None):
        self.compressor = parse_spec(compressor)
        if not _C.shards(self.compressor):
            raise InvalidArgument(f"gradcomp.torch.ReduceScatter: {self.compressor} cannot reduce-scatter (its "
                                  f"payload does not sum element by element, or needs the tensors' shapes)")
        self.seed = seed
        self._impl = None
        self._group = None

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        if op != dist.ReduceOp.AVG:
            raise InvalidArgument(f"gradcomp.torch.ReduceScatter computes the mean (ReduceOp.AVG); FSDP asked for "
                                  f"{op} (a gradient_divide_factor other than the world size, or 16-bit "
                                  f"reduce_dtype other than bf16)")
        if self._impl is None or self._group is not group:
            self._impl = _C.ReduceScatterState(group, self.compressor, self.seed, torch.get_num_threads())
            self._group = group
        self._impl(input_tensor, output_tensor)
        return None

    @property
    def wire_bytes(self):
        """Bytes the last call put on the wire, per rank."""
        return self._impl.wire_bytes if self._impl is not None else 0


def shard(model, compressor="thc", **options):
    """Gives every FSDP2 module of ``model`` (``fully_shard`` applied) a
    gradcomp ReduceScatter of its own; returns them."""
    from torch.distributed.fsdp import FSDPModule
    comms = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            comms.append(ReduceScatter(compressor, **options))
            module.set_custom_reduce_scatter(comms[-1])
    return comms
