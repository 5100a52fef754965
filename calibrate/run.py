"""One calibration run: measure the requested sections in order, saving the profile after each.

``run_calibration`` is the programmatic entry (the CLI and the tests call it); it never parses argv.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from calibrate.collectives import format_table, run_in_process, run_local, unmeasurable
from calibrate.config import COLLECTIVES, GEMM, MEMORY, SECTIONS, SweepConfig
from calibrate.launch import cpu_threads_per_device, leave_group, torchrun_env
from calibrate.profile import finished_sections, load_profile, new_profile, record_section, save_profile
from calibrate.progress import note
from calibrate.timing import import_torch
from sim.errors import ScenarioError


@dataclass(frozen=True)
class CalibrationOptions:
    """What the user asked for (already validated)."""

    device: str  # "cuda" | "cpu"
    world: int  # GPUs (cuda) or worker processes (cpu) for collectives
    out: Path
    sections: tuple[str, ...] = SECTIONS
    resume: bool = False


def _start_profile(opts: CalibrationOptions, config: SweepConfig, argv: list[str]) -> dict:
    """A fresh profile, or the one on disk when resuming (after checking it describes the same run)."""
    from calibrate.metadata import collect_metadata

    run = {
        "device": opts.device,
        "sweep": config.name,
        "world_size": opts.world,
        "threads_per_device": cpu_threads_per_device(opts.world) if opts.device == "cpu" else None,
        "sweep_config": config.as_dict(),
    }
    if opts.resume and opts.out.exists():
        profile = load_profile(opts.out, field="--out")
        for key, want in (("device", opts.device), ("sweep", config.name), ("world_size", opts.world)):
            have = profile["run"].get(key)
            if have != want:
                raise ScenarioError(
                    f"profile {str(opts.out)!r} was measured with {key}={have!r} but this run asks {key}={want!r}; "
                    "rerun with the same options, or without --resume to start a new profile",
                    field="--resume",
                )
        profile["metadata"].setdefault("resumed", []).append(collect_metadata(opts.device, opts.world, argv))
        return profile
    return new_profile(collect_metadata(opts.device, opts.world, argv), run)


def resume_starts_new(out: Path) -> str:
    """The note for --resume of a profile not written yet: the CLI says it before anything is measured."""
    return f"--resume: {out} does not exist yet, starting a new profile"


def _all_ranks_measure(name: str, device: str) -> bool:
    """Under torchrun, whether every rank takes part in section ``name`` (else rank 0 alone measures it).
    Collectives need all ranks; on CPU so do GEMMs and memory (calibrate.kernels: one device of a fully
    loaded machine)."""
    return name == COLLECTIVES or device == "cpu"


def _measure(name: str, opts: CalibrationOptions, config: SweepConfig, fault: str | None) -> dict | None:
    """Run one section; None on a non-zero torchrun rank (rank 0 records the section)."""
    launched = torchrun_env()
    world = launched[1] if launched else opts.world
    if name in (GEMM, MEMORY):
        from calibrate import kernels
        from calibrate.gemm import run_gemm
        from calibrate.membw import run_membw

        if opts.device == "cpu" and world > 1:  # every device's worker at once (see calibrate.kernels)
            if not launched:
                return kernels.run_local(name, world, config)
            with _device_threads(opts):
                return kernels.run_in_process(name, config)
        with _device_threads(opts):
            section = (run_gemm if name == GEMM else run_membw)(opts.device, config)
        if opts.device == "cpu":
            section.update(workers=1, threads_per_worker=cpu_threads_per_device(world), launcher="in-process")
        return section
    if world < 2:
        why = "--gpus 1" if not launched else "WORLD_SIZE=1"
        return unmeasurable(f"only one device ({why}): a collective needs at least 2 ranks", world)
    if launched:
        return run_in_process(opts.device, config.collectives)
    return run_local(opts.device, world, config.collectives, fault=fault)


@contextmanager
def _device_threads(opts: CalibrationOptions) -> Iterator[None]:
    """On CPU, measure kernels with one device's share of the cores (what each collective worker gets)."""
    torch = import_torch()
    before = torch.get_num_threads()
    if opts.device == "cpu":
        torch.set_num_threads(cpu_threads_per_device(opts.world))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _summary(name: str, section: dict) -> str:
    if section.get("status") == "unmeasurable":
        return f"{name}: not measurable ({section['reason']})"
    ms = section.get("measurements", [])
    skipped = len(section.get("skipped", []))
    notes = [f"{section['workers']} workers at once"] if (section.get("workers") or 1) > 1 else []
    retaken = sum(m.get("retaken", 0) for m in ms)
    disturbed = sum(bool(m.get("disturbed")) for m in ms)
    if retaken or disturbed:
        notes.append(
            f"other processes took CPU time: {retaken} sample(s) retaken"
            + (f", {disturbed} point(s) disturbed throughout" if disturbed else "")
        )
    text = f"{name}: {len(ms)} measurements" + (f", {skipped} skipped" if skipped else "")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def progress_path(opts: CalibrationOptions) -> Path:
    """Where sections are saved as they finish: ``--out`` itself, unless this fresh run (no ``--resume``)
    would replace a profile already there; then a sibling NAME.partial.json, moved over ``--out`` once
    every section is measured, so an interrupted re-measurement leaves the old profile whole."""
    if opts.resume or not opts.out.exists():
        return opts.out
    return opts.out.with_name(f"{opts.out.stem}.partial{opts.out.suffix}")


