"""The validation jobs of `dtsim validate`: one spec builds both the torch job and the simulated scenario."""

from __future__ import annotations

from dataclasses import dataclass

from sim.api import run_scenario_dict

JOBS = ("single", "ddp", "pipeline")
DDP_BUCKET_MB = 25.0  # torch DDP's default bucket_cap_mb, and the scenario's parallel.bucket_MB


@dataclass(frozen=True)
class ValidationJob:
    """One real-vs-simulated comparison; the same numbers build the torch job and the scenario."""

    name: str
    dp: int
    pp: int
    widths: tuple[int, ...]
    micro_batch: int
    microbatches: int  # per replica per step
    dtype: str  # fp32 | tf32
    steps: int
    warmup: int
    replicas: int = 1  # independent copies run at once (single on CPU: the profile's loaded machine)

    @property
    def world(self) -> int:
        """Devices of one copy of the job (what the simulator runs)."""
        return self.dp * self.pp

    @property
    def processes(self) -> int:
        """Worker processes of the real run: every copy's devices."""
        return self.world * self.replicas

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.microbatches * self.dp


def jobs_for(
    device: str,
    world: int,
    quick: bool,
    steps: int | None,
    only: tuple[str, ...],
    widths: tuple[int, ...] | None = None,
    micro_batch: int | None = None,
) -> list[ValidationJob]:
    """The jobs to run. Default sizes per device: CPU small, GPU large enough to be compute-bound.
    The pipeline job splits the same batch into 4 micro-batches; ddp and pipeline need 2 devices. On CPU
    the single job runs ``world`` copies at once (a CPU profile describes one device of a fully loaded
    machine; GPUs do not share, so there it runs alone)."""
    if device == "cuda":
        default = ((4096,) * 5, 1024, "tf32") if quick else ((8192,) * 9, 2048, "tf32")
    else:
        default = ((1024,) * 5, 64, "fp32") if quick else ((2048,) * 5, 128, "fp32")
    w, mb, dtype = widths or default[0], micro_batch or default[1], default[2]
    n = steps or (5 if quick else 10)
    warm = 2 if quick else 3
    jobs = {
        "single": ValidationJob("single", 1, 1, w, mb, 1, dtype, n, warm, world if device == "cpu" else 1),
        "ddp": ValidationJob("ddp", world, 1, w, mb, 1, dtype, n, warm),
        "pipeline": ValidationJob("pipeline", 1, 2, w, max(1, mb // 4), 4, dtype, n, warm),
    }
    runnable = {name for name, job in jobs.items() if name == "single" or 2 <= job.world <= world}
    return [jobs[name] for name in only if name in runnable]


# --------------------------------------------------------------------------------------------- simulated


def scenario_for(job: ValidationJob, profile: dict, profile_path: str) -> dict:
    """The scenario mapping of ``job`` on the profiled device (hardware figures from the profile).

    On a CPU whose cores all run a compute thread, gloo's communication threads have no core of their
    own, so the all-reduce cannot overlap the backward pass; the scenario then sets overlap_grad_sync off.
    """
    fits, md, run = profile["fits"], profile["metadata"], profile["run"]
    gpu = {
        "name": f"profiled-{run.get('device')}",
        "peak_tflops": {dtype: t["max_flops_per_s"] / 1e12 for dtype, t in fits.get("gemm", {}).items()}
        or {"fp32": 1.0},
        "memory_GB": (md.get("gpu_memory_bytes") or 64e9) / 1e9,
        "memory_bandwidth_GBps": (fits.get("memory") or {}).get("max_bytes_per_s", 100e9) / 1e9,
        "kernel_launch_us": 0.0,  # measured times already include launch costs
    }
    cluster: dict = {"nodes": 1, "gpus_per_node": job.world, "gpu": gpu}
    links = [f for f in fits.get("collectives", []) if f["op"] == "all_reduce" and f.get("bandwidth_Bps")]
    if links:
        link = links[0]
        cluster["intra_node"] = {
            "name": "profiled",
            "bandwidth_GBps": link["bandwidth_Bps"] / 1e9,
            "latency_us": link["alpha_s"] * 1e6,
        }
    threads = run.get("threads_per_device") or 1
    cores_busy = run.get("device") == "cpu" and threads * job.processes >= (
        md.get("usable_cores") or md.get("cpu_count") or 1
    )
    widths = zip(job.widths[:-1], job.widths[1:], strict=True)
    layers = [
        {
            "name": f"fc{i}",
            "params": a * b + b,
            "forward_flops": 2.0 * a * b,
            "activation_bytes": 2.0 * (a + b),
            "in_features": a,
            "out_features": b,
        }
        for i, (a, b) in enumerate(widths)
    ]
    parallel = {
        "data": job.dp,
        "tensor": 1,
        "pipeline": job.pp,
        "schedule": "1f1b",
        "bucket_MB": DDP_BUCKET_MB,
    }
    training = {"global_batch": job.global_batch, "micro_batch": job.micro_batch, "precision": job.dtype}
    return {
        "name": f"validate-{job.name}",
        "cluster": cluster,
        "model": {"kind": "layers", "layers": layers},
        "parallel": {**parallel, "overlap_grad_sync": not cores_busy},
        "training": {**training, "optimizer": "adam"},
        "calibration": profile_path,
    }


def simulate_job(job: ValidationJob, profile: dict, profile_path: str) -> tuple[dict, dict]:
    """(scenario, summary) of the simulated job."""
    scenario = scenario_for(job, profile, profile_path)
    return scenario, run_scenario_dict(scenario, calibration=profile_path)
