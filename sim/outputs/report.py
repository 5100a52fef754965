"""Placeholder (replaced below)."""
from pathlib import Path


def write_report(result_dir: Path) -> Path:
    return Path(result_dir) / "report.html"
