"""``python -m gradcomp``: the version, where the package was imported from,
the PyTorch it was built for, whether CUDA buckets are built, and every
compressor with its spec keys."""

import torch

import gradcomp.torch as gt


def describe() -> str:
    """What this installation of gradcomp holds, one fact a line."""
    lines = [
        f"gradcomp {gt.__version__} ({gt.__file__})",
        f"PyTorch {torch.__version__}",
        f"CUDA buckets: {'built' if gt.device_buckets else 'not built'}",
        "compressors (spec keys):",
    ]
    for name, keys in gt.compressors().items():
        lines.append(f"  {name}" + (f" ({', '.join(keys)})" if keys else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe())
