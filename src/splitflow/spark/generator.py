"""The generator source on Spark: ``spark.read(Stream).format("splitflow-generator")``.

Rows: ``split int, id bigint, value bigint, event_time timestamp`` (see
:mod:`splitflow.connectors.generator` for the row function).

=================  ===========  ==========================================================
option             default      meaning
=================  ===========  ==========================================================
``splits``         4            number of splits
``rowsPerSplit``   (see below)  rows per split (the first; see ``skew``), or ``unbounded``;
                                default: ``unbounded`` with ``rowsPerSecond``, else 1,000,000
``rowsPerSecond``  (as fast     rows per second over all splits; row ``i`` of a split
                   as read)     exists once its event time ``start + i / rate`` has passed
``startTime``      (first       event time of row 0: seconds since the epoch, or an
                   start)       ISO-8601 time (``2026-01-01T00:00:00+00:00``)
``skew``           0            split ``i`` of ``n`` weighs ``1 + skew * i / (n - 1)``
``batchRows``      65,536       rows per Arrow batch
=================  ===========  ==========================================================

plus the runtime options of :mod:`splitflow.spark.options`. An unbounded stream without
``rowsPerSecond`` is always available, so it needs ``maxRecordsPerBatch`` (each batch would
be endless otherwise); a batch read (``spark.read``) of it would never end either.
"""

from __future__ import annotations

import math
from datetime import datetime

from splitflow.api.options import parse_positive_int
from splitflow.connectors.generator import SPARK_SCHEMA, GeneratorSource
from splitflow.errors import ConfigurationError
from splitflow.spark.datasource import SplitflowDataSource


def _parse_time(text: str) -> float:
    """Seconds since the epoch from a number or an ISO-8601 time with a zone."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ConfigurationError(
            f"option startTime: {text!r} is neither seconds since the epoch nor an ISO-8601 "
            "time with a zone (example: 2026-01-01T00:00:00+00:00)",
            option="startTime",
        )
    return moment.timestamp()


class GeneratorDataSource(SplitflowDataSource):
    OPTIONS = ("splits", "rowsPerSplit", "rowsPerSecond", "startTime", "skew", "batchRows")

    @classmethod
    def name(cls) -> str:
        return "splitflow-generator"

    def schema(self) -> str:
        return SPARK_SCHEMA

    def _number(self, name: str) -> float | None:
        text = self.options.get(name.lower())
        if text is None:
            return None
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 <= value < math.inf:
            raise ConfigurationError(
                f"option {name}: {text!r} is not a number of at least 0", option=name
            )
        return value

    def create_source(self) -> GeneratorSource:
        def whole(name: str) -> int | None:
            text = self.options.get(name.lower())
            return None if text is None else parse_positive_int(name, text)

        rate = self._number("rowsPerSecond")
        if rate == 0:
            raise ConfigurationError(
                "option rowsPerSecond: must be above 0 (leave it unset for as fast as read)",
                option="rowsPerSecond",
            )
        rows_text = self.options.get("rowspersplit")
        if rows_text is not None and rows_text.strip().lower() == "unbounded":
            rows = None
        elif rows_text is None:
            rows = None if rate is not None else 1_000_000
        else:
            rows = parse_positive_int("rowsPerSplit", rows_text)
        skew = self._number("skew") or 0.0
        if rows is None and rate is None and self.runtime.max_records_per_batch is None:
            raise ConfigurationError(
                "option maxRecordsPerBatch is required with rowsPerSplit=unbounded and no "
                "rowsPerSecond: every split is endless and always available",
                option="maxRecordsPerBatch",
            )
        start = self.options.get("starttime")
        return GeneratorSource(
            whole("splits") or 4,
            rows,
            rows_per_second=rate,
            start_time=None if start is None else _parse_time(start),
            batch_rows=whole("batchRows") or 65_536,
            skew=skew,
        )
