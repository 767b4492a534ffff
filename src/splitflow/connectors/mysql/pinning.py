"""One binlog position per planned batch: every chunk of the batch is read as the table stood
there.

MariaDB cannot export a snapshot to other sessions (no ``pg_export_snapshot()``), so the
PostgreSQL design (the driver holds one snapshot, every task imports it) cannot be built.
The rule it keeps, that every read of a planned batch returns the same rows with the same
watermark (Spark reads a micro-batch again for each action in ``foreachBatch``, a
``MERGE``, a retried or speculative task, a recomputed stage), is kept by a **position**
instead:

* the driver pins one log position ``P`` per batch that reads chunks
  (:class:`PositionPinner`): the binlog position of a consistent snapshot it takes and ends
  at once (``binlog_snapshot_position``, as a GTID with ``BINLOG_GTID_POS``). Every
  transaction before ``P`` is committed and visible to any later snapshot. Nothing is held
  on the server;
* a task reads its chunk in a consistent snapshot of its own, which lies at ``S >= P`` in
  the binlog, then reads the binlog's transactions in ``[P, S)`` and **rewinds** the chunk
  to ``P``: it undoes their changes to the chunk's rows, last first (an insert removed, a
  delete put back, an update put back to its before image). For a keyed row that is the
  before image of the first change after ``P``. The result is the chunk as of ``P``,
  whatever ``S`` the read happened to get;
* the chunk's watermark is ``P`` (:class:`~splitflow.connectors.cdc.splits.PositionMark`):
  the log leaves out a change to the chunk's keys exactly when its position is below
  ``P``, and the ``r`` rows' ``lsn`` is ``P``.

This is Flink CDC's watermark correction run backwards to a fixed point instead of forwards
to a high watermark that differs with every read. A pin is nothing but its event, so nothing
on the server outlives a driver, and the event does: with ``stateDir`` the runtime keeps it,
and a restarted driver that replays the batch reads at the same position
(:meth:`PositionPinner.resume`), so the replay returns the rows and watermarks of the first
evaluation, whichever of the two a sink keeps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pymysql

from splitflow.api.events import SourceEvent
from splitflow.api.source import ReadPinner
from splitflow.connectors.cdc.splits import CdcSplit, ChunkSplit
from splitflow.connectors.mysql import catalog
from splitflow.connectors.mysql.options import MySqlOptions
from splitflow.errors import ConnectorError

log = logging.getLogger("splitflow.mysql")

ATTEMPTS = 3
"""Tries of a batch's pin before the batch fails."""

T = TypeVar("T")


@dataclass(frozen=True)
class BatchPosition(SourceEvent):
    """Driver -> every task of batch ``batch``: read chunks as of log position
    ``position`` (``P``), which lies at ``gtid`` (the GTID position there, ``0-1-41``;
    empty before any transaction) and at binlog ``(file, offset)``.

    >>> BatchPosition(7, "0-1-41", 3, 1165, 42).where
    'position 42 (after GTID 0-1-41) of batch 7'
    """

    batch: int
    gtid: str
    file: int
    offset: int
    position: int

    @property
    def where(self) -> str:
        return f"position {self.position} (after GTID {self.gtid or 'none'}) of batch {self.batch}"


class PositionPinner(ReadPinner[CdcSplit]):
    """Pins one binlog position per batch that reads chunks (see the module doc).

    ``pin`` returns the same event for a batch until it is released; it holds nothing on
    the server.
    """

    def __init__(self, options: MySqlOptions) -> None:
        self._options = options
        self._held: dict[int, BatchPosition] = {}

    def pin(self, batch: int, splits: Sequence[CdcSplit]) -> BatchPosition | None:
        if not any(isinstance(s, ChunkSplit) for s in splits):
            return None  # the log's slices are repeatable by themselves
        held = self._held.get(batch)
        if held is not None:
            return held
        (file, offset), gtid, position = self._position()
        if file == 0 and offset == 0:
            raise ConnectorError(
                f"MySQL {self._options.where} writes no binlog: a stream reads every batch's "
                "chunks as of one binlog position, so it needs the binlog even with "
                "startupMode=snapshotOnly (spark.read needs none)"
            )
        event = BatchPosition(batch, gtid, file, offset, position)
        self._held[batch] = event
        return event

    def resume(
        self, batch: int, splits: Sequence[CdcSplit], pinned: SourceEvent
    ) -> BatchPosition | None:
        """The position the batch was pinned at before the driver restarted, which holds
        nothing on the server and so outlives it: the replay reads every chunk as the first
        evaluation did, rows and watermarks. A position whose binlog file the server no
        longer has (purged since) cannot be rewound to: the batch is pinned anew."""
        if not isinstance(pinned, BatchPosition):
            return self.pin(batch, splits)
        if pinned.file not in self._ask(catalog.binlog_files):
            log.warning(
                "splitflow: MySQL %s no longer has the binlog of %s: the replay of batch %d "
                "reads its chunks at a new position",
                self._options.where,
                pinned.where,
                batch,
            )
            return self.pin(batch, splits)
        self._held[batch] = pinned
        return pinned

    def _position(self) -> tuple[tuple[int, int], str, int]:
        """Where a consistent snapshot taken now lies (``catalog.snapshot_position``)."""
        return self._ask(lambda conn: catalog.snapshot_position(conn, self._options.where))

    def _ask(self, question: Callable[[Any], T]) -> T:
        """``question`` answered on a new connection. A lost connection or a server down
        for a moment is tried again, up to :data:`ATTEMPTS` times in all, 0.5 s then 1 s
        apart: a pin holds nothing on the server, so a new one is as good (the batch's tasks
        have not read yet). Credentials refused are not."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                with catalog.connect(self._options) as conn:
                    return question(conn)
            except (pymysql.err.OperationalError, ConnectorError) as error:
                refused = "Access denied" in str(error)
                if refused or attempt == ATTEMPTS:
                    raise ConnectorError(
                        f"cannot pin the binlog position of a batch on MySQL "
                        f"{self._options.where} ({attempt} attempt(s)): {error}"
                    ) from None
                time.sleep(0.5 * attempt)
        raise AssertionError("the last attempt raises")

    def release(self, through_batch: int) -> None:
        for batch in [b for b in self._held if b <= through_batch]:
            del self._held[batch]
