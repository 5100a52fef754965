"""Command-line helpers shared by `dtsim calibrate` and `dtsim validate`: errors stay one line.

The value types here are factories that take the option's name: argparse hands a type only the text, and
an error's example must name the option the user typed (``--steps 10``), not another one.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from sim.paths import ends_in_separator

# The most worker processes a CPU run starts (calibrate and validate alike): one per simulated device; more
# only oversubscribes the cores and can hang the machine.
MAX_CPU_WORKERS = 64


def shown(value: str, limit: int = 60) -> str:
    """``value`` quoted for an error line, shortened: a 100,000-digit --steps must not become the line."""
    return repr(value if len(value) <= limit else value[: limit - 1] + "…")


class UsageError(Exception):
    """A bad command line; its message becomes the one-line error."""


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so errors stay one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def positive_int(option: str, example: int, maximum: int | None = None) -> Callable[[str], int]:
    """The type of a count option: a whole number >= 1 (and <= ``maximum``, where a larger one cannot be
    meant); the error's example names ``option``."""
    rule = "a whole number >= 1" + (f" and <= {maximum}" if maximum is not None else "")

    def parse_count(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1 or maximum is not None and n > maximum:
            raise argparse.ArgumentTypeError(f"got {shown(value)}; must be {rule} (e.g. {option} {example})")
        return n

    return parse_count


def positive_seconds(option: str, example: float, maximum: float) -> Callable[[str], float]:
    """The type of a duration option: finite seconds in (0, ``maximum``]. inf and nan are refused here, not
    in the workers (a timedelta of inf overflows; a timeout of 0 or below gives up at once)."""

    def parse_seconds(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and 0 < x <= maximum):
            raise argparse.ArgumentTypeError(
                f"got {shown(value)}; must be a number of seconds > 0 and <= {maximum:g} (e.g. {option} {example:g})"
            )
        return x

    return parse_seconds


def path_arg(option: str, example: str, has_default: bool = True) -> Callable[[str], Path]:
    """The type of a path option: not empty (``Path('')`` is the current folder, so an empty --out would
    silently write there), with a leading ``~`` expanded (a quoted or ``--out=~/…`` path reaches us
    unexpanded; the checks and the writes must see the same path)."""

    def parse_path(value: str) -> Path:
        if not value.strip():
            raise argparse.ArgumentTypeError(
                f"got {shown(value)}; must be a path, not empty (e.g. {option} {example}"
                + ("; leave the option out for its default)" if has_default else ")")
            )
        try:
            return Path(value).expanduser()
        except RuntimeError:  # '~USER' of a user this machine does not have
            raise argparse.ArgumentTypeError(
                f"got {shown(value)}; starts with {value.split('/', 1)[0]!r}, but this machine has no such user's home "
                "folder; write the path out in full"
            ) from None

    return parse_path


@dataclass(frozen=True)
class OutPath:
    """An output option's path and whether it was written as a folder: ``Path('new/')`` drops the
    trailing slash, which is the only sign that a folder not made yet is meant."""

    path: Path
    folder: bool

    def __str__(self) -> str:
        """The path as the user wrote it (with its slash): what an error message must show."""
        return str(self.path) + (os.sep if self.folder and str(self.path) != os.sep else "")


def out_path_arg(option: str, example: str) -> Callable[[str], OutPath]:
    """The type of an output option that takes a file or a folder: a path as :func:`path_arg`, and
    whether it ends in a separator (a folder, to be made if it does not exist)."""
    parse_path = path_arg(option, example)

    def parse_out(value: str) -> OutPath:
        return OutPath(parse_path(value), ends_in_separator(value))

    return parse_out


def comma_items(value: str, option: str, example: str) -> list[str]:
    """The items of a comma-separated option value, stripped; an empty item ('a,,b', 'a,', ',a', '') is
    refused: it is a typo that would otherwise be dropped unseen."""
    if not value.strip():
        raise argparse.ArgumentTypeError(f"got {shown(value)}; must name at least one item (e.g. {option} {example})")
    items = [v.strip() for v in value.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(
            f"got {shown(value)}; an item of the comma-separated list is empty (e.g. {option} {example})"
        )
    return items


def parse(parser: argparse.ArgumentParser, argv: list[str], prog: str) -> argparse.Namespace | int:
    """The parsed arguments, or the exit code: 2 (with one line on stderr) for a bad command line,
    0 after --help."""
    try:
        return parser.parse_args(argv)
    except UsageError as exc:
        print(f"{prog}: error: {exc} (see {prog} --help)", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
