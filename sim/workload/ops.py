"""Op: the unit of work the cost model prices. Workloads produce ops; they never price them."""

from __future__ import annotations

from dataclasses import dataclass

GEMM = "gemm"  # a (batched) matrix multiply; m, n, k set
ATTENTION = "attention"  # fused attention core (scores, softmax, context); flops and bytes set
ELEMENTWISE = "elementwise"  # memory-bound: norms, activations, dropout, residual adds, optimizer
FIXED = "fixed"  # a given duration (synthetic workloads): fixed_s set
OP_KINDS = (GEMM, ATTENTION, ELEMENTWISE, FIXED)

# Families of memory-bound kernels. Real kernels of the same bytes reach very different shares of HBM
# bandwidth: a copy or an add streams, a norm reduces each row (its backward also reduces over rows for
# the weight gradients), a softmax reads each row twice or keeps it in registers, a dropout draws random
# numbers. The cost model prices each family at its own achieved bandwidth (the reference profile's
# public figures, or a calibration profile's measured curve); "" is a streaming kernel.
STREAM = ""
NORM = "norm"  # LayerNorm/RMSNorm of a framework (apex's affine kernels, torch.nn.functional.layer_norm)
NORM_BWD = "norm.bwd"
PERSISTENT_NORM = "persistent_norm"  # row kept in registers (apex contrib FastLayerNorm, Transformer Engine)
PERSISTENT_NORM_BWD = "persistent_norm.bwd"
SOFTMAX = "softmax"  # softmax over rows (the attention scores), fused with scale and mask where the stack did
SOFTMAX_BWD = "softmax.bwd"
DROPOUT = "dropout"  # dropout, alone or fused with bias and residual add (random numbers drawn per element)
SOFTMAX_TORCH = "softmax.torch"  # torch's own (multi-pass) softmax: the unfused fallback of SOFTMAX
SOFTMAX_TORCH_BWD = "softmax.torch.bwd"
MEMORY_FAMILIES = (NORM, NORM_BWD, PERSISTENT_NORM, PERSISTENT_NORM_BWD, SOFTMAX, SOFTMAX_BWD, DROPOUT, SOFTMAX_TORCH,
                   SOFTMAX_TORCH_BWD)
# Families whose kernel `dtsim calibrate` times under another family's name: it measures torch's own
# softmax (calibrate.membw), which prices the fused softmax in a measured profile and is exactly the
# unfused fallback's kernel.
MEASURED_AS = {SOFTMAX_TORCH: SOFTMAX, SOFTMAX_TORCH_BWD: SOFTMAX_BWD}


# ``Op.kernel`` of a fused attention run by Transformer Engine: whatever kernel TE selects on the GPU (its
# profile's ``flash_attention_te`` fit, else the profile's own kernel).
TE_ATTENTION = "te"


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
    kernel: str = ""  # fused attention: its generation ("" = the GPU profile's own; "v1", "v2"; TE_ATTENTION)
    family: str = STREAM  # memory-bound ops: the kernel family (MEMORY_FAMILIES) that sets its bandwidth


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


def elementwise(name: str, bytes_moved: float, dtype: str, flops: float = 0.0, family: str = STREAM) -> Op:
    """A memory-bound kernel moving ``bytes_moved``; ``family`` says what kind of kernel moves them."""
    return Op(name=name, kind=ELEMENTWISE, flops=flops, bytes=float(bytes_moved), dtype=dtype, family=family)


def fixed(name: str, seconds: float) -> Op:
    return Op(name=name, kind=FIXED, fixed_s=float(seconds))
