"""Op: the unit of work the cost model prices. Workloads produce ops; they never price them."""

from __future__ import annotations

from dataclasses import dataclass

GEMM = "gemm"  # a (batched) matrix multiply; m, n, k set
ATTENTION = "attention"  # fused attention core (scores, softmax, context); flops and bytes set
ELEMENTWISE = "elementwise"  # memory-bound: norms, activations, dropout, residual adds, optimizer
FIXED = "fixed"  # a given duration (synthetic workloads): fixed_s set
OP_KINDS = (GEMM, ATTENTION, ELEMENTWISE, FIXED)


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel (or fused group) on one GPU.

    flops: floating-point operations; bytes: HBM traffic (reads + writes); dtype: compute precision.
    For GEMMs, (m, n, k) is the per-GPU shape and ``batch`` the number of such GEMMs (flops covers all).
    Fused attention keeps (m, n, k) = (queries, keys, head_dim) of one head and batch = b × heads; its
    ``flops`` follow the model-FLOP convention (4bs²h forward, twice that backward, mask not halved), and
    ``backward``/``causal`` tell the cost model what the kernel really executes, ``kernel`` which
    FlashAttention generation runs it.
    """

    name: str
    kind: str
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str = "bf16"
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    fixed_s: float = 0.0
    backward: bool = False
    causal: bool = False
    kernel: str = ""  # fused attention: the FlashAttention generation ("" = the GPU profile's own; "v1")


def gemm(name: str, m: int, n: int, k: int, dtype: str, batch: int = 1) -> Op:
    """A GEMM C[m,n] = A[m,k] @ B[k,n] (``batch`` times): 2mnk FLOPs, reads A and B, writes C."""
    from sim.units import DTYPE_BYTES

    e = DTYPE_BYTES[dtype]
    return Op(
        name=name,
        kind=GEMM,
        flops=2.0 * m * n * k * batch,
        bytes=float(e * (m * k + k * n + m * n) * batch),
        dtype=dtype,
        m=m,
        n=n,
        k=k,
        batch=batch,
    )


def elementwise(name: str, bytes_moved: float, dtype: str, flops: float = 0.0) -> Op:
    return Op(name=name, kind=ELEMENTWISE, flops=flops, bytes=float(bytes_moved), dtype=dtype)


def fixed(name: str, seconds: float) -> Op:
    return Op(name=name, kind=FIXED, fixed_s=float(seconds))
