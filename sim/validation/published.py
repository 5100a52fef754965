"""`dtsim validate --published`: simulate every published training run of the set and compare.

The set (``published.yaml`` beside this module, or ``--cases FILE``) holds public end-to-end
measurements, each with its scenario, figure, unit, FLOP formula and source. For each case this runs the
scenario through the simulator and sets the simulated iteration time beside the published one; TFLOP/s
on both sides come from the *source's* FLOP formula (``sim.validation.flops``), never from dtsim's own
MFU, so a paper that counts recomputation is compared with the same count. It is a report: the exit
status is 0 whatever the errors, 2 for bad input (unknown case, bad data file, missing scenario).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim.errors import ScenarioError
from sim.scenario.schema import NAME_PATTERN, RuleError, TransformerModel, did_you_mean, show
from sim.validation.flops import FLOP_FORMULAS

PROG = "dtsim validate --published"
DEFAULT_CASES = Path(__file__).with_name("published.yaml")
REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_CASES_BYTES = 16 << 20  # the shipped set is ~40 kB; a file far larger is not a case set


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class Published(_Strict):
    """The figures a source states; at least one of iteration_s, tokens_per_s_per_gpu, tflops_per_gpu, mfu."""

    iteration_s: float | None = Field(None, gt=0, description="seconds per iteration, as published")
    tokens_per_s_per_gpu: float | None = Field(None, gt=0, description="tokens/s per GPU, as published")
    tflops_per_gpu: float | None = Field(
        None, gt=0, description="TFLOP/s per GPU under the source's FLOP formula"
    )
    mfu: float | None = Field(
        None, gt=0, le=1, description="model FLOPs utilisation, as published: the source formula's FLOPs over "
        "the GPU's dense 16-bit peak (bf16, else fp16), as PaLM, Llama 3 and llm-foundry define it")

    @model_validator(mode="after")
    def _some_time(self) -> Published:
        if all(x is None for x in (self.iteration_s, self.tokens_per_s_per_gpu, self.tflops_per_gpu, self.mfu)):
            raise RuleError(None, "(none)", "a case needs a figure that gives a time",
                            "give iteration_s, tokens_per_s_per_gpu, tflops_per_gpu or mfu")
        return self


class Source(_Strict):
    """Where the figure is published, precisely enough to find it."""

    title: str = Field(min_length=1)
    authors: str = Field(min_length=1)
    venue: str = Field(min_length=1)
    where: str = Field(min_length=1, description="section, table or figure")
    url: str = Field(pattern=r"^https?://")
    label: str | None = Field(None, min_length=1, max_length=40,
                              description="short name the table's per-source lines use (default: the title)")


class Case(_Strict):
    """One published run: scenario, figures, the source's FLOP formula, what the source ran."""

    name: str = Field(pattern=NAME_PATTERN, max_length=100)
    scenario: str = Field(min_length=1, description="scenario YAML, relative to the repository root")
    published: Published
    unit: str = Field(min_length=1, description="what the published figure measures")
    flop_formula: Literal[tuple(FLOP_FORMULAS)]  # type: ignore[valid-type]
    source: Source
    assumptions: list[str] = Field(default_factory=list, description="where the source is silent")



class CaseSet(_Strict):
    cases: list[Case] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> CaseSet:
        seen: set[str] = set()
        for c in self.cases:
            if c.name in seen:
                raise RuleError("cases", show(c.name), "case names must be unique", "rename one of them")
            seen.add(c.name)
        return self


