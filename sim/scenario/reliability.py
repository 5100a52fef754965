"""The reliability section: failures over the whole run, checkpoints and restarts (goodput)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from sim.scenario.base import _Strict


class CheckpointPolicy(_Strict):
    """How often and how fast the training state is saved (sets the checkpoint overhead and lost work)."""

    model_config = ConfigDict(**_Strict.model_config, validate_by_name=True, serialize_by_alias=True)

    interval: Literal["auto"] | Annotated[int, Field(ge=1)] = Field(
        "auto", description="training steps between checkpoints, or auto = Young/Daly optimum"
    )
    write_GBps: float = Field(
        gt=0, description="aggregate storage write bandwidth for the checkpoint, GB/s (1e9 bytes)"
    )
    async_: bool = Field(
        False,
        alias="async",
        description="asynchronous checkpoint: training blocks only for the device→host snapshot; the "
        "storage write runs in the background and is lost if a failure strikes before it ends",
    )
    snapshot_GBps: float | None = Field(
        None,
        gt=0,
        description="async: device→host copy bandwidth per GPU, GB/s; default the pcie4 link preset "
        "(31.5 GB/s × 0.8 efficiency)",
    )


class Reliability(_Strict):
    """Failures over the whole run: MTBFs, checkpoints and restarts → goodput and expected time to train."""

    gpu_mtbf_hours: float = Field(gt=0, description="mean time between failures of one GPU, hours")
    node_mtbf_hours: float | None = Field(
        None, gt=0, description="per node (host, PSU, NVSwitch…), hours; null = not counted"
    )
    link_mtbf_hours: float | None = Field(
        None, gt=0, description="per inter-node link (NIC, cable, switch port), hours; null = not counted"
    )
    checkpoint: CheckpointPolicy = Field(description="{interval, write_GBps, async, snapshot_GBps}")
    restart_s: float = Field(ge=0, description="detect + reschedule + reload after a failure, seconds")
    monte_carlo_trials: int = Field(
        200, ge=0, description="seeded Monte-Carlo runs of the whole training (0 = closed forms only)"
    )

