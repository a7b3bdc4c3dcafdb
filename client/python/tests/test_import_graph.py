"""The package's modules import one another without a cycle: no module
imports a module that imports it back, directly or through others.

Every import counts, wherever it is written: at module level, under
`if TYPE_CHECKING:` and inside functions (a function-local import that
closes a loop only hides it until the function runs). The graph is read
from the source with `ast`; nothing is imported. A package's own
`__init__` is an edge only where a module names it (`from . import
__version__`), not for being a submodule's parent.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "tensorcheck"

# One import: the module that imports, the one imported, the line.
Edge = tuple[str, str, int]


def modules(src: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under `src/package`."""
    found: dict[str, Path] = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> list[Edge]:
    """The package modules that module `name` (file `path`) imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: list[Edge] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                if node.module:
                    base = f"{base}.{node.module}"
            else:
                base = node.module or ""
            # `from .x import y` imports the submodule x.y when there is one,
            # else reads y from x.
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            targets = subs if len(subs) == len(node.names) else [base, *subs]
        # Modules outside the package (numpy, grpc), and generated ones not
        # there (`_proto` before an install), are no part of the graph.
        edges.extend((name, t, node.lineno) for t in targets if t in known and t != name)
    return edges


def cycles(src: Path, package: str) -> list[list[Edge]]:
    """The groups of modules that import one another (the graph's strongly
    connected components of more than one module), each as the imports
    among its members; [] when there is none."""
    known = modules(src, package)
    graph: dict[str, dict[str, int]] = {m: {} for m in known}
    for m, path in known.items():
        for a, b, line in imports(m, path, known):
            graph[a].setdefault(b, line)

    # Tarjan's strongly connected components (iterative).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))

    return [
        [(a, b, graph[a][b]) for a in group for b in sorted(graph[a]) if b in group]
        for group in groups
    ]


def _text(group: list[Edge], src: Path, package: str = PACKAGE) -> str:
    known = modules(src, package)
    members = sorted({a for a, _, _ in group})
    lines = [f"{', '.join(members)} import one another:"]
    lines += [f"  {a} imports {b} ({known[a].relative_to(src)}:{line})" for a, b, line in group]
    return "\n".join(lines)


def test_the_package_has_no_import_cycle():
    found = cycles(SRC, PACKAGE)
    assert not found, "import cycles:\n" + "\n".join(_text(g, SRC) for g in found)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    "files, members",
    [
        (  # both at module level, one absolute
            {"__init__.py": "", "a.py": "from . import b\n", "b.py": "import pkg.a\n"},
            ["pkg.a", "pkg.b"],
        ),
        (  # one side inside a function
            {
                "__init__.py": "",
                "a.py": "from .b import f\n",
                "b.py": "def f():\n    from .a import g\n    return g\n",
            },
            ["pkg.a", "pkg.b"],
        ),
        (  # one side for the type checker only
            {
                "__init__.py": "",
                "a.py": "from .b import B\n",
                "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from .a import A\nclass B: ...\n",
            },
            ["pkg.a", "pkg.b"],
        ),
        (  # through a third module and a subpackage, `..` included
            {
                "__init__.py": "",
                "a.py": "from .sub import c\n",
                "sub/__init__.py": "",
                "sub/c.py": "from ..b import x\n",
                "b.py": "x = 1\ndef f():\n    from . import a\n",
            },
            ["pkg.a", "pkg.b", "pkg.sub.c"],
        ),
        (  # the package's __init__, named by a module it imports
            {
                "__init__.py": "from .a import f\n__version__ = '1'\n",
                "a.py": "from . import __version__\n",
            },
            ["pkg", "pkg.a"],
        ),
    ],
    ids=["module-level", "function-local", "type-checking", "three-modules", "init"],
)
def test_the_check_finds_every_kind_of_cycle(tmp_path, files, members):
    found = cycles(_write(tmp_path, files), "pkg")
    assert len(found) == 1
    assert sorted({a for a, _, _ in found[0]}) == members
    assert "import one another" in _text(found[0], tmp_path, "pkg")


def test_a_submodule_is_not_an_edge_to_its_package(tmp_path):
    # `pkg/__init__` imports a; a imports its sibling b: no cycle, although
    # importing pkg.a runs pkg/__init__ first.
    files = {
        "__init__.py": "from .a import f\n",
        "a.py": "from .b import g\nf = g\n",
        "b.py": "g = 1\n",
    }
    assert cycles(_write(tmp_path, files), "pkg") == []
