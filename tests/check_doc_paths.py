#!/usr/bin/env python3
"""Checks that every repository file a document names exists.

    tests/check_doc_paths.py REPO_ROOT [DOC ...]   # default: every tracked *.md
    tests/check_doc_paths.py --self-test

A name is a `code span` that looks like a file of the repository: it ends
in a known source or document suffix (or a brace list of them,
`server/service/server_options.{h,cc}`), from the root or by a shorter
tail (`cuda/internal/lt_matmul.cc`, `sweep.cc`). Such a name must match a tracked
file: the whole path from the root, or a tail of one. Paths under build
outputs, the venv and $OUT-like places are not names of repository files
and are skipped (their first part is not a top-level folder, and no tail
of a file would match them anyway).

Standard library only: CTest runs it with the system's python3.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tempfile

SPAN = re.compile(r"`([^`\n]+)`")
SUFFIXES = (".h", ".cc", ".cu", ".py", ".go", ".md", ".sh", ".proto", ".yaml", ".yml",
            ".txt", ".toml", ".cmake")
PATHLIKE = re.compile(r"^[A-Za-z0-9_.\-/{},*]+$")
# Files a document names that are not the repository's, with why.
NOT_OURS = {
    "summary.md": "written by tests/gpu/run.sh into the results folder",
    "replay_bitwise.md": "written by tests/gpu/run.sh's replay_bitwise step into the results folder",
    "cublasLt.h": "the CUDA toolkit's header",
    "foo.cc": "CONTRIBUTING's example of a test's name",
    "foo_test.cc": "CONTRIBUTING's example of a test's name",
}
SKIP_FIRST = {"build", "build-cuda", ".venv", "tmp", "usr", "etc", "proc", "dev", "$OUT",
              "http:", "https:", "~", "..", "."}


def expand(name: str) -> list[str]:
    """`a.{h,cc}` -> [a.h, a.cc]; `x/{a,b}.h` -> [x/a.h, x/b.h]."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    out: list[str] = []
    for part in m.group(1).split(","):
        out += expand(name[: m.start()] + part + name[m.end():])
    return out


def names_in(text: str) -> list[str]:
    found = []
    for span in SPAN.findall(text):
        span = span.strip()
        if not PATHLIKE.match(span) or "*" in span:
            continue
        if span.split("/")[0] in SKIP_FIRST or span.startswith("/"):
            continue
        for name in expand(span):
            name = name.rstrip("/")
            if name.endswith(SUFFIXES) and name not in NOT_OURS and not name.startswith("."):
                found.append(name)
    return found


def tracked(root: pathlib.Path) -> list[str]:
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files"], check=True,
                             capture_output=True, text=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]


def missing(root: pathlib.Path, docs: list[pathlib.Path]) -> list[str]:
    files = tracked(root)
    whole = set(files)
    found = []
    for doc in docs:
        text = doc.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            for name in names_in(line):
                if name in whole or any(f.endswith("/" + name) for f in files):
                    continue
                found.append(f"{doc.relative_to(root).as_posix()}:{number}: names {name}, "
                             "which no tracked file is")
    return found


def self_test() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        (root / "server/engine").mkdir(parents=True)
        (root / "server/engine/plan.h").write_text("")
        (root / "server/engine/plan.cc").write_text("")
        (root / "docs").mkdir()
        doc = root / "docs/a.md"
        doc.write_text("`server/engine/plan.{h,cc}` and `engine/plan.h` exist;\n"
                       "`server/engine/gone.cc` and `server/engine/plan.{h,cu}` do not;\n"
                       "`build/bench/x` and `--flag=a/b` are not names.\n")
        found = missing(root, [doc])
    want = ["server/engine/gone.cc", "server/engine/plan.cu"]
    ok = len(found) == 2 and all(any(w in f for f in found) for w in want)
    for line in found:
        print("self-test found:", line)
    print("self-test", "passed" if ok else "FAILED")
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) < 2:
        print(__doc__)
        return 2
    root = pathlib.Path(argv[1]).resolve()
    docs = [pathlib.Path(a).resolve() for a in argv[2:]] or \
        [root / f for f in tracked(root) if f.endswith(".md")]
    found = missing(root, docs)
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} name(s) of files that do not exist")
        return 1
    print(f"docs: every file named in {len(docs)} document(s) exists")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
