"""gradcomp in PyTorch: every gradcomp compressor as a DDP communication hook,
and FSDP2's reduce-scatter through the compressors that shard.

    import gradcomp.torch
    state = gradcomp.torch.register(ddp_model, "topkc:fraction=0.1", warmup=2)

Each DDP bucket is reduced by the compressor the spec names (small buckets and
buckets of 1-D tensors by ``small``, bf16 by default), over the process group
DDP uses, while the backward pass goes on: host (gloo) buckets in C++ on
gradcomp's lanes, two buckets at once by default; a CUDA (NCCL) bucket on a
side stream, where the module was built with CUDA (``device_buckets``), without
the host waiting for the step. 16-bit buckets are reduced as they are stored.
The spec strings and their keys are gradcomp's registry's (``compressors()``).
``"auto"`` (bf16, topkc and powersgd) or ``"auto:of=A+B+..."`` lets gradcomp's
planner choose among those, bucket by bucket, just before a bucket's first
compressed step, every rank waiting and nothing else on the group: it measures
the network, times each candidate's step on the bucket, and weighs it with the
bucket's share of an iteration timed during warm-up. It predicts step time,
not convergence: a candidate whose steps to a target are unknown is priced at
twice bf16's (``auto_unknown_steps_factor``; measured ones go in
``auto_steps_factor``), and bf16 is kept unless another is predicted to save
over 10% of its time to target. It prints nothing; ``state.choices()`` says
what it chose and ``state.report()`` why. Every option and its default is
``Options``'s (``Options()`` prints them).

Errors, each a subclass of ``Error`` (a ``RuntimeError``), raised on every rank:

- ``register`` raises ``TypeError`` for arguments of the wrong kind, and
  ``InvalidArgument`` (also a ``ValueError``) for a spec it cannot read, a
  value out of its key's range, or one this group's size cannot take, before
  any step;
- ``loss.backward()`` (the step DDP waits on) raises ``NonfiniteError`` (also
  an ``ArithmeticError``) for a NaN or infinity in any rank's bucket under
  ``nonfinite="raise"``, ``InvalidArgument`` for a bucket the spec cannot take
  (a ``k`` beyond it, say; known only once DDP has built it), and
  ``CollectiveError`` when a peer leaves or the group times out. Each carries
  gradcomp's message alone, and every rank's error-feedback state is kept.
"""

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from . import _C
from ._C import (
    CollectiveError,
    Error,
    InvalidArgument,
    NonfiniteError,
    Options,
    compressors,
    device_buckets,
    parse_spec,
)

__version__ = _C.__version__
__all__ = [
    "GradcompState",
    "Options",
    "register",
    "hook",
    "ReduceScatter",
    "shard",
    "compressors",
    "parse_spec",
    "Error",
    "InvalidArgument",
    "CollectiveError",
    "NonfiniteError",
    "device_buckets",
]


def _options(compressor: str | None, options: dict[str, Any]) -> Options:
    """An ``Options`` with ``compressor`` (where given) and ``options`` set;
    the host loops take torch's intra-op thread count unless told."""
    made = Options()
    made.threads = torch.get_num_threads()
    if compressor is not None:
        made.compressor = compressor
    known = [name for name in dir(Options) if not name.startswith("_")]
    for key, value in options.items():
        if key not in known:
            raise TypeError(f"gradcomp: unknown option {key!r} (the options are {', '.join(known)})")
        setattr(made, key, value)
    return made


