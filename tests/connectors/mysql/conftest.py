"""The MySQL/MariaDB tests' server: one per test session (see ``tests/support/mariadb.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.support.mariadb import MariaDB, mariadb_fixture


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    """A MariaDB 10.11 on loopback for the whole session (row binlog, full row metadata,
    GTIDs); each test uses its own tables and replica ``server_id``."""
    yield from mariadb_fixture(tmp_path_factory)
