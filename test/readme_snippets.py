"""Writes the C++ and CUDA code blocks of the docs to files, one per block, so
the build can compile them as written: snippet_<n>.cpp and snippet_<n>.cu.

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
    blocks = re.findall(r"^```(cpp|cuda)\n(.*?)^```", pathlib.Path(doc).read_text(), flags=re.M | re.S)
    for language, code in blocks:
        (out / f"snippet_{n}.{'cu' if language == 'cuda' else 'cpp'}").write_text(f"// {doc}\n{code}")
        n += 1
print(n)
