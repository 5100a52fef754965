"""What a calibration run measures: shapes, sizes, dtypes and timing effort, per device and mode.

Kept as plain data so the CLI, the tests (with a tiny sweep) and the report all read the same sweep.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sim.units import KiB, MiB
from sim.workload.ops import MEASURED_AS, MEMORY_FAMILIES

GEMM = "gemm"
MEMORY = "memory"
COLLECTIVES = "collectives"
SECTIONS = (GEMM, MEMORY, COLLECTIVES)

COLLECTIVE_OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "send_recv")
MEMBW_STREAMING = ("copy", "add", "mul", "gelu")  # the generic elementwise curve
# Memory-bound kernel families the simulator prices by their own curves (bytes: calibrate.membw.family_bytes):
# its families but the persistent norms, which need apex or Transformer Engine (the reference figures serve).
# Not the families timed under another's name (MEASURED_AS: torch's softmax is the "softmax" kernel here).
MEMBW_FAMILIES = tuple(f for f in MEMORY_FAMILIES if not f.startswith("persistent") and f not in MEASURED_AS)
MEMBW_KERNELS = MEMBW_STREAMING + MEMBW_FAMILIES

Shape = tuple[int, int, int]


@dataclass(frozen=True)
class TimingConfig:
    """How hard to time one kernel: warm-up calls, timed repeats (median taken), batch length."""

    warmup: int = 3
    repeats: int = 7
    min_batch_s: float = 0.002  # calls are batched until one timed sample lasts this long
    max_inner: int = 200  # upper bound on calls per timed sample
    rotate_bytes: int = 256 * MiB  # rotate input buffers until they span this many bytes (beats caches)
    max_buffers: int = 256
    passes: int = 1  # sweeps over all points; a point's figure is the median of its passes (timing.sweep)
    # On CPU a sample in which the timing thread ran less than this share of the wall time was slowed by
    # other processes (a shared machine); it is retaken, up to ``retakes`` extra samples per point.
    cpu_share_min: float = 0.9
    retakes: int = 5
    # CPU kernel workers (calibrate.kernels) must connect within the first and report each point within the
    # second; one point of the full sweep (a 4096³ GEMM on a CPU without fast bf16) can take minutes.
    startup_timeout_s: float = 180.0
    point_timeout_s: float = 900.0


@dataclass(frozen=True)
class CollectiveConfig:
    """Collective sweep: sizes (bytes of the full buffer, nccl-tests convention) and timing effort."""

    ops: tuple[str, ...] = COLLECTIVE_OPS
    sizes_bytes: tuple[int, ...] = ()
    warmup: int = 3
    repeats: int = 5
    target_bytes: int = (
        64 * MiB
    )  # iterations per sample ≈ target_bytes / size (nccl-tests style back-to-back)
    max_iters: int = 20
    group_sizes: tuple[int, ...] | None = None  # None: powers of two up to the world size, plus the world
    startup_timeout_s: float = 180.0  # workers must connect within this
    stall_timeout_s: float = 300.0  # no progress for this long ends the run


@dataclass(frozen=True)
class SweepConfig:
    """Everything one run measures. ``name`` is recorded in the profile (full / quick / tiny)."""

    name: str
    gemm_shapes: tuple[Shape, ...]
    gemm_dtypes: tuple[str, ...]
    membw_sizes_bytes: tuple[int, ...]
    membw_dtypes: tuple[str, ...]
    membw_kernels: tuple[str, ...] = MEMBW_KERNELS
    # Sizes for the kernel families (MEMBW_FAMILIES); None: ``membw_sizes_bytes``.
    membw_family_sizes_bytes: tuple[int, ...] | None = None
    timing: TimingConfig = field(default_factory=TimingConfig)
    collectives: CollectiveConfig = field(default_factory=CollectiveConfig)
    # Points a speed probe left out (calibrate.probe), each {"dtype", "m", "n", "k", "reason"} or
    # {"dtype", "reason"}: reported with the section's skips, so the profile says what was not measured.
    gemm_skipped: tuple[dict, ...] = ()
    # Memory points the sweep leaves out by design, each {"kernel", "reason"} or {"kernel", "dtype",
    # "size_bytes", "reason"}: reported with the memory section's skips, like ``gemm_skipped``.
    membw_skipped: tuple[dict, ...] = ()
    probe: dict = field(default_factory=dict)  # what the probe measured (GEMM FLOP/s per dtype), for the record

    def membw_sizes_for(self, kernel: str) -> tuple[int, ...]:
        """The sizes (bytes of one operand) the memory section measures ``kernel`` at."""
        if kernel in MEMBW_FAMILIES and self.membw_family_sizes_bytes is not None:
            return self.membw_family_sizes_bytes
        return self.membw_sizes_bytes

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SweepConfig:
        """Inverse of ``as_dict`` (after a JSON round trip: lists back to tuples)."""

        def tup(v: Any) -> Any:
            return tuple(tup(x) for x in v) if isinstance(v, list) else v

        fields = {k: tup(v) for k, v in d.items() if k not in ("timing", "collectives")}
        return cls(
            **fields,
            timing=TimingConfig(**d["timing"]),
            collectives=CollectiveConfig(**{k: tup(v) for k, v in d["collectives"].items()}),
        )


def transformer_gemm_shapes(
    hiddens: tuple[int, ...], tokens: tuple[int, ...], vocab: int | None
) -> list[Shape]:
    """(m, n, k) of a transformer layer's GEMMs: forward, input-gradient and weight-gradient passes.

    C[m,n] = A[m,k] @ B[k,n]. For a linear layer y = x W (x: tokens × d_in, W: d_in × d_out):
    forward (T, d_out, d_in); input grad (T, d_in, d_out); weight grad (d_in, d_out, T).
    """
    shapes: list[Shape] = []
    for h in hiddens:
        linears = [(h, 3 * h), (h, h), (h, 4 * h), (4 * h, h)]  # QKV, out-proj, MLP up, MLP down
        if vocab:
            linears.append((h, vocab))
        for t in tokens:
            for d_in, d_out in linears:
                shapes += [(t, d_out, d_in), (t, d_in, d_out), (d_in, d_out, t)]
    return shapes


def grid_gemm_shapes(values: tuple[int, ...]) -> list[Shape]:
    """A regular grid over m, n, k so off-transformer shapes interpolate too."""
    return [(m, n, k) for m in values for n in values for k in values]


def skinny_gemm_shapes(ms: tuple[int, ...], nks: tuple[int, ...]) -> list[Shape]:
    """Small-batch linear layers: (m, n, k) with few rows, and their weight gradients (n, k, m)."""
    shapes = []
    for m in ms:
        for n in nks:
            for k in nks:
                shapes += [(m, n, k), (n, k, m)]
    return shapes


def _unique(shapes: list[Shape]) -> tuple[Shape, ...]:
    return tuple(sorted(set(shapes), key=lambda s: (s[0] * s[1] * s[2], s)))


def _pow2_sizes(lo: int, hi: int, step: int) -> tuple[int, ...]:
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= step
    return tuple(sizes)


def _sizes_left_out(
    kernels: tuple[str, ...],
    dtypes: tuple[str, ...],
    sizes: tuple[int, ...],
    kept: tuple[int, ...],
    reason: str,
) -> tuple[dict, ...]:
    """Skip records for the (kernel, dtype, size) points of ``sizes`` not in ``kept``."""
    return tuple(
        {"kernel": k, "dtype": d, "size_bytes": s, "reason": reason}
        for d in dtypes
        for k in kernels
        for s in sizes
        if s not in kept
    )


def make_config(device: str, quick: bool) -> SweepConfig:
    """The sweep for ``device`` ('cuda' or 'cpu'); ``quick`` keeps it to a couple of minutes."""
    if device == "cuda":
        if quick:
            shapes = (
                transformer_gemm_shapes((2048, 8192), (4096,), None)
                + grid_gemm_shapes((256, 2048, 8192))
                + skinny_gemm_shapes((16, 64), (1024, 8192))
            )
            return SweepConfig(
                name="quick",
                gemm_shapes=_unique(shapes),
                gemm_dtypes=("fp32", "tf32", "bf16", "fp16", "fp8"),
                membw_sizes_bytes=_pow2_sizes(256 * KiB, 1024 * MiB, 16),
                membw_dtypes=("bf16",),
                timing=TimingConfig(warmup=2, repeats=5, min_batch_s=0.001, max_inner=100),
                collectives=CollectiveConfig(
                    sizes_bytes=_pow2_sizes(KiB, 1024 * MiB, 8), warmup=2, repeats=3
                ),
            )
        shapes = (
            transformer_gemm_shapes((1024, 2048, 4096, 8192, 12288), (2048, 8192), 50304)
            + grid_gemm_shapes((128, 512, 2048, 8192))
            + skinny_gemm_shapes((8, 32), (1024, 4096, 16384))
            + [(s, s, s) for s in (64, 256, 1024, 4096, 16384)]
        )
        return SweepConfig(
            name="full",
            gemm_shapes=_unique(shapes),
            gemm_dtypes=("fp32", "tf32", "bf16", "fp16", "fp8"),
            membw_sizes_bytes=_pow2_sizes(64 * KiB, 2048 * MiB, 4),
            membw_dtypes=("fp32", "bf16"),
            collectives=CollectiveConfig(sizes_bytes=_pow2_sizes(KiB, 1024 * MiB, 2)),
        )
    if device != "cpu":
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if quick:
        # Small-batch layers up to 2048 wide (as in the full sweep), with 16, 32 and 128 rows: the shapes of
        # `dtsim validate`'s CPU jobs (default: 2048-wide layers, micro-batches of 128 or 32; --quick:
        # 1024-wide, 64 or 16), so validation checks the concurrency and composition of a step rather than
        # the interpolation between shapes, or an extrapolation below the fewest rows measured (FLOP/s
        # changes steeply with few rows: 16 → 128 rows is 31 → 84 GFLOP/s on the 2-core EPYC VM).
        shapes = (
            transformer_gemm_shapes((256, 768), (512,), None)
            + grid_gemm_shapes((64, 256, 1024))
            + skinny_gemm_shapes((16, 32, 128), (256, 1024, 2048))
        )
        membw_sizes, family_sizes = _pow2_sizes(64 * KiB, 64 * MiB, 4), (MiB,)
        return SweepConfig(
            name="quick",
            gemm_shapes=_unique(shapes),
            gemm_dtypes=("fp32", "bf16"),
            membw_sizes_bytes=membw_sizes,
            membw_dtypes=("fp32",),
            # The kernel families at one size (+1 s): at all six they took the memory section from 5.5 to
            # 40 s on the 2-core EPYC VM with other processes running (dropout runs at 0.6 GB/s there, 0.35 s
            # a call at 64 MiB; above 32 MiB every op-allocated output is freshly mapped, page faults included).
            membw_family_sizes_bytes=family_sizes,
            membw_skipped=_sizes_left_out(
                MEMBW_FAMILIES,
                ("fp32",),
                membw_sizes,
                family_sizes,
                "--quick on CPU measures the kernel families at 1 MiB only; the full sweep measures every size",
            ),
            # Up to three passes of 2 samples: a shared VM's speed drifts for seconds at a time (by up to
            # 1.6× on the 2-core EPYC VM); the median of three passes ignores one slow spell (timing.sweep).
            # calibrate.probe lowers the passes (then the shapes) to what this CPU measures in its budget,
            # and two retakes per point bound what a busy machine can add (five took 614 retakes and 119 s
            # for this GEMM section on the 2-core VM with other processes running).
            timing=TimingConfig(
                warmup=2, repeats=2, passes=3, min_batch_s=0.002, max_inner=20, rotate_bytes=64 * MiB, retakes=2
            ),
            # Up to 16 MiB, 1 warm-up and 3 samples: a gloo all-reduce of 64 MiB alone took 0.62 s per call
            # on the 2-core VM (27 s for the section with 64 MiB, 3 + 5 samples); 8 sizes still pin α and B.
            collectives=CollectiveConfig(
                sizes_bytes=_pow2_sizes(KiB, 16 * MiB, 4), warmup=1, repeats=3, target_bytes=8 * MiB
            ),
        )
    shapes = (
        transformer_gemm_shapes((512, 1024, 2048), (512, 2048), None)
        + grid_gemm_shapes((64, 256, 1024, 2048))
        + skinny_gemm_shapes((8, 32), (256, 1024, 2048))
        + [(s, s, s) for s in (32, 128, 512, 4096)]
    )
    return SweepConfig(
        name="full",
        gemm_shapes=_unique(shapes),
        gemm_dtypes=("fp32", "bf16"),
        membw_sizes_bytes=_pow2_sizes(16 * KiB, 256 * MiB, 4),
        membw_dtypes=("fp32", "bf16"),
        timing=TimingConfig(
            warmup=2, repeats=2, passes=3, min_batch_s=0.005, max_inner=50, rotate_bytes=128 * MiB
        ),
        collectives=CollectiveConfig(sizes_bytes=_pow2_sizes(KiB, 256 * MiB, 2), target_bytes=16 * MiB),
    )


def tiny_config(device: str = "cpu") -> SweepConfig:
    """A few-second sweep for tests: same code paths, fewer and smaller points."""
    return SweepConfig(
        name="tiny",
        gemm_shapes=_unique(grid_gemm_shapes((32, 128)) + [(256, 256, 256)]),
        gemm_dtypes=("fp32", "bf16") if device == "cpu" else ("fp32", "tf32", "bf16"),
        membw_sizes_bytes=(16 * KiB, 256 * KiB, 4 * MiB),
        membw_dtypes=("fp32",),
        membw_kernels=("copy", "add"),
        timing=TimingConfig(
            warmup=1,
            repeats=2 if device == "cpu" else 3,
            passes=2 if device == "cpu" else 1,
            min_batch_s=0.0005,
            max_inner=10,
            rotate_bytes=8 * MiB,
            point_timeout_s=60.0,
        ),
        collectives=CollectiveConfig(
            ops=COLLECTIVE_OPS,
            sizes_bytes=(KiB, 16 * KiB, 256 * KiB, 4 * MiB),
            warmup=1,
            repeats=3,
            target_bytes=MiB,
            max_iters=5,
            startup_timeout_s=120.0,
            stall_timeout_s=60.0,
        ),
    )


def group_sizes_for(world: int, requested: tuple[int, ...] | None) -> tuple[int, ...]:
    """Group sizes to measure: powers of two from 2 up to ``world``, plus ``world`` itself."""
    if requested is not None:
        return tuple(sorted({g for g in requested if 2 <= g <= world}))
    sizes, g = [], 2
    while g <= world:
        sizes.append(g)
        g *= 2
    if world >= 2 and world not in sizes:
        sizes.append(world)
    return tuple(sizes)
