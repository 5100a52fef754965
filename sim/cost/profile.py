"""The calibration profile format and its reader: what the simulator needs to price ops from a profile.

A profile is one versioned JSON file (``dtsim calibrate`` writes it, through ``calibrate.profile``)::

    {"schema_version": 1, "kind": "dtsim-calibration-profile",
     "metadata": {...device, versions, env, date, host, command...},
     "run": {"device": "cpu"|"cuda", "sweep": "full"|"quick"|"tiny", "world_size": N, "sweep_config": {...}},
     "sections": {"gemm": {"status": "done", "measurements": [...], ...},
                  "memory": {...}, "collectives": {"status": "done"|"unmeasurable", ...}},
     "fits": {"gemm": {dtype: {...}}, "memory": {...}, "collectives": [{op, scope, group_size, alpha_s, ...}]}}

The format, its checks and the read-side models (GEMM throughput over shape, bandwidth over size) live
here so that ``sim`` never imports the calibration tool; ``calibrate`` measures, fits and writes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable

import numpy as np

from sim.errors import ScenarioError
from sim.paths import expand_path
from sim.scenario.base import did_you_mean
from sim.scenario.load import read_capped
from sim.workload.ops import MEMORY_FAMILIES, STREAM

GEMM_NEIGHBOURS = 4  # inverse-distance weighting over this many nearest measured shapes (log space)

SCHEMA_VERSION = 1
PROFILE_KIND = "dtsim-calibration-profile"
FINISHED = ("done", "unmeasurable")
# The collectives a profile's fits may name: those `dtsim calibrate` measures and fits in closed form
# (calibrate.config.COLLECTIVE_OPS, calibrate.fit.CLOSED_FORM_TEXT). The simulator prices links from the
# all_reduce and all_gather fits (sim.cost.calibrated.LINK_SOURCE_OPS); an op outside this list would never
# match one, so the profile's measured links would be silently unused: it is refused.
COLLECTIVE_FIT_OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "send_recv")


def load_profile(path: str | os.PathLike, field: str = "profile") -> dict:
    """Read and check a profile; a missing, unreadable or incompatible file is the user's mistake.

    ``field`` names where the path came from in error messages (a scenario key, a CLI option)."""
    p = expand_path(path, field)  # '--calibration=~/p.json' reaches here unexpanded
    if not p.exists() and not p.is_symlink():
        raise ScenarioError(
            f"file {str(p)!r} does not exist; run `dtsim calibrate --out {p}` first", field=field
        )
    try:
        raw = read_capped(p, MAX_PROFILE_BYTES, repr(str(p)), field, kind="calibration profile")
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError, RecursionError) as exc:
        detail = str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__
        raise ScenarioError(
            f"{str(p)!r} is not valid JSON ({detail}); re-run `dtsim calibrate` to rewrite it", field=field
        ) from None
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise ScenarioError(
            f"{str(p)!r} is not a dtsim calibration profile (its kind must be {PROFILE_KIND!r}); give a "
            f"profile written by `dtsim calibrate --out {p.name}`", field=field
        )
    version = data.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise ScenarioError(
            f"{str(p)!r} has schema_version {version!r}; this dtsim reads profiles whose schema_version is the "
            f"whole number {SCHEMA_VERSION}; re-run `dtsim calibrate` to measure a new profile",
            field=field,
        )
    for key in ("metadata", "run", "sections", "fits"):
        if not isinstance(data.get(key), dict):
            raise ScenarioError(f"{str(p)!r} lacks the {key!r} object; re-run `dtsim calibrate`", field=field)
    for name, section in data["sections"].items():
        if not isinstance(section, dict):
            raise ScenarioError(f"{str(p)!r}: sections.{name} is not an object; re-run `dtsim calibrate`",
                                field=field)
        rows = section.get("measurements", [])
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ScenarioError(f"{str(p)!r}: sections.{name}.measurements is not a list of objects; re-run "
                                "`dtsim calibrate`", field=field)
    check_fits(data["fits"], str(p), field)
    return data


# Ranges a fitted model must lie in to be priced with (the same physical floor as scenario links).
MIN_BANDWIDTH_Bps = 1e6  # 1 MB/s
MAX_BANDWIDTH_Bps = 1e15
MAX_ALPHA_S = 1.0  # a collective step's fixed cost of a second is a broken fit
MAX_PROFILE_BYTES = 64 << 20
# A measured GEMM: a dimension up to 10⁸ (profiles time up to ~16k), a rate from 1 MFLOP/s (far below any
# CPU) to 10¹⁷ FLOP/s (20× a B200's dense fp8 peak): outside these a point would price kernels at 0 or ∞ s.
MAX_GEMM_DIM = 1e8
MIN_FLOPS_PER_S = 1e6
MAX_FLOPS_PER_S = 1e17


def _finite(x: object, lo: float, hi: float) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and lo <= float(x) <= hi  # NaN fails


def check_fits(fits: dict, path: str, field: str = "profile") -> None:
    """Every fitted model the simulator prices with, checked: types, non-empty tables, finite positive
    numbers in physical ranges. A bad one is one ScenarioError naming the file, the field and the fix."""

    def bad(where: str, value: object, rule: str, fix: str = "") -> ScenarioError:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:59] + "…"
        return ScenarioError(
            f"{path!r}: fits.{where} = {shown} — {rule}; {fix}re-run `dtsim calibrate` to measure it again "
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
            if not (isinstance(pt, list) and len(pt) == 4 and all(_finite(v, 1, MAX_GEMM_DIM) for v in pt[:3])
                    and _finite(pt[3], MIN_FLOPS_PER_S, MAX_FLOPS_PER_S)):
                raise bad(f"{where}.points[{i}]", pt, f"must be [m, n, k, FLOP/s] with m, n, k from 1 to "
                          f"{MAX_GEMM_DIM:.0e} and FLOP/s from {MIN_FLOPS_PER_S:.0e} to {MAX_FLOPS_PER_S:.0e}")
        if not _finite(table.get("min_time_s"), 0.0, 1.0):
            raise bad(f"{where}.min_time_s", table.get("min_time_s"), "must be a number from 0 to 1 s")
        if "elem_bytes" in table and not _finite(table["elem_bytes"], 0.125, 64):
            raise bad(f"{where}.elem_bytes", table["elem_bytes"], "must be a number from 0.125 to 64")
    memory = fits.get("memory")
    if memory is not None:
        if not isinstance(memory, dict):
            raise bad("memory", memory, "must be a mapping with kernels")
        kernels = memory.get("kernels")
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
        for key in ("op", "scope"):
            if not isinstance(f.get(key), str):
                raise bad(f"{where}.{key}", f.get(key), "must be a string" if key in f else "is missing")
        if f["op"] not in COLLECTIVE_FIT_OPS:
            raise bad(f"{where}.op", f["op"], f"must be one of {', '.join(COLLECTIVE_FIT_OPS)} (the collectives "
                      "dtsim calibrate measures; another never matches, so its figures would go unused)",
                      f"{did_you_mean(f['op'], COLLECTIVE_FIT_OPS)}correct it, or ")
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


def device_name(profile: dict) -> str:
    """The measured device as one string (GPU name, or CPU model)."""
    md = profile.get("metadata", {})
    return str(md.get("device_name") or md.get("cpu_model") or "unknown device")


def _idw(coords: np.ndarray, values: np.ndarray, q: np.ndarray, exclude: int | None) -> float:
    """Inverse-distance weighting (power 2) over the nearest points; exact matches are averaged."""
    d = np.linalg.norm(coords - q, axis=1)
    if exclude is not None:
        d[exclude] = np.inf
    exact = d < 1e-9
    if exact.any():
        return float(np.mean(values[exact]))
    order = np.argsort(d)[:GEMM_NEIGHBOURS]
    order = order[np.isfinite(d[order])]
    w = 1.0 / d[order] ** 2
    return float(np.sum(w * values[order]) / np.sum(w))


class ShapeTable:
    """Achieved FLOP/s of one dtype's GEMMs, interpolated from the measured shapes.

    With a shape: inverse-distance weighting of log throughput over the nearest measured shapes in
    log2(m, n, k). Without one (a coarse op that only knows FLOPs and bytes): the same over
    (log2 FLOPs, 2·log2 arithmetic intensity), where intensity = FLOPs / bytes of A, B and C; this tells a
    skinny small-batch GEMM from a square one of equal FLOPs, which a cube-shaped stand-in cannot.
    Outside the measured range the same rule extrapolates and the lookup says so. No GEMM is predicted
    faster than the fastest one measured (launch / latency floor).
    """

    INTENSITY_WEIGHT = 2.0  # throughput depends more on intensity than on size; fitted on CPU and GPU sweeps

    def __init__(self, points: list[list[float]], min_time_s: float, elem_bytes: float = 2.0):
        arr = np.asarray(points, dtype=float)
        m, n, k = arr[:, 0], arr[:, 1], arr[:, 2]
        self.coords = np.log2(arr[:, :3])
        self.log_tput = np.log(arr[:, 3])
        self.lo = self.coords.min(axis=0)
        self.hi = self.coords.max(axis=0)
        flops = 2.0 * m * n * k
        intensity = flops / (elem_bytes * (m * k + k * n + m * n))
        self.fi_coords = np.column_stack([np.log2(flops), self.INTENSITY_WEIGHT * np.log2(intensity)])
        self.fi_lo = self.fi_coords.min(axis=0)
        self.fi_hi = self.fi_coords.max(axis=0)
        self.min_time_s = float(min_time_s)

    def flops_per_s(self, m: float, n: float, k: float, exclude: int | None = None) -> tuple[float, bool]:
        """(achieved FLOP/s, extrapolated?) for one (m, n, k) GEMM."""
        q = np.log2(np.maximum([m, n, k], 1.0))
        extrapolated = bool(np.any(q < self.lo - 1e-9) or np.any(q > self.hi + 1e-9))
        return float(np.exp(_idw(self.coords, self.log_tput, q, exclude))), extrapolated

    def flops_per_s_by_intensity(
        self, flops: float, nbytes: float, exclude: int | None = None
    ) -> tuple[float, bool]:
        """(achieved FLOP/s, extrapolated?) for a GEMM known only by its FLOPs and bytes moved."""
        q = np.array(
            [math.log2(max(flops, 1.0)), self.INTENSITY_WEIGHT * math.log2(max(flops / nbytes, 1e-9))]
        )
        extrapolated = bool(np.any(q < self.fi_lo - 1e-9) or np.any(q > self.fi_hi + 1e-9))
        return float(np.exp(_idw(self.fi_coords, self.log_tput, q, exclude))), extrapolated

    def time_s(self, m: float, n: float, k: float) -> tuple[float, bool]:
        tput, extrapolated = self.flops_per_s(m, n, k)
        return max(2.0 * m * n * k / tput, self.min_time_s), extrapolated


def streaming_kernels(names: Iterable[str]) -> list[str]:
    """The streaming kernels (copy, add, …) among measured curve names: those not of a kernel family
    (``MEMORY_FAMILIES``); all of them when a profile measured families only."""
    names = list(names)
    return [name for name in names if name not in MEMORY_FAMILIES] or names


class BandwidthCurve:
    """Achieved bytes/s over bytes moved: per kernel, log-log linear interpolation.

    A streaming op is priced at the median of the streaming kernels (copy, add, mul, gelu); an op of a
    kernel family (``Op.family``: norm, softmax, dropout, ...) at that family's own curve when the profile
    measured it (``has``). Below the smallest measured size the time floor is the smallest measured time
    (latency bound); above the largest the bandwidth of the largest size holds. Both count as
    extrapolation.
    """

    def __init__(self, kernels: dict[str, dict]):
        self.curves = {
            name: (np.log(np.asarray(c["bytes_moved"], float)), np.log(np.asarray(c["bytes_per_s"], float)))
            for name, c in kernels.items()
        }
        self.streaming = {name: self.curves[name] for name in streaming_kernels(self.curves)}
        self.min_time_s = self._floor_s(STREAM)  # a streaming op's latency floor

    def streaming_range(self) -> tuple[float, float]:
        """Smallest and largest bytes moved the streaming curves measured."""
        return (min(float(np.exp(x[0])) for x, _ in self.streaming.values()),
                max(float(np.exp(x[-1])) for x, _ in self.streaming.values()))

    def has(self, family: str) -> bool:
        return not family or family in self.curves

    def _group(self, family: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return {family: self.curves[family]} if family else self.streaming

    def bytes_per_s(self, nbytes: float, family: str = "") -> tuple[float, bool]:
        group = self._group(family)
        lx = math.log(max(nbytes, 1.0))
        bws = [float(np.exp(np.interp(lx, x, y))) for x, y in group.values()]
        lo = min(float(np.exp(x[0])) for x, _ in group.values())
        hi = max(float(np.exp(x[-1])) for x, _ in group.values())
        return float(np.median(bws)), not (lo * (1 - 1e-9) <= nbytes <= hi * (1 + 1e-9))

    def time_s(self, nbytes: float, family: str = "") -> tuple[float, bool]:
        bw, extrapolated = self.bytes_per_s(nbytes, family)
        return max(nbytes / bw, self._floor_s(family)), extrapolated

    def _floor_s(self, family: str) -> float:
        return min(float(np.min(np.exp(x - y))) for x, y in self._group(family).values())
