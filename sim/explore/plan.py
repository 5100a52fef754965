"""``dtsim plan BASE.yaml``: search parallel layouts for a transformer on a cluster, then simulate the best.

Search space (the global batch and precision stay the user's; the GPU count is the cluster's unless
``--gpus`` gives others): tensor t ≤ GPUs per node dividing the heads, KV heads and MLP width; pipeline p
dividing the GPUs left, p ≤ layers; data d = GPUs / (t·p) dividing the global batch; micro-batch b with
d·b dividing the global batch; schedule 1F1B, GPipe or interleaved 1F1B with v chunks (p·v ≤ layers and
the micro-batch count a multiple of p); ZeRO 0–3; checkpointing none, selective or full; sequence
parallelism on or off when t > 1.

Three filters, cheapest first: divisibility rules; model states (ZeRO formulas) larger than the GPU;
then, in order of the closed-form estimate (``sim.explore.estimate``), the exact per-stage memory from
``sim.build`` and the scenario's own validation, until ``--top`` candidates pass. Those, and the given
configuration, are simulated in worker processes and ranked by the objective.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from sim.errors import ScenarioError
from sim.explore.estimate import Candidate, Estimate, Estimator
from sim.explore.runner import NO_FIT, OK, default_workers, run_jobs
from sim.explore.table import csv_text, setting_row, summary_row, text_table
from sim.outputs.writers import atomic_write_text

OBJECTIVES = ("throughput", "cost", "time-to-train")
SCHEDULES = ("1f1b", "interleaved-1f1b", "gpipe")
VIRTUAL_STAGES = (2, 3, 4, 6, 8)
CHECKPOINTING = ("none", "selective", "full")
MAX_EXACT_CHECKS = 20_000  # memory checks while walking the ranked list (about a millisecond each)
CSV_SCREENED = 200  # best screened candidates written to plan.csv besides the simulated ones


@dataclass
class Screened:
    """A candidate that passed the cheap filters, with its closed-form estimate and score."""

    candidate: Candidate
    gpus: int
    estimate: Estimate
    score: float  # lower is better, in the objective's terms
    memory: dict | None = None  # exact fullest-stage memory, once checked
    fits: bool | None = None


@dataclass
class PlanResult:
    name: str
    objective: str
    gpu_counts: list[int]
    base: object  # the base Scenario (overrides applied)
    rows: list[dict]  # simulated (the top candidates and the given configuration), ranked best first
    screened: list[Screened]
    stats: dict = field(default_factory=dict)
    explanation: list[str] = field(default_factory=list)
    winner: dict | None = None
    given: dict | None = None
    winner_scenario: dict | None = None
    estimators: dict[int, Estimator] = field(default_factory=dict)  # per GPU count


# ---- search space -----------------------------------------------------------------------------------
def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending, from its prime factors (trial division to √n: fast for any GPU count)."""
    factors: dict[int, int] = {}
    rest, q = n, 2
    while q * q <= rest:
        while rest % q == 0:
            factors[q] = factors.get(q, 0) + 1
            rest //= q
        q += 1 if q == 2 else 2
    if rest > 1:
        factors[rest] = factors.get(rest, 0) + 1
    out = [1]
    for prime, power in factors.items():
        out = [d * prime**e for d in out for e in range(power + 1)]
    return sorted(out)


def _tensor_rule(model, t: int) -> str | None:
    for name in ("heads", "kv_heads", "ffn_hidden"):
        if getattr(model, name) % t:
            return f"{name} % tensor"
    return None


