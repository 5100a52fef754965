"""``dtsim sweep BASE.yaml --grid KEY=V1,V2 …``: the cartesian product of the grids, simulated in parallel.

Every point is the base scenario with the ``--set`` overrides, then one value per grid key (same syntax as
``--set``, values parsed as YAML). Points that break a rule (data×tensor×pipeline ≠ GPUs, heads not
divisible by tensor, …) or do not fit in memory stay in the results, with the reason, instead of being
dropped.

Keeping the GPU count: when a grid changes ``parallel.tensor``, ``parallel.pipeline`` or the cluster size
but not ``parallel.data``, the data-parallel degree is recomputed as GPUs / (tensor × pipeline) for each
point ("fit data", on by default; ``--no-fit-data`` keeps the base value, making such points invalid).
A data degree given by ``--set`` or a grid is never changed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from sim.errors import ScenarioError
from sim.explore.runner import INVALID, NO_FIT, OK, first_line, run_jobs
from sim.explore.table import (
    METRIC_COLUMNS,
    csv_text,
    format_duration,
    setting_row,
    summary_row,
    text_table,
)
from sim.outputs.writers import atomic_write_text
from sim.scenario.load import apply_overrides, read_scenario_file, scenario_from_dict

MAX_POINTS = 10_000


@dataclass
class Point:
    """One grid point: its values (raw text per key), the resolved scenario or why it has none."""

    index: int
    values: dict[str, str]
    scenario: dict | None = None
    reason: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in self.values.items())


def split_values(text: str) -> list[str]:
    """ "1,2,[a, b],{x: 1}" → ["1", "2", "[a, b]", "{x: 1}"]: commas inside brackets or quotes stay."""
    out: list[str] = []
    cur: list[str] = []
    depth, quote = 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return out


def parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    """``KEY=V1,V2`` strings → [(key, [raw values])]; a malformed or repeated key is a ScenarioError."""
    grid: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        values = split_values(raw) if sep else []
        if not key or not sep or not values or any(v == "" for v in values):
            raise ScenarioError(
                f"{item!r} — expected KEY=V1,V2,…; write e.g. --grid parallel.tensor=1,2,4,8", "--grid"
            )
        if key in (k for k, _ in grid):
            raise ScenarioError(f"{key} appears in two --grid options; give all its values in one", "--grid")
        grid.append((key, values))
    if not grid:
        raise ScenarioError("give at least one --grid KEY=V1,V2,…", "--grid")
    total = 1
    for _, values in grid:
        total *= len(values)
    if total > MAX_POINTS:
        raise ScenarioError(
            f"the grid has {total} points, more than {MAX_POINTS}; sweep fewer values", "--grid"
        )
    return grid


def _fit_data(data: dict, fixed_data: bool) -> str | None:
    """Set parallel.data = GPUs / (tensor × pipeline) in ``data`` (in place); a note, or None if unchanged."""
    if fixed_data:
        return None
    cluster, par = data.get("cluster"), data.get("parallel")
    if not isinstance(cluster, dict) or not isinstance(par, dict):
        return None
    nodes, per = cluster.get("nodes"), cluster.get("gpus_per_node")
    t, p = par.get("tensor", 1), par.get("pipeline", 1)
    if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (nodes, per, t, p)):
        return None
    assert isinstance(nodes, int) and isinstance(per, int)  # checked just above
    gpus = nodes * per
    c = par.get("context") or 1  # context parallelism also takes GPUs
    if not isinstance(c, int) or isinstance(c, bool) or c < 1:
        return None
    if gpus % (t * p * c) or par.get("data", 1) * t * p * c == gpus:
        return None
    par["data"] = gpus // (t * p * c)
    ctx = f" × context {c}" if c > 1 else ""
    return f"data={par['data']} (fit: {gpus} GPUs / (tensor {t} × pipeline {p}{ctx}))"


def _data_fixed(overrides: list[str], keys: list[str]) -> bool:
    """Whether a --set or a grid key gives parallel.data (then fit data never changes it)."""
    return "parallel.data" in keys or any(o.partition("=")[0].strip() == "parallel.data" for o in overrides)


def expand(
    base: dict,
    overrides: list[str],
    grid: list[tuple[str, list[str]]],
    *,
    fit_data: bool = True,
    base_dir: Path | None = None,
) -> list[Point]:
    """Every grid point validated against the schema (invalid ones keep their reason)."""
    keys = [k for k, _ in grid]
    data_fixed = _data_fixed(overrides, keys)
    start, set_origins = apply_overrides(base, overrides)  # a bad --set is the user's mistake: raise
    points = []
    for i, combo in enumerate(itertools.product(*(v for _, v in grid))):
        pt = Point(i, dict(zip(keys, combo, strict=True)))
        sets = [f"{k}={v}" for k, v in pt.values.items()]
        try:
            data, grid_origins = apply_overrides(start, sets, flag="--grid")
            # a field a --set gave is named as the --set's, not only the grid's settings
            origins = {**set_origins, **grid_origins}
        except ScenarioError as exc:
            if i == 0:  # an unknown key fails every point: report it as the user's mistake
                raise
            pt.reason = first_line(exc)
            points.append(pt)
            continue
        note = _fit_data(data, data_fixed) if fit_data else None
        if note:
            pt.notes.append(note)
        try:
            pt.scenario = scenario_from_dict(data, base_dir=base_dir, origins=origins).resolved()
        except ScenarioError as exc:
            pt.reason = first_line(exc)
        points.append(pt)
    return points


def _related(field: str, key: str) -> bool:
    """Whether a setting of ``key`` can change ``field`` (the same key, one inside the other)."""
    return field == key or field.startswith(key + ".") or key.startswith(field + ".")


def base_mistake(
    base: dict,
    overrides: list[str],
    keys: list[str],
    base_dir: Path | None = None,
    *,
    fit_data: bool = True,
) -> ScenarioError | None:
    """The error of the base scenario with the --set settings alone, when no grid key touches the field it
    names; else None. Called once every point failed: such an error is the --set's (or the file's), and
    reporting it as the first grid point's sent the user to the grid. parallel.data is refit as every
    point refits it (``fit_data``): a data degree the sweep fixes itself is no --set's mistake."""
    start, origins = apply_overrides(base, overrides)
    if fit_data:
        _fit_data(start, _data_fixed(overrides, keys))
    try:
        scenario_from_dict(start, base_dir=base_dir, origins=origins)
    except ScenarioError as exc:
        if exc.field and not any(_related(exc.field, k) for k in keys):
            return exc
    return None


