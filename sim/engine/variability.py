"""GPU-to-GPU and step-to-step variability: each GPU's own speed, seeded kernel-time jitter and random
stragglers.

Every GPU's compute block is multiplied by ``gpu_factor(g) × step_factor(g, step) × kernel_factor(g, step)``:

- its own speed: identical GPUs of one SKU sustain different clocks under the same power cap (Sinha et
  al., SC'22; ``cluster.gpu_speed_spread``): a persistent factor exp(σZ) of median 1, drawn once per GPU;
- a random straggler: each GPU, each step, is slow (× ``slowdown``) with probability ``probability``,
  independently (a throttled or noisy GPU for one step; the explicit ``{gpu: factor}`` map is separate);
- jitter: every compute block's time × a log-normal factor of mean 1, exp(σZ − σ²/2).

Draws come from NumPy generators keyed by (seed, stream, step[, gpu]), never from event order, so the same
seed gives the same bytes whatever the simulation interleaves.

Symmetry. With every GPU simulated the synchronisation does the rest: a TP collective waits for its
slowest member, the pipeline for its slowest stage, the data-parallel all-reduce for the slowest replica.
When one GPU per pipeline stage stands for all the stage's GPUs (``symmetric``), it takes:

- stragglers and its own speed: the largest factor among the GPUs it stands for (its stage's data × tensor
  GPUs), drawn from the same per-GPU draws. Exact in the limit that matters: a slow GPU holds back its TP
  group at every layer, hence its replica's pipeline stage, hence the data-parallel sync every replica
  waits for. (With every GPU simulated only the slow GPU's replica has that stage slow; the pipeline's
  steady state runs at its slowest stage either way, so mostly the fill and drain differ: 0.8 % of the
  step on the 64-GPU check in tests/test_variability.py);
- jitter: each block draws a factor for every member of its TP group; the members' times since the last TP
  collective add up, and a block that ends in one lasts until the slowest member arrives (what the
  rendezvous does when every GPU is simulated). Replicas' sums over the many blocks of a step differ by
  only ~σ/√blocks, so the maximum over data-parallel replicas at the gradient sync is left out (it would
  add ~σ·√(2 ln d)/√blocks of the step).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from sim.parallel.layout import Layout

_STRAGGLER, _JITTER, _SPEED = 1, 2, 3  # stream ids in the seed key
_BATCH = 512  # jitter draws taken at a time per (GPU, step)


class Variability:
    def __init__(self, *, seed: int, layout: Layout, symmetric: bool, jitter_sigma: float = 0.0,
                 straggler_probability: float = 0.0, straggler_slowdown: float = 1.0, speed_sigma: float = 0.0):
        self.seed = seed & 0xFFFF_FFFF_FFFF_FFFF  # SeedSequence keys must be non-negative
        self.layout = layout
        self.symmetric = symmetric
        self.sigma = jitter_sigma
        self.p = straggler_probability
        self.slowdown = straggler_slowdown
        self.speed_sigma = speed_sigma
        self._speed: np.ndarray | None = None  # every GPU's own time factor, once drawn
        self._slow_steps: dict[int, np.ndarray] = {}
        self._stage_slow: dict[tuple[int, int], float] = {}
        self._jit: dict[int, tuple[int, int, np.ndarray, int]] = {}
        self._lag: dict[int, np.ndarray | float] = {}
        self._group = layout.tp if symmetric else 1

    @property
    def varies_by_step(self) -> bool:
        """Whether steps differ from one another (jitter or random stragglers; a GPU's own speed does not)."""
        return self.sigma > 0 or self.p > 0

    # ---- each GPU's own speed ---------------------------------------------------------------------
    def speed_factors(self) -> np.ndarray:
        """Time factor exp(σZ) of every GPU (median 1), drawn once from the seed: the same GPU is as slow
        in every step."""
        if self._speed is None:
            rng = np.random.default_rng([self.seed, _SPEED])
            self._speed = np.exp(self.speed_sigma * rng.standard_normal(self.layout.world_size))
        return self._speed

    def gpu_factor(self, g: int) -> float:
        """GPU g's own time factor; symmetric: the slowest among the GPUs of the stage g stands for (ranks of
        stage s are s·d·t … (s+1)·d·t − 1: pipeline outermost)."""
        if self.speed_sigma <= 0:
            return 1.0
        f = self.speed_factors()
        if not self.symmetric:
            return float(f[g])
        stage = self.layout.coords(g)[2]
        return float(f.reshape(self.layout.pp, -1)[stage].max())

    def slowest_factor(self) -> float:
        """The slowest GPU's time factor: what a synchronous step waits for."""
        return float(self.speed_factors().max()) if self.speed_sigma > 0 else 1.0

    # ---- stragglers ------------------------------------------------------------------------------
    def slow_gpus(self, step: int) -> np.ndarray:
        """Ids of the GPUs that straggle in ``step`` (sorted)."""
        got = self._slow_steps.get(step)
        if got is None:
            if self.p <= 0:
                got = np.empty(0, dtype=np.int64)
            else:
                rng = np.random.default_rng([self.seed, _STRAGGLER, step])
                got = np.flatnonzero(rng.random(self.layout.world_size) < self.p)
            self._slow_steps[step] = got
        return got

    def step_factor(self, g: int, step: int) -> float:
        """Slow-down of GPU g (or, symmetric, of the stage g stands for) during ``step``."""
        if self.p <= 0:
            return 1.0
        slow = self.slow_gpus(step)
        if not self.symmetric:
            i = np.searchsorted(slow, g)
            return self.slowdown if i < len(slow) and slow[i] == g else 1.0
        stage = self.layout.coords(g)[2]
        key = (stage, step)
        f = self._stage_slow.get(key)
        if f is None:
            per_stage = self.layout.dp * self.layout.tp  # ranks of stage s are s·d·t … (s+1)·d·t − 1
            lo, hi = stage * per_stage, (stage + 1) * per_stage
            hit = np.searchsorted(slow, lo) < np.searchsorted(slow, hi)
            f = self._stage_slow[key] = self.slowdown if hit else 1.0
        return f

    # ---- jitter ----------------------------------------------------------------------------------
    def block_time(self, g: int, step: int, dur_s: float, synced: bool = False) -> float:
        """GPU g's time for a block of ``dur_s`` in ``step`` with log-normal jitter of mean 1.

        Symmetric: g stands for its TP group, whose members drift apart between TP collectives; the lag of
        each member behind g accumulates block by block, and a block that ends in a TP collective
        (``synced``) lasts until the slowest member is there too."""
        if self.sigma <= 0:
            return dur_s
        times = self._draw(g, step, dur_s)
        if self._group == 1:
            return float(times[0])
        lag = self._lag.get(g, 0.0) + times - times[0]  # members' time behind g since the last sync
        if synced:
            self._lag[g] = 0.0
            return float(times[0] + lag.max())
        self._lag[g] = lag
        return float(times[0])

    def overlapped_block(self, g: int, step: int, dur_s: float) -> tuple[float, float, Callable[[float], None]]:
        """Jitter of a block whose TP collective runs beside its compute (Megatron's asynchronous backward):
        (g's compute time, how long after g starts the block its group's slowest member arrives, which is
        when the collective can start, and a function to call with the collective's duration).

        Symmetric: each member computes on from where it is; the collective starts with the last of them,
        and a member's block ends when its own compute and the collective are both done; that call sets
        the members' lags behind g from those ends (none of them waits for a slower member's compute).
        Every GPU simulated, the rendezvous itself does this."""
        if self.sigma <= 0:
            return dur_s, 0.0, _ignore
        times = self._draw(g, step, dur_s)
        if self._group == 1:
            return float(times[0]), 0.0, _ignore
        lag = np.zeros(self._group) + self._lag.get(g, 0.0)  # members behind g at the block's start
        wait = float(lag.max())

        def finish(collective_s: float) -> None:
            ends = np.maximum(lag + times, wait + collective_s)
            self._lag[g] = ends - ends[0]

        return float(times[0]), wait, finish

    def _draw(self, g: int, step: int, dur_s: float) -> np.ndarray:
        """The block's time on g and on each member it stands for, from the seeded log-normal factors."""
        state = self._jit.get(g)  # (step, batch number, draws, next index): one live batch per GPU
        if state is None or state[0] != step or state[3] >= _BATCH:
            n = state[1] + 1 if state is not None and state[0] == step else 0
            rng = np.random.default_rng([self.seed, _JITTER, step, g, n])
            z = rng.standard_normal((_BATCH, self._group))
            state = (step, n, np.exp(self.sigma * z - self.sigma**2 / 2), 0)
        step_, n, buf, i = state
        self._jit[g] = (step_, n, buf, i + 1)
        return dur_s * buf[i]


def _ignore(_collective_s: float) -> None:
    return None


def percentiles(step_times_s: list[float]) -> dict[str, float]:
    """p50/p90/p99 of the simulated step times (linear interpolation, NumPy's default) and their spread."""
    arr = np.asarray(step_times_s, dtype=float)
    p50, p90, p99 = (float(x) for x in np.percentile(arr, [50, 90, 99]))
    return {"step_time_p50_s": p50, "step_time_p90_s": p90, "step_time_p99_s": p99,
            "step_time_min_s": float(arr.min()), "step_time_max_s": float(arr.max()),
            "step_time_std_s": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0,
            "step_time_cv": float(arr.std(ddof=1) / arr.mean()) if len(arr) > 1 and arr.mean() > 0 else 0.0}


def expected_slow_fraction(probability: float, gpus: int) -> float:
    """Chance that at least one of ``gpus`` GPUs straggles in a step: 1 − (1 − p)^N."""
    return -math.expm1(gpus * math.log1p(-probability)) if probability < 1 else 1.0


def expected_slowest(sigma: float, gpus: int) -> float:
    """Expected time factor of the slowest of ``gpus`` GPUs whose factors are exp(σZ): exp(σ·E[max Z]),
    with Blom's approximation E[max of n normals] ≈ Φ⁻¹((n − 0.375)/(n + 0.25)) (0.59 against the exact 0.56
    at n = 2, within 0.012 from n = 8 on: 1.43 at 8, 3.2 at 1,024). For the plan's screen, which does not
    draw."""
    if sigma <= 0 or gpus <= 1:
        return 1.0
    from statistics import NormalDist

    return math.exp(sigma * NormalDist().inv_cdf((gpus - 0.375) / (gpus + 0.25)))
