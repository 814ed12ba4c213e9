"""The figures a benchmark run measured, by key, so that `bench.compare` can set two runs side by side."""

from __future__ import annotations

FIGURES: dict[str, tuple[float, str]] = {}
"""key -> (value, unit); every figure here is better when lower (times, bytes)."""


def record(key: str, value: float, unit: str) -> float:
    FIGURES[key] = (value, unit)
    return value


def percentile(samples: list[float], q: float) -> float:
    """The sample at quantile q (0..1) of `samples`: the same rule in every suite."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
