"""Change data capture end to end: a writer of changes, and a replay of what the sink got.

:class:`Writer` (PostgreSQL) and :class:`MariaWriter` insert, update (``version + 1``) and
delete rows of a table ``(id bigint PRIMARY KEY, version int, payload text)`` from a
thread, and reconnect when the server restarts. :func:`sink_in_batch_order` reads a
Parquet sink of the CDC source in the order Spark committed it (Spark's file sink, or the
batch folders of a ``foreachBatch`` sink), and :func:`replay` replays it key by key
against the table's final rows: every key's history must be gap-free (``r`` or ``c``,
then ``u`` with versions +1 each, maybe a ``d``) and end at the table's row.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from splitflow.connectors.cdc.chunks import cut_ahead
from splitflow.connectors.cdc.splits import ChunkSplit
from splitflow.job.pipeline import committed_output_files
from splitflow.testing.postgres import Postgres


class ChangeWriter(threading.Thread):
    """Inserts (new ids only), updates and deletes, a few per 10 ms in transactions of one to
    three, until :meth:`stop`; reconnects (after 0.2 s) when the server goes away, so it
    outlives a restart. A subclass says how to connect, what a lost connection raises, how
    to commit a transaction, and the SQL of a random payload."""

    PAYLOAD = ""
    INSERT = "INSERT INTO {table} VALUES (%s, 0, 'new')"
    UPDATE = "UPDATE {table} SET version = version + 1, payload = {payload} WHERE id = %s"

    def __init__(self, server: Any, table: str, first_id: int, seed: int = 7) -> None:
        super().__init__(daemon=True)
        self.server, self.table, self.next_id = server, table, first_id
        self.seed = seed
        self.stopped = threading.Event()
        self.changes = 0
        """Changes of committed transactions."""
        self.reconnects = 0

    def connection(self) -> Any:
        raise NotImplementedError

    def lost(self) -> type[Exception]:
        raise NotImplementedError

    def commit(self, conn: Any, statements: list[tuple[str, tuple[int]]]) -> None:
        raise NotImplementedError

    def run(self) -> None:
        rng = random.Random(self.seed)
        while not self.stopped.is_set():
            try:
                with self.connection() as conn:
                    self._write(conn, rng)
            except self.lost():
                self.reconnects += 1
                self.stopped.wait(0.2)

    def _write(self, conn: Any, rng: random.Random) -> None:
        while not self.stopped.wait(0.01):
            statements = []
            for _ in range(rng.randint(1, 3)):
                action, key = rng.random(), rng.randint(1, self.next_id)
                if action < 0.35:
                    insert = self.INSERT.format(table=self.table)
                    statements.append((insert, (self.next_id,)))
                    self.next_id += 1
                elif action < 0.85:
                    update = self.UPDATE.format(table=self.table, payload=self.PAYLOAD)
                    statements.append((update, (key,)))
                else:
                    statements.append((f"DELETE FROM {self.table} WHERE id = %s", (key,)))
            self.commit(conn, statements)
            self.changes += len(statements)  # the transaction committed

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)


class Writer(ChangeWriter):
    """:class:`ChangeWriter` for PostgreSQL."""

    PAYLOAD = "md5(random()::text)"

    def __init__(self, postgres: Postgres, table: str, first_id: int, seed: int = 7) -> None:
        super().__init__(postgres, table, first_id, seed)
        self.postgres = postgres

    def connection(self) -> Any:
        return self.postgres.connect()

    def lost(self) -> type[Exception]:
        import psycopg

        return psycopg.OperationalError

    def commit(self, conn: Any, statements: list[tuple[str, tuple[int]]]) -> None:
        with conn.transaction():
            for sql, params in statements:
                conn.execute(sql, params)


class MariaWriter(ChangeWriter):
    """:class:`ChangeWriter` for MariaDB (``server``: a :class:`tests.support.mariadb.MariaDB`)."""

    PAYLOAD = "MD5(RAND())"

    def connection(self) -> Any:
        return contextlib.closing(self.server.connect(autocommit=False))

    def lost(self) -> type[Exception]:
        import pymysql

        return pymysql.err.OperationalError

    def commit(self, conn: Any, statements: list[tuple[str, tuple[int]]]) -> None:
        with conn.cursor() as cursor:
            for sql, params in statements:
                cursor.execute(sql, params)
        conn.commit()


def sink_in_batch_order(out: Path) -> list[dict[str, Any]]:
    """Every row the file sink committed (:func:`committed_output_files`), in batch order
    (by ``lsn`` within a file): a batch's files are written after the batch before it
    committed, so their modification times order the batches. A key's rows of one batch
    come from one task, hence one file.

    A folder without the file sink's log (``_spark_metadata``) is read as the folders of a
    ``foreachBatch`` sink (:func:`batch_folders_in_order`).
    """
    if not (out / "_spark_metadata").is_dir():
        return batch_folders_in_order(out)
    rows: list[dict[str, Any]] = []
    for path in sorted(committed_output_files(out), key=lambda p: (p.stat().st_mtime_ns, p)):
        rows.extend(sorted(pq.read_table(path).to_pylist(), key=lambda r: r["lsn"]))
    return rows


def batch_folders(out: Path) -> dict[int, Path]:
    """Batch id -> its folder ``<out>/batch=<id>`` (:class:`tests.spark.jobs.ForeachBatchSink`).
    Each must hold Spark's ``_SUCCESS``: a write cut short is replaced when its batch is
    replayed, so a folder without it means that a batch was never written whole. Only the
    newest batch may be cut short, and is left out: Spark runs one batch at a time, and a
    query stopped or killed while writing it has not committed it (a restart replays it)."""
    folders = {
        int(path.name.partition("=")[2]): path
        for path in out.glob("batch=*")
        if path.name.partition("=")[2].isdigit()
    }
    partial = sorted(b for b, path in folders.items() if not (path / "_SUCCESS").exists())
    if partial and partial[-1] == max(folders):
        del folders[partial.pop()]
    assert not partial, f"batches {partial} of {out} were not written whole (no _SUCCESS)"
    return dict(sorted(folders.items()))


def batch_rows(folder: Path) -> list[dict[str, Any]]:
    """The rows of one batch's folder, by ``lsn`` (a stable sort: a transaction's changes
    keep their order, and a key's rows of one batch come from one task, hence one file)."""
    rows: list[dict[str, Any]] = []
    for path in sorted(folder.glob("part-*.parquet")):
        rows.extend(pq.read_table(path).to_pylist())
    return sorted(rows, key=lambda r: r["lsn"])


