"""Every relative link in the project's Markdown files leads somewhere: the
file or folder exists, and an anchor (#...) names a heading of its target as
GitHub spells it. External links (http, https, mailto) are not fetched.

Usage: links_test.py ROOT  (prints each dead link; exits 1 if there is one)"""

import pathlib
import re
import sys
import urllib.parse

SKIPPED_DIRS = {".git", ".gpu-kit", "node_modules"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.M | re.S)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", flags=re.M)


def markdown_files(root: pathlib.Path) -> list[pathlib.Path]:
    """Every .md under root, outside build trees and VCS folders."""
    return sorted(
        p
        for p in root.rglob("*.md")
        if not any(part in SKIPPED_DIRS or part.startswith("build") for part in p.relative_to(root).parts)
    )


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: pathlib.Path, cache: dict[pathlib.Path, set[str]]) -> set[str]:
    """The anchors of doc's headings, with GitHub's -1, -2 ... for repeats."""
    if doc not in cache:
        seen: dict[str, int] = {}
        found = set()
        for heading in HEADING.findall(FENCE.sub("", doc.read_text(encoding="utf-8"))):
            base = slug(heading)
            count = seen.get(base, 0)
            found.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
        cache[doc] = found
    return cache[doc]


def dead_links(root: pathlib.Path) -> list[str]:
    """'file: link (why)' for each link that leads nowhere."""
    cache: dict[pathlib.Path, set[str]] = {}
    problems = []
    for doc in markdown_files(root):
        text = FENCE.sub("", doc.read_text(encoding="utf-8"))
        text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
        for target in LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            dest = (doc.parent / urllib.parse.unquote(path_part)).resolve() if path_part else doc
            where = f"{doc.relative_to(root)}: {target}"
            if not dest.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest, cache):
                problems.append(f"{where} (no heading '{anchor}' in {dest.relative_to(root)})")
    return problems


if __name__ == "__main__":
    root = pathlib.Path(sys.argv[1]).resolve()
    problems = dead_links(root)
    for problem in problems:
        print(problem)
    print(f"{len(markdown_files(root))} Markdown files, {len(problems)} dead links")
    sys.exit(1 if problems else 0)
