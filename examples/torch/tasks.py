"""The training example's tasks: a model, its data in a fixed order, its
loss and its score against a target, the same for every hook.

- ``mlp``: examples/train's MLP on Fashion-MNIST (test accuracy);
- ``cnn``: a small conv net with BatchNorm on Fashion-MNIST (test accuracy);
- ``gpt``: a byte-level transformer language model on the reST sources of
  the Python documentation (Debian's python3-doc), scored by bits per byte
  on held-out files.
"""

from __future__ import annotations

import gzip
import itertools
import math
import os
import struct
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
PYTHON_DOCS = "/usr/share/doc/python3/html/_sources"


class Task:
    """What the training loop asks of a task. ``higher_is_better`` says how
    its score meets a target (accuracy: at least; bits per byte: at most)."""

    name = ""
    metric = ""
    higher_is_better = True
    default_target = 0.0
    default_batch = 64  # examples per rank per step
    default_lr = 0.05

    def optimizer(self, params, lr: float, momentum: float) -> torch.optim.Optimizer:
        """SGD with momentum, as examples/train."""
        return torch.optim.SGD(params, lr=lr, momentum=momentum)

    def model(self, seed: int) -> torch.nn.Module:
        raise NotImplementedError

    def shard_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The submodules FSDP2 shards one by one before the whole model."""
        return []

    def steps_per_epoch(self, rank: int, ranks: int, batch: int) -> int:
        raise NotImplementedError

    def batch(self, step: int, rank: int, ranks: int, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``step``'s examples of ``rank``: the same for every hook."""
        raise NotImplementedError

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)

    def score(self, model: torch.nn.Module, rank: int, ranks: int) -> float:
        """The held-out score, each rank computing its share (collective)."""
        raise NotImplementedError

    def reached(self, score: float, target: float) -> bool:
        return score >= target if self.higher_is_better else score <= target


def load_fashion_mnist(data: str, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    prefix = os.path.join(data, "train" if train else "t10k")
    with gzip.open(prefix + "-images-idx3-ubyte.gz") as f:
        _, count, rows, cols = struct.unpack(">IIII", f.read(16))
        images = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).reshape(count, rows * cols)
    with gzip.open(prefix + "-labels-idx1-ubyte.gz") as f:
        f.read(8)
        labels = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    return (images.float() / 255.0 - 0.2860) / 0.3530, labels


def mlp(sizes: list[int], seed: int) -> torch.nn.Module:
    """He-uniform weights and zero biases, as examples/train's mlp."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        linear = torch.nn.Linear(a, b)
        bound = math.sqrt(6.0 / a)
        with torch.no_grad():
            linear.weight.uniform_(-bound, bound)
            linear.bias.zero_()
        layers.append(linear)
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def cnn(seed: int) -> torch.nn.Module:
    """Three 3x3 convolutions (16, 32 and 64 channels), each with BatchNorm
    and ReLU, the first two max-pooled, and a linear head (3136-512-10):
    1.6M parameters, most in the head's first layer, as in the conv nets
    PyTorch users train on small images; PyTorch's default initialization."""
    torch.manual_seed(seed)

    def block(a: int, b: int) -> list[torch.nn.Module]:
        return [torch.nn.Conv2d(a, b, 3, padding=1, bias=False), torch.nn.BatchNorm2d(b), torch.nn.ReLU()]

    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 28, 28)),
        *block(1, 16),
        torch.nn.MaxPool2d(2),
        *block(16, 32),
        torch.nn.MaxPool2d(2),
        *block(32, 64),
        torch.nn.Flatten(),
        torch.nn.Linear(64 * 7 * 7, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )


