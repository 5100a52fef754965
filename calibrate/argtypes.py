"""Command-line helpers shared by `dtsim calibrate` and `dtsim validate`: errors stay one line."""

from __future__ import annotations

import argparse


class UsageError(Exception):
    """A bad command line; its message becomes the one-line error."""


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so errors stay one line."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"got {value!r}; must be a whole number >= 1 (e.g. --gpus 2)")
    return n
