"""Timing one kernel honestly: warm-up, batched calls, CUDA events (or a synchronised wall clock), median.

Callers pass ``call(i)`` which runs the kernel on buffer set ``i``; rotating through sets that together
exceed the last-level cache keeps caches from flattering small kernels.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from calibrate.config import TimingConfig
from calibrate.cores import usable_cores

if TYPE_CHECKING:
    from calibrate.progress import Progress

CARVE_ALIGN_BYTES = 64  # operands carved from a pool are aligned as torch's CPU allocator aligns tensors
_POOLS: dict = {}  # (dtype, "in" | "out") -> flat CPU tensor that operand sets are carved from


def import_torch() -> ModuleType:
    """Import torch on first use, so profile loading and fitting never need it (torch stays untyped here:
    the calibration tool imports it lazily, and ``sim`` never does)."""
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
    retaken: int = 0  # CPU samples dropped because other processes took this one's cores (see time_kernel)
    disturbed: bool = False  # no undisturbed sample within the retakes: the figures include that load

    def as_dict(self) -> dict:
        return asdict(self)


T = TypeVar("T")
P = TypeVar("P", bound=Hashable)  # a sweep point (shape, dtype, ...)


class PointFailed(RuntimeError):
    """A point could not be set up on some worker (``Lockstep.check``); every worker skips it."""


class Lockstep(Protocol):
    """Keeps concurrent workers' timed samples overlapping and combines them (``calibrate.kernels``).

    Every method is collective: each worker calls it the same number of times, in the same order."""

    def check(self, error: Exception | None) -> None:
        """Raise PointFailed on every worker when any worker's ``error`` is set (all skip the point)."""

    def agree(self, inner: int) -> int:
        """The calls per sample all workers use (the largest any worker asked for)."""

    @property
    def workers(self) -> int:
        """Processes timing at once (each with this process's thread count)."""

    def barrier(self) -> None:
        """Return when every worker is here (called right before each timed sample)."""

    def all_undisturbed(self, undisturbed: bool) -> bool:
        """Whether no worker's sample was disturbed (so all keep it, or all retake it)."""

    def slowest(self, median_s: float, min_s: float, max_s: float) -> tuple[float, float, float]:
        """The slowest worker's median; the least minimum and greatest maximum of all workers."""


def set_up_point(build: Callable[[], T], lockstep: Lockstep | None) -> T:
    """``build()`` (a point's buffers and call). Alone, its errors propagate as they are; with a lockstep,
    a RuntimeError or ValueError on any worker (out of memory, unsupported) becomes PointFailed on all of
    them, so they skip the point together. Errors later, while timing, are not agreed on: they end the
    worker (and the launcher reports it) rather than let the workers fall out of step."""
    if lockstep is None:
        return build()
    built, error = None, None
    try:
        built = build()
    except (RuntimeError, ValueError) as exc:
        error = exc
    lockstep.check(error)
    return built  # type: ignore[return-value]  # check() raised if build() failed


