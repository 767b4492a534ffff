"""The generator connector: the contract suites, determinism and skew."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from splitflow.connectors.generator import GeneratorSource, make_batch
from splitflow.errors import ConfigurationError
from splitflow.testing.contracts import SourceContract, SourceReaderContract


class TestGeneratorSource(SourceContract, SourceReaderContract):
    def make_source(self) -> GeneratorSource:
        return GeneratorSource(5, 40, batch_rows=7, skew=1.0)

    def expected_records(self) -> list[Any]:
        return [(s.index, i) for s in self.make_source().splits() for i in range(s.rows)]

    def rows(self, record: Any) -> list[Any]:
        assert isinstance(record, pa.RecordBatch)
        columns = record.to_pydict()
        return list(zip(columns["split"], columns["id"], strict=True))

    def record_split_id(self, record: Any) -> str:
        return f"gen-{record[0]:05d}"


def test_a_slice_is_the_same_rows_whatever_the_batch_boundaries() -> None:
    whole = make_batch(3, 0, 100)
    pieces = pa.Table.from_batches([make_batch(3, 0, 37), make_batch(3, 37, 100)])
    assert pa.Table.from_batches([whole]).equals(pieces)


def test_skew_makes_the_last_split_that_many_times_the_first() -> None:
    splits = GeneratorSource(4, 100, skew=2.0).splits()
    assert [s.rows for s in splits] == [100, 167, 233, 300]


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [({"splits": 0}, "splits"), ({"rows": 0}, "rowsPerSplit"), ({"skew": -1.0}, "skew")],
)
def test_bad_settings_name_the_option(kwargs: dict[str, Any], option: str) -> None:
    settings: dict[str, Any] = {"splits": 2, "rows": 10, **kwargs}
    with pytest.raises(ConfigurationError) as error:
        GeneratorSource(settings.pop("splits"), settings.pop("rows"), **settings)
    assert error.value.option == option