@dataclass
class CaseResult:
    """One row of the table: published and simulated time and TFLOP/s per GPU, and the errors."""

    name: str
    gpus: int
    gpu: str
    flop_formula: str
    flops_per_iteration: float
    published_s: float
    published_from: str
    published_tflops_per_gpu: float
    simulated_s: float
    simulated_tflops_per_gpu: float
    time_error: float      # (simulated − published) / published
    tflops_error: float    # the same for TFLOP/s per GPU
    wall_s: float
    source: str
    source_label: str  # the source's short name: cases sharing one are summarised together
    # Where the simulated iteration goes, on the bottleneck GPU (the one with the most compute): its busy
    # compute, the communication it waits for, the mean idle share over GPUs, and its hardware FLOPs (dtsim's
    # own count with recomputation) over its busy compute. ``implied_compute_tflops_per_gpu`` is the rate
    # the published time leaves for that compute if everything else were as simulated: how fast the kernels
    # would have had to run to give the published time, not which part of the iteration the simulation
    # misses (None when the published time is shorter than what the simulation spends outside compute).
    simulated_compute_s: float = 0.0
    simulated_exposed_comm_s: float = 0.0
    simulated_idle_fraction: float = 0.0
    compute_tflops_per_gpu: float | None = None
    implied_compute_tflops_per_gpu: float | None = None


def load_cases(path: str | Path = DEFAULT_CASES) -> CaseSet:
    """The case set in ``path``, validated; a one-line ScenarioError naming --cases if it is wrong. The file
    is read as the scenario loader reads a scenario (``read_capped``: size-capped, an unreadable file one
    line) and decoded here, so a binary or non-UTF-8 file is one line too, not an internal error."""
    from sim.scenario.errors_format import one_line, to_scenario_error
    from sim.scenario.load import parse_yaml, read_capped

    name, p = show(str(path)), Path(path)
    if not p.is_file():  # a folder, a device, a pipe (never opened: it could hang), a broken link
        state = "is not a file" if p.exists() else "no such file"
        raise one_line(f"{name} — {state}; give the published-cases YAML (default {DEFAULT_CASES})", "--cases")
    raw = read_capped(p, MAX_CASES_BYTES, name, "--cases", kind="case set")  # what can still go wrong reading
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise one_line(f"{name} — not a text file (byte {exc.start} is not UTF-8), not YAML at all; give the "
                       f"published-cases YAML (default {DEFAULT_CASES})", "--cases") from None
    data = parse_yaml(text, name, "--cases")
    if not isinstance(data, dict) or "cases" not in data:
        what = "is empty" if data is None else "has no top-level cases: list"
        raise one_line(f"{show(str(path))} — {what}; a published-cases file is a mapping with a cases: list, like "
                       f"{DEFAULT_CASES}", "--cases")
    try:
        return CaseSet.model_validate(data)
    except ValidationError as exc:
        err = to_scenario_error(exc, CaseSet)
        raise ScenarioError(f"{show(str(path))}: {err}", "--cases") from None


def scenario_path(case: Case, cases_file: Path) -> Path:
    """A case's scenario: as written if absolute, else under the repository root, else beside the file."""
    p = Path(case.scenario)
    if p.is_absolute():
        return p
    for base in (REPO_ROOT, cases_file.resolve().parent, Path.cwd()):
        if (base / p).is_file():
            return base / p
    return REPO_ROOT / p


def published_time_s(case: Case, model: TransformerModel, global_batch: int, gpus: int,
                     peak_flops_per_s: float | None = None) -> tuple[float, str]:
    """The published seconds per iteration and what they come from (see published.yaml's header).
    ``peak_flops_per_s``: the GPU's dense 16-bit peak, needed only when MFU is the one figure given."""
    pub = case.published
    if pub.iteration_s is not None:
        return pub.iteration_s, "iteration time"
    if pub.tokens_per_s_per_gpu is not None:
        return global_batch * model.seq_len / (pub.tokens_per_s_per_gpu * gpus), "tokens/s"
    flops = FLOP_FORMULAS[case.flop_formula](model, global_batch)
    if pub.tflops_per_gpu is not None:
        return flops / (pub.tflops_per_gpu * 1e12 * gpus), "TFLOP/s"
    if peak_flops_per_s is None or peak_flops_per_s <= 0:
        raise ScenarioError(f"case {case.name}: published.mfu — MFU gives a time only against the GPU's bf16 or "
                            "fp16 peak, and this GPU states neither; give the GPU a bf16/fp16 peak_tflops or "
                            "publish another figure (iteration_s, tokens_per_s_per_gpu, tflops_per_gpu)")
    return flops / (pub.mfu * peak_flops_per_s * gpus), "MFU"  # type: ignore[operator]


