"""Pixel-column aggregation for charts: spans narrower than a pixel or two become one raster layer.

A chart is a few thousand pixels wide, but a large run's timeline holds hundreds of thousands of spans, most
of them far narrower than a pixel. Drawing each as a vector rectangle costs seconds and tens of megabytes
of SVG while showing nothing more than its share of a pixel column. Here every such span adds its covered
fraction to the columns it touches (per colour), and each chart row becomes one strip of an RGBA image:
colour = the coverage-weighted mix of the span colours, opacity = the covered fraction (with a floor, so
sparse work stays visible). That is close to what an anti-aliased renderer shows, drawn as one image artist (rasterised inside SVGs as well); the
full detail stays in trace.json for Perfetto.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb

SUBROWS = 10  # image rows per chart row: the band y ± 0.4 is 8 of them, the 0.1 margins stay clear
MIN_ALPHA = 0.35  # opacity of a column that is busy at all (a hairline of work must not vanish)
WIDE_PX = 2.0  # spans at least this many pixels wide stay vector rectangles (with separators and hatches)


def column_coverage(starts_px: np.ndarray, ends_px: np.ndarray, columns: int) -> np.ndarray:
    """Fraction of each pixel column ``[k, k+1)`` covered by the intervals ``[start, end)`` (in pixels).

    Uses the integral C(x) = Σ clip(x − start, 0, end − start), evaluated at the column edges with sorted
    prefix sums: O((n + columns) log n) and exact for any interval lengths. Overlaps add up (clipped later).
    """
    s = np.sort(np.asarray(starts_px, dtype=float))
    e = np.sort(np.asarray(ends_px, dtype=float))
    edges = np.arange(columns + 1, dtype=float)

    def ramp(points: np.ndarray) -> np.ndarray:  # Σ_{p < x} (x − p) at every edge x
        k = np.searchsorted(points, edges, side="left")
        csum = np.concatenate(([0.0], np.cumsum(points)))
        return k * edges - csum[k]

    integral = ramp(s) - ramp(e)
    return np.clip(np.diff(integral), 0.0, None)


class DenseLayer:
    """Accumulates narrow spans per chart row and colour, then draws them as one image."""

    def __init__(self, rows: int, columns: int, x0: float, x1: float) -> None:
        self.rows = rows
        self.columns = max(int(columns), 1)
        self.x0, self.x1 = x0, x1
        self.px_per_unit = self.columns / (x1 - x0) if x1 > x0 else 0.0
        self._palette: dict[tuple[float, float, float], int] = {}
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def px(self, width: npt.ArrayLike) -> Any:
        """Width in pixels of ``width`` data units."""
        return np.asarray(width) * self.px_per_unit

    def color_id(self, color) -> int:
        """Index of ``color`` in this layer's palette (added on first use)."""
        r, g, b = to_rgb(color)
        return self._palette.setdefault((float(r), float(g), float(b)), len(self._palette))

    def add_many(self, rows: np.ndarray, color_ids: np.ndarray, x: np.ndarray, width: np.ndarray) -> None:
        """Intervals as arrays: chart row, palette index (``color_id``), start and width in data units."""
        if len(x):
            self._parts.append((np.asarray(rows, dtype=np.int64), np.asarray(color_ids, dtype=np.int64),
                                np.asarray(x, dtype=float), np.asarray(width, dtype=float)))

    def is_empty(self) -> bool:
        return not self._parts

    def image(self) -> np.ndarray:
        """The RGBA image (rows·SUBROWS × columns), 8 bits per channel (cheap to resample and encode)."""
        palette = np.zeros((max(len(self._palette), 1), 3))
        for color, i in self._palette.items():
            palette[i] = color
        rgb = np.zeros((self.rows, self.columns, 3))
        total = np.zeros((self.rows, self.columns))
        if self._parts:
            rows, ids, x, w = (np.concatenate(c) for c in zip(*self._parts, strict=True))
            key = rows * len(palette) + ids
            order = np.argsort(key, kind="stable")
            key, x, w = key[order], x[order], w[order]
            bounds = np.flatnonzero(np.diff(key)) + 1
            for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(key)], strict=True):
                row, cid = divmod(int(key[lo]), len(palette))
                start = (x[lo:hi] - self.x0) * self.px_per_unit
                cov = column_coverage(start, start + w[lo:hi] * self.px_per_unit, self.columns)
                rgb[row] += cov[:, None] * palette[cid]
                total[row] += cov
        with np.errstate(invalid="ignore", divide="ignore"):
            mixed = np.where(total[..., None] > 0, rgb / total[..., None], 0.0)
        # Opacity follows the busy share, with a floor so a stream that is busy for a sliver of every column
        # (short collectives, p2p sends) stays visible instead of fading into the idle background.
        alpha = np.where(total > 0, MIN_ALPHA + (1.0 - MIN_ALPHA) * np.clip(total, 0.0, 1.0), 0.0)
        rgba = np.concatenate([mixed, alpha[..., None]], axis=2)
        img = np.zeros((self.rows, SUBROWS, self.columns, 4), dtype=np.uint8)
        img[:, 1 : SUBROWS - 1] = np.rint(rgba * 255.0).astype(np.uint8)[:, None]
        return img.reshape(self.rows * SUBROWS, self.columns, 4)

    def draw(self, ax: Axes, zorder: float = 1.9) -> None:
        """Place the image over rows 0…rows−1 (row i spans y = i ± 0.5, drawn top to bottom)."""
        if self.is_empty():
            return
        ax.imshow(
            self.image(),
            extent=(self.x0, self.x1, self.rows - 0.5, -0.5),
            aspect="auto",
            interpolation="nearest",
            origin="upper",
            zorder=zorder,
            resample=False,
        )
