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
from sim.explore.runner import NO_FIT, OK, run_jobs
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
    rows: list[dict]  # simulated, ranked best first (the given config marked rank "given" if not in top)
    screened: list[Screened]
    stats: dict = field(default_factory=dict)
    explanation: list[str] = field(default_factory=list)
    winner: dict | None = None
    given: dict | None = None
    winner_scenario: dict | None = None


# ---- search space -----------------------------------------------------------------------------------
def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _tensor_rule(model, t: int) -> str | None:
    for name in ("heads", "kv_heads", "ffn_hidden"):
        if getattr(model, name) % t:
            return f"{name} % tensor"
    return None


def enumerate_candidates(scenario, gpus: int, max_micro_batch: int = 8,
                         schedules: tuple[str, ...] = SCHEDULES) -> tuple[list[Candidate], dict[str, int]]:
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
    return Candidate(par.data, par.tensor, par.pipeline, tr.micro_batch, par.schedule, par.virtual_stages,
                     par.zero, tr.checkpointing.kind, par.sequence_parallel and par.tensor > 1)


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
        raise ScenarioError(f"{gpus} GPUs is not a whole number of {per}-GPU nodes; use a multiple of {per}",
                            "--gpus")
    cluster = base.cluster.model_copy(update={"nodes": gpus // per})
    return base.model_copy(update={"cluster": cluster})


def screen(base, gpu_counts: list[int], objective: str, max_micro_batch: int = 8
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
    return data


def _twin(a: Screened, b: Screened) -> bool:
    """Candidates differing only in ZeRO stage with estimates within 0.5%: simulating both teaches little."""
    return (a.gpus == b.gpus and replace(a.candidate, zero=0) == replace(b.candidate, zero=0)
            and abs(a.estimate.step_time_s / b.estimate.step_time_s - 1) < 0.005)


def plan(path: str, overrides: list[str] | None = None, *, gpus: list[int] | None = None,
         objective: str = "throughput", top: int = 3, workers: int | None = None, executor: str = "local",
         address: str | None = None, progress: bool = True, max_micro_batch: int = 8) -> PlanResult:
    """Search, screen, verify and simulate; the result carries the ranking and the winner's explanation."""
    from sim.scenario.load import load_scenario, read_scenario_file, scenario_from_dict

    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise ScenarioError(f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)}", "--objective")
    if top < 1:
        raise ScenarioError(f"--top must be at least 1, got {top}", "--top")
    overrides = list(overrides or [])
    base = load_scenario(path, overrides)
    if base.model.kind != "transformer":
        raise ScenarioError(f"plan searches transformer layouts; {path} has a {base.model.kind} model", "model")
    if objective == "time-to-train" and not (base.training.tokens or base.training.train_steps):
        raise ScenarioError("time-to-train needs training.tokens or training.train_steps; add e.g. "
                            "--set training.tokens=300e9", "--objective")
    gpu_counts = sorted(set(gpus)) if gpus else [base.total_gpus]
    base_data = read_scenario_file(path)
    base_dir = Path(path).expanduser().resolve().parent
    per_node = base.cluster.gpus_per_node

    screened, estimators, stats = screen(base, gpu_counts, objective, max_micro_batch)
    t_screen = time.perf_counter() - t0

    # Walk the ranking: exact memory, then the scenario's own rules, until `top` candidates pass.
    chosen: list[tuple[Screened, dict]] = []
    checks = no_fit = invalid = twins = 0
    for s in screened:
        if len(chosen) >= top or checks >= MAX_EXACT_CHECKS:
            break
        if any(_twin(s, other) for other, _ in chosen):
            twins += 1  # same layout, only the ZeRO stage differs and the estimate does not tell them apart
            continue
        checks += 1
        if not check_memory(s, estimators[s.gpus]):
            no_fit += 1
            continue
        try:
            data = _candidate_data(base_data, overrides, s, per_node)
            resolved = scenario_from_dict(data, base_dir=base_dir).resolved()
        except ScenarioError:
            invalid += 1
            continue
        chosen.append((s, resolved))
    t_verify = time.perf_counter() - t0 - t_screen

    given_cand = candidate_of(base)
    given_in_top = any(s.candidate == given_cand and s.gpus == base.total_gpus for s, _ in chosen)
    jobs = [(resolved, None) for _, resolved in chosen]
    if base.total_gpus in gpu_counts and not given_in_top:
        jobs.append((base.resolved(), None))
    t1 = time.perf_counter()
    results = run_jobs(jobs, workers=workers, executor=executor, address=address, progress=progress, desc="plan")
    t_sim = time.perf_counter() - t1

    rows: list[dict] = []
    for i, res in enumerate(results):
        is_given = i >= len(chosen)
        s = chosen[i][0] if not is_given else None
        data = jobs[i][0]
        label = s.candidate.label() if s else (given_cand.label() if given_cand else "given configuration")
        row = {"candidate": label, "given": is_given or (
            s.candidate == given_cand and s.gpus == base.total_gpus), "status": res["status"],
            "reason": res.get("reason", ""), "est_step_time_s": s.estimate.step_time_s if s else None,
            "est_score": s.score if s else None, "scenario": data, **setting_row(data)}
        if s is None and given_cand is not None:
            gest = estimators[base.total_gpus].estimate(given_cand)
            row["est_step_time_s"] = gest.step_time_s
        if "summary" in res:
            row.update(summary_row(res["summary"]))
            row["time_to_train_s"] = res["summary"].get("time_to_train_s")
            row["sim_wall_s"] = res.get("wall_s")
            row["score"] = summary_score(objective, res["summary"]) if res["status"] == OK else math.inf
        else:
            row["score"] = math.inf
        row["_screened"] = s
        rows.append(row)
    rows.sort(key=lambda r: (r["score"], not r["given"]))
    for k, r in enumerate(rows, 1):
        r["rank"] = k
    stats.update({
        "screened": len(screened), "twins": twins, "exact_checks": checks, "exact_no_fit": no_fit, "invalid": invalid,
        "simulated": len(jobs), "screen_s": t_screen, "verify_s": t_verify, "simulate_s": t_sim,
        "total_s": time.perf_counter() - t0,
    })
    result = PlanResult(base.name, objective, gpu_counts, base, rows, screened, stats)
    ok_rows = [r for r in rows if r["status"] == OK]
    result.winner = ok_rows[0] if ok_rows else None
    result.given = next((r for r in rows if r["given"]), None)
    if result.winner is not None:
        result.winner_scenario = result.winner["scenario"]
        result.explanation = explain(result, estimators)
    stats["total_s"] = time.perf_counter() - t0
    return result


# ---- explanation ----------------------------------------------------------------------------------
def _best_other(result: PlanResult, estimators: dict[int, Estimator], win: Screened, attr: str,
                keep: tuple[str, ...] = (), limit: int = 400) -> Screened | None:
    """The best-estimated candidate (same GPU count, same ``keep`` attributes) that differs from the winner
    in ``attr`` and fits."""
    mine = getattr(win.candidate, attr)
    tried = 0
    for s in result.screened:
        if s.gpus != win.gpus or getattr(s.candidate, attr) == mine:
            continue
        if any(getattr(s.candidate, k) != getattr(win.candidate, k) for k in keep):
            continue
        tried += 1
        if tried > limit:
            return None
        if check_memory(s, estimators[s.gpus]):
            return s
    return None


def _slower(win: Screened, other: Screened | None, attr: str, name: str | None = None) -> str:
    """" (best with tensor 4: <label>, est. +12% step time)", or "" when nothing else fits."""
    if other is None:
        return ""
    pct = (other.estimate.step_time_s / win.estimate.step_time_s - 1) * 100
    return (f" (best with {name or attr} {getattr(other.candidate, attr)}: {other.candidate.label()}, "
            f"est. {pct:+.0f}% step time)")


def _winner_screened(result: PlanResult, estimators: dict[int, Estimator]) -> Screened:
    w = result.winner
    s = w.get("_screened")
    if s is not None:
        return s
    c = candidate_of(result.base)
    e = estimators[result.base.total_gpus].estimate(c)
    s = Screened(c, result.base.total_gpus, e, score_of(result.objective, result.base, result.base.total_gpus,
                                                        e.step_time_s))
    check_memory(s, estimators[s.gpus])
    return s


def explain(result: PlanResult, estimators: dict[int, Estimator]) -> list[str]:
    """Why the winner's degrees and settings, in the seeds' terms, with the numbers behind each choice."""
    w = result.winner
    win = _winner_screened(result, estimators)
    c, est = win.candidate, estimators[win.gpus]
    sc = est.scenario
    cl, gpu, m = sc.cluster, sc.gpu, sc.model
    cap = gpu.memory_bytes
    e = win.estimate
    gb = 1e9
    m_count = sc.training.global_batch // (c.data * c.micro_batch)
    lines = []
    lines.append(f"layout: data {c.data} × tensor {c.tensor} × pipeline {c.pipeline} on {win.gpus} {gpu.name} "
                 f"({cl.gpus_per_node} per node); global batch {sc.training.global_batch} = data {c.data} × "
                 f"micro-batch {c.micro_batch} × {_n(m_count, 'micro-batch')}")
    # tensor
    per_layer_ar = 2 if not c.sequence_parallel else 4
    msg_mb = c.micro_batch * m.seq_len * m.hidden * 2 / 1e6
    if c.tensor > 1:
        why = (f"TP {c.tensor}: splits every layer's weights and GEMMs {c.tensor} ways and keeps the "
               f"{per_layer_ar} tensor {'all-reduces' if not c.sequence_parallel else 'all-gathers/reduce-scatters'}"
               f" per layer ({msg_mb:.0f} MB each, forward and again in backward) on {cl.intra_node.name} inside a node "
               f"({cl.intra_node.bandwidth_Bps / gb:.0f} GB/s, vs {cl.inter_node.bandwidth_Bps / gb:.0f} GB/s per "
               f"{cl.inter_node.name} NIC); est. {e.tp_comm_s:.2f} s of TP communication per step")
    else:
        why = "TP 1: no tensor-parallel collectives on the critical path; the model states fit without splitting layers"
    lines.append(why + _slower(win, _best_other(result, estimators, win, "tensor"), "tensor"))
    # pipeline
    states_total = est.model_state_bytes()
    replica = c.tensor * c.pipeline
    need = math.ceil(states_total / cap)
    why = (f"PP {c.pipeline}: the model's {states_total / gb:,.0f} GB of weights, gradients and "
           f"{sc.training.optimizer} states ({_params(est) / 1e9:.1f} B parameters) need ≥ {_n(need, 'GPU')} of "
           f"{cap / gb:.0f} GB without ZeRO; a replica of tensor × pipeline = {_n(replica, 'GPU')} holds "
           f"{e.states_bytes / gb:.1f} GB of states per GPU"
           + (f" (ZeRO-{c.zero} shards them over the {c.data} replicas)" if c.zero else "")
           + ("; no pipeline, so no bubble" if c.pipeline == 1 else ""))
    if c.pipeline > 1:
        why += (f"; bubble (p−1)/(v·m+p−1) = ({c.pipeline}−1)/({c.virtual_stages}·{m_count}+{c.pipeline}−1) = "
                f"{e.bubble_fraction:.1%}")
    lines.append(why + _slower(win, _best_other(result, estimators, win, "pipeline"), "pipeline"))
    # data
    dp_span = est._span_nodes(c.tensor, c.data)
    link = cl.intra_node.name if dp_span <= 1 else cl.inter_node.name
    if c.data > 1:
        why = (f"DP {c.data} gets the remaining GPUs for throughput: {c.data} replicas each run "
               f"{_n(m_count, 'micro-batch')} per step; the gradient sync ({_grad_op(c.zero)} over {link}) takes "
               f"est. {e.dp_comm_s:.2f} s, {e.dp_exposed_s:.2f} s of it exposed after overlapping the last backward")
    else:
        why = "DP 1: every GPU is needed inside one replica (tensor × pipeline)"
    lines.append(why)
    # micro-batch and schedule
    lines.append(f"micro-batch {c.micro_batch}: {_n(m_count, 'micro-batch')} per replica per step; larger ones use the "
                 f"GEMMs better but leave fewer micro-batches to fill the pipeline"
                 + _slower(win, _best_other(result, estimators, win, "micro_batch"), "micro_batch", "micro-batch"))
    if c.pipeline > 1:
        if c.schedule == "interleaved-1f1b":
            why = (f"schedule interleaved-1f1b with {c.virtual_stages} chunks per GPU: cuts the bubble to "
                   f"(p−1)/(v·m+p−1) = {e.bubble_fraction:.1%} from {(c.pipeline - 1) / (m_count + c.pipeline - 1):.1%}"
                   f" at the cost of {c.virtual_stages}× more pipeline sends")
        elif c.schedule == "1f1b":
            why = (f"schedule 1f1b: the same bubble as GPipe ({e.bubble_fraction:.1%}) but at most p = {c.pipeline} "
                   f"micro-batches of activations in flight instead of all {m_count}")
        else:
            why = f"schedule gpipe: all {m_count} micro-batches' activations fit, bubble {e.bubble_fraction:.1%}"
        lines.append(why + _slower(win, _best_other(result, estimators, win, "schedule", keep=("data", "tensor", "pipeline")), "schedule"))
    # checkpointing, ZeRO, SP: exact memory of the winner with that one setting changed
    peak = (win.memory or est.exact_memory(c))["peak"]
    lines.append(_memory_choice(est, c, "checkpointing", CHECKPOINTING, peak, cap, {
        "none": "keeps every activation (no recomputation)",
        "selective": "recomputes only the attention core in backward (cheap), keeping the rest",
        "full": "keeps only each layer's input and recomputes the whole forward in backward (+1 forward)",
    }))
    if c.data > 1:
        lines.append(_memory_choice(est, c, "zero", (0, 1, 2, 3), peak, cap, {
            0: "plain DDP: no extra collectives", 1: "shards the optimizer states over the replicas",
            2: "shards optimizer states and gradients", 3: "shards everything, gathering weights per layer"},
            name="ZeRO"))
    if c.tensor > 1:
        lines.append(_memory_choice(est, c, "sequence_parallel", (False, True), peak, cap, {
            False: "off", True: "splits the norm and dropout activations over the TP ranks"},
            name="sequence parallelism"))
    lines.append(f"precision {sc.training.precision}: kept as given (the planner does not change numerics)")
    given = result.given
    if given and given.get("tokens_per_s") and w.get("tokens_per_s"):
        gain = w["tokens_per_s"] / given["tokens_per_s"] - 1
        same = " (the given configuration is already the best found)" if w is given else ""
        lines.append(f"vs the given configuration: {w['tokens_per_s']:,.0f} vs {given['tokens_per_s']:,.0f} "
                     f"tokens/s simulated ({gain:+.1%}){same}")
    return lines


def _n(count: int, noun: str) -> str:
    """ "1 GPU", "8 GPUs"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}es" if noun.endswith("h") else f"{count} {noun}s"


def _params(est: Estimator) -> float:
    from sim.workload import transformer as tf

    return float(tf.model_params(est.dims))


def _grad_op(zero: int) -> str:
    return {0: "ring all-reduce", 1: "reduce-scatter + all-gather", 2: "reduce-scatter + all-gather"}.get(
        zero, "per-layer gathers and reduce-scatters")


def _memory_choice(est: Estimator, c: Candidate, attr: str, options, peak: float, cap: float,
                   what: dict, name: str | None = None) -> str:
    """"<setting> X: what it does; peak P GB; with Y: Q GB (does not fit / est. +z% step)"."""
    name = name or attr
    mine = getattr(c, attr)
    shown = {True: "on", False: "off"}.get(mine, mine) if isinstance(mine, bool) else mine
    parts = [f"{name} {shown}: {what[mine]}; peak {peak / 1e9:.1f} GB of {cap / 1e9:.0f} GB"]
    base_t = est.estimate(c).step_time_s
    for opt in options:
        if opt == mine:
            continue
        alt = replace(c, **{attr: opt})
        mem = est.exact_memory(alt)["peak"]
        label = {True: "on", False: "off"}.get(opt, opt) if isinstance(opt, bool) else opt
        if mem > cap:
            parts.append(f"{label} would need {mem / 1e9:.1f} GB (does not fit)")
        else:
            pct = (est.estimate(alt).step_time_s / base_t - 1) * 100
            parts.append(f"{label}: {mem / 1e9:.1f} GB, est. {pct:+.1f}% step time")
    return parts[0] + "; " + "; ".join(parts[1:]) if len(parts) > 1 else parts[0]


# ---- output -----------------------------------------------------------------------------------------
def plan_table(result: PlanResult) -> str:
    header = ["rank", "configuration", "GPUs", "est step", "sim step", "tokens/s", "MFU", "bubble", "peak GB",
              "$/1M tok", "days", "status"]
    body = []
    for r in result.rows:
        def f(key: str, fmt: str, r=r) -> str:
            return format(r[key], fmt) if r.get(key) is not None else "—"

        name = r["candidate"] + (" [given]" if r["given"] else "")
        body.append([str(r["rank"]), name, f("num_gpus", "d"), f("est_step_time_s", ".3f"), f("step_time_s", ".3f"),
                     f("tokens_per_s", ",.0f"), f("mfu", ".1%"), f("bubble_fraction", ".1%"),
                     f("peak_memory_GB", ".1f"), f("cost_per_1M_tokens_usd", ".3f"), f("time_to_train_days", ".2f"),
                     r["status"] if r["status"] != NO_FIT else "no-fit"])
    return text_table(header, body, right={0, 2, 3, 4, 5, 6, 7, 8, 9, 10})


def stats_text(result: PlanResult, workers: int | None) -> str:
    st = result.stats
    pruned = sum(st["pruned"].values())
    rules = ", ".join(f"{v:,} {k}" for k, v in sorted(st["pruned"].items(), key=lambda kv: -kv[1]))
    return (f"considered {st['considered']:,} candidates on {', '.join(map(str, result.gpu_counts))} GPUs: "
            f"{pruned:,} broke a divisibility rule ({rules}); {st['states_too_big']:,} cannot hold their model "
            f"states; {st['screened']:,} screened by closed forms in {st['screen_s']:.2f} s; exact memory checked "
            f"for {st['exact_checks']:,} in order ({st['exact_no_fit']:,} do not fit, {st['invalid']} invalid) in "
            f"{st['verify_s']:.2f} s; simulated {st['simulated']} in {st['simulate_s']:.1f} s "
            f"({workers or 'default'} workers); total {st['total_s']:.1f} s")


PLAN_COLUMNS = [
    "rank", "simulated", "given", "candidate", "status", "reason", "num_gpus", "data", "tensor", "pipeline",
    "schedule", "virtual_stages", "zero", "micro_batch", "checkpointing", "sequence_parallel", "est_step_time_s",
    "est_bubble_fraction", "est_tp_comm_s", "est_dp_exposed_s", "est_states_GB", "exact_peak_GB", "step_time_s",
    "tokens_per_s", "mfu", "bubble_fraction", "exposed_comm_s", "peak_memory_GB", "fits_in_memory",
    "cost_per_step_usd", "cost_per_1M_tokens_usd", "time_to_train_days",
]


def _screened_row(s: Screened) -> dict:
    c, e = s.candidate, s.estimate
    return {
        "candidate": c.label(), "num_gpus": s.gpus, "data": c.data, "tensor": c.tensor, "pipeline": c.pipeline,
        "schedule": c.schedule, "virtual_stages": c.virtual_stages, "zero": c.zero, "micro_batch": c.micro_batch,
        "checkpointing": c.checkpointing, "sequence_parallel": c.sequence_parallel,
        "est_step_time_s": e.step_time_s, "est_bubble_fraction": e.bubble_fraction, "est_tp_comm_s": e.tp_comm_s,
        "est_dp_exposed_s": e.dp_exposed_s, "est_states_GB": e.states_bytes / 1e9,
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
        row = {**(_screened_row(s) if s else {}), **{k: v for k, v in r.items() if not k.startswith("_")},
               "simulated": True}
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