def run_case(case: Case, cases_file: Path, overrides: list[str] | None = None) -> CaseResult:
    """Simulate one case and compare it with its published figures."""
    from sim.api import simulate
    from sim.scenario.load import load_scenario

    try:
        sc = load_scenario(scenario_path(case, cases_file), overrides or [])
    except ScenarioError as exc:
        raise ScenarioError(f"case {case.name}: {exc}") from None
    if not isinstance(sc.model, TransformerModel) or sc.parallel is None or sc.training is None:
        raise ScenarioError(f"case {case.name}: {show(case.scenario)} — a published case is a transformer "
                            "training run; give a scenario with model kind transformer and a parallel layout",
                            "scenario")
    gpus, batch = sc.total_gpus, sc.training.global_batch
    flops = FLOP_FORMULAS[case.flop_formula](sc.model, batch)
    pub_s, pub_from = published_time_s(case, sc.model, batch, gpus, sc.cluster.gpu.peak_16bit_flops())
    pub_tflops = case.published.tflops_per_gpu or flops / (pub_s * gpus) / 1e12
    t0 = time.perf_counter()
    summary = simulate(sc).summary
    wall = time.perf_counter() - t0
    sim_s = float(summary["step_time_s"])
    sim_tflops = flops / (sim_s * gpus) / 1e12
    compute_s = float(summary["compute_s"])
    hw = summary.get("hardware_tflops_per_gpu")
    hw_tflop = float(hw) * sim_s if hw is not None else None  # TFLOP per GPU per iteration (dtsim's count)
    implied_s = pub_s - (sim_s - compute_s)  # the published time less what the simulation spends outside compute
    return CaseResult(
        name=case.name, gpus=gpus, gpu=sc.cluster.gpu.name, flop_formula=case.flop_formula,
        flops_per_iteration=flops, published_s=pub_s, published_from=pub_from,
        published_tflops_per_gpu=pub_tflops, simulated_s=sim_s, simulated_tflops_per_gpu=sim_tflops,
        time_error=(sim_s - pub_s) / pub_s, tflops_error=(sim_tflops - pub_tflops) / pub_tflops,
        wall_s=wall, source=f"{case.source.title} ({case.source.venue}), {case.source.where}",
        source_label=case.source.label or case.source.title,
        simulated_compute_s=compute_s, simulated_exposed_comm_s=float(summary["exposed_comm_s"]),
        simulated_idle_fraction=float(summary["bubble_fraction"]),
        compute_tflops_per_gpu=hw_tflop / compute_s if hw_tflop is not None and compute_s > 0 else None,
        implied_compute_tflops_per_gpu=hw_tflop / implied_s if hw_tflop is not None and implied_s > 0 else None,
    )


WITHIN = 0.10  # the share of a published time a case counts as agreeing within


def aggregate(results: list[CaseResult]) -> dict[str, float]:
    """Mean and max absolute error over the cases, for time and for TFLOP/s per GPU; the mean signed time
    error (below 0: dtsim optimistic on average, as a sizing that under-buys) and how many cases agree
    within ``WITHIN``."""
    te = [abs(r.time_error) for r in results]
    fe = [abs(r.tflops_error) for r in results]
    return {"cases": len(results), "mean_abs_time_error": sum(te) / len(te), "max_abs_time_error": max(te),
            "mean_time_error": sum(r.time_error for r in results) / len(results),
            "cases_within_10pct": sum(e <= WITHIN for e in te),
            "mean_abs_tflops_error": sum(fe) / len(fe), "max_abs_tflops_error": max(fe)}


def aggregate_by_source(results: list[CaseResult]) -> dict[str, dict[str, float]]:
    """``aggregate`` over each source's cases (by its label), in the order the sources first appear: one
    stack or one period of a stack can be off while another agrees, and a single mean hides which."""
    groups: dict[str, list[CaseResult]] = {}
    for r in results:
        groups.setdefault(r.source_label, []).append(r)
    return {label: aggregate(rs) for label, rs in groups.items()}


