"""A test-only generator whose split 3 lags behind (``splitflow-test-lagging``).

Options are the generator's, plus ``lag`` (default ``60s``): split 3's event times start
that much before the others' (a partition behind on a backlog); ``stall`` and
``stallAfter``: split ``stall`` gets no new rows after its first ``stallAfter`` (a
partition that goes quiet); ``mapsPositions=false``: the enumerator tells event times but
maps no position (as Kafka's), so the planner searches positions itself; ``unit``: it maps
positions only to multiples of ``unit`` rows, as a coarse index does (Parquet's row groups);
``starts`` and ``rates`` (comma lists, one per split): each split's first event time, in
seconds after ``startTime`` (instead of ``lag``), and its rows per second of event time (all
rows exist: the generator's clock is far ahead). Importable in executors (the repository
root is on their path).
"""

from __future__ import annotations

from typing import Any

from splitflow.api.assigner import AssignerState
from splitflow.api.enumerator import SplitEnumerator, SplitEnumeratorContext, SplitExtent
from splitflow.api.options import parse_duration
from splitflow.connectors.generator import GeneratorEnumerator, GeneratorSource, GeneratorSplit
from splitflow.spark.generator import GeneratorDataSource


class LaggingGenerator(GeneratorSource):
    """Generated splits; split 3's event times start ``lag_us`` earlier. ``stall``: split
    ``stall`` gets no new rows after its first ``stall_after`` (an idle partition)."""

    def __init__(
        self,
        *args: Any,
        lag_us: int = 60_000_000,
        stall: int | None = None,
        stall_after: int = 0,
        maps_positions: bool = True,
        unit: int = 1,
        starts: list[float] | None = None,
        rates: list[float] | None = None,
        **kw: Any,
    ) -> None:
        if rates is not None:
            kw["clock"] = lambda: 1e12  # every row of every rate exists
        super().__init__(*args, **kw)
        self.lag_us, self.stall, self.stall_after = lag_us, stall, stall_after
        self.maps_positions, self.unit = maps_positions, unit
        self.starts, self.rates = starts, rates

    def splits(self, start_us: int = 0) -> list[GeneratorSplit]:
        splits = super().splits(start_us)
        if self.starts is not None or self.rates is not None:
            starts = self.starts or [0.0] * len(splits)
            return [
                GeneratorSplit(
                    s.index,
                    s.rows,
                    s.start_us + round(starts[s.index] * 1e6),
                    s.rate if self.rates is None else self.rates[s.index],
                )
                for s in splits
            ]
        return [
            GeneratorSplit(s.index, s.rows, s.start_us - self.lag_us, s.rate) if s.index == 3 else s
            for s in splits
        ]

    def create_enumerator(
        self, context: SplitEnumeratorContext[GeneratorSplit]
    ) -> SplitEnumerator[GeneratorSplit, AssignerState[GeneratorSplit]]:
        return StallingEnumerator(self, context, None)

    def restore_enumerator(
        self, context: SplitEnumeratorContext[GeneratorSplit], state: AssignerState[GeneratorSplit]
    ) -> SplitEnumerator[GeneratorSplit, AssignerState[GeneratorSplit]]:
        return StallingEnumerator(self, context, state)


class StallingEnumerator(GeneratorEnumerator):
    def latest_positions(self, splits: Any) -> dict[str, SplitExtent]:
        extents = super().latest_positions(splits)
        source: LaggingGenerator = self._source  # type: ignore[assignment]
        for split in splits:
            if split.index == source.stall:
                extents[split.split_id] = SplitExtent(source.stall_after)
        return extents

    def positions_after(self, splits: Any, event_time: int) -> dict[str, int]:
        """The generator's exact answers; with ``unit``, each rounded down to a multiple of
        ``unit`` rows (reading up to it still reads nothing later), never below the
        position."""
        source: LaggingGenerator = self._source  # type: ignore[assignment]
        if not source.maps_positions:
            return {}
        exact = super().positions_after(splits, event_time)
        position = {s.split_id: s.position for s in splits}
        unit = source.unit
        return {sid: max(position[sid], at - at % unit) for sid, at in exact.items()}


class LaggingDataSource(GeneratorDataSource):
    """The generator's data source over :class:`LaggingGenerator` (options as the generator's)."""

    OPTIONS = (
        *GeneratorDataSource.OPTIONS,
        *("lag", "stall", "stallAfter", "mapsPositions", "unit", "starts", "rates"),
    )

    @classmethod
    def name(cls) -> str:
        return "splitflow-test-lagging"

    def create_source(self) -> LaggingGenerator:
        base = super().create_source()
        stall = self.options.get("stall")
        return LaggingGenerator(
            base.num_splits,
            base.rows,
            start_time=base.start_time,
            batch_rows=base.batch_rows,
            lag_us=round(parse_duration("lag", self.options.get("lag", "60s")) * 1_000_000),
            stall=None if stall is None else int(stall),
            stall_after=int(self.options.get("stallafter", "0")),
            maps_positions=self.options.get("mapspositions", "true") == "true",
            unit=int(self.options.get("unit", "1")),
            starts=_floats(self.options.get("starts")),
            rates=_floats(self.options.get("rates")),
        )


def _floats(text: str | None) -> list[float] | None:
    return None if text is None else [float(v) for v in text.split(",")]