class GradcompState:
    r"""The hook's state: its ``Options`` and every bucket's reduction.

    Args:
        process_group: the group to reduce over (default: the default group).
        compressor: a compressor spec, or ``"auto:of=..."`` (default:
            ``Options``'s, bf16).
        model: the module DDP wraps; its parameters' positions let a loaded
            state reduce DDP's first (not yet rebuilt) buckets as the saved
            run did.
        \*\*options: any other field of ``Options`` (``small``, ``warmup``,
            ``lanes``, ...).

    Its options read as its attributes (``state.compressor``,
    ``state.warmup``, ...). ``state_dict()``/``load_state_dict()`` save and
    restore this rank's part
    (residuals and compressor state, as gradcomp's checkpoint bytes); pickling
    leaves out the process group, which the unpickled state takes from the
    default group, as PyTorch's ``PowerSGDState`` does.
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        compressor: str | None = None,
        *,
        model: torch.nn.Module | None = None,
        **options: Any,
    ) -> None:
        # A parameter's position in the model names it across processes.
        self._positions = {id(p): i for i, p in enumerate(model.parameters())} if model is not None else {}
        self._bind(process_group, _options(compressor, options))

    def _bind(self, process_group: dist.ProcessGroup | None, options: Options) -> None:
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self._impl = _C.HookState(self.process_group, options)
        self._streams: dict[torch.device, torch.cuda.Stream] = {}  # CUDA device -> its buckets' side stream

    @property
    def options(self) -> Options:
        """A copy of its options (fixed when it was made)."""
        return self._impl.options

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

    def __getattr__(self, name: str) -> Any:
        # Its options read as its own attributes (state.compressor, state.warmup), as PowerSGDState's do.
        impl = self.__dict__.get("_impl")
        if impl is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(impl.options, name)

    @property
    def lanes(self) -> int:
        """The lanes host buckets are reduced on (0 before the first host bucket)."""
        return self._impl.lanes

    @property
    def iterations(self) -> int:
        """Iterations completed (warm-up included)."""
        return self._impl.iterations

    @property
    def wire_bytes(self) -> int:
        """Bytes the last iteration's buckets put on the wire (waits for them)."""
        return self._impl.wire_bytes

    def description(self, index: int) -> str:
        """Bucket ``index``'s compressor, e.g. ``topkc<bf16>`` (waits for the buckets)."""
        return self._impl.description(index)

    def choices(self) -> dict[int, str]:
        """The planner's compressor of each bucket it planned, by index (a
        spec ``"auto"`` or ``"auto:of=..."``; empty otherwise)."""
        return self._impl.choices()

    def report(self) -> str:
        """What the planner weighed for each bucket it planned, as tables
        headed "Bucket <index>" (the indices of ``choices()``): the measured
        network, each candidate's predicted step time against bf16's, and the
        choice. The choices are the same on every rank; the timings are this
        rank's. Empty for a fixed compressor. Nothing is printed unless asked."""
        return self._impl.report()

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: the options' compressors, the iterations and
        each kind of bucket's checkpoint bytes (every bucket's residual,
        compressor state, compressor and parameters)."""
        return {
            "gradcomp": __version__,
            "compressor": self.compressor,
            "small": self.small,
            "iterations": self.iterations,
            "buckets": self._impl.save(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what ``state_dict()`` saved on this rank (every rank loads
        its own before the next step). A checkpoint of another configuration
        fails every rank with gradcomp's message, among them host (gloo)
        buckets' checkpoints saved under ``"raise"`` loaded into CUDA buckets
        (which always propagate)."""
        if state.get("compressor") != self.compressor or state.get("small") != self.small:
            raise InvalidArgument(
                f"gradcomp state: a checkpoint of compressor {state.get('compressor')!r} / small "
                f"{state.get('small')!r} cannot be loaded into {self.compressor!r} / {self.small!r}"
            )
        self._impl.load(int(state["iterations"]), dict(state["buckets"]))

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "saved": self.state_dict()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._positions = {}
        self._bind(None, state["options"])
        self.load_state_dict(state["saved"])