def _name_width(names: Iterable[str]) -> int:
    """The case column's width: the longest name shown (26 at least), so the columns stay aligned."""
    return max([26, *(len(n) for n in names)])


def format_table(results: list[CaseResult]) -> str:
    """The human-readable comparison printed by the command."""
    w = _name_width(r.name for r in results)
    head = (f"{'case':<{w}} {'GPUs':>6} {'formula':<20} {'pub s':>8} {'sim s':>8} {'err':>7} "
            f"{'pub TF/s':>9} {'sim TF/s':>9} {'err':>7}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r.name:<{w}} {r.gpus:>6} {r.flop_formula:<20} {r.published_s:>8.2f} "
                     f"{r.simulated_s:>8.2f} {r.time_error:>+7.1%} {r.published_tflops_per_gpu:>9.1f} "
                     f"{r.simulated_tflops_per_gpu:>9.1f} {r.tflops_error:>+7.1%}")
    agg = aggregate(results)
    lines.append("-" * len(head))
    lines.append(f"iteration time: mean |error| {agg['mean_abs_time_error']:.1%}, max {agg['max_abs_time_error']:.1%}"
                 f"; TFLOP/s per GPU: mean |error| {agg['mean_abs_tflops_error']:.1%}, "
                 f"max {agg['max_abs_tflops_error']:.1%} ({agg['cases']} cases)")
    lines.append(f"iteration time: mean signed error {agg['mean_time_error']:+.1%} (below 0: faster than published); "
                 f"{agg['cases_within_10pct']} of {agg['cases']} cases within {WITHIN:.0%}")
    by_source = aggregate_by_source(results)
    if len(by_source) > 1:
        lw = max(len(label) for label in by_source)
        lines.append("by source (iteration time):")
        for label, a in by_source.items():
            lines.append(f"  {label:<{lw}}  {a['cases']:>3} case{'s' if a['cases'] != 1 else ' '}  "
                         f"mean |error| {a['mean_abs_time_error']:>5.1%}  max {a['max_abs_time_error']:>5.1%}  "
                         f"signed {a['mean_time_error']:>+6.1%}")
    lines.append("err = (simulated − published) / published; TFLOP/s on both sides use the source's own "
                 "FLOP formula (sim/validation/flops.py)")
    return "\n".join(lines)


def format_breakdown(results: list[CaseResult]) -> str:
    """Where each simulated iteration goes, and the compute rate its published time implies."""
    w = _name_width(r.name for r in results)
    head = (f"{'case':<{w}} {'sim s':>8} {'compute':>8} {'exp comm':>8} {'idle':>6} "
            f"{'busy TF/s':>9} {'implied':>9} {'ratio':>6}")
    lines = [head, "-" * len(head)]

    def num(x: float | None, width: int, fmt: str) -> str:
        return f"{x:>{width}{fmt}}" if x is not None else f"{'-':>{width}}"

    for r in results:
        ratio = (r.implied_compute_tflops_per_gpu / r.compute_tflops_per_gpu
                 if r.implied_compute_tflops_per_gpu and r.compute_tflops_per_gpu else None)
        lines.append(f"{r.name:<{w}} {r.simulated_s:>8.2f} {r.simulated_compute_s:>8.2f} "
                     f"{r.simulated_exposed_comm_s:>8.2f} {r.simulated_idle_fraction:>6.1%} "
                     f"{num(r.compute_tflops_per_gpu, 9, '.1f')} {num(r.implied_compute_tflops_per_gpu, 9, '.1f')} "
                     f"{num(ratio, 6, '.3f')}")
    lines.append("-" * len(head))
    lines.append("per iteration, on the GPU with the most compute: compute = its busy kernels, exp comm = "
                 "communication it waits for, idle = mean idle share over GPUs; busy TF/s = its hardware "
                 "FLOPs (dtsim's count, recomputation included) over its compute; implied = the same FLOPs "
                 "over (published time − simulated time outside compute); ratio = implied / busy")
    return "\n".join(lines)


