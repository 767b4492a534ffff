"""A minimal metric group: named counters and gauges, read as one snapshot dict."""

from __future__ import annotations

from collections.abc import Callable


class SimpleCounter:
    def __init__(self) -> None:
        self._count = 0

    def inc(self, n: int = 1) -> None:
        self._count += n

    @property
    def count(self) -> int:
        return self._count


class SimpleMetricGroup:
    """Counters and gauges of one source. Called by: the coordinator thread."""

    def __init__(self) -> None:
        self._counters: dict[str, SimpleCounter] = {}
        self._gauges: dict[str, Callable[[], float | int | None]] = {}

    def counter(self, name: str) -> SimpleCounter:
        return self._counters.setdefault(name, SimpleCounter())

    def gauge(self, name: str, supplier: Callable[[], float | int | None]) -> None:
        self._gauges[name] = supplier

    def snapshot(self) -> dict[str, float | int | None]:
        values: dict[str, float | int | None] = {k: c.count for k, c in self._counters.items()}
        values.update({k: g() for k, g in self._gauges.items()})
        return values
