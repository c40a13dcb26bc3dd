"""Writes the README's C++ and CUDA code blocks to files, one per block, so
the build can compile them as written: snippet_<n>.cpp and snippet_<n>.cu."""
import pathlib
import re
import sys

readme, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
for old in out.glob("snippet_*"):
    old.unlink()
blocks = re.findall(r"^```(cpp|cuda)\n(.*?)^```", readme.read_text(), flags=re.M | re.S)
for n, (language, code) in enumerate(blocks):
    (out / f"snippet_{n}.{'cu' if language == 'cuda' else 'cpp'}").write_text(code)
print(len(blocks))
