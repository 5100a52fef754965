"""Run many scenarios: in this process, in local worker processes, or as Ray tasks.

Work travels as resolved scenario mappings (plain, picklable data) and comes back as a small dict with a
status, never as an exception, so one bad point cannot sink a sweep: ``ok`` (simulated, fits), ``no-fit``
(simulated, but the peak memory exceeds the GPU's), ``invalid`` (the scenario breaks a rule) or ``error``
(the simulation itself failed, e.g. a deadlock).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from tqdm import tqdm

from sim.api import simulate
from sim.budget import check_budget
from sim.errors import ScenarioError, SimulationError
from sim.processes import pool_context, quiet_worker
from sim.scenario.load import scenario_from_dict

EXECUTORS = ("local", "ray")
OK, NO_FIT, INVALID, ERROR = "ok", "no-fit", "invalid", "error"

Job = tuple[dict, str | None]  # (resolved scenario mapping, folder relative calibration paths start from)


def default_workers() -> int:
    """min(CPUs, 4): simulations are CPU-bound, and more processes than cores only add overhead."""
    return max(1, min(os.cpu_count() or 1, 4))


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def no_fit_reason(summary: Mapping[str, Any]) -> str:
    """Why a simulated point does not fit, in one line (peak, capacity, the first fix)."""
    mb = summary.get("memory_bytes", {})
    cap = summary.get("gpu_memory_bytes", 0.0)
    fixes = [f for f in summary.get("memory_fixes", []) if not f.startswith("needs ")]
    tail = f"; try: {fixes[0]}" if fixes else ""
    return f"does not fit in memory: {mb.get('peak', 0.0) / 1e9:.1f} GB > {cap / 1e9:.0f} GB per GPU{tail}"


def simulate_point(data: dict, base_dir: str | None = None) -> dict:
    """Validate and simulate one scenario mapping (a worker's whole job); failures come back as data."""
    t0 = time.perf_counter()
    try:
        scenario = scenario_from_dict(data, base_dir=Path(base_dir) if base_dir else None)
        check_budget(scenario, flag=None, announce=False)  # one huge point must not stall the sweep
        summary = simulate(scenario).summary
    except ScenarioError as exc:
        return {"status": INVALID, "reason": first_line(exc), "wall_s": time.perf_counter() - t0}
    except SimulationError as exc:
        return {
            "status": ERROR,
            "reason": f"simulation failed: {first_line(exc)}",
            "wall_s": time.perf_counter() - t0,
        }
    fits = summary.get("fits_in_memory", True)
    return {
        "status": OK if fits else NO_FIT,
        "reason": "" if fits else no_fit_reason(summary),
        "summary": summary,
        "wall_s": time.perf_counter() - t0,
    }


def run_jobs(
    jobs: Sequence[Job],
    *,
    workers: int | None = None,
    executor: str = "local",
    address: str | None = None,
    progress: bool = True,
    desc: str = "simulating",
    fn: Callable[..., dict] = simulate_point,
) -> list[dict]:
    """``fn(*job)`` for every job, results in job order; local processes by default, or Ray tasks."""
    if executor not in EXECUTORS:
        raise ScenarioError(f"unknown executor {executor!r}; use one of {', '.join(EXECUTORS)}", "--executor")
    if not jobs:
        return []
    if executor == "ray":
        from sim.explore.ray_executor import run_on_ray  # lazy: ray is an optional dependency

        return run_on_ray(fn, jobs, address=address, progress=progress, desc=desc)
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ScenarioError(f"--workers must be at least 1, got {workers}", "--workers")
    bar = tqdm(total=len(jobs), desc=desc, unit="run", disable=not progress, leave=False)
    try:
        if workers == 1 or len(jobs) == 1:
            out = []
            for job in jobs:
                out.append(fn(*job))
                bar.update()
            return out
        return _run_pool(fn, jobs, min(workers, len(jobs)), bar)
    finally:
        bar.close()


def _run_pool(fn: Callable[..., dict], jobs: Sequence[Job], workers: int, bar: tqdm) -> list[dict]:
    results: list[dict | None] = [None] * len(jobs)
    # Forked only where that is safe (sim.processes): a caller with threads of its own (a notebook, a
    # service) gets workers from a fork server instead, which import the simulator afresh.
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=pool_context(), initializer=quiet_worker)
    try:
        pending = {pool.submit(fn, *job): i for i, job in enumerate(jobs)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                results[pending.pop(fut)] = fut.result()
                bar.update()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results  # type: ignore[return-value]
