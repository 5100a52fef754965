"""``dtsim compare A.yaml B.yaml …``: simulate several scenarios and set their figures side by side.

Each file is loaded with the same ``--set`` overrides (a bad file is the user's mistake: one-line error,
exit 2), the runs go to worker processes, and the result is a table on stdout, ``compare.csv`` and a
chart of small multiples (``compare.png``/``.svg``) in the out folder.
"""

from __future__ import annotations

from pathlib import Path

from sim.errors import ScenarioError
from sim.explore.runner import OK, run_jobs
from sim.explore.table import (
    METRIC_COLUMNS,
    METRICS,
    cell,
    csv_text,
    layout_text,
    schedule_text,
    setting_row,
    summary_row,
    text_table,
)
from sim.outputs.writers import atomic_write_text
from sim.scenario.load import load_scenario

CSV_COLUMNS = ["label", "file", "status", "reason", "name", "gpu", "intra_node", "inter_node",
               "sequence_parallel", *METRIC_COLUMNS]


def unique_labels(names: list[str]) -> list[str]:
    """Scenario names, made unique with #2, #3 … where two files share a name."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


def load_all(paths: list[str], overrides: list[str]) -> list[dict]:
    """Every scenario resolved (presets expanded); the first bad file raises its ScenarioError."""
    out = []
    for p in paths:
        try:
            sc = load_scenario(p, overrides)
        except ScenarioError as exc:
            raise ScenarioError(f"{p}: {exc}") from None
        out.append(sc.resolved())
    return out


def compare(
    paths: list[str],
    overrides: list[str] | None = None,
    *,
    workers: int | None = None,
    executor: str = "local",
    address: str | None = None,
    progress: bool = True,
) -> list[dict]:
    """Simulate each scenario file (with the same overrides) and return one row per file."""
    scenarios = load_all(paths, overrides or [])
    results = run_jobs(
        [(s, None) for s in scenarios],
        workers=workers,
        executor=executor,
        address=address,
        progress=progress,
        desc="compare",
    )
    labels = unique_labels([s["name"] for s in scenarios])
    rows = []
    for path, label, sc, res in zip(paths, labels, scenarios, results, strict=True):
        row = {
            "label": label,
            "file": str(path),
            "name": sc["name"],
            "status": res["status"],
            "reason": res.get("reason", ""),
            **setting_row(sc),
        }
        if "summary" in res:
            row.update(summary_row(res["summary"]))
        rows.append(row)
    return rows


def compare_table(rows: list[dict]) -> str:
    """Scenarios as columns, settings and figures as rows."""
    header = ["", *(r["label"] for r in rows)]
    lines: list[list[str]] = [
        ["GPUs", *(f"{cell(r.get('num_gpus'))} × {cell(r.get('gpu'))}" for r in rows)],
        ["network", *(f"{cell(r.get('intra_node'))} / {cell(r.get('inter_node'))}" for r in rows)],
        ["data × tensor × pipeline", *(layout_text(r) for r in rows)],
        ["schedule", *(schedule_text(r) for r in rows)],
        [
            "micro-batch × count",
            *(f"{cell(r.get('micro_batch'))} × {cell(r.get('microbatches'))}" for r in rows),
        ],
        ["ZeRO / checkpointing", *(f"{cell(r.get('zero'))} / {cell(r.get('checkpointing'))}" for r in rows)],
        ["precision", *(cell(r.get("precision")) for r in rows)],
    ]
    for key, label, fmt in METRICS:
        if any(r.get(key) is not None for r in rows):
            lines.append([label, *(cell(r.get(key), fmt) for r in rows)])
    bad = [r for r in rows if r["status"] != OK]
    text = text_table(header, lines, right=set(range(1, len(header))))
    for r in bad:
        text += f"\n{r['label']}: {r['status']}: {r['reason']}"
    return text


def write_compare(rows: list[dict], out_dir: Path, charts: bool = True) -> list[Path]:
    """compare.csv (+ compare.png/.svg) in ``out_dir``."""
    out_dir = Path(out_dir)
    atomic_write_text(out_dir / "compare.csv", csv_text(rows, CSV_COLUMNS))
    files = [out_dir / "compare.csv"]
    if charts:
        from sim.outputs.compare_chart import plot_compare  # lazy: matplotlib, only when charts are drawn

        files += plot_compare(rows, out_dir / "compare")
    return files
