"""Dependency direction: the simulator never imports the calibration tool (only the CLI composes them)."""

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
