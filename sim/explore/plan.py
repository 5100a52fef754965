"""``dtsim plan BASE.yaml``: search parallel layouts for a transformer on a cluster, then simulate the best.

The search space and objective are ``sim.explore.search``; printing and files ``sim.explore.plan_output``.

Three filters, cheapest first: divisibility rules; model states (ZeRO formulas) larger than the GPU;
then, in order of the closed-form estimate (``sim.explore.estimate``), the exact per-stage memory from
``sim.build`` and the scenario's own validation, until ``--top`` candidates pass (and on while the
estimates lie within the screen's error of the best, ``SCREEN_ERROR``). Those, and the given
configuration, are simulated in worker processes and ranked by the objective.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from sim.errors import ScenarioError
from sim.explore.estimate import Estimator
from sim.explore.explain import explain
from sim.explore.runner import OK, run_jobs
from sim.explore.search import (
    OBJECTIVES,
    PlanResult,
    Screened,
    candidate_of,
    check_memory,
    enumerate_candidates,
    score_of,
    summary_score,
)
from sim.explore.table import setting_row, summary_row
from sim.parallel.layout import stage_layers_for
from sim.scenario.load import apply_overrides, load_scenario, read_scenario_file, scenario_from_dict

MAX_EXACT_CHECKS = 20_000  # memory checks while walking the ranked list (about a millisecond each)


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
    stats: dict[str, Any] = {"considered": 0, "pruned": {}, "states_too_big": 0}
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


def _candidate_data(base_data: dict, overrides: list[str], s: Screened, per_node: int) -> dict:
    sets = [*overrides, f"cluster.nodes={s.gpus // per_node}", *s.candidate.overrides()]
    data, _ = apply_overrides(base_data, sets)
    par = data.get("parallel")
    if isinstance(par, dict) and par.get("stage_layers") is not None:  # uneven stages fit one depth only
        par["stage_layers"] = stage_layers_for(par["stage_layers"], s.candidate.pipeline,
                                               s.candidate.virtual_stages)
    return data


def _twin(a: Screened, b: Screened) -> bool:
    """Candidates differing only in ZeRO stage, rank order or in keeping vs recomputing the attention core
    (checkpointing none / selective), with estimates within 0.5%: simulating both teaches little (a 175B simulation costs
    minutes on two cores), so the simulated slots go to different layouts. A selective candidate ``a`` is also
    the twin of the same candidate ``b`` without recomputation once ``b`` is chosen (it fits): it does the
    same work plus the recomputed attention core, so it cannot be faster whatever the estimates say (the
    other way round the one without recomputation may well be faster, and is simulated)."""
    def core(s: Screened):
        ck = "none" if s.candidate.checkpointing == "selective" else s.candidate.checkpointing
        return replace(s.candidate, zero=0, checkpointing=ck, order="tp-dp-pp")

    if a.gpus != b.gpus or core(a) != core(b):
        return False
    # ``a`` is the candidate considered, ``b`` one already chosen: only the recomputing one is dominated
    dominated = (a.candidate.zero == b.candidate.zero and a.candidate.checkpointing == "selective"
                 and b.candidate.checkpointing == "none")
    return dominated or abs(a.estimate.step_time_s / b.estimate.step_time_s - 1) < 0.005


# Candidates simulated by default.
DEFAULT_TOP = 3
# The screen's estimates of the leading layouts err by −1.8 … +1.6 % against their simulations (GPT-3 175B
# on 1,024 A100, `--top 10`), about as much as such layouts lie apart, so it cannot order candidates that
# close: once the top ones are simulated, every fitting candidate whose estimate lies within this share of
# the best simulated score (so that it might still beat it) is simulated too, up to --top more.
SCREEN_ERROR = 0.015


def _check_inputs(base, path: str, objective: str, top: int) -> None:
    if objective not in OBJECTIVES:
        raise ScenarioError(
            f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}", "--objective"
        )
    if top < 1:
        raise ScenarioError(f"--top must be at least 1, got {top}", "--top")
    if base.model.kind != "transformer":
        raise ScenarioError(
            f"plan searches transformer layouts; {path} has a {base.model.kind} model — give a scenario with a "
            "transformer model (e.g. model: gpt3-1.3b, as scenarios/gpt3-1.3b-16xa100.yaml)", "model"
        )
    if objective == "time-to-train" and not (base.training.tokens or base.training.train_steps):
        raise ScenarioError(
            "time-to-train needs training.tokens or training.train_steps; "
            "add e.g. --set training.tokens=300e9",
            "--objective",
        )


def choose(
    screened: list[Screened], estimators: dict[int, Estimator], top: int, resolve,
    beat: float | None = None, taken: list[tuple[Screened, dict]] | None = None,
    counts: dict | None = None, seen: set[int] | None = None,
) -> tuple[list[tuple[Screened, dict]], dict]:
    """Walk the estimate ranking: exact memory, then ``resolve`` (the scenario's own validation, returning
    the resolved mapping or raising ScenarioError), until ``top`` candidates pass. With ``beat`` (the best
    simulated score so far) the walk goes on past ``taken`` (those already chosen, which it skips) and
    picks only candidates whose estimate lies within ``SCREEN_ERROR`` of that score: those the screen cannot
    tell from the best simulated one, up to ``top`` more. ``seen`` collects the ids of the candidates
    examined, which a later walk skips."""
    taken = taken or []
    chosen: list[tuple[Screened, dict]] = []
    counts = counts if counts is not None else {"exact_checks": 0, "exact_no_fit": 0, "invalid": 0, "twins": 0}
    seen = seen if seen is not None else set()
    for s in screened:
        if counts["exact_checks"] >= MAX_EXACT_CHECKS or len(chosen) >= top:
            break
        if id(s) in seen:
            continue
        if beat is not None and s.score - beat > SCREEN_ERROR * abs(beat):
            break  # ranked by estimate: none further on could beat it either
        seen.add(id(s))
        if any(_twin(s, other) for other, _ in [*taken, *chosen]):
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
        "order": (data.get("parallel") or {}).get("order"),
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
    top: int = DEFAULT_TOP,
    workers: int | None = None,
    executor: str = "local",
    address: str | None = None,
    progress: bool = True,
    max_micro_batch: int = 8,
) -> PlanResult:
    """Search, screen, verify and simulate; the result carries the ranking and the winner's explanation."""
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
    seen: set[int] = set()
    chosen, counts = choose(screened, estimators, top, resolve, seen=seen)
    t_verify = time.perf_counter() - t0 - t_screen

    given_cand = candidate_of(base)
    mine = base.total_gpus
    jobs = [(resolved, None) for _, resolved in chosen]

    def is_given(s: Screened) -> bool:
        return s.candidate == given_cand and s.gpus == mine

    given_apart = mine in gpu_counts and not any(is_given(s) for s, _ in chosen)
    if given_apart:
        jobs.append((base.resolved(), None))  # the user's own configuration, to compare against
    t1 = time.perf_counter()
    results = run_jobs(
        jobs, workers=workers, executor=executor, address=address, progress=progress, desc="plan"
    )

    def rows_of(picked: list[tuple[Screened, dict]], done: list[dict], start: int) -> list[dict]:
        out = []
        for i, res in enumerate(done):
            if i < len(picked):
                s = picked[i][0]
                out.append(_row(res, jobs[start + i][0], s, is_given(s), s.candidate.label(), s.estimate.step_time_s,
                                objective))
            else:
                label = given_cand.label() if given_cand else "given configuration"
                est = estimators[mine].estimate(given_cand).step_time_s if given_cand else None
                out.append(_row(res, jobs[start + i][0], None, True, label, est, objective))
        return out

    rows = rows_of(chosen, results, 0)
    # Then the candidates the screen cannot tell from the best simulated one (branch and bound: an estimate
    # more than the screen's error behind it cannot win).
    best = min((r["score"] for r in rows), default=math.inf)
    if math.isfinite(best):
        more, _ = choose(screened, estimators, top, resolve, beat=best, taken=chosen, counts=counts, seen=seen)
        if given_apart:  # already simulated as the user's own configuration: not twice
            more = [(s, resolved) for s, resolved in more if not is_given(s)]
        if more:
            start = len(jobs)
            jobs += [(resolved, None) for _, resolved in more]
            rows += rows_of(more, run_jobs(jobs[start:], workers=workers, executor=executor, address=address,
                                           progress=progress, desc="plan"), start)
    t_sim = time.perf_counter() - t1
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


