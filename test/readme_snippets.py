"""Writes the C++, CUDA and Python code blocks of the docs to files, one per
block, so the build can compile or run them as written: snippet_<n>.cpp,
snippet_<n>.cu and snippet_<n>.py.

Usage: readme_snippets.py OUT_DIR DOC.md...  (prints the number of blocks)"""

import pathlib
import re
import sys

out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for old in out.glob("snippet_*"):
    old.unlink()
n = 0
for doc in sys.argv[2:]:
    blocks = re.findall(r"^```(cpp|cuda|python)\n(.*?)^```", pathlib.Path(doc).read_text(), flags=re.M | re.S)
    for language, code in blocks:
        suffix = {"cpp": "cpp", "cuda": "cu", "python": "py"}[language]
        comment = "#" if language == "python" else "//"
        (out / f"snippet_{n}.{suffix}").write_text(f"{comment} {doc}\n{code}")
        n += 1
print(n)