def hook(state: GradcompState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook: bucket ``bucket.index()`` reduced in place
    to the mean by gradcomp, on the state's lanes (host buckets) or its side
    stream (CUDA buckets, which the side stream reduces once the backward
    pass's stream has computed them)."""
    buffer = bucket.buffer()
    params = bucket.parameters()
    positions = [state._positions.get(id(p), -1) for p in params]
    if -1 in positions:
        positions = []  # (a state without its model: buckets are known by index)
    shapes = [list(p.shape) for p in params]
    if not buffer.is_cuda:
        return state._impl.reduce(bucket.index(), buffer, positions, shapes, bucket.is_last())
    side = state._side_stream(buffer.device)
    side.wait_stream(torch.cuda.current_stream(buffer.device))
    with torch.cuda.stream(side):
        return state._impl.reduce(bucket.index(), buffer, positions, shapes, bucket.is_last())


def register(
    model: torch.nn.parallel.DistributedDataParallel,
    compressor: str | None = None,
    *,
    process_group: dist.ProcessGroup | None = None,
    **options: Any,
) -> GradcompState:
    """Registers gradcomp's hook on the DDP ``model``, reducing by the
    ``compressor`` spec (default bf16; ``"auto"`` or ``"auto:of=..."``: the
    planner's choice per bucket); returns its GradcompState. ``options`` are
    ``Options``' fields, each described there with its default: ``small``,
    ``min_compression_elements``, ``vectors_uncompressed``, ``warmup`` (2),
    ``seed``, ``nonfinite``, ``lanes`` (2), ``threads``, and for ``"auto"``
    ``auto_steps_factor`` and ``auto_unknown_steps_factor`` (2).

    Raises ``TypeError`` when ``model`` is not the DDP wrapper (a module
    before ``DistributedDataParallel(module)``, say), the compressor is not a
    string or the process group not a ProcessGroup; ``InvalidArgument`` (a
    ``ValueError``), on every rank before any step, for a spec that does not
    read, a value out of its key's range, or a spec this group's size cannot
    take (the module docstring lists where the other errors arrive).

    Under ``torch.compile`` the hook runs as it does eagerly with DDP's
    default graph split (``torch._dynamo.config.optimize_ddp`` left at
    ``"ddp_optimizer"``). A model built under ``"python_reducer"`` (compiled
    autograd's reducer, which calls a hook once per parameter with
    ``(grad, param)`` and drops its future) is refused with
    ``InvalidArgument``: gradcomp reduces whole buckets."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(
            "gradcomp.torch.register: expected the torch.nn.parallel.DistributedDataParallel wrapper "
            f"of the model, got {type(model).__name__} (wrap it first: DistributedDataParallel(module))"
        )
    if compressor is not None and not isinstance(compressor, str):
        raise TypeError(f"gradcomp.torch.register: the compressor is a spec string, got {type(compressor).__name__}")
    if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(
            f"gradcomp.torch.register: process_group must be a torch.distributed.ProcessGroup, "
            f"got {type(process_group).__name__}"
        )
    # DistributedDataParallel._use_python_reducer: set when the model is built
    # under optimize_ddp = "python_reducer" (PyTorch 2.15, private).
    if getattr(model, "_use_python_reducer", False):
        raise InvalidArgument(
            "gradcomp.torch.register: this DDP model was built under torch._dynamo.config.optimize_ddp = "
            '"python_reducer", whose reducer calls a hook once per parameter and ignores its future, so '
            "gradcomp cannot reduce its buckets; build the DDP model under the default "
            '"ddp_optimizer" (torch.compile then splits the graph at the buckets and the hook runs as in '
            "eager mode), or shard with FSDP2 and gradcomp.torch.shard"
        )
    state = GradcompState(
        process_group if process_group is not None else model.process_group, compressor, model=model.module, **options
    )
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

    def __init__(self, compressor: str = "thc", *, seed: int | None = None) -> None:
        if not isinstance(compressor, str):
            raise TypeError(
                f"gradcomp.torch.ReduceScatter: the compressor is a spec string, got {type(compressor).__name__}"
            )
        self.compressor = parse_spec(compressor)
        if not _C.shards(self.compressor):
            raise InvalidArgument(
                f"gradcomp.torch.ReduceScatter: {self.compressor} cannot reduce-scatter (its "
                f"payload does not sum element by element, or needs the tensors' shapes)"
            )
        self.seed = seed
        self._impl = None
        self._group = None

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """FSDP's buffer for a reduce-scatter's input or output."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: dist.ReduceOp,
        async_op: bool = False,
    ) -> None:
        """Reduce-scatters ``input_tensor`` into this rank's ``output_tensor``
        shard, as the mean over ``group`` (FSDP asks for ``ReduceOp.AVG``)."""
        if op != dist.ReduceOp.AVG:
            raise InvalidArgument(
                f"gradcomp.torch.ReduceScatter computes the mean (ReduceOp.AVG); FSDP asked for "
                f"{op} (a gradient_divide_factor other than the world size, or 16-bit "
                f"reduce_dtype other than bf16)"
            )
        if self._impl is None or self._group is not group:
            self._impl = _C.ReduceScatterState(group, self.compressor, self.seed, torch.get_num_threads())
            self._group = group
        self._impl(input_tensor, output_tensor)
        return None

    @property
    def wire_bytes(self) -> int:
        """Bytes the last call put on the wire, per rank."""
        return self._impl.wire_bytes if self._impl is not None else 0


def shard(model: torch.nn.Module, compressor: str = "thc", **options: Any) -> list[ReduceScatter]:
    """Gives every FSDP2 module of ``model`` (``fully_shard`` applied) a
    gradcomp ReduceScatter of its own; returns them. ``options`` are
    ReduceScatter's (``seed``). Raises ``TypeError`` when ``model`` is not a
    module or holds no FSDP2 module (``fully_shard`` not applied yet)."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"gradcomp.torch.shard: expected a torch.nn.Module, got {type(model).__name__}")
    modules = [module for module in model.modules() if isinstance(module, FSDPModule)]
    if not modules:
        raise TypeError(
            f"gradcomp.torch.shard: {type(model).__name__} holds no FSDP2 module "
            "(apply torch.distributed.fsdp.fully_shard to it first)"
        )
    comms = []
    for module in modules:
        comms.append(ReduceScatter(compressor, **options))
        module.set_custom_reduce_scatter(comms[-1])
    return comms
