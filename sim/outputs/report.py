"""``report.html``: one self-contained page per result folder, readable offline and safe to mail around.

It gathers what the folder already holds, it recomputes nothing: the summary table (``summary.json``),
every chart (PNG embedded as base64 data URIs), the tables of ``compare``/``sweep``/``plan``
(their CSVs), the planner's explanation (``plan.txt``), the resolved scenario YAML and how to open
``trace.json`` in Perfetto. A Content-Security-Policy forbids every external resource, so the page looks
the same with or without a network and cannot leak that it was opened.
"""

from __future__ import annotations

import base64
import csv
import html
import json
from pathlib import Path

from sim.outputs.writers import atomic_write_text
from sim.summary import SummaryView
from sim.units import format_days, format_seconds

PERFETTO_URL = "https://ui.perfetto.dev"
CHART_ORDER = ("gantt", "pipeline", "memory", "compare", "sweep")  # the rest follow alphabetically
TEXT_TABLES = (("compare.txt", "Comparison"), ("plan.txt", "Plan"), ("sweep.txt", "Sweep"))
CSV_TABLES = (("compare.csv", "Comparison"), ("plan.csv", "Plan: candidates"), ("sweep.csv", "Sweep"))
MAX_TABLE_ROWS = 300
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1400px;
padding:16px 28px;color:#222;background:#fff;line-height:1.4}
h1{font-size:1.5em;margin:.2em 0 .1em}h2{font-size:1.15em;margin:1.4em 0 .4em;border-bottom:1px solid #ddd}
.sub{color:#666;margin-bottom:1em}table{border-collapse:collapse;font-size:.86em;margin:.3em 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.bad td{background:#fdecea}tr.win td{background:#e8f4ea}
.scroll{overflow-x:auto}figure{margin:.6em 0 1.4em}
figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.85em}
pre{background:#f7f7f7;padding:10px;white-space:pre-wrap;overflow-wrap:anywhere;font-size:.82em}
details summary{cursor:pointer;color:#0b5394}
.fit{color:#1b7d2f;font-weight:600}.oom{color:#c00000;font-weight:600}
ol li{margin:.2em 0}code{background:#f3f3f3;padding:0 3px}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _summary_rows(s: SummaryView) -> list[tuple[str, str]]:
    """(label, HTML) pairs for a run's summary: the figures ``dtsim run`` prints."""
    rows: list[tuple[str, str]] = [("scenario", _e(s.get("name", "")))]
    if s.get("workload") == "collective":
        rows.append(("collective", _e(f"{s.get('op')} ({s.get('algorithm')}) on {s.get('num_gpus')} GPUs")))
        rows.append(("time", _e(format_seconds(float(s.get("step_time_s", 0.0))))))
        return rows
    par = s.get("parallel", {})
    if par:
        rows.append(
            (
                "GPUs",
                _e(
                    f"{s.get('num_gpus')} (data {par.get('data')} × tensor {par.get('tensor')} × "
                    f"pipeline {par.get('pipeline')}, {par.get('schedule')}"
                    + (f" v={par['virtual_stages']}" if par.get("virtual_stages", 1) > 1 else "")
                    + f", ZeRO {par.get('zero')})"
                ),
            )
        )
    for key, label, fmt in (
        ("step_time_s", "step time", format_seconds),
        (
            "tokens_per_s",
            "throughput",
            lambda x: f"{s.get('samples_per_s', 0.0):.4g} samples/s"
                      + (f", {x:,.0f} tokens/s" if s.get("workload") == "transformer" else ""),
        ),
        ("step_time_p50_s", "step time p50/p90/p99",
         lambda x: f"{format_seconds(x)} / {format_seconds(s.get('step_time_p90_s') or x)} / "
                   f"{format_seconds(s.get('step_time_p99_s') or x)} over {len(s.get('step_times_s') or [])} steps"),
        ("compute_s", "compute / step", format_seconds),
        ("exposed_comm_s", "exposed communication / step", format_seconds),
        ("bubble_fraction", "bubble (idle) fraction", lambda x: f"{x:.1%}"),
        ("mfu", "MFU / HFU", lambda x: f"{x:.1%} / {s.get('hfu', 0.0):.1%}"),
    ):
        if s.get(key) is not None:
            rows.append((label, _e(fmt(s[key]))))
    lt = s.get("layer_time_s")
    if lt:
        rows.append(("one layer (forward / backward)",
                     _e(f"{format_seconds(lt['forward_s'])} / {format_seconds(lt['backward_s'])}"
                        + (f", recompute {format_seconds(lt['recompute_s'])}" if lt.get("recompute_s") else "")
                        + f" (GPU {lt['gpu']:.0f}, micro-batch {lt['microbatch']:.0f})")))
    mb = s.get("memory_bytes")
    if mb:
        fits = s.get("fits_in_memory", True)
        cap = s.get("gpu_memory_bytes", 0.0)
        verdict = (
            '<span class="fit">fits</span>'
            if fits
            else f'<span class="oom">DOES NOT FIT ({_e(f"{cap / 1e9:.0f}")} GB per GPU)</span>'
        )
        peak = f"{mb['peak'] / 1e9:.2f} GB (stage {mb.get('stage')})"
        rows.append(("peak memory / GPU", f"{_e(peak)} — {verdict}"))
        if not fits and s.get("memory_fixes"):
            rows.append(("to make it fit", _e("; ".join(s["memory_fixes"][:3]))))
    if "cost_per_step_usd" in s:
        cost = f"${s['cost_per_step_usd']:.4g} per step"
        if "cost_per_1M_tokens_usd" in s:
            cost += f", ${s['cost_per_1M_tokens_usd']:.4g} per 1M tokens"
        rows.append(("cost", _e(cost)))
    if "energy_kWh_per_step" in s:
        rows.append(("energy", _e(f"{s['energy_kWh_per_step']:.4g} kWh per step")))
    if "time_to_train_days" in s:
        rows.append(
            (
                "time to train",
                _e(
                    f"{format_days(s['time_to_train_days'])}, ${s.get('cost_to_train_usd', 0):,.0f}, "
                    f"{s.get('energy_to_train_MWh', 0):.1f} MWh"
                ),
            )
        )
    return rows


def _kv_table(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="summary">{body}</table>'


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _cell(text: str) -> str:
    if _is_number(text) and not text.isdigit():
        value = float(text)
        shown = f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
        return f'<td class="num" title="{_e(text)}">{_e(shown)}</td>'
    return f'<td class="num">{_e(text)}</td>' if text.isdigit() else f"<td>{_e(text)}</td>"


def _csv_table(path: Path) -> str:
    """A CSV as an HTML table (empty columns dropped; rows that are not OK tinted)."""
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows:
        return "<p>(empty)</p>"
    header, body = rows[0], rows[1:]
    keep = [i for i in range(len(header)) if any(i < len(r) and r[i] != "" for r in body)] or list(
        range(len(header))
    )
    status = header.index("status") if "status" in header else None
    rank = header.index("rank") if "rank" in header else None
    out = ['<div class="scroll"><table><tr>' + "".join(f"<th>{_e(header[i])}</th>" for i in keep) + "</tr>"]
    for r in body[:MAX_TABLE_ROWS]:
        cls = ""
        if status is not None and status < len(r) and r[status] not in ("ok", "screened", ""):
            cls = ' class="bad"'
        elif rank is not None and rank < len(r) and r[rank] == "1":
            cls = ' class="win"'
        out.append(f"<tr{cls}>" + "".join(_cell(r[i] if i < len(r) else "") for i in keep) + "</tr>")
    out.append("</table></div>")
    if len(body) > MAX_TABLE_ROWS:
        out.append(f"<p>… {len(body) - MAX_TABLE_ROWS} more rows in {_e(path.name)}</p>")
    return "".join(out)


def _charts(folder: Path) -> list[Path]:
    pngs = {p.stem: p for p in folder.glob("*.png") if not p.name.startswith(".")}
    ordered = [pngs.pop(k) for k in CHART_ORDER if k in pngs]
    return ordered + [pngs[k] for k in sorted(pngs)]


def _figure(png: Path) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    svg = png.with_suffix(".svg")
    also = f" (vector version: {_e(svg.name)})" if svg.exists() else ""
    return (
        f'<figure><img alt="{_e(png.stem)} chart" src="data:image/png;base64,{data}">'
        f"<figcaption>{_e(png.name)}{also}</figcaption></figure>"
    )


def _perfetto(folder: Path, shown: Path) -> str:
    trace = folder / "trace.json"
    if not trace.exists():
        trace = folder / "trace.json.gz"  # --trace-gz: Perfetto opens the compressed file as it is
    if not trace.exists():
        return ""
    size = trace.stat().st_size / 1e6
    return (
        "<h2>Timeline in Perfetto</h2>"
        f'<p>The full timeline is in <a href="{trace.name}" download><code>{trace.name}</code></a> '
        f"({size:.1f} MB, "
        "next to this report). To explore it:</p><ol>"
        f'<li>open <a href="{PERFETTO_URL}" target="_blank" rel="noopener noreferrer">{PERFETTO_URL}</a> '
        "(it runs in your browser; the trace is not uploaded);</li>"
        "<li>click <b>Open trace file</b> in the left menu (or drag the file onto the page);</li>"
        f"<li>choose <code>{_e((shown / 'trace.json').resolve())}</code>.</li></ol>"
        "<p>Each GPU is a process; its compute, communication and pipeline streams are threads; memory is a "
        "counter track. Keys: <code>W</code>/<code>S</code> zoom, <code>A</code>/<code>D</code> pan.</p>"
    )


def report_html(folder: Path, shown_as: Path | None = None) -> str:
    """The report page for ``folder`` as a string (``write_report`` writes it). ``shown_as`` is the
    folder's final path when ``folder`` is the staging copy of a result being written."""
    folder = Path(folder)
    shown = Path(shown_as) if shown_as is not None else folder
    summary_path = folder / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.exists() else None
    title = (summary or {}).get("name") or shown.resolve().name
    parts = [
        f"<h1>dtsim report: {_e(title)}</h1>",
        f'<div class="sub">result folder <code>{_e(shown.resolve())}</code></div>',
    ]
    if summary is not None:
        parts += ["<h2>Summary</h2>", _kv_table(_summary_rows(summary))]
    for name, heading in TEXT_TABLES:
        if (folder / name).exists():
            parts += [
                f"<h2>{_e(heading)}</h2>",
                f"<pre>{_e((folder / name).read_text(encoding='utf-8'))}</pre>",
            ]
    for name, heading in CSV_TABLES:
        path = folder / name
        if not path.exists():
            continue
        table = _csv_table(path)
        if (folder / name.replace(".csv", ".txt")).exists():  # its text table is shown: keep this one folded
            parts.append(f"<details><summary>all columns ({_e(name)})</summary>{table}</details>")
        else:
            parts += [f"<h2>{_e(heading)} <small>({_e(name)})</small></h2>", table]
    charts = _charts(folder)
    if charts:
        parts.append("<h2>Charts</h2>")
        parts += [_figure(p) for p in charts]
    parts.append(_perfetto(folder, shown))
    for yaml_name, heading in (("resolved.yaml", "Resolved scenario"), ("best.yaml", "Best configuration")):
        y = folder / yaml_name
        if y.exists():
            parts.append(
                f"<h2>{heading} <small>({yaml_name})</small></h2><details open><summary>{_e(yaml_name)}"
                f"</summary><pre>{_e(y.read_text(encoding='utf-8'))}</pre></details>"
            )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>dtsim report: {_e(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>\n"
    )


def write_report(result_dir: Path, shown_as: Path | None = None) -> Path:
    """Write ``report.html`` into ``result_dir`` (atomically) and return its path; ``shown_as`` is the
    path the report names as its folder (the final one, when ``result_dir`` is a staging folder)."""
    folder = Path(result_dir)
    if not folder.is_dir():
        from sim.errors import ScenarioError

        raise ScenarioError(f"{folder} is not a result folder; run `dtsim run` first", "report")
    out = folder / "report.html"
    atomic_write_text(out, report_html(folder, shown_as))
    return out
