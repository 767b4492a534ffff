"""Schema changes in PostgreSQL's log, read by the CDC split reader and the source (option
``schemaChanges``; the Spark end to end is ``tests/spark/test_cdc_schema_changes_e2e.py``).

Against a real server: a planned log slice that crosses an ``ALTER TABLE`` ends just before
the first transaction written under the new schema, the same at every read, with a
:class:`SchemaChange` that describes the table from then on (a rename known by the column's
``attnum``); read from there with the new description, the slice goes on. ``fail``, a
narrowing type change and a dropped key column fail the read without recording. The source
records a change in its :class:`SchemaRecord` before it stops the query, once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from tests.connectors.postgres.test_cdc_log_streaming import Log, ids

from splitflow.connectors.cdc.changes import SchemaChange, SchemaRecord, difference
from splitflow.connectors.postgres import catalog, pgoutput
from splitflow.connectors.postgres.pgoutput import format_lsn
from splitflow.connectors.postgres.reader import CdcSplitReader, Piece, Pinned
from splitflow.connectors.postgres.source import PostgresCdcSource
from splitflow.connectors.postgres.splits import ChunkSplit, LogSplit
from splitflow.errors import SchemaChangedError
from splitflow.reader.split_reader import SplitSlice
from splitflow.testing.postgres import Postgres


class MemoryFile:
    """A state file in memory (:class:`~splitflow.connectors.cdc.changes.StateFile`)."""

    def __init__(self) -> None:
        self.content: bytes | None = None

    def read(self) -> bytes | None:
        return self.content

    def write(self, content: bytes) -> None:
        self.content = content


@pytest.fixture
def log(postgres: Postgres) -> Iterator[Log]:
    made = Log(postgres)
    yield made
    made.drop()


def commits(log: Log) -> list[int]:
    """The positions (commit LSNs) of the slot's transactions so far, in order."""
    rows = log.pg.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', %s)",
        (log.slot, log.slot),
    )
    messages = [pgoutput.decode(bytes(data)) for (data,) in rows]
    return [m.final_lsn for m in messages if isinstance(m, pgoutput.Begin)]


def described(log: Log) -> catalog.Table:
    with catalog.connect(log.source.options, autocommit=True) as conn:
        return catalog.describe_table(conn, f"public.{log.table}", log.source.options)


def read_slice(
    log: Log, stop: int, *, start: int | None = None, source: PostgresCdcSource | None = None
) -> tuple[list[int], SchemaChange | None, bool]:
    """The ids the slice ``[start, stop)`` read (``source``: default the log's), its last
    piece's cut, and whether the split reader reported the slice cut."""
    split_reader = CdcSplitReader(source or log.source, Pinned())
    split = LogSplit(log.slot, log.start if start is None else start)
    split_reader.handle_splits_changes([SplitSlice(split, stop)])
    pieces, cut = [], False
    try:
        for _ in range(1000):
            out = split_reader.fetch()
            pieces += out.records.get(log.split_id, [])
            if log.split_id in out.finished:
                cut = log.split_id in out.cut
                break
    finally:
        split_reader.close()
    return ids(pieces), pieces[-1].cut, cut


def altered(log: Log, statement: str, insert: str = "INSERT INTO {t} (id) VALUES (3)") -> int:
    """Two transactions, ``statement`` on the table, one more transaction (ids 1-2, then 3):
    the commit LSN of the last, the first written under the new schema."""
    log.write(transactions=2, rows=1)
    log.pg.execute(statement.format(t=log.table))
    log.pg.execute(insert.format(t=log.table))
    log.next_id = 4
    return commits(log)[-1]


def test_a_slice_ends_before_the_first_transaction_under_a_new_schema_every_read(
    log: Log,
) -> None:
    first_new = altered(log, "ALTER TABLE {t} ADD COLUMN x int")
    stop = log.insert_position()

    reads = [read_slice(log, stop) for _ in range(2)]

    assert reads[0] == reads[1]
    got, cut, ended_cut = reads[0]
    assert got == [1, 2]
    assert ended_cut
    assert cut is not None
    assert (cut.table, cut.position, cut.shown) == (
        f"public.{log.table}",
        first_new,
        format_lsn(first_new),
    )
    assert [n for n, _ in cut.new.columns] == ["id", "v", "w", "x"]
    assert str(difference(log.source.tables[cut.table], cut.new)) == "added x"


def test_from_the_change_on_the_slice_reads_with_the_new_schema(log: Log) -> None:
    first_new = altered(log, "ALTER TABLE {t} ADD COLUMN x int")
    log.pg.execute(f"INSERT INTO {log.table} VALUES (4, 0, 'w', 40)")
    stop = log.insert_position()
    now = PostgresCdcSource(log.source.options, [described(log)])

    got, cut, ended_cut = read_slice(log, stop, start=first_new, source=now)

    assert (got, cut, ended_cut) == ([3, 4], None, False)


def test_a_rename_is_known_by_the_columns_attnum(log: Log) -> None:
    altered(log, "ALTER TABLE {t} RENAME COLUMN w TO words")
    _, cut, _ = read_slice(log, log.insert_position())

    assert cut is not None
    assert str(difference(log.source.tables[cut.table], cut.new)) == "renamed w to words"
    assert cut.new.formerly == (("words", ("w",)),)


