"""The Summary of one simulated run: what ``summary.json`` holds and ``dtsim run`` prints.

One frozen record instead of a free dict: each field is one ``summary.json`` key, spelled as the key (units
in the name), so ``to_dict`` is the file's content. A field that is ``None`` is a figure this run does not
have (a collective has no tokens, a run without FLOPs no MFU) and is left out of the file, exactly as the
keys were left out before. Nested blocks (parallel layout, memory per stage, reliability, cost model) stay
mappings: their keys are written by their own modules.

``Summary`` is also a read-only ``Mapping`` of those keys, so code that read the old dict by string keys
(``summary["step_time_s"]``, ``summary.get("mfu")``, charts redrawn from a ``summary.json`` of any version)
keeps working; new code reads attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class Summary(Mapping[str, Any]):
    """A run's figures. Times are per training step unless the name says otherwise."""

    # -- every run ----------------------------------------------------------------------------------
    name: str
    workload: str  # the model's kind: "collective", "transformer", "synthetic", "layers"
    num_gpus: int
    step_time_s: float  # mean over the simulated steps (a collective: all its sizes back to back)
    samples_per_s: float
    global_batch: int
    compute_s: float  # busy compute of the bottleneck GPU
    exposed_comm_s: float  # communication the bottleneck GPU waits for (compute idle)
    bubble_fraction: float  # mean idle fraction over GPUs
    pipeline_utilisation: float  # mean compute fraction over GPUs
    cost_model: dict[str, Any] | None = None  # what the cost model reports (profile, extrapolations)
    calibration: dict[str, Any] | None = None  # a calibrated run's profile and fallbacks
    collective_algorithms: dict[str, dict[str, int]] | None = None  # op → algorithm/protocol → count

    # -- training runs: timeline ------------------------------------------------------------------------
    step_times_s: list[float] | None = None
    tokens_per_s: float | None = None
    comm_s: float | None = None  # all communication of the bottleneck GPU, overlapped or not
    model_tflops_per_gpu: float | None = None
    hardware_tflops_per_gpu: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    single_gpu_time_s: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    overhead_gpu_s: float | None = None
    # One transformer layer's forward and backward on the bottleneck GPU (sim.metrics.layer_times).
    layer_time_s: dict[str, float] | None = None
    step_time_p50_s: float | None = None
    step_time_p90_s: float | None = None
    step_time_p99_s: float | None = None
    step_time_min_s: float | None = None
    step_time_max_s: float | None = None
    step_time_std_s: float | None = None
    step_time_cv: float | None = None

    # -- training runs: layout, memory, cost --------------------------------------------------------------
    microbatches: int | None = None
    symmetry: str | None = None  # "on" / "off": whether one GPU per stage stood for its replicas
    gpu_speed_spread: float | None = None  # σ of the GPUs' own speeds (cluster.gpu_speed_spread)
    slowest_gpu_factor: float | None = None  # compute-time factor of the slowest GPU drawn (what the step waits for)
    parallel: dict[str, Any] | None = None
    memory_bytes: dict[str, float] | None = None  # the worst stage's breakdown (and its "stage")
    memory_by_stage: list[dict[str, Any]] | None = None
    gpu_memory_bytes: float | None = None
    fits_in_memory: bool | None = None
    memory_over_bytes: float | None = None
    memory_fixes: list[str] | None = None
    cost_per_step_usd: float | None = None
    cost_per_1M_tokens_usd: float | None = None
    energy_kWh_per_step: float | None = None
    time_to_train_s: float | None = None
    time_to_train_days: float | None = None
    cost_to_train_usd: float | None = None
    energy_to_train_MWh: float | None = None
    reliability: dict[str, Any] | None = None
    loss_scale: list[dict[str, Any]] | None = None
    skipped_steps: int | None = None

    # -- collective runs (one value per size, or the value when there is one size) ------------------------
    op: str | None = None
    algorithm: str | None = None
    time_s: float | list[float] | None = None
    algbw_GBps: float | list[float] | None = None
    busbw_GBps: float | list[float] | None = None
    collectives: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``summary.json`` mapping: every figure this run has (``None`` fields left out)."""
        return dict(self._present)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        """The Summary a ``summary.json`` mapping describes; an unknown key is a TypeError naming it."""
        return cls(**data)

    @cached_property
    def _present(self) -> dict[str, Any]:
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    # -- read-only Mapping view (string keys, as the summary was read before it was typed) ----------------
    def __getitem__(self, key: str) -> Any:
        return self._present[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._present)

    def __len__(self) -> int:
        return len(self._present)


# What charts and reports read: a Summary, or the mapping of a summary.json (of this or an older version).
SummaryView = Mapping[str, Any]
