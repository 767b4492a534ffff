"""The test source on Spark: ``spark.readStream.format("splitflow-sequence")``.

Options: ``catalog`` (path of a :class:`~splitflow.testing.SequenceCatalog` JSON file,
required), ``bounded`` (``true``/``false``), ``failOnDataLoss`` (default ``true``: a split
that vanishes under a planned batch fails the query with a DataLossError; ``false``: its
lost records are skipped with a warning), ``discoveryInterval`` (duration; unset:
discover once), ``fetchSize`` (records per fetch), ``recordBytes`` (a size estimate per
record, which enables ``maxBytesPerBatch``), plus the runtime options of
:mod:`splitflow.spark.options`. Rows are ``(split string, position bigint)``.
"""

from __future__ import annotations

import os

from splitflow.api.options import parse_bytes, parse_duration, parse_flag, parse_positive_int
from splitflow.errors import ConfigurationError
from splitflow.spark.datasource import SplitflowDataSource
from splitflow.testing.sequence import SequenceCatalog, SequenceSource


class SequenceDataSource(SplitflowDataSource):
    OPTIONS = (
        "catalog",
        "bounded",
        "failOnDataLoss",
        "discoveryInterval",
        "fetchSize",
        "recordBytes",
    )

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
        bounded = parse_flag("bounded", self.options.get("bounded"), False)
        fail_on_data_loss = parse_flag("failOnDataLoss", self.options.get("failondataloss"), True)
        interval = self.options.get("discoveryinterval")
        fetch = self.options.get("fetchsize")
        record_bytes = self.options.get("recordbytes")
        return SequenceSource(
            SequenceCatalog(path=path),
            bounded=bounded,
            fail_on_data_loss=fail_on_data_loss,
            discovery_interval=None
            if interval is None
            else parse_duration("discoveryInterval", interval, above_zero=True),
            fetch_size=parse_positive_int("fetchSize", fetch) if fetch else 1000,
            record_bytes=parse_bytes("recordBytes", record_bytes) if record_bytes else None,
        )
