"""Numbers as every report prints them (Markdown, progress lines, the final table): 3 significant digits."""

from __future__ import annotations

import math


def num(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "—"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def size(x: float) -> str:
    """A sweep's x value as given (1, 16, 1024), never rounded to 3 digits."""
    return f"{x:g}"


def times(value: float | None) -> str:
    """A ratio or a fraction of a roof: 0.89x, 3.1x, 0.0021x."""
    if value is None or math.isnan(value):
        return "—"
    return f"{value:.2f}x" if abs(value) >= 0.095 else f"{value:.2g}x"