@pytest.mark.parametrize(
    ("statement", "problem"),
    [
        ("ALTER TABLE {t} ALTER COLUMN v TYPE real", r"not a widening \(v int to float\)"),
        ("ALTER TABLE {t} ALTER COLUMN id TYPE text", r"not a widening \(id bigint to string\)"),
        ("ALTER TABLE {t} DROP COLUMN id", "key column id dropped"),
    ],
)
def test_a_change_no_restart_can_follow_fails_the_read_naming_it(
    log: Log, statement: str, problem: str
) -> None:
    dropped = "DROP COLUMN id" in statement
    altered(
        log,
        statement,
        "INSERT INTO {t} (v) VALUES (3)" if dropped else "INSERT INTO {t} (id) VALUES (3)",
    )

    with pytest.raises(SchemaChangedError, match=problem) as caught:
        read_slice(log, log.insert_position())
    assert not caught.value.recorded
    assert caught.value.table == f"public.{log.table}"


def test_with_schema_changes_fail_the_read_fails_at_the_change(log: Log) -> None:
    altered(log, "ALTER TABLE {t} ADD COLUMN x int")
    options = dataclasses.replace(log.source.options, schema_changes="fail")
    failing = PostgresCdcSource(options, list(log.source.tables.values()))

    with pytest.raises(SchemaChangedError, match="added x; schemaChanges=fail") as caught:
        read_slice(log, log.insert_position(), source=failing)
    assert caught.value.old == ("id bigint", "v int", "w string")
    assert caught.value.new == ("id bigint", "v int", "w string", "x int")


def test_the_source_records_a_change_then_stops_and_a_restarted_source_goes_on(
    log: Log,
) -> None:
    altered(log, "ALTER TABLE {t} ADD COLUMN x int")
    _, cut, _ = read_slice(log, log.insert_position())
    assert cut is not None
    file = MemoryFile()
    log.source.schema_record = log.source.schema_record_in(file)

    with pytest.raises(SchemaChangedError, match=SchemaChangedError.RECORDED) as caught:
        log.source.schema_changed(cut)

    assert caught.value.recorded
    record = SchemaRecord(file, catalog.Table, *_codec(log.source))
    recorded = record.read()
    assert recorded is not None
    tables, changes = recorded
    assert tables[cut.table] == cut.new
    assert [c["change"] for c in changes] == ["added x"]
    restarted = PostgresCdcSource(log.source.options, list(tables.values()))
    restarted.schema_record = restarted.schema_record_in(file)
    restarted.schema_changed(cut)  # the batch's events applied again after the restart
    assert file.read() == record._file.read()


def test_a_new_table_with_columns_the_query_lacks_stops_it_before_the_log_carries_it(
    log: Log,
) -> None:
    log.pg.execute(f"CREATE TABLE {log.table}_new (id bigint PRIMARY KEY, price numeric(6,2))")
    file = MemoryFile()
    log.source.schema_record = log.source.schema_record_in(file)
    with catalog.connect(log.source.options, autocommit=True) as conn:
        new = log.source.table(f"public.{log.table}_new", conn)
    fitting = dataclasses.replace(new, name=f"public.{log.table}_fits", columns=new.columns[:1])

    log.source.check_new_table(fitting)  # its columns are the query's: nothing to do
    with pytest.raises(SchemaChangedError, match="at its discovery: a new table") as caught:
        log.source.check_new_table(new)

    assert caught.value.recorded
    assert file.content is not None
    assert f"public.{log.table}_new" in file.content.decode()


def _codec(source: PostgresCdcSource) -> tuple[object, object]:
    record = source.schema_record_in(MemoryFile())
    return record._encode_kind, record._decode_kind


def test_a_type_change_spark_does_not_see_is_read_through(log: Log) -> None:
    altered(log, "ALTER TABLE {t} ALTER COLUMN v TYPE smallint")  # both are Spark's int

    assert read_slice(log, log.insert_position()) == ([1, 2, 3], None, False)


@pytest.mark.parametrize(
    ("statement", "change"),
    [
        ("ALTER TABLE {t} ADD COLUMN x int", "added x"),
        ("ALTER TABLE {t} RENAME COLUMN w TO words", "renamed w to words"),
        ("ALTER TABLE {t} DROP COLUMN w", "dropped w"),
    ],
)
def test_a_chunk_of_a_table_altered_since_the_query_described_it_fails_naming_the_change(
    log: Log, statement: str, change: str
) -> None:
    log.write(transactions=1, rows=3)
    log.pg.execute(statement.format(t=log.table))

    with pytest.raises(
        SchemaChangedError, match=rf"changed before the chunk was read \({change}\)"
    ):
        read_chunk(log)


def test_a_chunk_reads_through_a_type_change_spark_does_not_see(log: Log) -> None:
    log.write(transactions=1, rows=3)
    log.pg.execute(f"ALTER TABLE {log.table} ALTER COLUMN v TYPE smallint")

    assert ids([read_chunk(log)]) == [1, 2, 3]


def read_chunk(log: Log) -> Piece:
    split_reader = CdcSplitReader(log.source, Pinned())
    try:
        return split_reader.read_chunk(ChunkSplit(f"public.{log.table}", 0, "id"))
    finally:
        split_reader.close()
