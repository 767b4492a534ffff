"""The test source on Spark: ``spark.readStream.format("splitflow-sequence")``.

Options: ``catalog`` (path of a :class:`~splitflow.testing.SequenceCatalog` JSON file,
required), ``bounded`` (``true``/``false``), ``discoveryInterval`` (duration; unset:
discover once), ``fetchSize`` (records per fetch), plus the runtime options of
:mod:`splitflow.spark.options`. Rows are ``(split string, position bigint)``.
"""

from __future__ import annotations

import os

from splitflow.errors import ConfigurationError
from splitflow.spark.datasource import SplitflowDataSource
from splitflow.spark.options import parse_duration, parse_positive_int
from splitflow.testing.sequence import SequenceCatalog, SequenceSource


class SequenceDataSource(SplitflowDataSource):
    @classmethod
    def name(cls) -> str:
        return "splitflow-sequence"

    def schema(self) -> str:
        return "split string, position bigint"

    def create_source(self) -> SequenceSource:
        path = self.options.get("catalog")
        if not path:
            raise ConfigurationError(
                "option catalog is required: the path of a sequence catalog JSON file",
                option="catalog",
            )
        if not os.path.isfile(path):
            raise ConfigurationError(f"option catalog: no file at {path!r}", option="catalog")
        bounded = self.options.get("bounded", "false").strip().lower()
        if bounded not in ("true", "false"):
            raise ConfigurationError(
                f"option bounded: {bounded!r} is not true or false", option="bounded"
            )
        interval = self.options.get("discoveryinterval")
        fetch = self.options.get("fetchsize")
        return SequenceSource(
            SequenceCatalog(path=path),
            bounded=bounded == "true",
            discovery_interval=None
            if interval is None
            else parse_duration("discoveryInterval", interval),
            fetch_size=parse_positive_int("fetchSize", fetch) if fetch else 1000,
        )
