"""Failures, checkpoints and goodput of a whole training run: closed forms and a seeded Monte-Carlo.

A run-level layer above the simulated step: it takes the failure-free work (steps × simulated step time),
never enters the engine. Failures strike the job as a Poisson process whose rate is the sum of its
components' rates (GPUs, nodes, inter-node links, each exponential with its own MTBF). The run is cut
into segments of ``interval_s`` of work, each followed by a checkpoint; a failure rolls back to the last
durable checkpoint and costs a restart (detect, reschedule, reload), which a failure can interrupt too.

Closed forms (exponential failures, job MTBF M, checkpoint time δ, restart R, interval τ):
  Young 1974:  τ_opt ≈ √(2δM).
  Daly 2006 ("A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22):
  τ_opt = √(2δM)·[1 + ⅓·√(δ/2M) + (1/9)·(δ/2M)] − δ for δ < 2M (else M), and the expected wall time of a
  segment of w = τ + δ seconds is M·e^{R/M}·(e^{w/M} − 1), exact for this model. Summing it over the
  segments gives the expected time to train; the Monte-Carlo samples the same model and must agree.

Asynchronous checkpoints block training only for the device→host snapshot (δ_b); the write to storage
(δ_w) goes on in the background, and a failure before it is durable rolls back one checkpoint further.
The Monte-Carlo models that exactly; the closed form adds it to first order in δ_w/M.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import numpy as np

HOUR_S = 3600.0
Z_95 = 1.959963984540054  # two-sided 95 % normal quantile (confidence interval of the Monte-Carlo mean)


def job_mtbf_s(*, gpus: int, gpu_mtbf_hours: float, nodes: int = 0, node_mtbf_hours: float | None = None,
               links: int = 0, link_mtbf_hours: float | None = None) -> float:
    """Mean time between failures of the whole job: independent exponential components add their rates."""
    rate_per_h = gpus / gpu_mtbf_hours
    if node_mtbf_hours:
        rate_per_h += nodes / node_mtbf_hours
    if link_mtbf_hours:
        rate_per_h += links / link_mtbf_hours
    return HOUR_S / rate_per_h


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum compute time between checkpoints, √(2δM)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (2006, eq. 37); M itself when δ ≥ 2M."""
    d, m = checkpoint_s, mtbf_s
    if d >= 2.0 * m:
        return m
    x = d / (2.0 * m)
    return math.sqrt(2.0 * d * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - d


def expected_segment_s(work_s: float, mtbf_s: float, restart_s: float) -> float:
    """Expected wall time to get through ``work_s`` seconds that a failure sends back to their start,
    each failure costing a restart that failures can interrupt: M·e^{R/M}·(e^{w/M} − 1) (Daly 2006).
    Its limit w for M → ∞ (a job MTBF that overflowed float64: no failures) is taken as such, not ∞ × 0."""
    if math.isinf(mtbf_s):
        return work_s
    return mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1(work_s / mtbf_s)


def segments(work_s: float, interval_s: float) -> tuple[int, float]:
    """(full segments, remaining work of the last, shorter one): the run as the checkpoints cut it."""
    n = int(work_s // interval_s)
    rest = work_s - n * interval_s
    if rest <= 1e-9 * min(interval_s, work_s):  # float dust of an exact multiple (never the whole run:
        rest = 0.0                                 # an interval longer than the run leaves one segment)
    return n, rest


@dataclass(frozen=True)
class Plan:
    """One training run to evaluate: the work, the failure rate and the checkpoint policy (seconds)."""

    work_s: float  # failure-free compute time of the whole run (steps × step time)
    mtbf_s: float  # job MTBF
    interval_s: float  # compute between checkpoints (τ)
    checkpoint_s: float  # time training is blocked per checkpoint (δ; async: the snapshot δ_b)
    restart_s: float  # detect + reschedule + reload (R)
    durable_lag_s: float = 0.0  # async: the write to storage after the snapshot (δ_w); sync: 0

    @property
    def checkpoints(self) -> int:
        n, rest = segments(self.work_s, self.interval_s)
        return n + (1 if rest > 0 else 0)


@dataclass(frozen=True)
class Outcome:
    """Expected (or sampled-mean) figures of one run; times in seconds."""

    wall_s: float  # time to train including failures
    goodput: float  # useful / total GPU time = work / wall
    failures: float
    checkpoint_overhead_s: float  # time blocked writing checkpoints that were kept
    restart_s: float  # time spent restarting
    lost_work_s: float  # re-executed work (and checkpoints lost with it)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def expected(plan: Plan) -> Outcome:
    """The closed form: Daly's exact segment expectation summed over the run (first order for async)."""
    p = plan
    m, r = p.mtbf_s, p.restart_s
    n, rest = segments(p.work_s, p.interval_s)
    seg = expected_segment_s(p.interval_s + p.checkpoint_s, m, r)
    wall = n * seg + (expected_segment_s(rest + p.checkpoint_s, m, r) if rest > 0 else 0.0)
    if p.durable_lag_s > 0:
        # A failure within δ_w after a snapshot loses that checkpoint: one more segment to redo.
        wall += p.checkpoints * -math.expm1(-p.durable_lag_s / m) * seg
        wall += p.durable_lag_s  # the last checkpoint must be durable before the run is done
    failures = wall / m  # Poisson arrivals over the whole wall time (Wald's identity)
    # Each failure starts one restart: E[min(R, X)] (none, not 0 × ∞, when failures never come).
    restart_total = failures * m * -math.expm1(-r / m) if failures else 0.0
    ckpt = p.checkpoints * p.checkpoint_s
    return Outcome(wall, p.work_s / wall, failures, ckpt, restart_total, wall - p.work_s - ckpt - restart_total)


def _exponentials(rng: np.random.Generator, scale: float, block: int = 4096) -> Iterator[float]:
    """``rng.exponential(scale)`` draw after draw, taken from the generator a block at a time (the same
    values in the same order: an array draw is the scalar draws in sequence)."""
    while True:
        yield from rng.exponential(scale, block).tolist()


def _one_run(draw: Callable[[], float], ends: list[float], plan: Plan) -> tuple[float, int, float]:
    """One sampled run: (wall time, failures, restart time). ``draw()``: the next time to failure (an
    exponential of mean MTBF). ``ends[j]`` = when segment j ends, counted from the start of segment 0 in
    a failure-free run (segment = work + blocking checkpoint)."""
    r, lag = plan.restart_s, plan.durable_lag_s
    n = len(ends)
    t, done, failures, restarting = 0.0, 0, 0, 0.0
    base = 0.0
    while True:
        x = draw()
        finish = ends[-1] - base + lag
        if x >= finish:
            return t + finish, failures, restarting
        # Checkpoints durable before the failure: segment j's by ends[j] - base + lag ≤ x.
        done = max(done, min(n, bisect.bisect_right(ends, base + x - lag)))
        t += x
        failures += 1
        while True:  # restart; a failure during it starts it over
            y = draw()
            if y >= r:
                t += r
                restarting += r
                break
            t += y
            restarting += y
            failures += 1
        base = ends[done - 1] if done else 0.0


def monte_carlo(plan: Plan, trials: int, seed: int) -> dict[str, float]:
    """Sample ``trials`` whole runs (seeded): means of the Outcome fields and the 95 % half-width of the
    wall-time mean."""
    n, rest = segments(plan.work_s, plan.interval_s)
    works = [plan.interval_s] * n + ([rest] if rest > 0 else [])
    ends = np.cumsum(np.asarray(works) + plan.checkpoint_s)
    draw = _exponentials(np.random.default_rng(seed), plan.mtbf_s).__next__
    end_list: list[float] = ends.tolist()
    runs = np.array([_one_run(draw, end_list, plan) for _ in range(trials)])
    wall, fails, restart = runs[:, 0], runs[:, 1], runs[:, 2]
    ckpt = plan.checkpoints * plan.checkpoint_s
    mean_wall = float(wall.mean())
    half = Z_95 * float(wall.std(ddof=1)) / math.sqrt(trials) if trials > 1 else float("inf")
    return {
        "trials": trials,
        "seed": seed,
        "wall_s": mean_wall,
        "wall_ci95_s": half,
        "goodput": plan.work_s / mean_wall,
        "failures": float(fails.mean()),
        "checkpoint_overhead_s": ckpt,
        "restart_s": float(restart.mean()),
        "lost_work_s": float((wall - plan.work_s - ckpt - restart).mean()),
    }


def goodput_curve(plan: Plan, points: int = 41) -> list[tuple[float, float]]:
    """(interval_s, closed-form goodput) over a log-spaced range around the optimum, for the chart."""
    opt = daly_interval_s(plan.checkpoint_s, plan.mtbf_s)
    lo = max(opt / 20.0, plan.durable_lag_s, 1e-3)
    hi = max(opt * 20.0, lo * 2.0)
    xs = np.geomspace(lo, min(hi, plan.work_s), points) if plan.work_s > lo else np.array([plan.work_s])
    out = []
    for tau in xs:
        p = Plan(plan.work_s, plan.mtbf_s, float(tau), plan.checkpoint_s, plan.restart_s, plan.durable_lag_s)
        out.append((float(tau), expected(p).goodput))
    return out
