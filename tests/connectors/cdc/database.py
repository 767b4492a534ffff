"""What the CDC tests need of one database, and the tools they share on top of it.

Each database the CDC core serves subclasses :class:`DatabaseUnderTest` once, next to its
harness tests (``PostgresUnderTest`` in ``tests/connectors/postgres/test_cdc_harness.py``,
``MariaDbUnderTest`` in ``tests/connectors/mysql/test_mysql_cdc_harness.py``): how its
source is made, what a pattern of table names looks like, where its log ends, how a client
runs a transaction. The suites (:mod:`tests.connectors.cdc.harness_suite`,
:mod:`tests.connectors.cdc.contract_suite`) and the tools here speak only to it: a
:class:`Case` (a fresh table and its source), :class:`Writer` (seeded random changes, one
transaction at a time), :class:`Background` (a writer on a thread), :func:`read_slice`
(one split read as a Spark task reads it).

SQL here is what both PostgreSQL and MariaDB accept: ``%s`` placeholders, ``INT``, the
database's short text type (:attr:`DatabaseUnderTest.text`).
"""

from __future__ import annotations

import itertools
import random
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Generic, TypeVar

import pyarrow as pa

from splitflow.api.events import SourceEvent
from splitflow.api.reader import InputStatus
from splitflow.connectors.cdc.source import CdcSource
from splitflow.connectors.cdc.splits import ChunkSplit
from splitflow.reader.output import Collector, RecordingReaderContext
from splitflow.testing.dbserver import LoopbackServer

ServerT = TypeVar("ServerT", bound=LoopbackServer)
"""The database's throw-away server (``splitflow.testing.postgres.Postgres``, ...)."""

AnyCdcSource = CdcSource[Any, Any]

_names = itertools.count()


class DatabaseUnderTest(ABC, Generic[ServerT]):
    """One database of the CDC core on its test server, as the shared CDC tests use it.

    Called by: the tests' thread; :meth:`connect` and :meth:`transaction` also by a
    :class:`Background` writer's thread (on a connection of its own).
    """

    schema: ClassVar[str]
    """Where the tests' tables are: a table ``t`` is ``<schema>.t`` in the source."""
    text: ClassVar[str]
    """The type of a short text column (``text``, ``VARCHAR(20)``)."""

    def __init__(self, server: ServerT) -> None:
        self.server = server

    @abstractmethod
    def source(self, tables: str, log: str, **options: str) -> AnyCdcSource:
        """The source of ``tables`` (a name or a :meth:`pattern`) with ``options``, as the
        database's Spark data source makes it at ``load()``. ``log`` names what the
        source keeps on the server for its log (PostgreSQL's slot and publication)."""

    @abstractmethod
    def pattern(self, prefix: str) -> str:
        """The ``tables`` value that matches every table whose name starts with
        ``prefix``."""

    @abstractmethod
    def log_end(self) -> int:
        """Where the log ends now, in the log split's positions."""

    def drop_log(self, log: str) -> None:
        """Remove what sources made for ``log`` (after a test). Default: nothing."""

    @abstractmethod
    def connect(self) -> Any:
        """A new connection for a writer (close it when done)."""

    @abstractmethod
    def transaction(self, conn: Any) -> AbstractContextManager[Any]:
        """A cursor of ``conn`` whose statements commit together when the block ends."""

    @abstractmethod
    def cut(self, source: AnyCdcSource, table: str, chunk_size: int) -> list[ChunkSplit]:
        """``table``'s chunks as the source's enumerator cuts them."""

    def qualified(self, table: str) -> str:
        return f"{self.schema}.{table}"

    def execute(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """One statement on its own (autocommit); its rows."""
        return self.server.execute(sql, params)

    def insert(self, table: str, rows: Iterable[Sequence[Any]]) -> None:
        """Insert ``rows`` (tuples of every column) into ``table``, in one transaction."""
        rows = list(rows)
        marks = ", ".join(["%s"] * len(rows[0]))
        with self.connect() as conn, self.transaction(conn) as cursor:
            cursor.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)


class Case(Generic[ServerT]):
    """A fresh table name for one test, and its source; :meth:`drop` removes what the
    source left on the server (the test's fixture calls it)."""

    def __init__(self, database: DatabaseUnderTest[ServerT]) -> None:
        self.database = database
        self.server: ServerT = database.server
        self.table = f"cdc_h{next(_names)}"
        self.log = self.table
        """What the source keeps for its log is named after the table."""

    @property
    def name(self) -> str:
        """The table's name in the source (and in its output's ``table`` column)."""
        return self.database.qualified(self.table)

    def source(
        self, chunk_size: int = 500, *, tables: str | None = None, **options: str
    ) -> AnyCdcSource:
        """The source of the table (or of ``tables``), in chunks of ``chunk_size`` rows."""
        return self.database.source(
            tables or self.table, self.log, chunkSize=str(chunk_size), **options
        )

    def drop(self) -> None:
        self.database.drop_log(self.log)


