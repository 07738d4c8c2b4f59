"""The package's floors: imports point down the pipeline, never up, and never in a circle.

The floors, bottom to top, are the order of :data:`FLOORS` (docs/architecture.md). A module
may import from its own floor and the floors below; an import circle among modules (lazy
imports inside functions included) is an error even inside one floor, and every module must
import on its own in a clean interpreter (an import order that only works when something else
was imported first is a hidden circle).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "cpumap"
FLOORS = ["store", "host", "isa", "measure", "model", "evaluate", "roofline", "cli"]
MAX_LINES = 500
#: Modules that run something when imported (``python -m`` entry points).
ENTRY_POINTS = {"cpumap.cli.__main__"}


def _name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """cpumap modules a file imports anywhere (module level or inside functions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "cpumap":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.add(f"<relative import in {_name(path)}>")
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "cpumap"}
    return out


GRAPH = {m: _imports(p) for m, p in MODULES.items()}


def _floor(module: str) -> int | None:
    parts = module.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 1 and parts[1] in FLOORS else None


def test_every_module_is_on_a_floor():
    stray = [m for m in MODULES if m != "cpumap" and _floor(m) is None]
    assert not stray, f"modules outside the floors {FLOORS}: {stray}"


def test_imports_point_down():
    relative = sorted(d for deps in GRAPH.values() for d in deps if d.startswith("<"))
    assert not relative, f"use absolute imports: {relative}"
    upward = [f"{m} -> {d}" for m, deps in GRAPH.items() for d in sorted(deps)
              if _floor(m) is not None and _floor(d) is not None and _floor(d) > _floor(m)]
    assert not upward, "imports pointing up the pipeline:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), or self-loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    assert _cycles(GRAPH) == []


def test_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_each_module_imports_alone():
    """Every module imports in a fresh state of the package (third-party modules stay loaded,
    so one interpreter does them all in seconds)."""
    script = (
        "import importlib, sys, traceback\n"
        "bad = []\n"
        f"for m in {sorted(set(MODULES) - ENTRY_POINTS)!r}:\n"
        "    for k in [k for k in sys.modules if k == 'cpumap' or k.startswith('cpumap.')]:\n"
        "        del sys.modules[k]\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except Exception:\n"
        "        bad.append(m + ': ' + traceback.format_exc(limit=3))\n"
        "print('\\n'.join(bad))\n"
        "sys.exit(1 if bad else 0)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_module_size():
    sizes = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    big = {m: n for m, n in sizes.items() if n > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines (split them by what they hold): {big}"
