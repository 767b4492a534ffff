"""The PostgreSQL tests' server: one per test session (``splitflow.testing.postgres``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from splitflow.testing.postgres import Postgres, postgres_fixture


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    """A PostgreSQL 15 on loopback for the whole session (``wal_level=logical``); each test
    uses its own tables, publications and slots, and drops its slots."""
    yield from postgres_fixture(tmp_path_factory)