class FashionMnist(Task):
    """An image classifier; each rank takes every ranks-th training image,
    shuffled per epoch by (seed, epoch, rank)."""

    metric = "accuracy"

    def __init__(self, name: str, data: str, hidden: str) -> None:
        self.name, self.hidden = name, hidden
        self.default_target = {"mlp": 0.85, "cnn": 0.88}[name]
        self.images, self.labels = load_fashion_mnist(data, True)
        self.test_images, self.test_labels = load_fashion_mnist(data, False)
        self._order: tuple[int, torch.Tensor] | None = None

    def model(self, seed: int) -> torch.nn.Module:
        if self.name == "cnn":
            return cnn(seed)
        return mlp([self.images.shape[1]] + [int(h) for h in self.hidden.split(",")] + [10], seed)

    def steps_per_epoch(self, rank: int, ranks: int, batch: int) -> int:
        return len(range(rank, self.images.shape[0], ranks)) // batch

    def batch(self, step: int, rank: int, ranks: int, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        per_epoch = self.steps_per_epoch(rank, ranks, batch)
        epoch, in_epoch = divmod(step, per_epoch)
        if self._order is None or self._order[0] != epoch:
            shard = torch.arange(rank, self.images.shape[0], ranks)
            g = torch.Generator().manual_seed(seed * 7919 + epoch * 131 + rank)
            self._order = (epoch, shard[torch.randperm(shard.numel(), generator=g)])
        chosen = self._order[1][in_epoch * batch : (in_epoch + 1) * batch]
        return self.images[chosen], self.labels[chosen]

    def score(self, model: torch.nn.Module, rank: int, ranks: int) -> float:
        """Test accuracy (in eval mode: BatchNorm's running statistics)."""
        model.eval()
        mine = torch.arange(rank, self.test_images.shape[0], ranks)
        correct = torch.zeros(1, dtype=torch.long)
        with torch.no_grad():
            for chunk in mine.split(1000):
                correct += (model(self.test_images[chunk]).argmax(1) == self.test_labels[chunk]).sum()
        dist.all_reduce(correct)
        model.train()
        return correct.item() / self.test_images.shape[0]


def load_text(folder: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The corpus's bytes, training and validation: every reST source under
    ``folder`` in sorted order, each file ending with a newline; every tenth
    file held out, so validation is text the model never saw."""
    files = sorted(Path(folder).rglob("*.rst.txt"))
    if not files:
        raise SystemExit(f"no *.rst.txt under {folder}: install python3-doc (bash .ci/install-deps does)")
    train, held_out = bytearray(), bytearray()
    for i, path in enumerate(files):
        (held_out if i % 10 == 9 else train).extend(path.read_bytes().rstrip(b"\n") + b"\n")
    return torch.frombuffer(train, dtype=torch.uint8).long(), torch.frombuffer(held_out, dtype=torch.uint8).long()


class Block(torch.nn.Module):
    """A pre-LayerNorm transformer block: causal multi-head attention, then
    an MLP four times as wide, each added to the residual stream."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Gpt(torch.nn.Module):
    """A byte-level GPT: byte and position embeddings, ``layers`` blocks, a
    final LayerNorm and a linear head over the 256 byte values; GPT-2's
    initialization (normal 0.02, residual projections scaled by depth)."""

    def __init__(self, context: int, width: int, layers: int, heads: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.bytes = torch.nn.Embedding(256, width)
        self.positions = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, 256, bias=False)
        for name, p in self.named_parameters():
            if p.dim() > 1:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("out.weight", "down.weight")) else 0.02
                torch.nn.init.normal_(p, 0.0, std)
            elif "norm" not in name:
                torch.nn.init.zeros_(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)
        return self.head(self.norm(self.blocks(self.bytes(x) + self.positions(positions))))


class Text(Task):
    """Next-byte prediction: each step, each rank takes ``batch`` windows of
    ``context`` + 1 bytes at offsets drawn by (seed, step, rank); scored by
    bits per byte over 256 fixed held-out windows. Sized for a 2-core
    machine: the default target, 4.0 bits per byte, is past what byte
    frequencies alone give on the held-out files (4.87) and short of what
    pairs of bytes give (3.71); fp32 all-reduce over 4 ranks reaches it in
    about 300 steps (8 windows per rank), 2-3 minutes there."""

    name = "gpt"
    metric = "bits_per_byte"
    higher_is_better = False
    default_target = 4.0
    default_batch = 8
    default_lr = 0.003
    context, width, layers, heads = 64, 256, 4, 4
    windows = 256

    def optimizer(self, params, lr: float, momentum: float) -> torch.optim.Optimizer:
        """AdamW, as language models are trained (``momentum`` unused)."""
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)

    def __init__(self, folder: str) -> None:
        self.train, self.held_out = load_text(folder)

    def model(self, seed: int) -> torch.nn.Module:
        return Gpt(self.context, self.width, self.layers, self.heads, seed)

    def shard_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return list(model.blocks)

    def steps_per_epoch(self, rank: int, ranks: int, batch: int) -> int:
        return self.train.numel() // (ranks * batch * self.context)

    def _windows(self, text: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = text[starts[:, None] + torch.arange(self.context + 1)]
        return rows[:, :-1], rows[:, 1:]

    def batch(self, step: int, rank: int, ranks: int, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed((seed * 7919 + step) * 131 + rank)
        return self._windows(self.train, torch.randint(0, self.train.numel() - self.context - 1, (batch,), generator=g))

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.reshape(-1, 256), targets.reshape(-1))

    def score(self, model: torch.nn.Module, rank: int, ranks: int) -> float:
        """Bits per byte on the held-out windows (evenly spaced)."""
        model.eval()
        starts = torch.linspace(0, self.held_out.numel() - self.context - 2, self.windows).long()[rank::ranks]
        total = torch.zeros(2, dtype=torch.float64)  # nats, bytes
        with torch.no_grad():
            inputs, targets = self._windows(self.held_out, starts)
            total[0] = self.loss(model(inputs), targets).double() * targets.numel()
            total[1] = targets.numel()
        dist.all_reduce(total)
        model.train()
        return (total[0] / total[1]).item() / math.log(2)


def task_class(name: str) -> type[Task]:
    """The class of task ``name`` (mlp, cnn or gpt): its defaults, unloaded."""
    return Text if name == "gpt" else FashionMnist


def task_of(name: str, fashion_mnist: str = FASHION_MNIST, hidden: str = "512,256", text: str = PYTHON_DOCS) -> Task:
    """The task ``name`` (mlp, cnn or gpt), its data loaded."""
    if name == "gpt":
        return Text(text)
    return FashionMnist(name, fashion_mnist, hidden)
