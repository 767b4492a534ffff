"""The Kafka tests' broker: one Tansu per test session (see ``tests/support/tansu.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.tansu import Tansu, tansu_fixture


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tansu]:
    """A Tansu broker on loopback for the whole session; each test uses its own topics."""
    yield from tansu_fixture(tmp_path_factory)
