"""The GPT's corpus loader (examples/torch/tasks.py's load_text):

- on the packaged text (Debian's python3-doc 3.11.2-1): the known byte
  counts and SHA-256 of its training and held-out parts, and every file's
  bytes in exactly one of them;
- on a corpus written here: every tenth file held out, the rest trained on,
  each once, in sorted order, each ending with one newline;
- a folder without the text: an error naming the package to install.

    python3 test/torch/corpus_test.py
"""

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "torch"))
import tasks  # noqa: E402  (the example's module)

PACKAGE, VERSION = "python3-doc", "3.11.2-1"
# (training bytes, its SHA-256), (held-out bytes, its SHA-256) of that version.
KNOWN = (
    (10_005_160, "cfd8f60f16b897fd9aafb5731dd6f1dac79616ac373a94f0738a65b96ab07b9b"),
    (1_043_022, "50e93447c8ec4f860c1969cd100e02ab4cbf4ccfd82db34bb2e761c77eb1159d"),
)


def digest(text: torch.Tensor) -> tuple[int, str]:
    data = bytes(text.to(torch.uint8).numpy())
    return len(data), hashlib.sha256(data).hexdigest()


def main() -> int:
    failed = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failed
        print(("ok: " if ok else "FAILED: ") + what, flush=True)
        failed += not ok

    version = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", PACKAGE], capture_output=True, text=True, check=False
    ).stdout
    check(version == VERSION, f"{PACKAGE} is {VERSION}, the version the known sums are of (installed: {version!r})")
    train, held_out = tasks.load_text(tasks.PYTHON_DOCS)
    got = (digest(train), digest(held_out))
    check(got[0] == KNOWN[0], f"the training text's bytes and SHA-256 are the known ones ({got[0]})")
    check(got[1] == KNOWN[1], f"the held-out text's bytes and SHA-256 are the known ones ({got[1]})")
    files = sorted(Path(tasks.PYTHON_DOCS).rglob("*.rst.txt"))
    sizes = [len(f.read_bytes().rstrip(b"\n")) + 1 for f in files]
    check(
        sum(sizes[9::10]) == got[1][0] and sum(sizes) - sum(sizes[9::10]) == got[0][0],
        f"each of the {len(files)} files in exactly one part (the held-out part is every tenth file)",
    )

    with tempfile.TemporaryDirectory() as folder:
        texts = [f"file {i}\n\n".encode() * (i + 1) for i in range(25)]
        for i, text in enumerate(texts):
            path = Path(folder, f"part{i // 10}", f"{i:02d}.rst.txt")
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(text)
        Path(folder, "ignored.txt").write_bytes(b"not reST\n")
        train, held_out = tasks.load_text(folder)
        trimmed = [text.rstrip(b"\n") + b"\n" for text in texts]
        want_held_out = b"".join(trimmed[9::10])
        want_train = b"".join(t for i, t in enumerate(trimmed) if i % 10 != 9)
        got_held_out, got_train = (bytes(t.to(torch.uint8).numpy()) for t in (held_out, train))
        check(
            got_held_out == want_held_out and got_train == want_train,
            "a written corpus: files 9 and 19 held out, the other 23 trained on, each once, in order",
        )

    with tempfile.TemporaryDirectory() as empty:
        try:
            tasks.load_text(empty)
            check(False, "a folder without the text is refused")
        except SystemExit as e:
            check(PACKAGE in str(e) and empty in str(e), f"a folder without the text is refused: {e}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
