"""Where a profile was measured: device, driver and library versions, relevant env, date, host, command.

A profile without this is unreproducible, so every run records it before measuring anything.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import socket
import subprocess
from typing import Any

from calibrate.launch import usable_cores
from calibrate.timing import import_torch

ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "CUDA_", "CUBLAS", "NVIDIA_TF32", "OMP_", "MKL_", "KMP_")
ENV_EXCLUDE = ("CUDA_HOME", "CUDA_PATH")


def cpu_model() -> str:
    """The CPU model string from /proc/cpuinfo (falls back to platform data off Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def relevant_env() -> dict[str, str]:
    """Environment variables that change kernel or collective performance."""
    return {
        k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) and k not in ENV_EXCLUDE
    }


def _nvidia_driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def _nccl_version(torch: Any) -> str | None:
    if not torch.distributed.is_nccl_available():
        return None
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def collect_metadata(device: str, device_count: int, argv: list[str]) -> dict:
    """Everything needed to know what a profile describes (torch imported here, not at module load)."""
    torch = import_torch()
    from sim import __version__ as dtsim_version

    md: dict = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "command_line": " ".join(["dtsim", "calibrate", *argv]),
        "dtsim_version": dtsim_version,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "device_count": device_count,
        "env": relevant_env(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        md.update(
            device_name=torch.cuda.get_device_name(0),
            gpu_names=[torch.cuda.get_device_name(i) for i in range(device_count)],
            gpu_memory_bytes=int(props.total_memory),
            gpu_capability=list(torch.cuda.get_device_capability(0)),
            gpu_sm_count=int(props.multi_processor_count),
            cuda_version=torch.version.cuda,
            cudnn_version=torch.backends.cudnn.version(),
            nccl_version=_nccl_version(torch),
            driver_version=_nvidia_driver(),
        )
    else:
        md.update(device_name=md["cpu_model"], gloo_available=torch.distributed.is_gloo_available())
    return md
