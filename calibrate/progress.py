"""Progress bars for the long parts of a run (tqdm on stderr; silent when stderr is not a terminal)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from tqdm import tqdm


class Bar(Protocol):
    """What a section does with its progress bar (tqdm, or a worker's stand-in)."""

    def set_postfix_str(self, what: str, refresh: bool = ...) -> object: ...

    def update(self, n: int = ...) -> object: ...


# A section's progress: (description, total points) -> a context manager yielding its bar.
Progress = Callable[[str, int], AbstractContextManager[Bar]]


def progress_bar(desc: str, total: int) -> tqdm:
    """A bar for one section; ``disable=None`` turns it off in logs and tests, where it would be noise."""
    return tqdm(
        total=total, desc=desc, unit="pt", file=sys.stderr, disable=None, leave=False, dynamic_ncols=True
    )


def note(message: str) -> None:
    """One status line on stderr (section start/end), visible even when bars are off."""
    print(f"dtsim calibrate: {message}", file=sys.stderr, flush=True)
