"""What ``dtsim plan`` prints and writes: the ranked table, the search statistics, the winner's
explanation, plan.csv (simulated rows, then the best screened ones) and best.yaml."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from sim.explore.runner import NO_FIT, OK, default_workers
from sim.explore.search import PlanResult, Screened
from sim.explore.table import csv_text, text_table
from sim.outputs.writers import atomic_write_text
from sim.scenario.load import dump_resolved, scenario_from_dict

CSV_SCREENED = 200  # best screened candidates written to plan.csv besides the simulated ones


def plan_table(result: PlanResult) -> str:
    header = [
        "rank",
        "configuration",
        "GPUs",
        "est step",
        "sim step",
        "tokens/s",
        "MFU",
        "bubble",
        "peak GB",
        "$/1M tok",
        "days",
        "status",
    ]
    body = []
    for r in result.rows:

        def f(key: str, fmt: str, r=r) -> str:
            return format(r[key], fmt) if r.get(key) is not None else "—"

        name = r["candidate"] + (" [given]" if r["given"] else "")
        body.append(
            [
                str(r["rank"]),
                name,
                f("num_gpus", "d"),
                f("est_step_time_s", ".3f"),
                f("step_time_s", ".3f"),
                f("tokens_per_s", ",.0f"),
                f("mfu", ".1%"),
                f("bubble_fraction", ".1%"),
                f("peak_memory_GB", ".1f"),
                f("cost_per_1M_tokens_usd", ".3f"),
                f("time_to_train_days", ".2f"),
                r["status"] if r["status"] != NO_FIT else "no-fit",
            ]
        )
    return text_table(header, body, right={0, 2, 3, 4, 5, 6, 7, 8, 9, 10})


def _simulated_text(result: PlanResult) -> str:
    top = sum(1 for r in result.rows if r.get("_screened") is not None)
    extra = any(r["given"] and r.get("_screened") is None for r in result.rows)
    return f"the top {top}" + (" + the given configuration" if extra else "")


def _sim_walls(result: PlanResult) -> str:
    """Each simulation's own wall time, in rank order: where a plan's time goes."""
    walls = [r.get("sim_wall_s") for r in result.rows]
    return "each " + ", ".join("—" if w is None else f"{w:.1f}" for w in walls) + " s, in rank order"


def stats_text(result: PlanResult, workers: int | None) -> str:
    """How many candidates each filter removed and how long each phase took."""
    st = result.stats
    pruned = sum(st["pruned"].values())
    rules = ", ".join(f"{v:,} {k}" for k, v in sorted(st["pruned"].items(), key=lambda kv: -kv[1]))
    lines = [
        f"considered {st['considered']:,} candidates on {', '.join(map(str, result.gpu_counts))} GPUs in "
        f"{st['total_s']:.1f} s:",
        f"  {pruned:,} broke a divisibility rule ({rules})",
        f"  {st['states_too_big']:,} cannot hold their model states (ZeRO formula > GPU memory)",
        f"  {st['screened']:,} screened by closed forms in {st['screen_s']:.2f} s",
        f"  exact memory (sim.build) checked for {st['exact_checks']:,} in estimate order in "
        f"{st['verify_s']:.2f} s: "
        f"{st['exact_no_fit']:,} do not fit, {st['invalid']} invalid, {st['twins']} ZeRO/checkpointing/rank-order twins skipped",
        f"  simulated {_simulated_text(result)} in {st['simulate_s']:.1f} s with "
        f"{workers or default_workers()} workers ({_sim_walls(result)})",
    ]
    return "\n".join(lines)


def plan_text(result: PlanResult, workers: int | None = None) -> str:
    """What ``dtsim plan`` prints: the heading, the ranked table, the search statistics, the explanation."""
    sc = result.base
    counts = ", ".join(map(str, result.gpu_counts))
    lines = [
        f"plan for {result.name}: {getattr(sc.model, 'name', None) or 'transformer'} on {counts} × "
        f"{sc.gpu.name}, global batch {sc.training.global_batch if sc.training else '?'}, "
        f"objective {result.objective}",
        plan_table(result),
        # why a simulated row has no figures (over the event budget, refused by a rule, failed)
        *(f"  rank {r['rank']} {r['status']}: {r['reason']}" for r in result.rows
          if r["status"] not in (OK, NO_FIT) and r.get("reason")),
        stats_text(result, workers),
    ]
    if result.winner is not None:
        lines += ["", f"winner: {result.winner['candidate']}", *(f"  - {x}" for x in result.explanation)]
    return "\n".join(lines)


PLAN_COLUMNS = [
    "rank",
    "simulated",
    "given",
    "candidate",
    "status",
    "reason",
    "num_gpus",
    "data",
    "tensor",
    "pipeline",
    "schedule",
    "virtual_stages",
    "microbatch_group",
    "zero",
    "micro_batch",
    "checkpointing",
    "sequence_parallel",
    "order",
    "est_step_time_s",
    "est_bubble_fraction",
    "est_tp_comm_s",
    "est_dp_exposed_s",
    "est_states_GB",
    "exact_peak_GB",
    "step_time_s",
    "tokens_per_s",
    "mfu",
    "bubble_fraction",
    "exposed_comm_s",
    "peak_memory_GB",
    "fits_in_memory",
    "cost_per_step_usd",
    "cost_per_1M_tokens_usd",
    "time_to_train_days",
    "sim_wall_s",
]


def _screened_row(s: Screened) -> dict:
    c, e = s.candidate, s.estimate
    return {
        "candidate": c.label(),
        "num_gpus": s.gpus,
        **asdict(c),  # data … sequence_parallel: the candidate's fields are plan.csv's column names
        "est_step_time_s": e.step_time_s,
        "est_bubble_fraction": e.bubble_fraction,
        "est_tp_comm_s": e.tp_comm_s,
        "est_dp_exposed_s": e.dp_exposed_s,
        "est_states_GB": e.states_bytes / 1e9,
        "exact_peak_GB": s.memory["peak"] / 1e9 if s.memory else None,
        "fits_in_memory": s.fits,
    }


def write_plan(result: PlanResult, out_dir: Path) -> list[Path]:
    """plan.csv (simulated rows, then the best screened ones), best.yaml (the winner), plan.txt."""
    out_dir = Path(out_dir)
    rows = []
    for r in result.rows:
        s = r.get("_screened")
        row = {
            **(_screened_row(s) if s else {}),
            **{k: v for k, v in r.items() if not k.startswith("_")},
            "simulated": True,
        }
        rows.append(row)
    for s in result.screened[:CSV_SCREENED]:
        rows.append({**_screened_row(s), "simulated": False, "status": "screened"})
    files = [out_dir / "plan.csv"]
    atomic_write_text(files[0], csv_text(rows, PLAN_COLUMNS))
    if result.winner_scenario is not None:
        data = dict(result.winner_scenario)
        data["name"] = f"{result.name}-planned"[:100]
        winner = result.winner["candidate"] if result.winner else "?"
        data["description"] = f"dtsim plan winner ({result.objective}): {winner}"
        atomic_write_text(out_dir / "best.yaml", dump_resolved(scenario_from_dict(data)))
        files.append(out_dir / "best.yaml")
    return files
