"""Writing calibration profiles: new, record a finished section, refit, save atomically.

The format (schema_version, kind, metadata, run, sections, fits) and its reader live in
``sim.cost.profile``, with the simulator that prices ops from it; this module re-exports the reader.
Writes are atomic (temp file in the same folder, fsync, os.replace) and happen after each section, so an
interrupted run keeps what it finished. Importing this module never imports torch.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

from calibrate.config import COLLECTIVES, GEMM, MEMORY
from calibrate.fit import fit_collectives, gemm_tables, membw_table
from sim.cost.profile import (  # noqa: F401 (the profile format lives with its reader, in sim)
    FINISHED,
    MAX_PROFILE_BYTES,
    PROFILE_KIND,
    SCHEMA_VERSION,
    check_fits,
    device_name,
    load_profile,
)
from sim.outputs.writers import atomic_write_text


def new_profile(metadata: dict, run: dict) -> dict:
    """An empty profile for a run; sections are added as they finish."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": PROFILE_KIND,
        "metadata": metadata,
        "run": run,
        "sections": {},
        "fits": {},
    }


def save_profile(profile: dict, path: str | os.PathLike) -> Path:
    """Write the profile atomically (see write_json_atomic)."""
    return write_json_atomic(profile, path)


def write_json_atomic(data: dict, path: str | os.PathLike) -> Path:
    """Write atomically: a reader (or a crash) sees the old file or the new one, never half of one."""
    p = Path(path)
    atomic_write_text(p, json.dumps(data, indent=1, allow_nan=False) + "\n")
    return p


def finished_sections(profile: dict) -> set[str]:
    """Sections a --resume run can skip."""
    return {name for name, s in profile["sections"].items() if s.get("status") in FINISHED}


def record_section(profile: dict, name: str, section: dict, wall_s: float) -> None:
    """Store a finished section (with its wall time and finish date) and refresh the fits."""
    section = dict(section)
    section.setdefault("status", "done")
    section["wall_s"] = round(wall_s, 3)
    section["finished_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    profile["sections"][name] = section
    refit(profile)


def refit(profile: dict) -> None:
    """Recompute every fit from the raw measurements (cheap; keeps fits consistent with the data)."""
    fits: dict = {}
    sections = profile["sections"]
    if sections.get(GEMM, {}).get("measurements"):
        fits[GEMM] = gemm_tables(sections[GEMM]["measurements"])
    if sections.get(MEMORY, {}).get("measurements"):
        fits[MEMORY] = membw_table(sections[MEMORY]["measurements"])
    if COLLECTIVES in sections:
        fits[COLLECTIVES] = fit_collectives(sections[COLLECTIVES].get("measurements", []))
    profile["fits"] = fits
