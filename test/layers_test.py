#!/usr/bin/env python3
"""No header includes a layer above its own.

The specification is the layer list in include/gradcomp/README.md: the first
fenced block after its "## Layers" heading, lowest layer first, one layer per
line, "  name name ...   description" (continuation lines are indented
deeper). A name is a folder ("execution/") or a file ("types.hpp"); a
header belongs to the layer that names its folder or itself. A header may
include its own layer and those below it, and a compressor's folder only
itself and compressors/detail/ (no compressor includes another).

Usage: layers_test.py INCLUDE_DIR
"""

import pathlib
import re
import sys


def layers(spec: str) -> list[list[str]]:
    text = spec.split("\n## Layers", 1)[1]
    block = text.split("```", 2)[1]
    result = []
    for line in block.splitlines()[1:]:
        if not line.startswith("  ") or line.startswith("    "):
            continue  # the root line, blank lines and continuations
        names = re.split(r"\s{2,}", line.strip())[0].split()
        result.append(names)
    return result


def layer_of(rel: str, table: list[list[str]]) -> int | None:
    best = None
    for i, names in enumerate(table):
        for name in names:
            if rel == name or (name.endswith("/") and rel.startswith(name)):
                best = i
    return best


def main() -> int:
    root = pathlib.Path(sys.argv[1]) / "gradcomp"
    table = layers((root / "README.md").read_text())
    headers = sorted(p for p in root.rglob("*") if p.suffix in (".hpp", ".cuh"))
    problems = []
    for path in headers:
        rel = path.relative_to(root).as_posix()
        own = layer_of(rel, table)
        if own is None:
            problems.append(f"{rel}: in no layer of include/gradcomp/README.md")
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = re.match(r"\s*#\s*include\s*<gradcomp/([^>]+)>", line)
            if not m:
                continue
            target = m.group(1)
            theirs = layer_of(target, table)
            where = f"{rel}:{n}: includes <gradcomp/{target}>"
            if theirs is None:
                problems.append(f"{where}, which is in no layer")
            elif theirs > own:
                problems.append(f"{where}, a higher layer ({' '.join(table[theirs])} above {' '.join(table[own])})")
            parts, target_parts = rel.split("/"), target.split("/")
            if (
                parts[0] == "compressors"
                and target_parts[0] == "compressors"
                and len(parts) > 2
                and target_parts[1] not in (parts[1], "detail")
            ):
                problems.append(f"{where}: a compressor includes another (shared pieces go to compressors/detail/)")
    for p in problems:
        print(p)
    print(f"{len(headers)} headers in {len(table)} layers, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
