"""One flat row per simulated scenario, shared by compare, sweep and plan: CSV columns and table cells.

The row is read off the run's summary (and the resolved scenario for the settings a summary does not
carry, such as checkpointing and precision), so every command reports the same figures the same way.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterable
from typing import Any

from sim.units import format_duration


def _get(d: dict, path: str, default=None):
    for key in path.split("."):
        if not isinstance(d, dict) or key not in d:
            return default
        d = d[key]
    return d


def setting_row(scenario: dict) -> dict:
    """The settings of a resolved scenario mapping that a summary does not repeat."""
    ck = _get(scenario, "training.checkpointing")
    return {
        "gpu": _get(scenario, "cluster.gpu.name"),
        "inter_node": _get(scenario, "cluster.inter_node.name"),
        "intra_node": _get(scenario, "cluster.intra_node.name"),
        "precision": _get(scenario, "training.precision"),
        "checkpointing": ck.get("kind") if isinstance(ck, dict) else ck,
        "micro_batch": _get(scenario, "training.micro_batch"),
        "sequence_parallel": _get(scenario, "parallel.sequence_parallel"),
    }


def summary_row(summary: dict) -> dict:
    """The figures of a summary that compare/sweep/plan report (absent ones are None)."""
    par = summary.get("parallel", {})
    mb = summary.get("memory_bytes", {})
    peak = mb.get("peak")
    cap = summary.get("gpu_memory_bytes")
    return {
        "num_gpus": summary.get("num_gpus"),
        "data": par.get("data"),
        "tensor": par.get("tensor"),
        "pipeline": par.get("pipeline"),
        "schedule": par.get("schedule"),
        "virtual_stages": par.get("virtual_stages"),
        "zero": par.get("zero"),
        "microbatches": summary.get("microbatches"),
        "step_time_s": summary.get("step_time_s"),
        "samples_per_s": summary.get("samples_per_s"),
        "tokens_per_s": summary.get("tokens_per_s"),
        "mfu": summary.get("mfu"),
        "bubble_fraction": summary.get("bubble_fraction"),
        "exposed_comm_s": summary.get("exposed_comm_s"),
        "peak_memory_GB": peak / 1e9 if peak is not None else None,
        "gpu_memory_GB": cap / 1e9 if cap is not None else None,
        "fits_in_memory": summary.get("fits_in_memory"),
        "cost_per_step_usd": summary.get("cost_per_step_usd"),
        "cost_per_1M_tokens_usd": summary.get("cost_per_1M_tokens_usd"),
        "time_to_train_days": summary.get("time_to_train_days"),
        "cost_to_train_usd": summary.get("cost_to_train_usd"),
        "energy_kWh_per_step": summary.get("energy_kWh_per_step"),
    }


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _gb(x: float) -> str:
    return f"{x:.1f} GB"


def _usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 1000 else f"${x:.4g}"


# (row key, label, formatter) in the order the side-by-side table prints them.
METRICS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("step_time_s", "step time", format_duration),
    ("tokens_per_s", "tokens/s", lambda x: f"{x:,.0f}" if x >= 100 else f"{x:.4g}"),
    ("samples_per_s", "samples/s", lambda x: f"{x:.4g}"),
    ("mfu", "MFU", _pct),
    ("bubble_fraction", "bubble", _pct),
    ("exposed_comm_s", "exposed comm / step", format_duration),
    ("peak_memory_GB", "peak memory / GPU", _gb),
    ("fits_in_memory", "fits in memory", lambda x: "yes" if x else "NO"),
    ("cost_per_step_usd", "cost / step", _usd),
    ("cost_per_1M_tokens_usd", "cost / 1M tokens", _usd),
    ("time_to_train_days", "time to train", lambda x: f"{x:.2f} days"),
    ("cost_to_train_usd", "cost to train", _usd),
    ("energy_kWh_per_step", "energy / step", lambda x: f"{x:.3g} kWh"),
)


def cell(value, fmt: Callable[[object], str] = str) -> str:
    """A table cell: '—' for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return fmt(value)


def layout_text(row: dict) -> str:
    """ "d16 × t8 × p8" from a row's degrees."""
    if row.get("data") is None:
        return "—"
    return f"d{row['data']} × t{row['tensor']} × p{row['pipeline']}"


def schedule_text(row: dict) -> str:
    s = row.get("schedule")
    if s is None:
        return "—"
    v = row.get("virtual_stages") or 1
    return f"{s} (v={v})" if v > 1 else str(s)


def text_table(header: list[str], rows: Iterable[list[str]], right: set[int] | None = None) -> str:
    """A plain fixed-width table; columns in ``right`` are right-aligned."""
    rows = [list(map(str, r)) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    right = right or set()

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(x.rstrip() for x in out)


def csv_text(rows: list[dict], columns: list[str]) -> str:
    """CSV with the given columns (floats with repr precision, None as empty)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow(
            ["" if r.get(c) is None else (repr(r[c]) if isinstance(r[c], float) else r[c]) for c in columns]
        )
    return buf.getvalue()


# The figures a compare or sweep CSV reports for each run (summary_row's keys), in order.
METRIC_COLUMNS = [
    "num_gpus",
    "data",
    "tensor",
    "pipeline",
    "schedule",
    "virtual_stages",
    "zero",
    "micro_batch",
    "microbatches",
    "checkpointing",
    "precision",
    "step_time_s",
    "samples_per_s",
    "tokens_per_s",
    "mfu",
    "bubble_fraction",
    "exposed_comm_s",
    "peak_memory_GB",
    "gpu_memory_GB",
    "fits_in_memory",
    "cost_per_step_usd",
    "cost_per_1M_tokens_usd",
    "time_to_train_days",
    "cost_to_train_usd",
    "energy_kWh_per_step",
]