def run_calibration(
    opts: CalibrationOptions, config: SweepConfig, argv: list[str], fault: str | None = None
) -> Path:
    """Measure ``opts.sections`` (skipping finished ones with ``resume``), saving after each; returns the path.

    Under torchrun every rank measures collectives first (they need all ranks); then GEMMs and memory,
    on CPU by every rank at once, on GPU by rank 0 alone; rank 0 writes the profile. ``resume`` of a
    profile not written yet starts a new one (the CLI notes it first: :func:`resume_starts_new`). ``fault``
    is for tests of the collective watchdog.
    """
    launched = torchrun_env()
    rank = launched[0] if launched else 0
    # Finished sections of the profile being resumed (every torchrun rank reads the same file).
    done: set[str] = finished_sections(load_profile(opts.out, field="--out")) if opts.resume and opts.out.exists() else set()
    todo = [s for s in SECTIONS if s in opts.sections and s not in done]
    gemm_config = config
    if opts.device == "cpu" and config.name == "quick" and GEMM in todo and not launched:
        # Size the GEMM sweep to this CPU (calibrate.probe); under torchrun every rank would probe its own
        # speed and the ranks' sweeps would differ, so launched runs keep the sweep as configured. The probe
        # may take fewer timing passes for the GEMMs; the other sections keep the configured ones.
        from calibrate.probe import describe, size_cpu_sweep

        gemm_config = size_cpu_sweep(config, cpu_threads_per_device(opts.world))
        note(describe(gemm_config))
        config = replace(gemm_config, timing=config.timing)
    save_to = progress_path(opts)
    profile = _start_profile(opts, config, argv) if rank == 0 else None
    if rank == 0:
        for name in sorted(set(opts.sections) & done):
            note(f"{name}: already in {opts.out}, skipped (--resume)")
    if launched:
        todo.sort(key=lambda s: s != COLLECTIVES)
    for name in todo:
        if rank != 0 and not _all_ranks_measure(name, opts.device):
            continue
        if rank == 0:
            note(f"{name}: measuring on {opts.device} ({config.name} sweep)")
        t0 = time.perf_counter()
        section = _measure(name, opts, gemm_config if name == GEMM else config, fault)
        if section is None or profile is None:
            continue
        record_section(profile, name, section, time.perf_counter() - t0)
        save_profile(profile, save_to)
        note(f"{_summary(name, section)} in {time.perf_counter() - t0:.1f} s; saved to {save_to}")
        if name == COLLECTIVES:
            print(format_table(section), flush=True)
    if launched:
        leave_group()
    if profile is not None and save_to != opts.out:
        if not save_to.exists():  # nothing measured (every section skipped): the old profile stays
            return opts.out
        os.replace(save_to, opts.out)  # atomic: the old profile, then the whole new one
        note(f"all sections measured: {save_to} moved over {opts.out}")
    return opts.out
