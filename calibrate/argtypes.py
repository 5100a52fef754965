"""Command-line helpers shared by `dtsim calibrate` and `dtsim validate`: errors stay one line."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class UsageError(Exception):
    """A bad command line; its message becomes the one-line error."""


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so errors stay one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"got {value!r}; must be a whole number >= 1 (e.g. --gpus 2)")
    return n


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
