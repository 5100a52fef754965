"""GPU specifications: datasheet peaks plus the efficiency real kernels reach.

Peaks are NVIDIA datasheet figures (dense, no sparsity). Efficiencies are what large, well-shaped
kernels reach in public cuBLAS / FlashAttention / STREAM-style measurements; they are ceilings for the
roofline cost model, which adds wave quantisation and launch overhead on top. Memory capacity is what one
training process can allocate, from the device totals CUDA reports (``CUDA_TOTAL_GiB``), not the
datasheet's round figure.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sim.hardware.nccl import CommCTAs
from sim.units import GB, PRECISIONS, TFLOPS, US, GiB

# What a training process can allocate on each preset GPU. An "80 GB" part holds 80 GiB of HBM; CUDA reports
# a little less as the device's total (cudaMemGetInfo, which PyTorch's out-of-memory message prints as the
# "total capacity"; the driver keeps the rest), and of that the process itself holds some outside PyTorch's
# caching allocator: the CUDA context, the cuBLAS/cuDNN handles and NCCL's buffers. Totals as public
# out-of-memory messages print them (recent drivers; older ones reported 0.1-0.2 GiB more):
CUDA_TOTAL_GiB = {
    "V100": 31.74,  # V100 32GB: liucongg/ChatGLM-Finetuning issue #73 ("31.74 GiB total capacity")
    "A100-40GB": 39.50,  # TianheWu/CoSeR issue #10, one A100 40GB ("a total capacity of 39.50 GiB")
    "A100-80GB": 79.14,  # lianqi1008/Control-GIC issue #6, A100 80GB ("a total capacity of 79.14 GiB")
    "H100-SXM": 79.11,  # vllm-project/vllm issue #27508, H100 80GB ("a total capacity of 79.11 GiB")
    # H200: NVML's 143,771 MiB (Modal, "Why does an NVIDIA H100 80GB card offer 85.52 GB?",
    # thundergolfer.com/blog/nvidia-gpu-memory-capacity) less the 0.54 GiB the driver keeps on an H100
    # (the same table's 81,559 MiB against CUDA's 79.11 GiB)
    "H200": 139.86,
    "B200": 178.35,  # pytorch/ao pull request #4002: cudaGetDeviceProperties' total global memory on a B200
}
# Held outside PyTorch's allocator by one process of a multi-GPU training job (CUDA context, library
# handles, NCCL): the out-of-memory messages that give both print it as the process's memory in use less
# what PyTorch allocated and reserved: 54.99 − 40.00 − 13.91 = 1.08 GiB on 4 H100 (aqlaboratory/openfold
# issue #481), 37.46 − 36.04 − 0.32 = 1.10 GiB on 4 A100 40GB (awslabs/keys_values issue #92).
PROCESS_RESERVED_GiB = 1.1


def usable_memory_GB(preset: str) -> float:
    """GB (1e9 bytes) one training process can allocate on the preset GPU ``preset`` (see CUDA_TOTAL_GiB)."""
    return round((CUDA_TOTAL_GiB[preset] - PROCESS_RESERVED_GiB) * GiB / GB, 2)


class GPUSpec(BaseModel):
    """One GPU model. Inline mappings in a scenario use the same fields (TFLOP/s, GB, GB/s)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    name: str = "custom"
    peak_tflops: dict[str, float] = Field(description="dense peak TFLOP/s per dtype (fp32, tf32, fp16, bf16, fp8)")
    memory_GB: float = Field(gt=0, description="memory one training process can allocate, GB (1e9 bytes): for "
                             "the presets the device total CUDA reports less what the process holds outside "
                             "PyTorch's allocator (usable_memory_GB)")
    memory_bandwidth_GBps: float = Field(gt=0, description="HBM bandwidth, GB/s")
    sm_count: int = Field(108, gt=0, description="streaming multiprocessors (wave quantisation)")
    gemm_efficiency: float = Field(0.8, gt=0, le=1, description="fraction of peak a large GEMM reaches")
    attention_efficiency: float = Field(0.6, gt=0, le=1, description="fraction of peak fused attention reaches")
    memory_efficiency: float = Field(0.85, gt=0, le=1, description="fraction of HBM bandwidth streaming kernels reach")
    kernel_launch_us: float = Field(4.0, ge=0, description="fixed per-kernel overhead, µs")
    comm_sms: int = Field(
        16, ge=0, description="SMs (one NCCL CTA per channel) a collective's kernel holds while a ring runs "
        "through the NICs with several GPUs per node — 16 on DGX A100/H100 (NCCL 2.16-2.21: 8 rings, "
        "doubled when connected; NVIDIA/nccl-tests#319 logs '16 coll channels' on two HGX H100) — and in "
        "any case below without a figure: compute that overlaps communication runs on the rest")
    nccl_ctas_nvlink: int | None = Field(
        None, ge=0, description="the same for a collective inside one NVSwitch node (A100: 6 rings at "
        "40 GB/s over 12 links, doubled twice: 24, NVIDIA/nccl-tests#100 logs 'Channel 23/24' on HGX "
        "A100; H100/H200 (NCCL >= 2.16): 24, an AWS p5 log shows '24 coll channels')")
    nccl_ctas_nvls: int | None = Field(
        None, ge=0, description="the same for NVLink SHARP (NCCL_NVLS_NCHANNELS, default 16 since NCCL "
        "2.17, transport/nvls.cc)")
    nccl_ctas_one_per_node: int | None = Field(
        None, ge=0, description="the same for a ring with one rank per node (one ring NIC to NIC, "
        "doubled when connected: 2 on A100; 4 on H100/H200 where the search also duplicates it)")
    nvlink: str | None = Field(None, description="default intra-node link preset")
    price_per_gpu_hour: float = Field(2.0, ge=0, description="USD per GPU-hour (editable)")
    power_W: float = Field(400.0, ge=0, description="board power under load, W")

    @field_validator("peak_tflops")
    @classmethod
    def _known_dtypes(cls, peaks: dict[str, float]) -> dict[str, float]:
        unknown = [k for k in peaks if k not in PRECISIONS]
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not a dtype; use {', '.join(PRECISIONS)}")
        if not peaks:
            raise ValueError(f"give at least one dtype's peak ({', '.join(PRECISIONS)})")
        bad = [k for k, v in peaks.items() if not v > 0]
        if bad:
            raise ValueError(f"{bad[0]}: {peaks[bad[0]]!r} must be > 0")
        return peaks

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; tf32 falls back to fp32 on GPUs without tensor-float32."""
        if dtype in self.peak_tflops:
            return self.peak_tflops[dtype] * TFLOPS
        if dtype == "tf32" and "fp32" in self.peak_tflops:
            return self.peak_tflops["fp32"] * TFLOPS
        raise KeyError(dtype)

    def peak_16bit_flops(self) -> float | None:
        """The dense bf16 (else fp16) peak: what public kernel figures and MFU are stated against; None
        for a GPU with neither."""
        for dtype in ("bf16", "fp16"):
            if dtype in self.peak_tflops:
                return self.peak_flops(dtype)
        return None

    @property
    def memory_bytes(self) -> float:
        return self.memory_GB * GB

    @property
    def memory_bw_Bps(self) -> float:
        return self.memory_bandwidth_GBps * GB

    @property
    def kernel_launch_s(self) -> float:
        return self.kernel_launch_us * US

    def nccl_ctas(self) -> CommCTAs:
        """The SMs a collective's NCCL kernel holds here, by where its ranks are (sim.hardware.nccl)."""
        return CommCTAs(self.sm_count, self.comm_sms, self.nccl_ctas_nvlink, self.nccl_ctas_nvls,
                        self.nccl_ctas_one_per_node)


