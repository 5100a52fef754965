"""The GEMM shape model against public per-shape throughput (OpenXLA's default matmul table, copied in
tests/data/gemm_sweeps/): H100 bf16 and B200 bf16/fp8, shape by shape, at burst clocks as measured."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path
from statistics import median

import pytest

from sim.cost.roofline import RooflineCostModel
from sim.hardware.gpu import GPU_PRESETS
from sim.workload.ops import GEMM, Op

TABLE = Path(__file__).parent / "data" / "gemm_sweeps" / "xla_matmul_table.csv"
MIN_OUTPUT = 4096 * 1024  # b·m·n: shapes that fill the GPU's SMs at least a few times over


def _time_ratios(device: str, dtype: str, preset: str) -> dict[int, list[float]]:
    """Per K: simulated over measured time of each shape, the model's sustained clock taken back to the
    burst clock the table was measured at (as MAMF was)."""
    gpu = GPU_PRESETS[preset]
    cost = RooflineCostModel(gpu)
    assert cost.reference is not None
    out: dict[int, list[float]] = defaultdict(list)
    with TABLE.open() as fh:
        for row in csv.DictReader(fh):
            if row["device"] != device or row["dtype"] != dtype:
                continue
            b, m, n, k = (int(row[x]) for x in "bmnk")
            if b * m * n < MIN_OUTPUT:
                continue
            flops = 2.0 * b * m * n * k
            elem = 1 if dtype == "fp8" else 2
            op = Op(name="gemm", kind=GEMM, flops=flops, bytes=b * (elem * (m * k + k * n) + 2 * m * n),
                    dtype=dtype, m=m, n=n, k=k, batch=b)
            busy = (cost.op_time_s(op) - gpu.kernel_launch_s) * cost.reference.sustained_clock_ratio
            out[k].append((busy + gpu.kernel_launch_s) / (flops / (float(row["tflops"]) * 1e12)))
    return out


@pytest.mark.parametrize(("device", "dtype", "preset", "tolerance"), [
    ("sm_90", "bf16", "H100-SXM", 0.03),
    ("sm_100_B200", "bf16", "B200", 0.06),
    ("sm_100_B200", "fp8", "B200", 0.06),
])
def test_gemm_shape_model_follows_the_public_sweep(device, dtype, preset, tolerance):
    """For every K of the sweep (256 to 4096) the median simulated time of the shapes that fill the GPU is
    within ``tolerance`` of the measured one. The per-tile overhead fitted from the bf16 shapes holds for
    fp8 once counted in twice the K elements (same epilogue, mainloop twice as fast): with bf16's count the
    B200 fp8 shapes of K = 256 would run 20 % fast."""
    ratios = _time_ratios(device, dtype, preset)
    assert sorted(ratios) == [256, 512, 1024, 2048, 4096]
    for k, values in ratios.items():
        assert len(values) >= 20
        assert median(values) == pytest.approx(1.0, abs=tolerance), (k, median(values))
