"""Timing one kernel honestly: warm-up, batched calls, CUDA events (or a synchronised wall clock), median.

Callers pass ``call(i)`` which runs the kernel on buffer set ``i``; rotating through sets that together
exceed the last-level cache keeps caches from flattering small kernels.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from calibrate.config import TimingConfig


def import_torch():
    """Import torch on first use, so profile loading and fitting never need it."""
    import torch

    return torch


@dataclass(frozen=True)
class Timing:
    """Per-call seconds: median over repeats (the reported figure), min and max for spread."""

    median_s: float
    min_s: float
    max_s: float
    repeats: int
    inner: int  # calls per timed sample

    def as_dict(self) -> dict:
        return asdict(self)


def buffer_sets(set_bytes: int, cfg: TimingConfig) -> int:
    """How many input sets to rotate through so they span ``cfg.rotate_bytes`` (at least 1)."""
    if set_bytes <= 0:
        return 1
    return max(1, min(cfg.max_buffers, math.ceil(cfg.rotate_bytes / set_bytes)))


def synchronize(device: str) -> None:
    if device == "cuda":
        import_torch().cuda.synchronize()


def time_kernel(call: Callable[[int], object], n_sets: int, device: str, cfg: TimingConfig) -> Timing:
    """Time ``call`` (per call, seconds).

    Warm-up calls first, at least one per buffer set so every output page is faulted in and every set has
    been seen (allocator, cuBLAS heuristics, page faults); one probe call sizes the batch so each
    timed sample lasts at least ``cfg.min_batch_s`` (timer resolution, launch jitter); then ``cfg.repeats``
    samples, each timed with CUDA events on GPU or perf_counter around a synchronised region on CPU.
    """
    torch = import_torch()
    i = 0
    for _ in range(max(1, cfg.warmup, n_sets)):
        call(i % n_sets)
        i += 1
    synchronize(device)
    t0 = time.perf_counter()
    call(i % n_sets)
    i += 1
    synchronize(device)
    probe_s = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, min(cfg.max_inner, math.ceil(cfg.min_batch_s / probe_s)))

    samples: list[float] = []
    for _ in range(max(1, cfg.repeats)):
        if device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                call(i % n_sets)
                i += 1
            end.record()
            end.synchronize()
            elapsed_s = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                call(i % n_sets)
                i += 1
            elapsed_s = time.perf_counter() - t0
        samples.append(elapsed_s / inner)
    return Timing(
        median_s=statistics.median(samples),
        min_s=min(samples),
        max_s=max(samples),
        repeats=len(samples),
        inner=inner,
    )
