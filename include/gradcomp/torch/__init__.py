"""gradcomp in PyTorch: every gradcomp compressor as a DDP communication hook.

    import gradcomp.torch
    state = gradcomp.torch.register(ddp_model, "topkc:fraction=0.1", warmup=2)

Each DDP bucket is reduced by the compressor the spec names (small buckets and
buckets of 1-D tensors by ``small``, bf16 by default), over the process group
DDP uses, while the backward pass goes on: host (gloo) buckets in C++ on
worker threads, two buckets at once (``lanes``), a CUDA (NCCL) bucket on a side
stream, where the module was built with CUDA (``device_buckets``), without the
host waiting for the step. A bf16 or fp16 model's buckets are reduced in fp32
and rounded back. The spec strings and their keys are gradcomp's registry's
(``compressors()``).
``"auto:of=bf16+topkc+powersgd"`` lets gradcomp's planner choose among those,
bucket by bucket, on this group's network, when each bucket is first built
after warm-up (rank 0 prints its table; ``state.choices()`` says what it chose).
"""

import concurrent.futures
import functools
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
                 warmup=0, seed=None, nonfinite="raise", lanes=2, model=None):
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
        self.lanes = int(lanes)
        if self.lanes < 1:
            raise InvalidArgument(f"gradcomp state: lanes must be 1 or more, not {lanes}")
        self._bind(process_group)

    def _bind(self, process_group):
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self._impl = self._new_impl(self.process_group)  # lane 0's; every CUDA bucket's
        self._lanes = [_Lane(self._impl)]  # the others are made at the first host bucket
        self._streams = {}  # CUDA device -> the side stream its buckets are reduced on

    def _side_stream(self, device):
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

    def _new_impl(self, group):
        return _C.HookState(group, self.compressor, self.small, self.min_compression_elements, self.warmup, self.seed,
                            self.nonfinite, torch.get_num_threads())

    def _host_lanes(self):
        """The host lanes, made at the first host bucket (a NCCL group's CUDA
        buckets need none): every lane but the first reduces over a group
        split from this one, so its collectives never meet another lane's.
        Reduction ``i`` is lane ``i % lanes``'s on every rank."""
        if len(self._lanes) < self.lanes:
            iterations, buckets = self._impl.save()  # a loaded state's checkpoints, not yet applied
            choices = self._impl.choices()
            while len(self._lanes) < self.lanes:
                self._lanes.append(_Lane(self._new_impl(_C.lane_group(self.process_group))))
            self._load(iterations, buckets, choices)
        return self._lanes

    def _lane(self, index):
        return self._lanes[index % len(self._lanes)]

    def _load(self, iterations, buckets, choices):
        n = len(self._lanes)
        for k, lane in enumerate(self._lanes):
            lane.impl.load(iterations, {i: b for i, b in buckets.items() if i % n == k},
                           {i: c for i, c in choices.items() if i % n == k})

    def _drain(self):
        """Waits for every bucket submitted so far."""
        for done in [lane.worker.submit(lambda: None) for lane in self._lanes]:
            done.result()

    @property
    def iterations(self):
        """Iterations completed (warm-up included)."""
        return self._impl.iterations

    @property
    def wire_bytes(self):
        """Bytes the compressed buckets of the last iteration put on the wire."""
        return sum(lane.impl.wire_bytes for lane in self._lanes)

    def description(self, index):
        """Bucket ``index``'s compressor, e.g. ``topkc<bf16>``."""
        return self._lane(index).impl.description(index)

    def choices(self):
        """The planner's compressor of each bucket it planned, by index (a
        spec "auto:of=..."; empty otherwise)."""
        self._drain()
        return self._choices()

    def _choices(self):
        return {i: c for lane in self._lanes for i, c in lane.impl.choices().items()}

    def state_dict(self):
        """This rank's state: iterations, each bucket's checkpoint bytes, and
        the planner's choices (a loaded state keeps them)."""
        self._drain()
        iterations, buckets = self._impl.save()
        for lane in self._lanes[1:]:
            buckets.update(lane.impl.save()[1])
        return {"gradcomp": __version__, "compressor": self.compressor, "small": self.small,
                "iterations": iterations, "buckets": buckets, "choices": self._choices(),
                "units": {i: u for i, u in self._units.items() if i in buckets}}

    def load_state_dict(self, state):
        """Restores what ``state_dict()`` saved on this rank (every rank loads
        its own before the next step). A checkpoint of another configuration
        fails every rank with gradcomp's message when its bucket is built,
        among them host (gloo) buckets' checkpoints saved under ``"raise"``
        loaded into CUDA buckets (which always propagate)."""
        self._drain()
        if state.get("compressor") != self.compressor or state.get("small") != self.small:
            raise InvalidArgument(f"gradcomp state: a checkpoint of compressor {state.get('compressor')!r} / small "
                                  f"{state.get('small')!r} cannot be loaded into {self.compressor!r} / {self.small!r}")
        self._load(int(state["iterations"]), dict(state["buckets"]), dict(state.get("choices", {})))
        self._units = dict(state.get("units", {}))

    def __getstate__(self):
        saved = self.state_dict()
        keep = {k: v for k, v in self.__dict__.items()
                if k not in ("process_group", "_impl", "_lanes", "_positions", "_streams")}
        return {"config": keep, "saved": saved}

    def __setstate__(self, state):
        self.__dict__.update(state["config"])
        self._positions = {}
        self._bind(None)
        self.load_state_dict(state["saved"])


