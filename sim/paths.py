"""User-given paths: a leading ``~`` or ``~USER`` expanded the one way every command does it.

A path reaches dtsim unexpanded when it is quoted, written ``--opt=~/…``, or read from a scenario file; and
``Path.expanduser`` raises RuntimeError for a user this machine does not have, which must be the user's
one-line mistake, not an internal error."""

from __future__ import annotations

import os
from pathlib import Path

from sim.errors import ScenarioError

NO_SUCH_HOME_FIX = "write the path out in full"


def unknown_home(path: str | os.PathLike) -> str | None:
    """The ``~USER`` that ``path`` starts with when this machine has no such user, else None."""
    try:
        Path(path).expanduser()
    except RuntimeError:
        return str(path).split(os.sep, 1)[0]
    return None


def no_such_home(head: str) -> str:
    """The rule a ``~USER`` path of an unknown user breaks, as the messages word it."""
    return f"starts with {head!r}, but this machine has no such user's home folder"


def expand_path(path: str | os.PathLike, field: str) -> Path:
    """``path`` with a leading ``~`` or ``~USER`` expanded; one line naming ``field`` when there is no
    such user."""
    head = unknown_home(path)
    if head is not None:
        raise ScenarioError(f"{str(path)!r} {no_such_home(head)}; {NO_SUCH_HOME_FIX}", field)
    return Path(path).expanduser()


def ends_in_separator(value: str) -> bool:
    """Whether ``value`` names a folder by its last character ('new/', or 'new\\' on Windows): ``Path``
    drops that separator, so an option must look at the text it was given."""
    return value.endswith(os.sep) or bool(os.altsep and value.endswith(os.altsep))
