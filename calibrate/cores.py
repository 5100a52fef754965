"""How many CPU cores this process may use (timing and the launcher both need it; neither imports the other)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, which containers narrow), else the CPU count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