def carve(tdtype: Any, kind: str, shapes: list[tuple[int, ...]]) -> list[Any]:
    """Distinct, aligned CPU operands of ``shapes`` carved from one pool per (dtype, kind): random
    inputs (``kind`` "in"), zeroed (so already faulted-in) outputs ("out"). Generating fresh random sets
    that span the rotation size took most of a point's time on CPU (0.1 s per 64 MiB on one thread); the
    pool is made once and grows when a point needs more, so sets still occupy as much distinct memory as
    before. ``clear_pools`` frees them at the end of a section."""
    torch = import_torch()
    align = max(1, CARVE_ALIGN_BYTES // torch.empty(0, dtype=tdtype).element_size())
    numels = [math.prod(shape) for shape in shapes]
    sizes = [-(-n // align) * align for n in numels]
    need = sum(sizes) + align  # + align: room to align the first operand
    pool = _POOLS.get((tdtype, kind))
    if pool is None or pool.numel() < need:
        size = max(need, 2 * pool.numel() if pool is not None else need)
        gen = torch.Generator().manual_seed(size)
        pool = (
            torch.randn(size, dtype=tdtype, generator=gen)
            if kind == "in"
            else torch.zeros(size, dtype=tdtype)
        )
        _POOLS[(tdtype, kind)] = pool
    offset = (-(pool.data_ptr() // pool.element_size())) % align
    out = []
    for shape, numel, size in zip(shapes, numels, sizes, strict=True):
        out.append(pool[offset : offset + numel].view(shape))
        offset += size
    return out


def clear_pools() -> None:
    _POOLS.clear()


def buffer_sets(set_bytes: int, cfg: TimingConfig) -> int:
    """How many input sets to rotate through so they span ``cfg.rotate_bytes`` (at least 1)."""
    if set_bytes <= 0:
        return 1
    return max(1, min(cfg.max_buffers, math.ceil(cfg.rotate_bytes / set_bytes)))


def synchronize(device: str) -> None:
    if device == "cuda":
        import_torch().cuda.synchronize()


def _cpu_share_floor(cfg: TimingConfig, workers: int) -> float:
    """The least share of a CPU sample's wall time the calling thread may run before the sample counts as
    disturbed: ``cfg.cpu_share_min`` of what it is entitled to (less when the workers' threads
    oversubscribe the cores, as with more workers than cores)."""
    threads = import_torch().get_num_threads()
    return cfg.cpu_share_min * min(1.0, usable_cores() / max(1, workers * threads))


def time_kernel(
    call: Callable[[int], object],
    n_sets: int,
    device: str,
    cfg: TimingConfig,
    lockstep: Lockstep | None = None,
) -> Timing:
    """Time ``call`` (per call, seconds).

    Warm-up calls first, on GPU at least one per buffer set so every output page is faulted in and every
    set has been seen (allocator, cuBLAS heuristics, page faults; on CPU the sets are carved from pools
    whose pages were written when made); one probe call sizes the batch so each
    timed sample lasts at least ``cfg.min_batch_s`` (timer resolution, launch jitter); then ``cfg.repeats``
    samples, each timed with CUDA events on GPU or perf_counter around a synchronised region on CPU.

    On CPU each sample also reads the calling thread's CPU time. That thread runs the kernel, or leads its
    parallel region and waits (spinning, then sleeping) for the other threads, so an undisturbed sample
    keeps it on a core nearly all the time; a sample in which it ran less than ``cfg.cpu_share_min`` of
    the wall time was slowed by another process on the same cores (a shared machine), not by the kernel,
    and is retaken, up to ``cfg.retakes`` extra samples per point. If no sample was undisturbed, the
    figures are kept and flagged ``disturbed``.

    With ``lockstep`` (several CPU workers timing the same kernel at once) the workers agree on the calls
    per sample and start every sample together after a barrier, so every sample is taken while all
    workers run (a sample is retaken by all when any was disturbed). Each worker takes its median, and
    the slowest worker's median is the figure, the same on every worker: a synchronous step waits for
    its slowest device, and taking the median per worker first keeps sample-to-sample noise from
    biasing the maximum upwards.
    """
    torch = import_torch()
    i = 0
    # On CPU the operand sets come from pre-faulted pools (carve), so only the caches need warming.
    for _ in range(max(1, cfg.warmup, n_sets if device != "cpu" else 0)):
        call(i % n_sets)
        i += 1
    synchronize(device)
    t0 = time.perf_counter()
    call(i % n_sets)
    i += 1
    synchronize(device)
    probe_s = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, min(cfg.max_inner, math.ceil(cfg.min_batch_s / probe_s)))
    if lockstep is not None:
        inner = lockstep.agree(inner)
    cpu_floor = _cpu_share_floor(cfg, lockstep.workers if lockstep else 1) if device == "cpu" else 0.0

    good: list[float] = []
    disturbed: list[float] = []
    repeats = max(1, cfg.repeats)
    while len(good) < repeats and len(good) + len(disturbed) < repeats + cfg.retakes:
        if lockstep is not None:
            lockstep.barrier()
        if device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                call(i % n_sets)
                i += 1
            end.record()
            end.synchronize()
            elapsed_s, undisturbed = start.elapsed_time(end) / 1e3, True
        else:
            cpu0, t0 = time.thread_time(), time.perf_counter()
            for _ in range(inner):
                call(i % n_sets)
                i += 1
            elapsed_s = time.perf_counter() - t0
            undisturbed = time.thread_time() - cpu0 >= cpu_floor * elapsed_s
        if lockstep is not None:
            undisturbed = lockstep.all_undisturbed(undisturbed)
        (good if undisturbed else disturbed).append(elapsed_s / inner)
    samples = good or disturbed
    median_s, min_s, max_s = statistics.median(samples), min(samples), max(samples)
    if lockstep is not None:
        median_s, min_s, max_s = lockstep.slowest(median_s, min_s, max_s)
    return Timing(
        median_s=median_s,
        min_s=min_s,
        max_s=max_s,
        repeats=len(samples),
        inner=inner,
        retaken=len(disturbed) if good else 0,
        disturbed=not good,
    )


def merge_passes(records: list[dict], work_key: str, rate_key: str) -> dict:
    """One point's records from the sweep's passes, as one record: ``time_s`` is the median of the passes'
    medians (with two passes, their mean), min and max span every sample, counts add up, and
    ``rate_key`` (FLOP/s, bytes/s) is recomputed as ``work_key`` / time."""
    merged = dict(records[0])
    merged.update(
        time_s=statistics.median(r["time_s"] for r in records),
        min_s=min(r["min_s"] for r in records),
        max_s=max(r["max_s"] for r in records),
        repeats=sum(r["repeats"] for r in records),
        inner=max(r["inner"] for r in records),
        retaken=sum(r.get("retaken", 0) for r in records),
        disturbed=all(r.get("disturbed", False) for r in records),
        passes=len(records),
    )
    merged[rate_key] = merged[work_key] / merged["time_s"]
    return merged


def sweep(
    desc: str,
    points: Sequence[P],
    measure: Callable[[P], dict],
    *,
    label: Callable[[P], str],
    skip_record: Callable[[P, str], dict],
    errors: tuple[type[Exception], ...],
    device: str,
    cfg: TimingConfig,
    lockstep: Lockstep | None,
    progress: Progress,
    work_key: str,
    rate_key: str,
) -> tuple[list[dict], list[dict]]:
    """Measure every point ``cfg.passes`` times, pass after pass, and merge each point's records
    (merge_passes). A machine's speed drifts (other tenants of a shared host, other processes), and
    a slow spell of a few seconds would otherwise mark a run of consecutive points; passes spread each
    point's samples over the section. ``errors`` raised by ``measure`` (out of memory, unsupported)
    make the point a skip (returned as ``skip_record(point, reason)``) unless another pass measured it;
    with a lockstep only PointFailed, which every worker raises together, may do so. Returns
    (measurements, skipped) in the order of ``points``."""
    done: dict = {}
    failed: dict = {}
    passes = max(1, cfg.passes)
    with progress(desc, passes * len(points)) as bar:
        for _ in range(passes):
            for point in points:
                bar.set_postfix_str(label(point), refresh=False)
                if point not in failed:
                    try:
                        record = measure(point)
                    except errors as exc:
                        if lockstep is not None and not isinstance(exc, PointFailed):
                            raise  # one worker alone failed while timing: skipping would put it out of step
                        failed[point] = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                        if device == "cuda":
                            import_torch().cuda.empty_cache()
                    else:
                        done.setdefault(point, []).append(record)
                bar.update()
    measurements = [merge_passes(done[p], work_key, rate_key) for p in points if p in done]
    skipped = [skip_record(p, failed[p]) for p in points if p in failed and p not in done]
    return measurements, skipped
