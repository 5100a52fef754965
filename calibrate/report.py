"""`dtsim calibrate --report`: how well the fitted models reproduce the measurements (text + PNG).

Leave-one-out error is the honest figure: each measured point predicted by the model fitted without it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from calibrate.config import MEMBW_FAMILIES
from calibrate.fit import BandwidthCurve, ShapeTable, predict_time_s
from calibrate.profile import device_name


def _pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{100 * x:5.1f}%"


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def memory_skips(skipped: list[dict]) -> list[str]:
    """The memory section's skips, one line per reason and set of kernels (the quick CPU sweep leaves
    the families out at all sizes but one, for one reason): which kernels and sizes have no figure."""
    points: dict[tuple[str, str], list[str]] = {}
    for r in skipped:
        where = f"{_size(r['size_bytes'])} {r.get('dtype', '')}".strip() if "size_bytes" in r else "all sizes"
        points.setdefault((r.get("reason", ""), where), []).append(r.get("kernel", "?"))
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (reason, where), kernels in points.items():
        grouped.setdefault((reason, tuple(dict.fromkeys(kernels))), []).append(where)
    return [
        f"{', '.join(kernels)} at {', '.join(wheres)}: {reason}"
        for (reason, kernels), wheres in grouped.items()
    ]


def format_report(profile: dict, path: str = "") -> str:
    """Fit quality per op family, as a few aligned tables."""
    md, run, fits, sections = profile["metadata"], profile["run"], profile["fits"], profile["sections"]
    lines = [
        f"profile {path}  (schema {profile['schema_version']}, {run.get('sweep')} sweep)",
        f"  device {device_name(profile)} [{run.get('device')}, {md.get('device_count')}], host {md.get('hostname')}, "
        f"{md.get('date')}, torch {md.get('torch_version')}",
    ]
    for name, s in sections.items():
        extra = s.get("reason") or f"{len(s.get('measurements', []))} points, {s.get('wall_s', 0):.1f} s"
        lines.append(f"  {name}: {s.get('status')} ({extra})")
    family: dict[str, float | None] = {}

    if "gemm" in fits:
        lines += [
            "",
            "GEMM: achieved throughput by shape (leave-one-out error of the shape interpolation)",
            f"  {'dtype':<6} {'points':>6} {'best TFLOP/s':>13} {'LOO rms':>8} {'LOO max':>8} "
            f"{'LOO rms by FLOPs+intensity (shapeless ops)':>44}",
        ]
        rms = []
        for dtype, t in fits["gemm"].items():
            lines.append(
                f"  {dtype:<6} {len(t['points']):>6} {t['max_flops_per_s'] / 1e12:>13.3f} "
                f"{_pct(t['loo_rel_rms']):>8} {_pct(t['loo_rel_max']):>8} "
                f"{_pct(t.get('loo_intensity_rel_rms')):>44}"
            )
            if t["loo_rel_rms"] is not None:
                rms.append(t["loo_rel_rms"])
        family["gemm"] = float(np.sqrt(np.mean(np.square(rms)))) if rms else None
    if fits.get("memory"):
        mem = fits["memory"]
        lines += [
            "",
            "Memory bandwidth: achieved bytes/s by size (log-log interpolation per kernel)",
            f"  {'kernel':<11} {'points':>6} {'best GB/s':>10}",
        ]
        for name, c in mem["kernels"].items():
            lines.append(f"  {name:<11} {len(c['bytes_moved']):>6} {max(c['bytes_per_s']) / 1e9:>10.2f}")
        lines.append(f"  leave-one-out: rms {_pct(mem['loo_rel_rms'])}, max {_pct(mem['loo_rel_max'])}")
        lines += [f"  not measured: {s}" for s in memory_skips(sections.get("memory", {}).get("skipped", []))]
        missing = [f for f in MEMBW_FAMILIES if f not in mem["kernels"]]
        if missing:
            lines.append(
                f"  kernel families without a curve (priced from the fallback): {', '.join(missing)}"
            )
        family["memory"] = mem["loo_rel_rms"]
    if "collectives" in fits:
        lines += [
            "",
            "Collectives: α–β fits in each algorithm's closed form (relative time errors)",
            f"  {'op':<15} {'scope':<10} {'p':>3} {'alpha us':>9} {'B GB/s':>8} {'rms':>7} {'max':>7} "
            f"{'LOO rms':>8} {'LOO max':>8}  model",
        ]
        rms = []
        for f in fits["collectives"]:
            bw = f"{f['bandwidth_Bps'] / 1e9:8.3f}" if f["bandwidth_Bps"] else "     inf"
            lines.append(
                f"  {f['op']:<15} {f['scope']:<10} {f['group_size']:>3} {f['alpha_s'] * 1e6:>9.2f} {bw} "
                f"{_pct(f['rel_rms']):>7} {_pct(f['rel_max']):>7} {_pct(f['loo_rel_rms']):>8} "
                f"{_pct(f['loo_rel_max']):>8}  {f['model']}"
            )
            if f["loo_rel_rms"] is not None:
                rms.append(f["loo_rel_rms"])
        family["collectives"] = float(np.sqrt(np.mean(np.square(rms)))) if rms else None
        if not fits["collectives"]:
            lines.append(f"  none ({sections.get('collectives', {}).get('reason', 'no measurements')})")
    lines += [
        "",
        "Leave-one-out error per op family (rms): "
        + ", ".join(f"{k} {_pct(v).strip()}" for k, v in family.items()),
    ]
    return "\n".join(lines)


def plot_profile(profile: dict, png_path: str | Path) -> Path:
    """Measured points vs fitted curves: collectives (time vs size), GEMM (TFLOP/s), memory (GB/s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fits, sections = profile["fits"], profile["sections"]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5))
    ax = axes[0]
    coll = sections.get("collectives", {}).get("measurements", [])
    for i, f in enumerate(fits.get("collectives", [])):
        pts = sorted(
            (m["size_bytes"], m["time_s"])
            for m in coll
            if (m.get("op"), m.get("scope"), m.get("group_size")) == (f["op"], f["scope"], f["group_size"])
            and isinstance(m.get("size_bytes"), (int, float)) and isinstance(m.get("time_s"), (int, float))
        )
        if not pts:  # a fit whose measurements the profile no longer holds (edited): nothing to set beside it
            continue
        x = np.array([p[0] for p in pts], float)
        color = f"C{i % 10}"
        ax.loglog(x, [p[1] * 1e6 for p in pts], "o", ms=4, color=color)
        xs = np.geomspace(x.min(), x.max(), 60)
        ys = [predict_time_s(f["op"], f["group_size"], s, f["alpha_s"], f["bandwidth_Bps"]) * 1e6 for s in xs]
        ax.loglog(xs, ys, "-", color=color, label=f"{f['op']} p={f['group_size']} {f['scope']}")
    ax.set(title="collectives: measured (dots) vs α–β fit", xlabel="size (bytes)", ylabel="time (µs)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no collectives measured", ha="center", transform=ax.transAxes)

    ax = axes[1]
    for i, (dtype, t) in enumerate(fits.get("gemm", {}).items()):
        table = ShapeTable(t["points"], t["min_time_s"], t.get("elem_bytes", 2))
        flops = [2.0 * p[0] * p[1] * p[2] for p in t["points"]]
        loo = [table.flops_per_s(p[0], p[1], p[2], exclude=j)[0] / 1e12 for j, p in enumerate(t["points"])]
        ax.loglog(
            flops, [p[3] / 1e12 for p in t["points"]], "o", ms=4, color=f"C{i}", label=f"{dtype} measured"
        )
        ax.loglog(flops, loo, "x", ms=5, color=f"C{i}", alpha=0.6, label=f"{dtype} leave-one-out")
    ax.set(title="GEMM throughput", xlabel="FLOPs per GEMM", ylabel="TFLOP/s")
    if fits.get("gemm"):
        ax.legend(fontsize=7)

    ax = axes[2]
    mem = fits.get("memory") or {}
    if mem:
        curve = BandwidthCurve(mem["kernels"])
        for i, (name, c) in enumerate(mem["kernels"].items()):
            marker = "s" if name in MEMBW_FAMILIES else "o"
            ax.loglog(
                c["bytes_moved"],
                np.array(c["bytes_per_s"]) / 1e9,
                marker,
                ms=4,
                color=f"C{i % 10}",
                label=name,
            )
        xs = np.geomspace(*curve.streaming_range(), 80)
        ax.loglog(
            xs, [curve.bytes_per_s(x)[0] / 1e9 for x in xs], "k-", lw=1, label="streaming model (median)"
        )
        ax.legend(fontsize=7)
    ax.set(title="memory bandwidth", xlabel="bytes moved", ylabel="GB/s")
    fig.suptitle(
        f"{device_name(profile)} — {profile['run'].get('device')} — {profile['metadata'].get('date')}"
    )
    fig.tight_layout()
    out = Path(png_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    from sim.outputs.writers import atomic_open

    with atomic_open(out, "wb") as fh:  # an interrupted plot never leaves a truncated PNG over the last one
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)
    return out
