"""The reliability section: failures over the whole run, checkpoints and restarts (goodput)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from sim.scenario.base import _Strict

# Ranges that keep the run-level figures (job MTBF, checkpoint and restart times, the Daly interval) finite,
# non-zero and meaningful in float64: the job MTBF is 3600 / Σ(components / MTBF hours), which 1e308 h
# overflowed to infinity and 5e-324 h sent to 0; within these bounds it stays finite and positive for any
# cluster the schema admits.
MIN_MTBF_HOURS = 1e-6  # 3.6 ms: a component failing more often is broken, not unreliable
# Not a physical limit: "never fails" is a fair input (an MTBF of 1e30 h, far beyond the run, means one
# checkpoint at the end and no failure), so the ceiling is float64's: 3600 s × 1e300 h = 3.6e303 s is finite.
MAX_MTBF_HOURS = 1e300
MAX_RESTART_S = 1e6  # 11.6 days to detect, reschedule and reload: the ceiling of every simulated op (MAX_OP_MS)
MIN_STORAGE_GBps = 1e-3  # 1 MB/s, the floor of the schema's other bandwidths (MIN_LINK_Bps, MIN_MEMORY_GBps)
MAX_STORAGE_GBps = 1e6  # 1 PB/s: 500× the 2 TB/s of scenarios/llama3-405b-16384xh100.yaml
MAX_INTERVAL_STEPS = 10**12  # as training.train_steps: an interval beyond the run's length is one checkpoint
# Seeded Monte-Carlo runs: the 95 % interval of the mean shrinks as 1/√trials, so 10⁶ runs already pin the
# mean to 0.2 % of one run's spread, and take a few seconds (10⁷ took 6 s, 10⁹ about ten minutes).
MAX_MC_TRIALS = 1_000_000


class CheckpointPolicy(_Strict):
    """How often and how fast the training state is saved (sets the checkpoint overhead and lost work)."""

    model_config = ConfigDict(**_Strict.model_config, validate_by_name=True, serialize_by_alias=True)

    interval: Literal["auto"] | Annotated[
        int, Field(ge=1, le=MAX_INTERVAL_STEPS, description="a whole number of steps")
    ] = Field(
        "auto", description="training steps between checkpoints, or auto = Young/Daly optimum"
    )
    write_GBps: float = Field(
        ge=MIN_STORAGE_GBps,
        le=MAX_STORAGE_GBps,
        description="aggregate storage write bandwidth for the checkpoint, GB/s (1e9 bytes; 0.001 to 1e6)",
    )
    async_: bool = Field(
        False,
        alias="async",
        description="asynchronous checkpoint: training blocks only for the device→host snapshot; the "
        "storage write runs in the background and is lost if a failure strikes before it ends",
    )
    snapshot_GBps: float | None = Field(
        None,
        ge=MIN_STORAGE_GBps,
        le=MAX_STORAGE_GBps,
        description="async: device→host copy bandwidth per GPU, GB/s; default the pcie4 link preset "
        "(31.5 GB/s × 0.8 efficiency)",
    )


class Reliability(_Strict):
    """Failures over the whole run: MTBFs, checkpoints and restarts → goodput and expected time to train."""

    gpu_mtbf_hours: float = Field(
        ge=MIN_MTBF_HOURS, le=MAX_MTBF_HOURS, description="mean time between failures of one GPU, hours (1e-6 to 1e300)"
    )
    node_mtbf_hours: float | None = Field(
        None, ge=MIN_MTBF_HOURS, le=MAX_MTBF_HOURS,
        description="per node (host, PSU, NVSwitch…), hours; null = not counted",
    )
    link_mtbf_hours: float | None = Field(
        None, ge=MIN_MTBF_HOURS, le=MAX_MTBF_HOURS,
        description="per inter-node link (NIC, cable, switch port), hours; null = not counted",
    )
    checkpoint: CheckpointPolicy = Field(description="{interval, write_GBps, async, snapshot_GBps}")
    restart_s: float = Field(
        ge=0, le=MAX_RESTART_S, description="detect + reschedule + reload after a failure, seconds (at most 1e6)"
    )
    monte_carlo_trials: int = Field(
        200, ge=0, le=MAX_MC_TRIALS,
        description="seeded Monte-Carlo runs of the whole training (0 = closed forms only; at most 1e6)",
    )

