"""The calibration profile: one versioned JSON file with metadata, raw measurements and fitted models.

Layout (schema_version 1)::

    {"schema_version": 1, "kind": "dtsim-calibration-profile",
     "metadata": {...device, versions, env, date, host, command...},
     "run": {"device": "cpu"|"cuda", "sweep": "full"|"quick"|"tiny", "world_size": N, "sweep_config": {...}},
     "sections": {"gemm": {"status": "done", "measurements": [...], ...},
                  "memory": {...}, "collectives": {"status": "done"|"unmeasurable", ...}},
     "fits": {"gemm": {dtype: {...}}, "memory": {...}, "collectives": [{op, scope, group_size, alpha_s, ...}]}}

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
from sim.errors import ScenarioError
from sim.outputs.writers import atomic_write_text

SCHEMA_VERSION = 1
PROFILE_KIND = "dtsim-calibration-profile"
FINISHED = ("done", "unmeasurable")


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


def load_profile(path: str | os.PathLike, field: str = "profile") -> dict:
    """Read and check a profile; a missing, unreadable or incompatible file is the user's mistake.

    ``field`` names where the path came from in error messages (a scenario key, a CLI option)."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise ScenarioError(
            f"file {str(p)!r} does not exist; run `dtsim calibrate --out {p}` first", field=field
        )
    try:
        from sim.scenario.load import read_capped

        raw = read_capped(p, MAX_PROFILE_BYTES, repr(str(p)), field, kind="calibration profile")
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError, RecursionError) as exc:
        detail = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
        raise ScenarioError(
            f"{str(p)!r} is not valid JSON ({detail}); re-run `dtsim calibrate` to rewrite it", field=field
        ) from None
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise ScenarioError(
            f"{str(p)!r} is not a dtsim calibration profile (kind != {PROFILE_KIND!r})", field=field
        )
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ScenarioError(
            f"{str(p)!r} has schema_version {version!r}, this dtsim reads {SCHEMA_VERSION}; "
            "re-run `dtsim calibrate` to measure a new profile",
            field=field,
        )
    for key in ("metadata", "run", "sections", "fits"):
        if not isinstance(data.get(key), dict):
            raise ScenarioError(f"{str(p)!r} lacks the {key!r} object; re-run `dtsim calibrate`", field=field)
    check_fits(data["fits"], str(p), field)
    return data


# Ranges a fitted model must lie in to be priced with (the same physical floor as scenario links).
MIN_BANDWIDTH_Bps = 1e6  # 1 MB/s
MAX_BANDWIDTH_Bps = 1e15
MAX_ALPHA_S = 1.0  # a collective step's fixed cost of a second is a broken fit
MAX_PROFILE_BYTES = 64 << 20


def _finite(x: object, lo: float, hi: float) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and lo <= float(x) <= hi  # NaN fails


def check_fits(fits: dict, path: str, field: str = "profile") -> None:
    """Every fitted model the simulator prices with, checked: types, non-empty tables, finite positive
    numbers in physical ranges. A bad one is one ScenarioError naming the file, the field and the fix."""

    def bad(where: str, value: object, rule: str) -> ScenarioError:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:59] + "…"
        return ScenarioError(
            f"{path!r}: fits.{where} = {shown} — {rule}; re-run `dtsim calibrate` to measure it again "
            "(or delete that entry to fall back to the datasheet)",
            field=field,
        )

    gemm = fits.get("gemm", {})
    if not isinstance(gemm, dict):
        raise bad("gemm", gemm, "must be a mapping of dtype to table")
    for dtype, table in gemm.items():
        where = f"gemm.{dtype}"
        if not isinstance(table, dict):
            raise bad(where, table, "must be a mapping with points and min_time_s")
        points = table.get("points")
        if not isinstance(points, list) or not points:
            raise bad(f"{where}.points", points, "must be a non-empty list of [m, n, k, FLOP/s]")
        for i, pt in enumerate(points):
            if not (isinstance(pt, list) and len(pt) == 4 and all(_finite(v, 1e-300, 1e300) for v in pt)
                    and all(float(v) >= 1 for v in pt[:3])):
                raise bad(f"{where}.points[{i}]", pt, "must be [m, n, k, FLOP/s] with m, n, k ≥ 1 and FLOP/s > 0")
        if not _finite(table.get("min_time_s"), 0.0, 1.0):
            raise bad(f"{where}.min_time_s", table.get("min_time_s"), "must be a number from 0 to 1 s")
        if "elem_bytes" in table and not _finite(table["elem_bytes"], 0.125, 64):
            raise bad(f"{where}.elem_bytes", table["elem_bytes"], "must be a number from 0.125 to 64")
    memory = fits.get("memory")
    if memory is not None:
        kernels = memory.get("kernels") if isinstance(memory, dict) else None
        if not isinstance(kernels, dict) or not kernels:
            raise bad("memory.kernels", kernels, "must be a non-empty mapping of kernel to curve")
        for name, curve in kernels.items():
            where = f"memory.kernels.{name}"
            if not isinstance(curve, dict):
                raise bad(where, curve, "must be a mapping with bytes_moved and bytes_per_s")
            xs, ys = curve.get("bytes_moved"), curve.get("bytes_per_s")
            if not isinstance(xs, list) or not xs or not all(_finite(x, 1.0, 1e300) for x in xs):
                raise bad(f"{where}.bytes_moved", xs, "must be a non-empty list of byte counts ≥ 1")
            if any(b < a for a, b in zip(xs, xs[1:], strict=False)):
                raise bad(f"{where}.bytes_moved", xs, "must not decrease")
            if not isinstance(ys, list) or len(ys) != len(xs) or not all(
                _finite(y, MIN_BANDWIDTH_Bps, MAX_BANDWIDTH_Bps) for y in ys
            ):
                raise bad(f"{where}.bytes_per_s", ys, f"must be {len(xs)} rates between "
                          f"{MIN_BANDWIDTH_Bps:.0e} and {MAX_BANDWIDTH_Bps:.0e} B/s")
    colls = fits.get("collectives", [])
    if not isinstance(colls, list):
        raise bad("collectives", colls, "must be a list of fits")
    for i, f in enumerate(colls):
        where = f"collectives[{i}]"
        if not isinstance(f, dict):
            raise bad(where, f, "must be a mapping")
        if not isinstance(f.get("op"), str) or not isinstance(f.get("scope"), str):
            raise bad(f"{where}.op", f.get("op"), "op and scope must be strings")
        if not (isinstance(f.get("group_size"), int) and not isinstance(f["group_size"], bool)
                and f["group_size"] >= 1):
            raise bad(f"{where}.group_size", f.get("group_size"), "must be a whole number ≥ 1")
        if f.get("bandwidth_Bps") is None:
            continue  # an unmeasured fit: not used for links
        if not _finite(f["bandwidth_Bps"], MIN_BANDWIDTH_Bps, MAX_BANDWIDTH_Bps):
            raise bad(f"{where}.bandwidth_Bps", f["bandwidth_Bps"],
                      f"must be a rate between {MIN_BANDWIDTH_Bps:.0e} and {MAX_BANDWIDTH_Bps:.0e} B/s")
        if not _finite(f.get("alpha_s"), 0.0, MAX_ALPHA_S):
            raise bad(f"{where}.alpha_s", f.get("alpha_s"), f"must be a latency from 0 to {MAX_ALPHA_S:g} s")


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a profile may hold")


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


def device_name(profile: dict) -> str:
    """The measured device as one string (GPU name, or CPU model)."""
    md = profile.get("metadata", {})
    return str(md.get("device_name") or md.get("cpu_model") or "unknown device")
