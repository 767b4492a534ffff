"""The core's contract suites against the PostgreSQL CDC source and a real server
(:mod:`tests.connectors.cdc.contract_suite`): the bounded snapshot and the unbounded source,
which finds a table created while it runs."""

from __future__ import annotations

import pytest
from tests.connectors.cdc.contract_suite import InitialCdcContracts, SnapshotOnlyCdcContracts
from tests.connectors.postgres.test_cdc_harness import PostgresUnderTest

from splitflow.testing.postgres import Postgres


@pytest.fixture
def database(postgres: Postgres) -> PostgresUnderTest:
    return PostgresUnderTest(postgres)


class TestSnapshotOnlyCdcContracts(SnapshotOnlyCdcContracts):
    """``startupMode=snapshotOnly``."""


class TestInitialCdcContracts(InitialCdcContracts):
    """``startupMode=initial``: the snapshot, then the log."""
