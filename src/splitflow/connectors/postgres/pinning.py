"""One database snapshot per planned batch, exported by the driver, imported by every task.

A chunk's rows and its watermark must come from the same MVCC snapshot, and every read of a
planned batch must return the same rows: Spark reads a micro-batch again for each action on
it in ``foreachBatch``, for a ``MERGE``, for a retried or speculative task, and for a stage
recomputed after a lost executor. If each read took a snapshot of its own, the rows one read
wrote to the sink could pair with the watermark of another, later one, and the log would
then skip the changes committed between the two: lost updates.

So the driver pins one snapshot per batch that reads chunks (:class:`SnapshotPinner`): a
``REPEATABLE READ READ ONLY`` transaction whose first statement exports its snapshot
(``pg_export_snapshot()``) and reads its visibility (``pg_current_snapshot()``) and the WAL
insert position. The transaction stays open until the batch has completed. Every task of the
batch gets the :class:`BatchSnapshot` event first and reads its chunks in a transaction that
imports the snapshot (``SET TRANSACTION SNAPSHOT``): every read, in any task and any
attempt, sees the same rows, and every chunk's watermark is the batch's snapshot, the same in
each read.

A driver that dies takes its transaction with it. So, with ``stateDir``, every chunk a
pinned batch reads is kept there as it was read, rows and watermark
(:class:`~splitflow.connectors.cdc.reader.KeptChunks`, ``chunks/<batch>/``), the first read
of it winning, until the batch completes (:meth:`SnapshotPinner.release`): the restarted
driver replays the batch under a new snapshot, but its reads return the kept chunks, so the
replay is what the first evaluation was, whatever the sink kept of it (a chunk no read had
finished is read under the new snapshot). Without ``stateDir`` the replay reads anew. A read
that finds the snapshot gone (the driver's connection was cut while the batch ran) fails
the task rather than read another snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from splitflow.api.events import SourceEvent
from splitflow.api.source import ReadPinner
from splitflow.connectors.cdc.reader import KeptChunks
from splitflow.connectors.postgres import catalog
from splitflow.connectors.postgres.options import PostgresOptions
from splitflow.connectors.postgres.splits import CdcSplit, ChunkSplit
from splitflow.errors import ConnectorError

EXPORT = (
    "SELECT pg_export_snapshot(), pg_current_snapshot()::text, "
    "pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
)
"""One statement, so the snapshot it exports is the one it describes; the insert position is
read after the snapshot was taken, so no commit at or past it is visible in the snapshot."""


@dataclass(frozen=True)
class BatchSnapshot(SourceEvent):
    """Driver -> every task of batch ``batch``: read chunks in snapshot ``snapshot_id``.

    ``xmin``, ``xmax``, ``xip``: the snapshot's visibility (64-bit transaction ids);
    ``at``: the WAL insert position right after it was taken (the ``lsn`` of its ``r`` rows,
    and the chunks' high mark).

    >>> BatchSnapshot(7, "00000003-0000001B-1", 750, 752, (750,), 23_456_789).where
    'the snapshot 00000003-0000001B-1 of batch 7'
    """

    batch: int
    snapshot_id: str
    xmin: int
    xmax: int
    xip: tuple[int, ...]
    at: int

    @property
    def where(self) -> str:
        return f"the snapshot {self.snapshot_id} of batch {self.batch}"


def parse_snapshot(text: str) -> tuple[int, int, tuple[int, ...]]:
    """``xmin:xmax:xip,...`` (``pg_current_snapshot()``) as numbers.

    >>> parse_snapshot("750:752:750")
    (750, 752, (750,))
    """
    xmin, xmax, xip = text.split(":")
    return int(xmin), int(xmax), tuple(int(x) for x in xip.split(",") if x)


class SnapshotPinner(ReadPinner[CdcSplit]):
    """Exports one snapshot per batch that reads chunks and holds it until the batch completes.

    One connection per held snapshot (normally one: Spark runs one batch at a time). A held
    snapshot holds back the server's ``xmin`` horizon (vacuum) for as long as its batch runs,
    as each chunk's own transaction did before.
    """

    def __init__(self, options: PostgresOptions, kept: KeptChunks | None = None) -> None:
        self._options = options
        self._kept = kept  # the batches' chunk reads, forgotten once they completed
        self._held: dict[int, tuple[psycopg.Connection[Any], BatchSnapshot]] = {}

    def pin(self, batch: int, splits: Sequence[CdcSplit]) -> BatchSnapshot | None:
        if not any(isinstance(s, ChunkSplit) for s in splits):
            return None  # the log's slices are repeatable by themselves
        held = self._held.get(batch)
        if held is not None:
            self._check_alive(*held)
            return held[1]
        conn = catalog.connect(self._options)
        try:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            row = conn.execute(EXPORT).fetchone()  # opens the transaction, left open
            assert row is not None
        except BaseException:
            conn.close()
            raise
        snapshot_id, text, at = row
        event = BatchSnapshot(batch, str(snapshot_id), *parse_snapshot(text), int(at))
        self._held[batch] = (conn, event)
        return event

    def _check_alive(self, conn: psycopg.Connection[Any], event: BatchSnapshot) -> None:
        """The snapshot handed out for a batch is still held; if its transaction ended,
        the batch cannot be read again as it was, and a new snapshot would read other rows
        than the reads before: fail, so that the query restarts and replays the batch."""
        try:
            conn.execute("SELECT 1")
        except psycopg.Error as e:
            reason = " ".join(str(e).split()) or type(e).__name__
            raise ConnectorError(
                f"{event.where} in {self._options.where} is gone ({reason}): the batch's "
                "reads must all see one snapshot, and some may have read it already; "
                "restart the query, which reads the batch again under a new snapshot"
            ) from None

    def release(self, through_batch: int) -> None:
        released = [b for b in self._held if b <= through_batch]
        for batch in released:
            conn, _ = self._held.pop(batch)
            conn.close()  # ends the transaction; the snapshot is no longer importable
        if self._kept is not None:
            self._kept.drop_through(through_batch, released)

    def close(self) -> None:
        """End every held snapshot, keeping the kept chunk reads: the run ends, not
        necessarily its last batch (a stopped query replays it); the next run's first
        release forgets those of batches that completed."""
        for conn, _ in self._held.values():
            conn.close()
        self._held.clear()