class _Lane:
    """Host buckets reduced one after another, on a worker thread of their own
    (while the autograd thread computes the next gradients), over one group."""

    def __init__(self, impl):
        self.impl = impl
        self.worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gradcomp")


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
    mean by gradcomp, on the state's lanes (host buckets) or its side stream
    (CUDA buckets)."""
    buffer = bucket.buffer()
    pieces = _pieces(state, bucket)
    last = bucket.is_last()
    if buffer.is_cuda:
        return _device_hook(state, buffer, pieces, last)
    # Each piece on its reduction's lane, in DDP's order on every rank; the
    # last bucket also ends the iteration on every lane. The future completes
    # when all of it has.
    lanes = state._host_lanes()
    tasks = []
    for index, slices, shapes in pieces:
        lane = state._lane(index)
        tasks.append((lane, functools.partial(_reduce_piece, lane.impl, buffer, index, slices, shapes)))
    if last:
        tasks += [(lane, lane.impl.end_iteration) for lane in lanes]
    future = torch.futures.Future()
    remaining, failures, lock = len(tasks), [], threading.Lock()

    def run(task):
        nonlocal remaining
        try:
            task()
        except Exception as e:
            failures.append(e)
        with lock:
            remaining -= 1
            done = remaining == 0
        if done:
            future.set_result(failures[0] if failures else buffer)

    for lane, task in tasks:
        lane.worker.submit(run, task)
    return future.then(_raise_failure)


def _reduce_piece(impl, buffer, index, slices, shapes):
    if len(slices) == 1:
        impl.reduce(index, buffer[slices[0][0]:slices[0][1]], shapes)
        return
    gathered = torch.cat([buffer[a:b] for a, b in slices])  # (a resumed run's first iteration only)
    impl.reduce(index, gathered, shapes)
    at = 0
    for a, b in slices:
        buffer[a:b].copy_(gathered[at:at + b - a])
        at += b - a


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
        for index, slices, shapes in pieces:
            _reduce_piece(state._impl, buffer, index, slices, shapes)
        if last:
            state._impl.end_iteration()
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
    like ``start_powerSGD_iter``), ``seed``, ``nonfinite``
    (``"raise"`` or ``"propagate"``; CUDA buckets always propagate: a bad
    value makes the bucket NaN on every rank, as raising would need the host
    to wait) and ``lanes``: how many host buckets are reduced at once, each
    lane on a thread and a gloo group of its own (split from the process
    group), as gloo runs two collectives at once for PyTorch's own hooks; the
    results are the same with any number."""
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
