"""Speed of the commands users run, end to end, each beside the raw SimPy event rate of the same moment.

Times whole processes (`python -m sim …`, what `dtsim …` runs) from start to exit, with every default
output — the README's main job `run scenarios/gpt3-175b-1024xa100-hdr.yaml` (charts, timeline.csv,
trace.json, report.html), the 16,384-GPU Llama-3 405B job, a 13B model on one 8-GPU node (TP 8),
`plan` of the main job, `calibrate --quick`
on the CPU (when torch is installed) — and, for the two runs, the same command with `--no-charts
--no-trace` and the in-process simulate() time it prints, so the cost of the outputs shows as a ratio.

Wall times on a shared machine move with its load; so each case is printed with the raw SimPy rate
(events/s of a bare SimPy loop) measured right before it, and with the product "command seconds × raw
events/s" (≈ how many bare SimPy events the command is worth): that figure survives a busy machine far
better than seconds do. Also printed: CPU seconds (user + sys of the child), which a busy machine inflates
far less than wall time.

Run: python benchmarks/command_speed.py [--repeat 3] [--only run,llama,node,plan,calibrate]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.engine_speed import raw_simpy_events_per_s  # noqa: E402

MAIN = "scenarios/gpt3-175b-1024xa100-hdr.yaml"
LLAMA = "scenarios/llama3-405b-16384xh100.yaml"
NODE = ["--set", "model=gpt3-13b", "--set", "cluster.nodes=1", "--set", "parallel.data=1", "--set", "parallel.pipeline=1",
        "--set", "training.global_batch=8", "--set", "training.kernels=megatron-lm-2021"]


def _cases(out: Path) -> dict[str, list[tuple[str, list[str]]]]:
    return {
        "run": [
            ("run 175B/1,024 GPUs, default outputs", ["run", MAIN, "--out", str(out / "main")]),
            ("run 175B/1,024 GPUs, --no-charts --no-trace", ["run", MAIN, "--out", str(out / "main-bare"),
                                                            "--no-charts", "--no-trace"]),
        ],
        "llama": [
            ("run 405B/16,384 GPUs, default outputs", ["run", LLAMA, "--out", str(out / "llama")]),
            ("run 405B/16,384 GPUs, --no-charts --no-trace", ["run", LLAMA, "--out", str(out / "llama-bare"),
                                                             "--no-charts", "--no-trace"]),
        ],
        # One 8-GPU node, TP 8 without sequence parallelism (Megatron-LM 2021): below 16 GPUs, where
        # simulation.symmetry auto now turns on when simulating every GPU would be long.
        "node": [("run 13B/8 GPUs (one node, TP 8), default outputs", ["run", MAIN, *NODE, "--out", str(out / "node")])],
        "plan": [("plan 175B/1,024 GPUs", ["plan", MAIN, "--out", str(out / "plan")])],
        "calibrate": [("calibrate --device cpu --quick",
                       ["calibrate", "--device", "cpu", "--quick", "--out", str(out / "cpu.json")])],
    }


def _child_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def time_command(argv: list[str]) -> dict:
    """One run of ``python -m sim ARGV``: wall and CPU seconds, exit status, simulate() seconds if printed."""
    cpu0 = _child_cpu_s()
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "sim", *argv], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    m = re.search(r"simulated in ([0-9.]+) s", p.stdout)
    return {"wall_s": wall, "cpu_s": _child_cpu_s() - cpu0, "rc": p.returncode,
            "simulate_s": float(m.group(1)) if m else None, "err": p.stderr.strip().splitlines()[-1:] }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="run,llama,node,plan,calibrate")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dtsim-bench-") as tmp:
        cases = _cases(Path(tmp))
        for group in a.only.split(","):
            if group == "calibrate":
                try:
                    import torch  # noqa: F401
                except ImportError:
                    print("calibrate --quick: skipped (torch is not installed)")
                    continue
            for label, argv in cases[group]:
                runs, raws = [], []
                for _ in range(a.repeat):
                    raws.append(raw_simpy_events_per_s(200_000))
                    runs.append(time_command(argv))
                bad = [r for r in runs if r["rc"] != 0]
                if bad:
                    print(f"{label}: exit {bad[0]['rc']}: {bad[0]['err']}")
                    continue
                wall = statistics.median(r["wall_s"] for r in runs)
                cpu = statistics.median(r["cpu_s"] for r in runs)
                raw = statistics.median(raws)
                work = statistics.median(r["wall_s"] * q for r, q in zip(runs, raws, strict=True))
                line = (f"{label}: wall {wall:.2f} s median of {a.repeat} (min {min(r['wall_s'] for r in runs):.2f}, "
                        f"max {max(r['wall_s'] for r in runs):.2f}), cpu {cpu:.2f} s; raw SimPy {raw:,.0f} events/s; "
                        f"wall × raw rate = {work / 1e6:.2f} M SimPy events")
                sims = [r["simulate_s"] for r in runs if r["simulate_s"] is not None]
                if sims:
                    line += f"; simulate() {statistics.median(sims):.2f} s, command/simulate {wall / statistics.median(sims):.2f}×"
                print(line, flush=True)


if __name__ == "__main__":
    main()