def to_json(results: list[CaseResult], cases_file: Path) -> dict[str, Any]:
    """The machine-readable table."""
    return {"cases_file": str(cases_file), "summary": aggregate(results),
            "by_source": aggregate_by_source(results), "cases": [asdict(r) for r in results]}


def build_parser() -> argparse.ArgumentParser:
    from sim.cli import _Parser
    from sim.explore.cli import path_text, positive_int

    p = _Parser(prog=PROG, description="Simulate the published training runs and compare with their figures.")
    p.add_argument("--published", action="store_true", required=True,
                   help="compare with the published-figures set (no torch needed)")
    p.add_argument("--case", action="append", metavar="NAME", help="run only this case (repeatable)")
    p.add_argument("--cases", type=path_text, default=str(DEFAULT_CASES), metavar="FILE",
                   help="the case set (default: the set shipped with dtsim)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.add_argument("--out", type=path_text, metavar="FILE", help="also write the JSON table to FILE")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a key in every case's scenario, e.g. calibration=profile.json")
    p.add_argument("--list", action="store_true", help="list the cases and their sources; run nothing")
    p.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                   help="cases simulated at once, one process each (default: the cores this process may "
                        "use, at most 8 and the number of cases; 1 runs them in turn here)")
    p.add_argument("--breakdown", action="store_true",
                   help="also print where each simulated iteration goes and the compute rate the published "
                        "time implies")
    return p


MAX_DEFAULT_JOBS = 8  # the set's largest case holds ~1.4 GB while it simulates: bounded memory on big boxes


def default_jobs(cases: int) -> int:
    """One process per core this process may run on, at most ``MAX_DEFAULT_JOBS`` and the number of cases."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, cases, MAX_DEFAULT_JOBS))


@dataclass(frozen=True)
class _Failed:
    """A case's bad input, carried back from a worker as text (the parent raises it as one line)."""

    message: str


def _run_in_worker(case: Case, cases_file: Path, overrides: list[str] | None) -> CaseResult | _Failed:
    try:
        return run_case(case, cases_file, overrides)
    except ScenarioError as exc:
        return _Failed(str(exc))


