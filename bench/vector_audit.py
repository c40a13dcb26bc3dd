#!/usr/bin/env python3
"""Which host passes a compiler vectorized: read from the machine code.

    bench/vector_audit.py OBJECT [--include DIR]

OBJECT is a compiled benchmark (an object file or the binary) built for a
vector ISA, e.g. `-O2 -march=x86-64-v3` (AVX2) or `-v4` (AVX-512). Every
element pass of the host path is an instantiation of `host_transform`
(its chunk loop sometimes in a `host_chunk_run` of its own) or
`host_reduce_first`, named after its op; this script disassembles OBJECT
(objdump), adds up each op's instructions by the widest vector register
they use, and prints one row per op, narrowest first.

An op whose element work cannot vectorize says so in its header
(`static constexpr bool vectorizes = false`, read from DIR, by default
the include/ beside this script). Exit status 1 when any other op has no
instruction on 256- or 512-bit registers: its loop went scalar, and every
pass through it runs at a fraction of its byte ceiling.
"""

import argparse
import collections
import pathlib
import re
import subprocess
import sys

HEADER = re.compile(r"^[0-9a-f]+ <(.*)>:$")
PASSES = ("host_transform", "host_chunk_run", "host_reduce_first")
SCALAR = re.compile(r"^v?(?:\w*s[sd]|cvt\w*s[sd]2\w*|cvtsi2s[sd]\w*)$")
DECLARED = re.compile(r"struct (\w+)[^{;]*\{[^{}]*?static constexpr bool vectorizes = false")
WIDTHS = ("zmm", "ymm", "xmm")


def unvectorized_ops(include):
    """Names of the ops whose headers declare their work unvectorizable."""
    names = set()
    for header in pathlib.Path(include).rglob("*.hpp"):
        names.update(DECLARED.findall(header.read_text()))
    return names


def template_arguments(name, start):
    """The top-level template arguments of the list opening at name[start]."""
    args, depth, current = [], 0, ""
    for ch in name[start:]:
        if ch == "<":
            depth += 1
            if depth == 1:
                continue
        elif ch == ">":
            depth -= 1
            if depth == 0:
                args.append(current.strip())
                return args
        elif ch == "," and depth == 1:
            args.append(current.strip())
            current = ""
            continue
        current += ch
    return args


def instantiation(symbol):
    """(pass, op, its streams) of a host pass's function, or None.

    A pass's OpenMP region ([clone ._omp_fn.N]) counts as the pass itself;
    a chunk loop out of line (host_chunk_run) is its own row, named by its
    op and the element cursors it runs over."""
    name = re.sub(r"gradcomp::abi_[^:]*::", "", symbol).replace("detail::", "")
    for kind in PASSES:
        at = name.find(kind + "<")
        if at >= 0:
            args = template_arguments(name, at + len(kind))
            args = [a for a in args if a and not re.fullmatch(r"\d+ul|\(reduction\)\d+", a)]
            if kind == "host_chunk_run":
                args = args[1:]  # (the declared op, then the bound one)
            return kind, args[0], ", ".join(args[1:])
    return None


def count(path):
    """{(pass, op, streams): Counter of instructions by register width
    ('scalar': scalar floats; 'calls': calls of an out-of-line chunk loop;
    'library': calls of memcpy, memmove or memset, which a compiler makes
    of a loop that only copies or fills)}."""
    listing = subprocess.run(
        ["objdump", "-dr", "--no-show-raw-insn", "-C", str(path)], check=True, capture_output=True, text=True
    ).stdout
    counts = collections.defaultdict(collections.Counter)
    current = None
    for line in listing.splitlines():
        header = HEADER.match(line)
        if header:
            current = instantiation(header.group(1))
            continue
        if current is None or "\t" not in line:
            continue
        instruction = line.split("\t", 1)[1].strip()
        mnemonic = instruction.split()[0] if instruction else ""
        called = instruction if mnemonic.startswith("call") or "R_X86_64" in instruction else ""
        if "host_chunk_run<" in called:
            counts[current]["calls"] += 1
        if re.search(r"\b(memcpy|memmove|memset)\b", called):
            counts[current]["library"] += 1
        for width in WIDTHS:
            if "%" + width in instruction:
                scalar = width == "xmm" and SCALAR.match(mnemonic)
                counts[current]["scalar" if scalar else width] += 1
                break
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("object")
    parser.add_argument("--include", default=pathlib.Path(__file__).resolve().parent.parent / "include")
    args = parser.parse_args()
    declared = unvectorized_ops(args.include)
    rows = []
    for (kind, op, streams), c in count(args.object).items():
        widest = next((w for w in WIDTHS if c[w]), "none")
        rows.append(
            (
                WIDTHS[::-1].index(widest) if widest in WIDTHS else -1,
                widest,
                c,
                kind,
                op,
                streams,
                re.sub(r"<.*", "", op) in declared,
            )
        )
    if not rows:
        sys.exit(f"{args.object}: no host passes found (built with optimization, the library's names intact?)")
    failed = 0
    print(f"{'widest':6} {'zmm':>5} {'ymm':>5} {'xmm':>5} {'scalar':>6}  pass: op [streams]")
    for _, widest, c, kind, op, streams, by_design in sorted(rows, key=lambda r: (r[0], r[4], r[5])):
        note = ""
        if by_design:
            note = "  (declared: vectorizes = false)"
        elif c["calls"]:
            note = "  (its chunk loop: host_chunk_run)"
        elif c["library"] and widest in ("xmm", "none"):
            note = "  (a library copy or fill)"
        elif widest in ("xmm", "none"):
            failed += 1
            note = "  <- NOT VECTORIZED"
        print(
            f"{widest:6} {c['zmm']:5d} {c['ymm']:5d} {c['xmm']:5d} {c['scalar']:6d}  "
            f"{kind.removeprefix('host_')}: {op} [{streams}]{note}"
        )
    print(f"{len(rows)} instantiations, {failed} not vectorized that should be")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
