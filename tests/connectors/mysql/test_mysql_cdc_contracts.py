"""The core's contract suites against the MySQL/MariaDB CDC source and a real MariaDB
(:mod:`tests.connectors.cdc.contract_suite`): the bounded snapshot and the unbounded source.
Each pinned chunk read must rewind the later snapshot of the read-twice check's second read
to the batch's position."""

from __future__ import annotations

import unittest
from typing import Any

import pytest
from tests.connectors.cdc.contract_suite import InitialCdcContracts, SnapshotOnlyCdcContracts
from tests.support.mariadb import MariaDB

pytest.importorskip("pymysqlreplication", reason="pip install -e '.[mysql]'")

from tests.connectors.mysql.test_mysql_cdc_harness import MariaDbUnderTest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning"),
]


@pytest.fixture
def database(mariadb: MariaDB) -> MariaDbUnderTest:
    return MariaDbUnderTest(mariadb, server_ids="8000-8099")


class TestSnapshotOnlyCdcContracts(SnapshotOnlyCdcContracts):
    """``startupMode=snapshotOnly``."""


class TestInitialCdcContracts(InitialCdcContracts):
    """``startupMode=initial``: the snapshot, then the binlog."""

    def add_split_upstream(self) -> list[Any]:
        raise unittest.SkipTest(
            "a table that matches after the binlog started comes through the binlog from "
            "its first change and through its chunk too, so its rows may come twice (an "
            "upsert by key with the highest lsn is exact): test_mysql_cdc_harness.py's "
            "test_a_table_created_after_the_log_started_is_snapshotted_and_followed"
        )