def sweep(
    path: str,
    grid_items: list[str],
    overrides: list[str] | None = None,
    *,
    fit_data: bool = True,
    workers: int | None = None,
    executor: str = "local",
    address: str | None = None,
    progress: bool = True,
) -> list[dict]:
    """Simulate every valid grid point; one row per point (invalid ones too), in grid order."""
    grid = parse_grid(grid_items)
    base = read_scenario_file(path)
    base_dir = Path(path).expanduser().resolve().parent
    points = expand(base, overrides or [], grid, fit_data=fit_data, base_dir=base_dir)
    if not any(p.scenario is not None for p in points):
        base_error = base_mistake(
            base, overrides or [], [k for k, _ in grid], base_dir, fit_data=fit_data
        )
        if base_error is not None:
            raise base_error
    todo = [p for p in points if p.scenario is not None]
    results = run_jobs(
        [(p.scenario, None) for p in todo if p.scenario is not None],
        workers=workers,
        executor=executor,
        address=address,
        progress=progress,
        desc="sweep",
    )
    by_index = {p.index: r for p, r in zip(todo, results, strict=True)}
    rows = []
    for p in points:
        row: dict = {"point": p.index, "label": p.label, **p.values}
        res = by_index.get(p.index, {"status": INVALID, "reason": p.reason})
        row["status"], row["reason"] = res["status"], res.get("reason", "")
        row["notes"] = "; ".join(p.notes)
        if p.scenario is not None:
            row.update(setting_row(p.scenario))
        if "summary" in res:
            row.update(summary_row(res["summary"]))
        rows.append(row)
    return rows


def sweep_table(rows: list[dict], keys: list[str]) -> str:
    """One line per point: grid values, layout, step time, tokens/s, MFU, memory, status."""
    header = [k.rsplit(".", 1)[-1] for k in keys] + ["d×t×p", "step", "tokens/s", "MFU", "peak GB", "status"]

    def num(r: dict, key: str, fmt: str) -> str:
        return format(r[key], fmt) if r.get(key) is not None else "—"

    body = []
    for r in rows:
        layout = f"{r['data']}×{r['tensor']}×{r['pipeline']}" if r.get("data") is not None else "—"
        body.append(
            [str(r[k]) for k in keys]
            + [
                layout,
                format_duration(r["step_time_s"]) if r.get("step_time_s") is not None else "—",
                num(r, "tokens_per_s", ",.0f"),
                num(r, "mfu", ".1%"),
                num(r, "peak_memory_GB", ".1f"),
                r["status"],
            ]
        )
    n = len(keys)
    return text_table(header, body, right=set(range(n + 1, n + 5)))


def sweep_text(rows: list[dict], keys: list[str]) -> str:
    """The table, the counts by status and every infeasible point with its reason."""
    n = counts(rows)
    lines = [
        sweep_table(rows, keys),
        f"{len(rows)} points: {n[OK]} feasible, {n[NO_FIT]} do not fit in memory, {n[INVALID]} invalid"
        + (f", {n['error']} failed" if n.get("error") else ""),
    ]
    bad = infeasible_lines(rows)
    if bad:
        lines += ["infeasible points:", *bad]
    return "\n".join(lines)


def infeasible_lines(rows: list[dict]) -> list[str]:
    """ "label: reason" for every point that is not OK."""
    return [f"  {r['label']}: {r['status']}: {r['reason']}" for r in rows if r["status"] != OK]


def write_sweep(
    rows: list[dict], keys: list[str], out_dir: Path, charts: bool = True, title: str = ""
) -> list[Path]:
    """sweep.csv (+ sweep.png/.svg) in ``out_dir``."""
    out_dir = Path(out_dir)
    columns = ["point", "label", *keys, "status", "reason", "notes", *METRIC_COLUMNS]
    atomic_write_text(out_dir / "sweep.csv", csv_text(rows, columns))
    files = [out_dir / "sweep.csv"]
    if charts:
        from sim.outputs.compare_chart import plot_sweep  # lazy: matplotlib, only when charts are drawn

        files += plot_sweep(rows, out_dir / "sweep", keys, title)
    return files


def counts(rows: list[dict]) -> dict[str, int]:
    out = {OK: 0, NO_FIT: 0, INVALID: 0}
    for r in rows:
        out[r["status"]] = out.get(r["status"], 0) + 1
    return out