def _worker_init() -> None:
    """Workers leave Ctrl-C to the parent, which then stops them all (no traceback from each)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _indexed(job: tuple[int, Case, Path, list[str] | None]) -> tuple[int, CaseResult | _Failed]:
    i, case, cases_file, overrides = job
    return i, _run_in_worker(case, cases_file, overrides)


def _checked(case: Case, r: CaseResult | _Failed, done: int, total: int) -> CaseResult:
    if isinstance(r, _Failed):
        raise ScenarioError(r.message)
    if not (math.isfinite(r.simulated_s) and r.simulated_s > 0):
        raise ScenarioError(f"case {case.name}: the simulation gave no iteration time", "scenario")
    print(f"[{done}/{total}] {case.name}: simulated in {r.wall_s:.1f} s", file=sys.stderr)
    return r


def run_cases(selected: list[Case], cases_file: Path, overrides: list[str] | None, jobs: int) -> list[CaseResult]:
    """Every case's result, in the order given. With ``jobs`` > 1 the cases run in that many worker
    processes, a fresh one per case, each simulation on its own core: the set's wall time falls towards
    that of its longest case. Progress lines come in the order the cases finish; bad input, an error or
    Ctrl-C stops every worker at once. Workers come from a fork server with this module preloaded, never
    from forking the caller (why: ``sim.processes``), so they are the same whatever threads it runs."""
    total = len(selected)
    jobs = min(jobs, total)
    if jobs <= 1 or "forkserver" not in multiprocessing.get_all_start_methods():
        return [_checked(c, _run_in_worker(c, cases_file, overrides), i, total) for i, c in enumerate(selected, 1)]
    results: list[CaseResult | None] = [None] * total
    jobs_in = [(i, selected[i], cases_file, overrides) for i in longest_first(selected, cases_file, overrides)]
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, "sim.api"])  # each worker starts with the simulator imported
    with ctx.Pool(jobs, initializer=_worker_init, maxtasksperchild=1) as pool:
        for done, (i, r) in enumerate(pool.imap_unordered(_indexed, jobs_in), 1):  # leaving: terminate()
            results[i] = _checked(selected[i], r, done, total)
    return [r for r in results if r is not None]


def longest_first(selected: list[Case], cases_file: Path, overrides: list[str] | None) -> list[int]:
    """Indices of ``selected``, the cases the simulation budget expects to take longest first
    (``sim.budget.estimate_work``): started first on the workers, the few long ones run side by side
    rather than one of them last, alone. A case whose scenario does not load keeps its place at the front
    (its worker reports the error at once)."""
    from sim.budget import estimate_work
    from sim.scenario.load import load_scenario

    def events(case: Case) -> float:
        try:
            return estimate_work(load_scenario(scenario_path(case, cases_file), overrides or [])).events
        except ScenarioError:
            return math.inf

    work = [events(c) for c in selected]
    return sorted(range(len(selected)), key=lambda i: -work[i])


def _select(cases: CaseSet, names: list[str] | None) -> list[Case]:
    if not names:
        return list(cases.cases)
    known = [c.name for c in cases.cases]
    picked = []
    for n in names:
        if n not in known:
            raise ScenarioError(f"{show(n)} — not a case of the set; {did_you_mean(n, known)}"
                                f"use one of {', '.join(known)}", "--case")
        picked.append(next(c for c in cases.cases if c.name == n))
    return picked


def _check_table_out(out: Path, cases_file: Path) -> None:
    """``--out`` replaces only a table an earlier run wrote: never the case set, nor a user's other file."""
    if not out.exists():
        return
    if out.resolve() == cases_file.resolve():
        raise ScenarioError(f"{show(str(out))} is the --cases file this run reads; give another file name",
                            "--out")
    try:  # a table is a few hundred kB: a larger file is not one, and is not read
        old = json.loads(out.read_text(encoding="utf-8")) if out.stat().st_size < 64 << 20 else None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        old = None
    if not (isinstance(old, dict) and {"cases_file", "summary", "cases"} <= old.keys()):
        raise ScenarioError(f"{show(str(out))} exists and is not a table dtsim validate wrote; give a new file "
                            "name (dtsim replaces only its own tables)", "--out")


def main(argv: list[str]) -> int:
    """Run the command with ``argv`` (the arguments after 'validate'); ScenarioError → the caller's exit 2."""
    from sim.paths import ends_in_separator, expand_path

    args = build_parser().parse_args(argv)
    cases_file = expand_path(args.cases, "--cases")  # '--cases=~/set.yaml' reaches here unexpanded
    if args.out:
        from sim.outputs.resultdir import check_output_file

        if ends_in_separator(args.out):  # Path() would drop the slash
            raise ScenarioError(f"{args.out!r} names a folder (it ends in {os.sep!r}); --out is the JSON "
                                f"table's file: give a file name (e.g. --out {args.out}table.json)", "--out")
        _check_table_out(check_output_file(args.out, "--out", (".json",)), cases_file)  # before any case runs
    if args.list and args.set:
        raise ScenarioError(f"{show(args.set[0])} — --list runs no case, so --set would change nothing; "
                            "drop --set, or --list to run the cases", "--set")
    cases = load_cases(cases_file)
    selected = _select(cases, args.case)
    if args.list:
        w = _name_width(c.name for c in selected)
        for c in selected:
            print(f"{c.name:<{w}} {c.scenario}\n{'':<{w}} {c.source.title} ({c.source.venue}), "
                  f"{c.source.where} — {c.source.url}")
        return 0
    results = run_cases(selected, cases_file, args.set, args.jobs or default_jobs(len(selected)))
    table = to_json(results, cases_file)
    if args.out:
        from sim.outputs.writers import atomic_write_text

        atomic_write_text(Path(args.out), json.dumps(table, indent=2) + "\n")
    if args.json:
        sys.stdout.write(json.dumps(table, indent=2) + "\n")
    else:
        print(format_table(results))
        if args.breakdown:
            print()
            print(format_breakdown(results))
    return 0
