"""What every scenario section shares: the rule error, the strict base model, the limits and enumerations.

Rules raise ``RuleError`` carrying the field, the value, the rule and a fix; ``sim.scenario.errors_format``
turns them into one-line messages.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from pydantic import BaseModel, ConfigDict

from sim.engine.collective_algorithms import (  # noqa: F401  (re-exported to the scenario sections)
    ALGORITHM_NAMES,
    COLLECTIVE_ALGORITHMS,
    DP_ALGORITHMS,
)
from sim.units import PRECISIONS  # noqa: F401  (re-exported to the scenario sections)

COLLECTIVE_OPS = (
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
)
# The collective algorithms are defined once, by the engine's registry (op → algorithm → builder).
ALGORITHMS = ALGORITHM_NAMES
NAME_PATTERN = r"^[A-Za-z0-9._-]+$"


# Ranges that keep every simulated time and byte count finite and meaningful in float64.
MAX_OP_MS = 1e9  # 11.6 days for one layer's micro-batch: far beyond any real kernel
MAX_SLOWDOWN = 1e4  # a straggler 10,000× slower than its peers
MAX_BYTES = 2**60  # 1 EiB in one message or activation
MAX_PARAMS = 10**15  # parameters in one layer
MAX_EXPERTS = 65536  # experts in one MoE layer (32× Switch Transformer's 2,048)
MAX_FLOPS = 1e24  # FLOPs of one layer for one sample
MIN_LINK_Bps = 1e6  # 1 MB/s: below 10 Mb/s Ethernet no training network runs (a floor that keeps time finite)
MAX_LINK_Bps = 1e15  # 1 PB/s per direction, ~1000× NVLink 5
MAX_LATENCY_US = 1e6  # one second per message
MIN_PEAK_TFLOPS = 1e-6  # 1 MFLOP/s
MAX_PEAK_TFLOPS = 1e6
MIN_MEMORY_GBps = 1e-3  # 1 MB/s of HBM bandwidth
MAX_MEMORY_GBps = 1e6
MAX_LAUNCH_US = 1e6
MAX_NODES = 1_000_000  # ~40× the nodes of the largest clusters built (~200,000 GPUs, 8 per node)
MAX_GPUS_PER_NODE = 1024  # above the 576 GPUs of the largest NVLink domain announced (NVL576), were it one node
MAX_NICS_PER_NODE = 64  # DGX H100: 8 compute + 2 storage NICs; every NIC is a channel each transfer is split over


class RuleError(ValueError):
    """A broken rule: ``field`` (relative to the model that raised it), the value, the rule and a fix."""

    def __init__(self, field: str | None, value: str, rule: str, fix: str):
        self.field, self.value, self.rule, self.fix = field, value, rule, fix
        super().__init__(f"{value} — {rule}; {fix}")


def show(value: Any, limit: int = 60) -> str:
    """A short repr of a user value for a one-line message, with null, true and false spelt as YAML
    spells them (the user wrote YAML, not Python: ``None`` would read as a string they never typed)."""
    text = _yaml_repr(value, limit + 1).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _yaml_repr(value: Any, budget: int, depth: int = 0) -> str:
    """repr() with YAML's null/true/false, inside lists and mappings too; stops once ``budget``
    characters are written (a 50,000-item list must not be rendered whole to show 60 characters)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, dict)):
        if depth > 20:
            return "…"
        items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
        open_, close = ("{", "}") if isinstance(value, dict) else ("[", "]")
        parts: list[str] = []
        used = 1
        for key, item in items:
            if used > budget:
                parts.append("…")
                break
            text = _yaml_repr(item, budget - used, depth + 1)
            if isinstance(value, dict):
                text = f"{_yaml_repr(key, budget - used, depth + 1)}: {text}"
            parts.append(text)
            used += len(text) + 2
        return open_ + ", ".join(parts) + close
    return repr(value)


def did_you_mean(word: str, options: list[str] | tuple[str, ...]) -> str:
    """ "did you mean 'x'? " for the option closest to ``word`` (case-insensitive), or "" if none is close."""
    lower = {o.lower(): o for o in options}
    close = difflib.get_close_matches(str(word).lower(), list(lower), n=1, cutoff=0.6)
    return f"did you mean {lower[close[0]]!r}? " if close else ""


def lookup(kind: str, name: str, names: list[str], aliases: dict[str, str] | None = None) -> str:
    """The canonical key for preset ``name`` (case-insensitive, aliases allowed) or a RuleError."""
    table = {n.lower(): n for n in names}
    table.update({a.lower(): t for a, t in (aliases or {}).items()})
    key = table.get(name.strip().lower())
    if key is not None:
        return key
    known = ", ".join(names) or "(none installed)"
    extra = f"; aliases: {', '.join(aliases)}" if aliases else ""
    hint = did_you_mean(name, list(names) + list(aliases or {}))
    raise RuleError(
        None, show(name), f"unknown {kind} preset", f"{hint}use one of {known}{extra}, or an inline mapping"
    )



def _as_dict(obj: Any) -> dict[str, Any]:
    """A preset entry (dataclass, pydantic model or mapping) as a plain dict."""
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)  # type: ignore[arg-type]
    return obj.model_dump() if isinstance(obj, BaseModel) else dict(obj)


def _strip_none(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    """A copy without the given keys where they are None, so field defaults apply."""
    return {k: v for k, v in data.items() if not (k in keys and v is None)}


class _Strict(BaseModel):
    """Base for every section: unknown keys are errors, types are strict, values immutable."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, validate_default=True, allow_inf_nan=False
    )

