"""The figures a benchmark run measured, by key, so that `bench.compare` can set two runs side by side."""

from __future__ import annotations

FIGURES: dict[str, tuple[float, str]] = {}
"""key -> (value, unit); every figure here is better when lower (times, bytes)."""


def record(key: str, value: float, unit: str) -> float:
    FIGURES[key] = (value, unit)
    return value