def make_table(database: DatabaseUnderTest[Any], table: str, ids: Iterable[int]) -> set[int]:
    """``table (id INT PRIMARY KEY, v INT, w <text>)`` with a row ``(id, id % 100,
    'row<id>')`` for each of ``ids``; returns the ids."""
    ids = list(ids)
    database.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT, w {database.text})")
    database.insert(table, [(i, i % 100, f"row{i}") for i in ids])
    return set(ids)


def table_now(
    database: DatabaseUnderTest[Any], table: str, columns: str = "id, v, w"
) -> dict[Any, Any]:
    """The table's rows now: the first column -> every column by name."""
    names = [c.strip() for c in columns.split(",")]
    rows = database.execute(f"SELECT {columns} FROM {table}")
    return {row[0]: dict(zip(names, row, strict=True)) for row in rows}


class TransactionWriter:
    """Transactions of one or several changes (:meth:`one`), with a seeded generator: the
    same run every time. :meth:`write` may be called from one thread at a time; a lock
    keeps a :class:`Background` thread's transactions apart from the test's."""

    def __init__(self, database: DatabaseUnderTest[Any], table: str, seed: int) -> None:
        self.database = database
        self.conn = database.connect()
        self.table = table
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def one(self, cursor: Any, inserts_only: bool = False) -> None:
        """One change (an insert only, with ``inserts_only``) through ``cursor``."""
        raise NotImplementedError

    def write(self, transactions: int, inserts_only: bool = False) -> None:
        with self.lock:
            for _ in range(transactions):
                with self.database.transaction(self.conn) as cursor:
                    for _ in range(self.rng.choice((1, 1, 1, 3))):
                        self.one(cursor, inserts_only)

    def close(self) -> None:
        self.conn.close()


class Writer(TransactionWriter):
    """Random inserts, updates and deletes on a :func:`make_table` table; an insert takes a
    new id, or (3 in 10) a deleted one again, inside a chunk."""

    def __init__(
        self, database: DatabaseUnderTest[Any], table: str, live: set[int], seed: int
    ) -> None:
        super().__init__(database, table, seed)
        self.live = set(live)
        self.dead: set[int] = set()
        self.next_id = max(live, default=0) + 1

    def one(self, cursor: Any, inserts_only: bool = False) -> None:
        pick = self.rng.random()
        if inserts_only or pick < 0.4 or not self.live:
            if self.dead and self.rng.random() < 0.3:
                key = self.rng.choice(sorted(self.dead))  # a key again, inside a chunk
                self.dead.discard(key)
            else:
                key, self.next_id = self.next_id, self.next_id + 1
            cursor.execute(
                f"INSERT INTO {self.table} VALUES (%s, %s, 'new')", (key, self.rng.randrange(99))
            )
            self.live.add(key)
        elif pick < 0.8:
            key = self.rng.choice(sorted(self.live))
            cursor.execute(
                f"UPDATE {self.table} SET v = v + 1, w = %s WHERE id = %s", (f"u{pick:.3f}", key)
            )
        else:
            key = self.rng.choice(sorted(self.live))
            cursor.execute(f"DELETE FROM {self.table} WHERE id = %s", (key,))
            self.live.discard(key)
            self.dead.add(key)


class Background:
    """A writer thread that writes until stopped (changes made while chunks are read)."""

    def __init__(self, writer: TransactionWriter, inserts_only: bool = False) -> None:
        self.writer = writer
        self.stopping = threading.Event()
        self.count = 0
        self.error: BaseException | None = None

        def run() -> None:
            try:
                while not self.stopping.is_set():
                    writer.write(1, inserts_only)
                    self.count += 1
            except BaseException as e:  # reported by stop()
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def stop(self) -> int:
        """Stop the thread; the transactions it wrote (its error, if it failed)."""
        self.stopping.set()
        self.thread.join(30)
        if self.error is not None:
            raise self.error
        return self.count


def read_slice(
    source: AnyCdcSource, split: ChunkSplit, pin: SourceEvent | None
) -> tuple[list[tuple[Any, ...]], list[SourceEvent]]:
    """Read ``split`` whole as a Spark task does (the batch's pin first, when there is one,
    then the slice): its rows' ``(id, version, op, lsn)`` in the order they came, and the
    events the reader sent."""
    context = RecordingReaderContext(0)
    reader = source.create_reader(context)
    reader.start()
    out: Collector[pa.RecordBatch] = Collector()
    try:
        if pin is not None:
            reader.handle_source_event(pin)
        reader.add_splits([split], stop_at={split.split_id: 1})
        reader.notify_no_more_splits()
        while reader.poll_next(out) is not InputStatus.END_OF_INPUT:
            reader.wait_available(10)
    finally:
        reader.close()
    rows = [(r["id"], r["version"], r["op"], r["lsn"]) for batch in out for r in batch.to_pylist()]
    return rows, context.events
