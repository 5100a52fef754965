"""Subcommands that explore many scenarios: compare, sweep, plan."""

from __future__ import annotations


def add_explore_commands(sub) -> None:
    """Registered by the explore modules as they land."""
    return None