def enumerate_candidates(
    scenario, gpus: int, max_micro_batch: int = 8, schedules: tuple[str, ...] = SCHEDULES
) -> tuple[list[Candidate], dict[str, int]]:
    """Every layout of the search space for ``gpus`` GPUs, and how many each divisibility rule removed."""
    m, tr = scenario.model, scenario.training
    per_node, layers, batch = scenario.cluster.gpus_per_node, m.layers, tr.global_batch
    pruned: dict[str, int] = {}
    out: list[Candidate] = []

    def drop(reason: str, n: int = 1) -> None:
        pruned[reason] = pruned.get(reason, 0) + n

    for t in divisors(gpus):
        if t > per_node:
            drop("tensor > GPUs per node")
            continue
        if _tensor_rule(m, t):
            drop("heads/kv_heads/ffn_hidden not divisible by tensor")
            continue
        for p in divisors(gpus // t):
            if p > layers:
                drop("pipeline > layers")
                continue
            d = gpus // (t * p)
            for b in range(1, max_micro_batch + 1):
                if batch % (d * b):
                    drop("global batch not divisible by data × micro-batch")
                    continue
                mbs = batch // (d * b)
                for sched, v in _schedules(p, mbs, layers, schedules, drop):
                    for zero in (0, 1, 2, 3) if d > 1 else (0,):
                        for ck in CHECKPOINTING:
                            for sp in (False, True) if t > 1 else (False,):
                                if sp and (m.seq_len * b) % t:
                                    drop("seq_len × micro-batch not divisible by tensor (SP)")
                                    continue
                                out.append(Candidate(d, t, p, b, sched, v, zero, ck, sp))
    return out, pruned


def _schedules(p: int, mbs: int, layers: int, allowed: tuple[str, ...], drop) -> list[tuple[str, int]]:
    if p == 1:
        return [("1f1b", 1)]  # without a pipeline every schedule is the same
    out = [(s, 1) for s in ("1f1b", "gpipe") if s in allowed]
    if "interleaved-1f1b" in allowed:
        for v in VIRTUAL_STAGES:
            if p * v > layers:
                drop("pipeline × virtual stages > layers")
            elif mbs % p:
                drop("interleaved: micro-batches not a multiple of pipeline")
            else:
                out.append(("interleaved-1f1b", v))
    return out


def candidate_of(scenario) -> Candidate | None:
    """The base scenario's own layout as a candidate, when the search space can express it."""
    par, tr = scenario.parallel, scenario.training
    if par.schedule not in SCHEDULES or tr.checkpointing.every != 1:
        return None
    return Candidate(
        par.data,
        par.tensor,
        par.pipeline,
        tr.micro_batch,
        par.schedule,
        par.virtual_stages,
        par.zero,
        tr.checkpointing.kind,
        par.sequence_parallel and par.tensor > 1,
    )


# ---- objective ------------------------------------------------------------------------------------
def _steps_total(scenario, tokens_per_step: float) -> float | None:
    tr = scenario.training
    if tr.train_steps:
        return float(tr.train_steps)
    if tr.tokens:
        return tr.tokens / tokens_per_step
    return None


def score_of(objective: str, scenario, gpus: int, step_time_s: float) -> float:
    """Lower is better: −tokens/s, $ per 1M tokens, or seconds to train."""
    tokens_per_step = scenario.training.global_batch * scenario.model.seq_len
    if objective == "throughput":
        return -tokens_per_step / step_time_s
    if objective == "cost":
        return gpus * scenario.gpu.price_per_gpu_hour * step_time_s / 3600 * 1e6 / tokens_per_step
    return _steps_total(scenario, tokens_per_step) * step_time_s


def summary_score(objective: str, summary: dict) -> float:
    if objective == "throughput":
        return -summary["tokens_per_s"]
    if objective == "cost":
        return summary["cost_per_1M_tokens_usd"]
    return summary["time_to_train_s"]


# ---- the search -----------------------------------------------------------------------------------
def _scenario_for_gpus(base, gpus: int):
    per = base.cluster.gpus_per_node
    if gpus % per:
        raise ScenarioError(
            f"{gpus} GPUs is not a whole number of {per}-GPU nodes; use a multiple of {per}", "--gpus"
        )
    cluster = base.cluster.model_copy(update={"nodes": gpus // per})
    return base.model_copy(update={"cluster": cluster})


def screen(
    base, gpu_counts: list[int], objective: str, max_micro_batch: int = 8
) -> tuple[list[Screened], dict[int, Estimator], dict]:
    """All candidates for every GPU count, cheap filters applied, sorted by estimated score."""
    out: list[Screened] = []
    estimators: dict[int, Estimator] = {}
    stats = {"considered": 0, "pruned": {}, "states_too_big": 0}
    for n in gpu_counts:
        sc = _scenario_for_gpus(base, n)
        est = estimators[n] = Estimator(sc)
        cands, pruned = enumerate_candidates(sc, n, max_micro_batch)
        stats["considered"] += len(cands) + sum(pruned.values())
        for k, v in pruned.items():
            stats["pruned"][k] = stats["pruned"].get(k, 0) + v
        cap = sc.gpu.memory_bytes
        for c in cands:
            if est.states_bytes(c) > cap:
                stats["states_too_big"] += 1
                continue
            e = est.estimate(c)
            out.append(Screened(c, n, e, score_of(objective, sc, n, e.step_time_s)))
    out.sort(key=lambda s: (s.score, s.candidate))
    return out, estimators, stats


def check_memory(s: Screened, est: Estimator) -> bool:
    if s.fits is None:
        s.memory = est.exact_memory(s.candidate)
        s.fits = s.memory["peak"] <= est.capacity
    return s.fits


def _candidate_data(base_data: dict, overrides: list[str], s: Screened, per_node: int) -> dict:
    from sim.scenario.load import apply_overrides

    sets = [*overrides, f"cluster.nodes={s.gpus // per_node}", *s.candidate.overrides()]
    data, _ = apply_overrides(base_data, sets)
    par = data.get("parallel")
    if isinstance(par, dict) and par.get("stage_layers") is not None:  # uneven stages fit one depth only
        from sim.parallel.layout import stage_layers_for

        par["stage_layers"] = stage_layers_for(par["stage_layers"], s.candidate.pipeline,
                                               s.candidate.virtual_stages)
    return data


def _twin(a: Screened, b: Screened) -> bool:
    """Candidates differing only in ZeRO stage with estimates within 0.5%: simulating both teaches little."""
    return (
        a.gpus == b.gpus
        and replace(a.candidate, zero=0) == replace(b.candidate, zero=0)
        and abs(a.estimate.step_time_s / b.estimate.step_time_s - 1) < 0.005
    )


def _check_inputs(base, path: str, objective: str, top: int) -> None:
    if objective not in OBJECTIVES:
        raise ScenarioError(
            f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}", "--objective"
        )
    if top < 1:
        raise ScenarioError(f"--top must be at least 1, got {top}", "--top")
    if base.model.kind != "transformer":
        raise ScenarioError(
            f"plan searches transformer layouts; {path} has a {base.model.kind} model", "model"
        )
    if objective == "time-to-train" and not (base.training.tokens or base.training.train_steps):
        raise ScenarioError(
            "time-to-train needs training.tokens or training.train_steps; "
            "add e.g. --set training.tokens=300e9",
            "--objective",
        )


def choose(
    screened: list[Screened], estimators: dict[int, Estimator], top: int, resolve
) -> tuple[list[tuple[Screened, dict]], dict]:
    """Walk the estimate ranking: exact memory, then ``resolve`` (the scenario's own validation, returning
    the resolved mapping or raising ScenarioError), until ``top`` candidates pass."""
    chosen: list[tuple[Screened, dict]] = []
    counts = {"exact_checks": 0, "exact_no_fit": 0, "invalid": 0, "twins": 0}
    for s in screened:
        if len(chosen) >= top or counts["exact_checks"] >= MAX_EXACT_CHECKS:
            break
        if any(_twin(s, other) for other, _ in chosen):
            counts["twins"] += 1
            continue
        counts["exact_checks"] += 1
        if not check_memory(s, estimators[s.gpus]):
            counts["exact_no_fit"] += 1
            continue
        try:
            chosen.append((s, resolve(s)))
        except ScenarioError:
            counts["invalid"] += 1
    return chosen, counts


def _row(
    res: dict, data: dict, s: Screened | None, given: bool, label: str, est_step: float | None, objective: str
) -> dict:
    """A simulated candidate's row: its settings, estimate, simulated figures and score."""
    row = {
        "candidate": label,
        "given": given,
        "status": res["status"],
        "reason": res.get("reason", ""),
        "est_step_time_s": est_step,
        "scenario": data,
        "_screened": s,
        **setting_row(data),
    }
    if "summary" in res:
        row.update(summary_row(res["summary"]))
        row["time_to_train_s"] = res["summary"].get("time_to_train_s")
        row["sim_wall_s"] = res.get("wall_s")
    row["score"] = summary_score(objective, res["summary"]) if res["status"] == OK else math.inf
    return row


def plan(
    path: str,
    overrides: list[str] | None = None,
    *,
    gpus: list[int] | None = None,
    objective: str = "throughput",
    top: int = 3,
    workers: int | None = None,
    executor: str = "local",
    address: str | None = None,
    progress: bool = True,
    max_micro_batch: int = 8,
) -> PlanResult:
    """Search, screen, verify and simulate; the result carries the ranking and the winner's explanation."""
    from sim.explore.explain import explain
    from sim.scenario.load import load_scenario, read_scenario_file, scenario_from_dict

    t0 = time.perf_counter()
    overrides = list(overrides or [])
    base = load_scenario(path, overrides)
    _check_inputs(base, path, objective, top)
    gpu_counts = sorted(set(gpus)) if gpus else [base.total_gpus]
    base_data = read_scenario_file(path)
    base_dir = Path(path).expanduser().resolve().parent

    def resolve(s: Screened) -> dict:
        data = _candidate_data(base_data, overrides, s, base.cluster.gpus_per_node)
        return scenario_from_dict(data, base_dir=base_dir).resolved()

    screened, estimators, stats = screen(base, gpu_counts, objective, max_micro_batch)
    t_screen = time.perf_counter() - t0
    chosen, counts = choose(screened, estimators, top, resolve)
    t_verify = time.perf_counter() - t0 - t_screen

    given_cand = candidate_of(base)
    mine = base.total_gpus
    jobs = [(resolved, None) for _, resolved in chosen]
    given_in_top = any(s.candidate == given_cand and s.gpus == mine for s, _ in chosen)
    if mine in gpu_counts and not given_in_top:
        jobs.append((base.resolved(), None))  # the user's own configuration, to compare against
    t1 = time.perf_counter()
    results = run_jobs(
        jobs, workers=workers, executor=executor, address=address, progress=progress, desc="plan"
    )
    t_sim = time.perf_counter() - t1

    rows = []
    for i, res in enumerate(results):
        if i < len(chosen):
            s = chosen[i][0]
            is_given = s.candidate == given_cand and s.gpus == mine
            rows.append(
                _row(res, jobs[i][0], s, is_given, s.candidate.label(), s.estimate.step_time_s, objective)
            )
        else:
            label = given_cand.label() if given_cand else "given configuration"
            est = estimators[mine].estimate(given_cand).step_time_s if given_cand else None
            rows.append(_row(res, jobs[i][0], None, True, label, est, objective))
    rows.sort(key=lambda r: (r["score"], not r["given"]))
    for k, r in enumerate(rows, 1):
        r["rank"] = k
    stats.update(counts)
    stats.update(
        {
            "screened": len(screened),
            "simulated": len(jobs),
            "screen_s": t_screen,
            "verify_s": t_verify,
            "simulate_s": t_sim,
        }
    )
    result = PlanResult(base.name, objective, gpu_counts, base, rows, screened, stats, estimators=estimators)
    ok_rows = [r for r in rows if r["status"] == OK]
    result.winner = ok_rows[0] if ok_rows else None
    result.given = next((r for r in rows if r["given"]), None)
    if result.winner is not None:
        result.winner_scenario = result.winner["scenario"]
        result.explanation = explain(result)
    stats["total_s"] = time.perf_counter() - t0
    return result


# ---- output -----------------------------------------------------------------------------------------
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
        f"{st['exact_no_fit']:,} do not fit, {st['invalid']} invalid, {st['twins']} ZeRO-only twins skipped",
        f"  simulated {_simulated_text(result)} in {st['simulate_s']:.1f} s with "
        f"{workers or default_workers()} workers",
    ]
    return "\n".join(lines)


def plan_text(result: PlanResult, workers: int | None = None) -> str:
    """What ``dtsim plan`` prints: the heading, the ranked table, the search statistics, the explanation."""
    sc = result.base
    counts = ", ".join(map(str, result.gpu_counts))
    lines = [
        f"plan for {result.name}: {sc.model.name or 'transformer'} on {counts} × {sc.gpu.name}, "
        f"global batch {sc.training.global_batch}, objective {result.objective}",
        plan_table(result),
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
    "zero",
    "micro_batch",
    "checkpointing",
    "sequence_parallel",
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
]


def _screened_row(s: Screened) -> dict:
    c, e = s.candidate, s.estimate
    return {
        "candidate": c.label(),
        "num_gpus": s.gpus,
        "data": c.data,
        "tensor": c.tensor,
        "pipeline": c.pipeline,
        "schedule": c.schedule,
        "virtual_stages": c.virtual_stages,
        "zero": c.zero,
        "micro_batch": c.micro_batch,
        "checkpointing": c.checkpointing,
        "sequence_parallel": c.sequence_parallel,
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
    from sim.scenario.load import dump_resolved, scenario_from_dict

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
        data["description"] = f"dtsim plan winner ({result.objective}): {result.winner['candidate']}"
        atomic_write_text(out_dir / "best.yaml", dump_resolved(scenario_from_dict(data)))
        files.append(out_dir / "best.yaml")
    return files