def batch_folders_in_order(out: Path) -> list[dict[str, Any]]:
    """Every row a ``foreachBatch`` sink wrote to ``<out>/batch=<id>``, in batch id order
    (by ``lsn`` within a batch): :func:`batch_folders`, :func:`batch_rows`."""
    return [row for folder in batch_folders(out).values() for row in batch_rows(folder)]


@dataclass
class Replay:
    """What replaying a sink against a table found: changes lost (a gap in a key's
    versions, a change to a row never seen, a final row that differs) and changes delivered
    twice (a repeated row, an older version again, a snapshot read after changes), each
    with a description; ``keys``: the keys the sink or the table has."""

    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    keys: int = 0


def replay(rows: list[dict[str, Any]], table: Mapping[int, tuple[int, str]]) -> Replay:
    """Replay ``rows`` (in batch order) against ``table`` (id -> (version, payload)). A
    delete that carries the old row's version (the table's replica identity is FULL) must
    follow that version.

    A key inserted and deleted again is not looked for: when both changes precede the
    snapshot of the key's chunk, the source rightly emits nothing of it.
    """
    result = Replay()
    seen: set[tuple[Any, ...]] = set()
    state: dict[int, tuple[int, str]] = {}
    deleted: set[int] = set()
    snapshot_reads: set[int] = set()
    for row in rows:
        key, op, version = row["id"], row["op"], row["version"]
        identity = (key, op, row["lsn"], version)
        if identity in seen:
            result.duplicated.append(f"key {key}: {op} at lsn {row['lsn']} twice")
            continue
        seen.add(identity)
        if key in deleted:
            result.duplicated.append(f"key {key}: a row after its delete: {row}")
        elif op == "r":
            if key in snapshot_reads or key in state:
                result.duplicated.append(f"key {key}: snapshot read again or after changes")
            else:
                snapshot_reads.add(key)
                state[key] = (version, row["payload"])
        elif op == "c":
            if key in state:
                result.duplicated.append(f"key {key} inserted twice: {row}")
            state[key] = (version, row["payload"])
        elif op == "u":
            if key not in state:
                result.lost.append(f"key {key}: update of a row never seen: {row}")
            elif version <= state[key][0]:
                result.duplicated.append(f"key {key}: version {version} after {state[key][0]}")
            elif version > state[key][0] + 1:
                result.lost.append(f"key {key}: version {state[key][0]} then {version}")
            state[key] = (version, row["payload"])
        else:
            if key not in state:
                result.lost.append(f"key {key}: delete of a row never seen: {row}")
            elif version is not None and version != state[key][0]:
                result.lost.append(f"key {key}: version {state[key][0]}, then deleted at {version}")
            state.pop(key, None)
            deleted.add(key)
    for key in sorted(k for k in state.keys() | table.keys() if state.get(k) != table.get(k)):
        result.lost.append(
            f"key {key}: the sink ends at {state.get(key)}, the table at {table.get(key)}"
        )
    result.keys = len(state.keys() | table.keys() | deleted)
    return result


def table_rows(postgres: Postgres, table: str) -> dict[int, tuple[int, str]]:
    return {k: (v, p) for k, v, p in postgres.execute(f"SELECT id, version, payload FROM {table}")}


def chunks_of(catalog: Any, conn: Any, table: Any, chunk_size: int) -> list[ChunkSplit]:
    """``table`` cut whole, as a database's ``catalog`` module cuts it (``cut`` then
    ``key_after`` on ``conn``), for tests that look at every chunk."""
    start = catalog.cut(conn, table, chunk_size)
    return cut_ahead([start], None, lambda t, k, at, n: catalog.key_after(conn, t, k, at, n))[0]
