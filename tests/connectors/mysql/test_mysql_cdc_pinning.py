"""A batch's chunks read as of the binlog position the driver pinned for it, against a real
MariaDB.

Spark reads a micro-batch again for each action on it in ``foreachBatch`` (and for retried,
speculative and recomputed tasks). MariaDB cannot share a snapshot between sessions, so the
driver pins a position ``P`` (:class:`~splitflow.connectors.mysql.pinning.PositionPinner`)
and every read rewinds its own, later snapshot to ``P`` with the binlog: every read gives the
same rows, the table as it stood at ``P``, with the same watermark, whatever was committed
between the reads.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from tests.connectors.cdc.database import read_slice as read
from tests.connectors.mysql.test_mysql_cdc_harness import load
from tests.support.mariadb import MariaDB

pytest.importorskip("pymysqlreplication", reason="pip install -e '.[mysql]'")

from splitflow.connectors.cdc.splits import ChunkReadEvent, ChunkSplit, LogSplit
from splitflow.connectors.mysql.pinning import BatchPosition, PositionPinner
from splitflow.connectors.mysql.source import MySqlCdcSource
from splitflow.errors import ConnectorError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning"),
]

_names = itertools.count()


class Pinned:
    def __init__(self, db: MariaDB, keyed: bool = True) -> None:
        self.db = db
        self.table = f"pinned{next(_names)}"
        key = "PRIMARY KEY" if keyed else ""
        db.execute(f"CREATE TABLE {self.table} (id BIGINT {key}, version INT NOT NULL)")
        with db.connect() as conn, conn.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {self.table} VALUES (%s, 0)", [(i,) for i in range(1, 1001)]
            )
        self.source: MySqlCdcSource = load(db, tableName=self.table, chunkSize="400")

    def chunk(self) -> ChunkSplit:
        if self.source.tables[f"splitflow.{self.table}"].chunk_key:
            return ChunkSplit(f"splitflow.{self.table}", 0, "id", None, 500)
        return ChunkSplit(f"splitflow.{self.table}", 0)

    def rows_now(self) -> list[tuple[Any, ...]]:
        condition = " WHERE id < 500" if self.chunk().key else ""
        rows = self.db.execute(f"SELECT id, version FROM {self.table}{condition}")
        return sorted((int(i), int(v)) for i, v in rows)

    def write(self, n: int) -> None:
        """Updates, deletes and inserts inside the chunk's range, each a transaction."""
        t = self.table
        self.db.execute(f"UPDATE {t} SET version = version + 1 WHERE id <= 10 + {n}")
        self.db.execute(f"DELETE FROM {t} WHERE id = {20 + n}")
        self.db.execute(f"INSERT INTO {t} VALUES ({-n - 1}, 7)")
        self.db.execute(f"UPDATE {t} SET id = id + 100000 WHERE id = {30 + n}")  # leaves it
        self.db.execute(f"UPDATE {t} SET id = {20 + n} WHERE id = {600 + n}")  # comes in


@pytest.fixture
def pinned(mariadb: MariaDB) -> Pinned:
    return Pinned(mariadb)


def test_every_read_of_a_pinned_batch_gives_the_chunk_as_it_stood_at_the_pin(
    pinned: Pinned,
) -> None:
    pinner = PositionPinner(pinned.source.options)
    pin = pinner.pin(1, [pinned.chunk()])
    assert isinstance(pin, BatchPosition)
    at_pin = pinned.rows_now()
    pinned.write(1)
    first = read(pinned.source, pinned.chunk(), pin)  # rewinds 5 transactions
    pinned.write(2)
    assert pinner.pin(1, [pinned.chunk()]) == pin, "a batch keeps its pin while it runs"
    second = read(pinned.source, pinned.chunk(), pin)  # rewinds 10
    assert second == first
    rows, events = first
    assert [(i, v) for i, v, _, _ in rows] == at_pin  # ordered by the key, as at the pin
    assert {(op, lsn) for _, _, op, lsn in rows} == {("r", pin.position)}
    (mark,) = [e.mark for e in events if isinstance(e, ChunkReadEvent)]
    assert (mark.split_id, mark.high) == (pinned.chunk().split_id, pin.position)


def test_a_table_without_a_key_is_rewound_as_a_multiset(mariadb: MariaDB) -> None:
    keyless = Pinned(mariadb, keyed=False)
    keyless.db.execute(f"INSERT INTO {keyless.table} VALUES (5, 0), (5, 0)")  # equal rows
    pinner = PositionPinner(keyless.source.options)
    pin = pinner.pin(1, [keyless.chunk()])
    at_pin = keyless.rows_now()
    keyless.db.execute(f"DELETE FROM {keyless.table} WHERE id = 5 LIMIT 1")
    keyless.db.execute(f"UPDATE {keyless.table} SET version = 3 WHERE id < 4")
    keyless.db.execute(f"INSERT INTO {keyless.table} VALUES (5, 0)")
    first = read(keyless.source, keyless.chunk(), pin)
    keyless.db.execute(f"DELETE FROM {keyless.table} WHERE id > 900")
    second = read(keyless.source, keyless.chunk(), pin)
    assert second == first
    assert [(i, v) for i, v, _, _ in first[0]] == at_pin


