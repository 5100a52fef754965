"""Progress bars for the long parts of a run (tqdm on stderr; silent when stderr is not a terminal)."""

from __future__ import annotations

import sys

from tqdm import tqdm


def progress_bar(desc: str, total: int) -> tqdm:
    """A bar for one section; ``disable=None`` turns it off in logs and tests, where it would be noise."""
    return tqdm(
        total=total, desc=desc, unit="pt", file=sys.stderr, disable=None, leave=False, dynamic_ncols=True
    )


def note(message: str) -> None:
    """One status line on stderr (section start/end), visible even when bars are off."""
    print(f"dtsim calibrate: {message}", file=sys.stderr, flush=True)
