#!/usr/bin/env python3
"""The documentation's links resolve: every relative link `](path)` or `](path#anchor)` in README.md,
docs/*.md, jobs/README.md, slurm/README.md and tools/README.md names a file of the checkout and, for a Markdown target
with an anchor, a heading with that anchor (GitHub's rule: lower case, punctuation dropped, spaces as
hyphens, -1, -2 ... for repeats). Links outside the repository (http:, https:, ../ past the root)
are refused: the documentation must state what a user needs itself.
  usage: check_doc_links.py REPO_ROOT"""
import glob
import os
import re
import sys


def heading_anchors(path):
    anchors, seen, in_code = set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
                continue
            m = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def main():
    root = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = ["README.md", "jobs/README.md", "slurm/README.md", "tools/README.md"] + sorted(
        os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))
    problems, links = [], 0
    for rel in files:
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            continue
        text = open(path, encoding="utf-8").read()
        # Code blocks hold no links; blank them, keeping their lines for the line numbers.
        text = re.sub(r"```.*?```", lambda b: "\n" * b.group(0).count("\n"), text, flags=re.S)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            links += 1
            target = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target):
                problems.append(f"{rel}:{line}: link outside the repository: {target}")
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.realpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not (dest == root or dest.startswith(root + os.sep)):
                problems.append(f"{rel}:{line}: link outside the repository: {target}")
            elif not os.path.exists(dest):
                problems.append(f"{rel}:{line}: {target}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in heading_anchors(dest):
                problems.append(f"{rel}:{line}: {target}: no heading with that anchor")
    for p in problems:
        print(p)
    print(f"{len(files)} files, {links} links, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