def test_without_a_pin_each_read_stands_at_its_own_snapshot(pinned: Pinned) -> None:
    """What the pin prevents: a read after a commit sees it, with another watermark."""
    first = read(pinned.source, pinned.chunk(), None)
    pinned.write(3)
    second = read(pinned.source, pinned.chunk(), None)
    assert second[0] != first[0]
    assert second[1] != first[1]
    assert [(i, v) for i, v, _, _ in second[0]] == pinned.rows_now()


def test_a_truncate_after_the_pin_fails_the_read_instead_of_reading_it_empty(
    pinned: Pinned,
) -> None:
    pinner = PositionPinner(pinned.source.options)
    pin = pinner.pin(8, [pinned.chunk()])
    assert pin is not None
    assert len(read(pinned.source, pinned.chunk(), pin)[0]) == 499
    pinned.db.execute(f"TRUNCATE TABLE {pinned.table}")
    with pytest.raises(ConnectorError) as failure:
        read(pinned.source, pinned.chunk(), pin)
    message = str(failure.value)
    assert (
        f"chunk splitflow.{pinned.table}#0: table splitflow.{pinned.table} was changed" in message
    )
    assert pin.where in message
    assert "restart the query" in message


def test_a_batch_that_reads_only_the_log_pins_nothing(pinned: Pinned) -> None:
    pinner = PositionPinner(pinned.source.options)
    assert pinner.pin(5, [LogSplit("binlog", 0)]) is None


def test_a_pin_lasts_until_its_batch_is_released(pinned: Pinned) -> None:
    pinner = PositionPinner(pinned.source.options)
    first = pinner.pin(6, [pinned.chunk()])
    pinned.write(4)
    assert pinner.pin(6, [pinned.chunk()]) == first
    pinner.release(6)
    again = pinner.pin(6, [pinned.chunk()])
    assert again is not None
    assert first is not None
    assert again.position > first.position


def test_a_restarted_driver_resumes_the_pin_and_reads_what_the_first_reads_did(
    pinned: Pinned,
) -> None:
    """A replay after a driver crash: the new driver's pinner gets the kept event."""
    pin = PositionPinner(pinned.source.options).pin(2, [pinned.chunk()])
    assert pin is not None
    first = read(pinned.source, pinned.chunk(), pin)
    pinned.write(5)  # the driver dies; the table goes on changing until the replay
    restarted = PositionPinner(pinned.source.options)
    assert restarted.resume(2, [pinned.chunk()], pin) == pin
    assert restarted.pin(2, [pinned.chunk()]) == pin, "held as a pin is"
    assert read(pinned.source, pinned.chunk(), pin) == first


def test_a_pin_whose_binlog_was_purged_is_taken_anew_on_resume(
    pinned: Pinned, caplog: pytest.LogCaptureFixture
) -> None:
    pin = PositionPinner(pinned.source.options).pin(3, [pinned.chunk()])
    assert pin is not None
    gone = dataclasses.replace(pin, file=pin.file - 1_000)  # a file the server never had
    resumed = PositionPinner(pinned.source.options).resume(3, [pinned.chunk()], gone)
    assert isinstance(resumed, BatchPosition)
    assert resumed != gone
    assert resumed.position >= pin.position
    assert f"no longer has the binlog of {gone.where}" in caplog.text


def test_a_pin_whose_connection_is_lost_is_taken_again(
    pinned: Pinned, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost connection (the fault schedules' KILL CONNECTION, a server restarting) while
    the driver pins a batch is tried again: a pin holds nothing on the server. Only a server
    that keeps failing fails the batch, naming it."""
    import pymysql

    from splitflow.connectors.mysql import catalog

    real = catalog.snapshot_position
    calls = []

    def lost_once(conn: Any, where: str) -> Any:
        calls.append(where)
        if len(calls) == 1:
            raise pymysql.err.OperationalError(2013, "Lost connection to server during query")
        return real(conn, where)

    monkeypatch.setattr(catalog, "snapshot_position", lost_once)
    pin = PositionPinner(pinned.source.options).pin(9, [pinned.chunk()])
    assert pin is not None
    assert len(calls) == 2

    def lost(conn: Any, where: str) -> Any:
        raise pymysql.err.OperationalError(2013, "Lost connection to server during query")

    monkeypatch.setattr(catalog, "snapshot_position", lost)
    with pytest.raises(ConnectorError, match=r"cannot pin .* on MySQL .*127\.0\.0\.1.*3 attempt"):
        PositionPinner(pinned.source.options).pin(10, [pinned.chunk()])
