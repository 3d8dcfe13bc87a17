#!/usr/bin/env python3
"""Every repository path that a message or a document names must exist in the repository.

Usage: check_paths.py REPO_ROOT

Scans the product's sources (src/, simnvml/), scripts/, deploy/, docs/, the README, the Makefile,
the Dockerfile and .ci/ for
  * repository-relative paths that start with a top-level directory of the repository
    (`docs/mig-mps.md`, `deploy/monitoring/README.md`, `scripts/install-deps.sh`, ...), and
  * relative Markdown links (`[text](../x.md)`), resolved against the document's directory,
and fails when one of them does not exist, or when a document points outside the repository
(`../shared/...`): a clean clone has nothing there.

Paths in build outputs (`build/...`) and host paths (`/var/lib/...`) are not repository paths and
are not checked. A path may end in a glob (`tests/fuzz/*_fuzz.cc`) or name a directory.
"""

import glob
import os
import re
import sys

SCANNED = ["src", "simnvml", "scripts", "deploy", "docs", ".ci", "README.md", "Makefile", "Dockerfile"]
SUFFIXES = (".cc", ".h", ".c", ".md", ".sh", ".yaml", ".yml", ".json", ".txt", ".map", "")
# Top-level directories of the repository that a named path can start with.
TOP = ["docs", "deploy", "src", "scripts", "tests", "bench", "simnvml", "proto", ".ci", "packaging"]
PATH_RE = re.compile(r"(?<![\w./$@{-])((?:%s)/[A-Za-z0-9_.*/-]*[A-Za-z0-9_*])" %
                     "|".join(re.escape(t) for t in TOP))
MD_LINK_RE = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
OUTSIDE_RE = re.compile(r"(?<![\w.])\.\./(?:shared|[A-Za-z0-9_-]+/docs)/[A-Za-z0-9_./-]+")


def files(root):
    for entry in SCANNED:
        path = os.path.join(root, entry)
        if os.path.isfile(path):
            yield path
        elif os.path.isdir(path):
            for d, _, names in os.walk(path):
                for n in sorted(names):
                    if n.endswith(SUFFIXES) and not n.startswith("."):
                        yield os.path.join(d, n)
                    elif d.endswith(".ci"):
                        yield os.path.join(d, n)


def exists(root, rel):
    rel = rel.rstrip("/.")
    if any(c in rel for c in "*?["):
        return bool(glob.glob(os.path.join(root, rel)))
    return os.path.exists(os.path.join(root, rel))


def main():
    if len(sys.argv) != 2:
        print("usage: check_paths.py REPO_ROOT", file=sys.stderr)
        return 2
    root = os.path.abspath(sys.argv[1])
    problems = []
    checked = 0
    for path in files(root):
        rel_file = os.path.relpath(path, root)
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(lines, 1):
            where = f"{rel_file}:{lineno}"
            for m in OUTSIDE_RE.finditer(line):
                problems.append(f"{where}: names {m.group(0)}, outside the repository "
                                "(a clean clone has nothing there; point at a file in the repository)")
            for m in PATH_RE.finditer(line):
                named = m.group(1)
                checked += 1
                if not exists(root, named):
                    problems.append(f"{where}: names {named}, which does not exist in the repository")
            if rel_file.endswith(".md"):
                for m in MD_LINK_RE.finditer(line):
                    target = m.group(1)
                    if re.match(r"^[a-z]+:", target) or target.startswith("/"):
                        continue  # URLs, mailto:, absolute host paths
                    checked += 1
                    resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
                    if not (resolved + os.sep).startswith(root + os.sep):
                        problems.append(f"{where}: links to {target}, outside the repository")
                    elif not os.path.exists(resolved):
                        problems.append(f"{where}: links to {target}, which does not exist")
    for p in problems:
        print(p)
    print(f"check_paths: {checked} named paths checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