GPU_PRESETS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec(
            name="V100",
            peak_tflops={"fp32": 15.7, "fp16": 125.0},
            memory_GB=usable_memory_GB("V100"),  # datasheet: 32 GB
            memory_bandwidth_GBps=900,
            sm_count=80,
            gemm_efficiency=0.80,
            attention_efficiency=0.45,
            memory_efficiency=0.85,
            nvlink="nvlink2",
            price_per_gpu_hour=1.50,
            power_W=300,
        ),
        GPUSpec(
            name="A100-40GB",
            peak_tflops={"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
            memory_GB=usable_memory_GB("A100-40GB"),  # datasheet: 40 GB
            memory_bandwidth_GBps=1555,
            sm_count=108,
            gemm_efficiency=0.80,
            attention_efficiency=0.65,
            memory_efficiency=0.85,
            nvlink="nvlink3",
            price_per_gpu_hour=1.80,
            power_W=400,
            nccl_ctas_nvlink=24, nccl_ctas_one_per_node=2,
        ),
        GPUSpec(
            name="A100-80GB",
            peak_tflops={"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
            memory_GB=usable_memory_GB("A100-80GB"),  # datasheet: 80 GB
            memory_bandwidth_GBps=2039,
            sm_count=108,
            gemm_efficiency=0.80,
            attention_efficiency=0.65,
            memory_efficiency=0.85,
            nvlink="nvlink3",
            price_per_gpu_hour=2.20,
            power_W=400,
            nccl_ctas_nvlink=24, nccl_ctas_one_per_node=2,
        ),
        GPUSpec(
            name="H100-SXM",
            peak_tflops={"fp32": 67.0, "tf32": 495.0, "fp16": 989.0, "bf16": 989.0, "fp8": 1979.0},
            memory_GB=usable_memory_GB("H100-SXM"),  # datasheet: 80 GB
            memory_bandwidth_GBps=3350,
            sm_count=132,
            gemm_efficiency=0.72,
            attention_efficiency=0.50,
            memory_efficiency=0.85,
            nvlink="nvlink4",
            price_per_gpu_hour=3.00,
            power_W=700,
            nccl_ctas_nvlink=24, nccl_ctas_nvls=16, nccl_ctas_one_per_node=4,
        ),
        GPUSpec(
            name="H200",
            peak_tflops={"fp32": 67.0, "tf32": 495.0, "fp16": 989.0, "bf16": 989.0, "fp8": 1979.0},
            memory_GB=usable_memory_GB("H200"),  # datasheet: 141 GB
            memory_bandwidth_GBps=4800,
            sm_count=132,
            gemm_efficiency=0.72,
            attention_efficiency=0.50,
            memory_efficiency=0.85,
            nvlink="nvlink4",
            price_per_gpu_hour=3.80,
            power_W=700,
            nccl_ctas_nvlink=24, nccl_ctas_nvls=16, nccl_ctas_one_per_node=4,
        ),
        GPUSpec(
            name="B200",
            peak_tflops={"fp32": 75.0, "tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0},
            memory_GB=usable_memory_GB("B200"),  # datasheet: 180 GB
            memory_bandwidth_GBps=7700,
            sm_count=148,
            gemm_efficiency=0.70,
            attention_efficiency=0.50,
            memory_efficiency=0.85,
            nvlink="nvlink5",
            price_per_gpu_hour=5.50,
            power_W=1000,
            nccl_ctas_nvlink=32, nccl_ctas_nvls=24,  # NCCL >= 2.25: 8 rings at 90 GB/s doubled twice; NVLS_NCHANNELS_SM100_NVL
        ),
    ]
}
GPU_ALIASES = {"H100": "H100-SXM", "A100": "A100-80GB", "H200-SXM": "H200"}
