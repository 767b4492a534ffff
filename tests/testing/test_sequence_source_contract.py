"""The contract suites, applied to the test source itself (bounded and unbounded)."""

from __future__ import annotations

from typing import Any

from splitflow.testing import SequenceCatalog, SequenceSource
from splitflow.testing.contracts import SourceContract, SourceReaderContract


class _SequenceFixtures:
    bounded = False

    def setup_method(self) -> None:
        lengths = {f"split-{i}": 5 + 7 * i for i in range(7)}
        self.catalog = SequenceCatalog(lengths)

    def make_source(self) -> SequenceSource:
        return SequenceSource(
            self.catalog,
            bounded=self.bounded,
            discovery_interval=None if self.bounded else 1.0,
            fetch_size=4,
        )

    def expected_records(self) -> list[Any]:
        return self.catalog.records()

    def record_split_id(self, record: Any) -> str:
        return str(record[0])


class TestUnboundedSequenceSource(_SequenceFixtures, SourceContract, SourceReaderContract):
    def add_split_upstream(self) -> list[Any]:
        self.catalog.add("late", 9)
        return [("late", i) for i in range(9)]

    def change_upstream_between_reads(self) -> None:
        """Records are appended past the planned stops, and a split appears."""
        for name in self.catalog.lengths():
            self.catalog.append(name, 3)
        self.catalog.add(f"new-{len(self.catalog.lengths())}", 4)


class TestBoundedSequenceSource(_SequenceFixtures, SourceContract, SourceReaderContract):
    bounded = True
