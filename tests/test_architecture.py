"""Dependency direction: the simulator never imports the calibration tool (only the CLI composes them), and no
module-level import cycle exists in sim/ or calibrate/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPOSERS = {ROOT / "sim" / "cli.py"}  # the command line entry may dispatch to `dtsim calibrate`


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_sim_never_imports_calibrate_or_torch() -> None:
    offenders = []
    for path in sorted((ROOT / "sim").rglob("*.py")):
        if path in COMPOSERS:
            continue
        bad = {n for n in _imports(path) if n.split(".")[0] in ("calibrate", "torch")}
        if bad:
            offenders.append(f"{path.relative_to(ROOT)}: {sorted(bad)}")
    assert not offenders, offenders


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module loads: top level and inside try blocks, not under TYPE_CHECKING
    and not inside functions (those run later, after every module involved has loaded)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        body = node.body if isinstance(node, ast.Try) else [node]
        found += [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return found


def test_no_circular_imports_in_sim_or_calibrate() -> None:
    """The module-level import graph of sim/ and calibrate/ has no cycle (`from pkg import mod` counts as an
    edge to pkg.mod when that is a module)."""
    modules = {_module_name(p): p for pkg in ("sim", "calibrate") for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in _module_level_imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
            elif node.module and node.level == 0:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    if full in modules:
                        edges.add(full)
                    elif node.module in modules:
                        edges.add(node.module)
        graph[name] = edges
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    cycles: list[str] = []

    def visit(u: str) -> None:
        state[u] = 1
        path.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                cycles.append(" -> ".join(path[path.index(v):] + [v]))
            elif v not in state:
                visit(v)
        path.pop()
        state[u] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not cycles, cycles
