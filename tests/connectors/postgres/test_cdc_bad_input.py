"""What the CDC source says when the server, the tables, the slot or the role are not what it
needs: each error names the thing at fault (server as ``user@host:port/db``, table, column,
slot) and never the password."""

from __future__ import annotations

import itertools
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.schema import ddl

from splitflow.connectors.postgres import catalog
from splitflow.connectors.postgres.options import PostgresOptions
from splitflow.connectors.postgres.pgoutput import format_lsn
from splitflow.connectors.postgres.source import PostgresCdcSource
from splitflow.connectors.postgres.splits import LogSplit
from splitflow.errors import ConfigurationError, ConnectorError, DataLossError, SourceFailedError
from splitflow.testing.harness import SourceHarness
from splitflow.testing.postgres import PASSWORD, Postgres, free_port

_names = itertools.count()


def data_source(**options: str) -> Any:
    """``PostgresCdcDataSource`` as Spark makes it at ``load()`` (keys lower-cased)."""
    from splitflow.spark.postgres import PostgresCdcDataSource

    return PostgresCdcDataSource({k.lower(): v for k, v in options.items()})


def load(postgres: Postgres, **options: str) -> PostgresCdcSource:
    parsed = PostgresOptions.parse({"conninfo": postgres.conninfo(), **options})
    with catalog.connect(parsed, autocommit=True) as conn:
        names = catalog.list_tables(conn, parsed)
        tables = [catalog.describe_table(conn, name, parsed) for name in names]
    return PostgresCdcSource(parsed, tables)


@pytest.fixture
def name(postgres: Postgres) -> Iterator[str]:
    """A fresh name for this test's table, slot and publication; they are dropped after."""
    made = f"bad_{next(_names)}"
    yield made
    postgres.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
        "WHERE slot_name = %s AND NOT active",
        (made,),
    )
    postgres.execute(f"DROP PUBLICATION IF EXISTS {made}")


def where(postgres: Postgres, user: str = "splitflow") -> str:
    return f"{user}@127.0.0.1:{postgres.port}/splitflow"


# -- the server -----------------------------------------------------------------------------------


def test_wrong_password_names_the_server_and_not_the_password(postgres: Postgres) -> None:
    wrong = "not-the-pw-42"
    with pytest.raises(ConnectorError) as caught:
        data_source(
            conninfo=postgres.conninfo(password=wrong), tables="t", startupMode="snapshotOnly"
        )
    message = str(caught.value)
    assert message.startswith(f"cannot connect to PostgreSQL {where(postgres)}: ")
    assert 'password authentication failed for user "splitflow"' in message
    assert wrong not in message
    assert PASSWORD not in message
    assert caught.value.__cause__ is None


def test_a_closed_port_names_the_server(postgres: Postgres) -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(ConnectorError) as caught:
        data_source(
            host="127.0.0.1",
            port=str(port),
            user="u",
            password="pw",
            dbname="d",
            tables="t",
            startupMode="snapshotOnly",
        )
    assert time.monotonic() - started < 3
    assert str(caught.value).startswith(f"cannot connect to PostgreSQL u@127.0.0.1:{port}/d: ")


def test_a_closed_port_says_the_connection_was_refused() -> None:
    port = free_port()
    with pytest.raises(ConnectorError) as caught:
        data_source(conninfo=f"host=127.0.0.1 port={port}", tables="t", startupMode="snapshotOnly")
    message = str(caught.value)
    assert "Connection refused" in message
    assert "\t" not in message


def test_a_server_that_never_answers_fails_after_connect_timeout() -> None:
    with socket.socket() as listener:  # accepts TCP connections, never speaks
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(ConnectorError) as caught:
            data_source(
                conninfo=f"host=127.0.0.1 port={port} user=u dbname=d",
                tables="t",
                connectTimeout="1s",
                startupMode="snapshotOnly",
            )
        elapsed = time.monotonic() - started
    assert 0.8 < elapsed < 4, elapsed
    assert str(caught.value).startswith(f"cannot connect to PostgreSQL u@127.0.0.1:{port}/d: ")
    assert "timeout" in str(caught.value)


# -- the tables ------------------------------------------------------------------------------------


def test_a_missing_table_is_named(postgres: Postgres) -> None:
    with pytest.raises(ConfigurationError) as caught:
        data_source(conninfo=postgres.conninfo(), tables="nope_missing", slotName="s")
    assert caught.value.option == "tables"
    assert str(caught.value) == (
        f"option tables: table public.nope_missing does not exist in {where(postgres)} (or the "
        "role cannot see it)"
    )


def test_a_pattern_that_matches_nothing_gives_an_empty_schema(postgres: Postgres) -> None:
    source = data_source(
        conninfo=postgres.conninfo(), tables="nothing_like_this_*", startupMode="snapshotOnly"
    )
    assert (
        ddl(source.schema()) == "`op` string, `lsn` bigint, `commit_ts` timestamp, `table` string"
    )


def test_a_table_without_primary_key_loads_and_reads_as_a_snapshot(
    postgres: Postgres, name: str
) -> None:
    postgres.execute(f"CREATE TABLE {name} (id int, v text)")
    postgres.execute(f"INSERT INTO {name} VALUES (1, 'a'), (1, 'a'), (NULL, 'b')")
    data_source(conninfo=postgres.conninfo(), tables=name, slotName=name)  # spark.read may use it
    source = data_source(conninfo=postgres.conninfo(), tables=name, startupMode="snapshotOnly")
    harness = SourceHarness(source.create_source(), 1)
    harness.run_to_end()
    rows = [row for batch in harness.committed() for row in batch.to_pylist()]
    harness.close()
    assert sorted((r["id"] or 0, r["v"], r["op"]) for r in rows) == [
        (0, "b", "r"),
        (1, "a", "r"),
        (1, "a", "r"),
    ]


def keyless_refused(name: str, identity: str) -> str:
    return (
        f"option tables: table public.{name} has no primary key and replica identity "
        f"{identity}: updates and deletes of a table without a primary key need REPLICA "
        "IDENTITY FULL to be streamed (PostgreSQL refuses them on a published table without a "
        f"replica identity, and the log needs the old row): run ALTER TABLE public.{name} "
        "REPLICA IDENTITY FULL, or leave the table out, or use startupMode=snapshotOnly"
    )


@pytest.mark.parametrize("mode", ["initial", "latest"])
@pytest.mark.parametrize("identity", ["default", "nothing"])
def test_a_stream_of_a_table_without_primary_key_needs_replica_identity_full(
    postgres: Postgres, name: str, mode: str, identity: str
) -> None:
    postgres.execute(f"CREATE TABLE {name} (id int, v text)")
    postgres.execute(f"ALTER TABLE {name} REPLICA IDENTITY {identity}")
    loaded = data_source(conninfo=postgres.conninfo(), tables=name, slotName=name, startupMode=mode)
    with pytest.raises(ConfigurationError) as caught:
        loaded.streamReader(None)  # Spark's query start
    assert caught.value.option == "tables"
    assert str(caught.value) == keyless_refused(name, identity)
    with pytest.raises(SourceFailedError) as failed:  # the enumerator, without Spark
        SourceHarness(load(postgres, tables=name, slotName=name, startupMode=mode), 1)
    assert str(failed.value.__cause__) == keyless_refused(name, identity)
    published = postgres.execute(
        "SELECT count(*) FROM pg_publication_tables WHERE pubname = %s", (name,)
    )
    assert published == [(0,)], "refused before it was published (its updates would fail)"
    postgres.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    full = load(postgres, tables=name, slotName=name, startupMode=mode)
    catalog.check_replica_identity(full.tables[f"public.{name}"])  # passes


def chunk_key_refused(postgres: Postgres, name: str, chunk_key: str) -> str:
    with pytest.raises(ConfigurationError) as caught:
        data_source(
            conninfo=postgres.conninfo(), tables=f"{name}*", slotName=name, chunkKeyColumn=chunk_key
        )
    assert caught.value.option == "chunkKeyColumn"
    return str(caught.value)


def test_chunk_key_column_of_a_table_not_read_is_named(postgres: Postgres, name: str) -> None:
    postgres.execute(f"CREATE TABLE {name} (id int, v text)")
    assert chunk_key_refused(postgres, name, f"{name}:id, other_{name}:id") == (
        f"option chunkKeyColumn: table public.other_{name} is not one of the tables the query "
        "reads (option tables)"
    )


def test_chunk_key_column_that_no_table_has_is_named(postgres: Postgres, name: str) -> None:
    postgres.execute(f"CREATE TABLE {name} (id int, v text)")
    assert chunk_key_refused(postgres, name, "nope") == (
        f"option chunkKeyColumn: no table the query reads has a column nope (public.{name})"
    )
    assert chunk_key_refused(postgres, name, f"{name}:nope") == (
        f"option chunkKeyColumn: column public.{name}.nope does not exist"
    )


def test_chunk_key_column_that_is_not_an_integer_is_named(postgres: Postgres, name: str) -> None:
    postgres.execute(f"CREATE TABLE {name} (id int, v text)")
    assert chunk_key_refused(postgres, name, "v") == (
        f"option chunkKeyColumn: column public.{name}.v is text: chunks are cut by an integer "
        "column (smallint, integer or bigint)"
    )


def test_chunk_key_column_outside_the_primary_key_is_named(postgres: Postgres, name: str) -> None:
    postgres.execute(f"CREATE TABLE {name} (a int, b int, n int, PRIMARY KEY (a, b))")
    postgres.execute(f"CREATE TABLE {name}_h (n int, v text)")  # without a key: n is fine
    assert chunk_key_refused(postgres, name, "n") == (
        f"option chunkKeyColumn: column public.{name}.n is not in the primary key of "
        f"public.{name} (a, b): a table with a key is cut by one of its key columns, because a "
        "delete carries only the key (name the tables a column applies to as table:column)"
    )
    source = data_source(
        conninfo=postgres.conninfo(), tables=f"{name}*", chunkKeyColumn=f"{name}:b, {name}_h:n"
    ).create_source()
    assert [(t.name, t.chunk_key) for t in source.tables.values()] == [
        (f"public.{name}", "b"),
        (f"public.{name}_h", "n"),
    ]


def test_an_unsupported_column_type_names_table_and_column(postgres: Postgres, name: str) -> None:
    postgres.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, ok text, span interval)")
    with pytest.raises(ConfigurationError) as caught:
        data_source(conninfo=postgres.conninfo(), tables=name, slotName=name)
    assert f"column public.{name}.span has PostgreSQL type 'interval'" in str(caught.value)


@pytest.mark.parametrize("column", ["op", "lsn", "commit_ts", "table"])
def test_a_column_named_like_the_metadata_is_refused(
    postgres: Postgres, name: str, column: str
) -> None:
    postgres.execute(f'CREATE TABLE {name} (id int PRIMARY KEY, "{column}" text)')
    source = data_source(conninfo=postgres.conninfo(), tables=name, slotName=name)
    with pytest.raises(ConfigurationError) as caught:
        source.schema()
    assert caught.value.option == "tables"
    assert str(caught.value) == (
        f"option tables: table public.{name} has a column named {column}, which the source "
        "adds to every row (op, lsn, commit_ts, table)"
    )


def test_one_column_name_with_two_types_names_both_tables(postgres: Postgres, name: str) -> None:
    postgres.execute(f"CREATE TABLE {name}_a (id int PRIMARY KEY, amount numeric(10,2))")
    postgres.execute(f"CREATE TABLE {name}_b (id int PRIMARY KEY, amount text)")
    source = data_source(conninfo=postgres.conninfo(), tables=f"{name}_*", slotName=name)
    with pytest.raises(ConfigurationError) as caught:
        source.schema()
    assert str(caught.value) == (
        f"option tables: column amount is decimal(10,2) in public.{name}_a but string in "
        f"public.{name}_b; the tables of one query share one schema by column name"
    )


def test_the_same_column_name_and_type_in_two_tables_is_one_column(
    postgres: Postgres, name: str
) -> None:
    postgres.execute(f"CREATE TABLE {name}_a (id int PRIMARY KEY, a text)")
    postgres.execute(f"CREATE TABLE {name}_b (id int PRIMARY KEY, b bigint)")
    source = data_source(conninfo=postgres.conninfo(), tables=f"{name}_*", slotName=name)
    assert ddl(source.schema()) == (
        "`id` int, `a` string, `b` bigint, `op` string, `lsn` bigint, `commit_ts` timestamp, "
        "`table` string"
    )


# -- wal_level -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    """A second server with ``wal_level=replica`` (no logical decoding)."""
    server = Postgres.start(tmp_path_factory.mktemp("replica"), settings={"wal_level": "replica"})
    server.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    server.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 50) g")
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("mode", ["initial", "latest"])
def test_wal_level_replica_is_refused_when_the_stream_starts(replica: Postgres, mode: str) -> None:
    loaded = data_source(
        conninfo=replica.conninfo(), tables="items", slotName="s", startupMode=mode
    )
    with pytest.raises(ConnectorError) as caught:
        loaded.streamReader(None)  # Spark's query start, before any batch
    assert str(caught.value) == (
        f"PostgreSQL {where(replica)} has wal_level=replica; change data capture needs "
        "wal_level=logical (set it in postgresql.conf and restart the server), or use "
        "startupMode=snapshotOnly"
    )


def test_wal_level_replica_still_reads_a_snapshot(replica: Postgres) -> None:
    source = data_source(
        conninfo=replica.conninfo(), tables="items", startupMode="snapshotOnly", chunkSize="20"
    ).create_source()
    harness = SourceHarness(source, 2)
    harness.run_to_end()
    rows = [row for batch in harness.committed() for row in batch.to_pylist()]
    harness.close()
    assert sorted((r["id"], r["v"], r["op"], r["table"]) for r in rows) == [
        (i, f"v{i}", "r", "public.items") for i in range(1, 51)
    ]


# -- the slot --------------------------------------------------------------------------------------


def started(postgres: Postgres, name: str, **options: str) -> SourceHarness[Any, Any, Any]:
    postgres.execute(f"CREATE TABLE IF NOT EXISTS {name} (id int PRIMARY KEY, v text)")
    postgres.execute(f"INSERT INTO {name} VALUES (1, 'a') ON CONFLICT DO NOTHING")
    return SourceHarness(load(postgres, tables=name, slotName=name, **options), 1)


def test_a_slot_in_use_by_another_reader_fails_the_log_reader(
    postgres: Postgres, name: str
) -> None:
    postgres.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
    postgres.execute(f"CREATE PUBLICATION {name} FOR TABLE {name}")
    postgres.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
    other = subprocess.Popen(
        [
            str(postgres.bin_dir / "pg_recvlogical"),
            "--start",
            "--slot",
            name,
            "-d",
            postgres.conninfo(),
            "-o",
            "proto_version=1",
            "-o",
            f"publication_names={name}",
            "-f",
            "/dev/null",
            "--no-loop",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while not postgres.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (name,)
        )[0][0]:
            assert other.poll() is None, other.stderr.read() if other.stderr else ""
            assert time.monotonic() < deadline, "pg_recvlogical never took the slot"
            time.sleep(0.05)
        harness = started(postgres, name)
        harness.read_available()  # the chunk, and the log while it has nothing to read
        postgres.execute(f"INSERT INTO {name} VALUES (2, 'b')")
        with pytest.raises(ConnectorError) as caught:
            harness.read_available()
        harness.close()
    finally:
        other.terminate()
        other.wait(10)
    message = str(caught.value)
    assert message.startswith(f"option slotName: replication slot {name} is in use by another ")
    assert f'replication slot "{name}" is active for PID' in message
    assert message.endswith("one query per slot")


def test_a_slot_of_another_plugin_is_refused_naming_it(postgres: Postgres, name: str) -> None:
    postgres.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (name,))
    with pytest.raises(SourceFailedError) as caught:
        started(postgres, name)
    cause = caught.value.__cause__
    assert isinstance(cause, ConnectorError)
    assert str(cause) == (
        f"option slotName: replication slot {name} in {where(postgres)} uses plugin "
        "test_decoding, not pgoutput: choose another slot name"
    )


@pytest.fixture
def plain_role(postgres: Postgres, name: str) -> Iterator[str]:
    """A role that may log in and read ``name`` but has no REPLICATION and owns nothing."""
    role = f"{name}_role"
    postgres.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'plain-pw'")
    postgres.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
    postgres.execute(f"GRANT SELECT ON {name} TO {role}")
    yield role
    postgres.execute(f"DROP TABLE IF EXISTS {name}")
    postgres.execute(f"DROP ROLE {role}")


def test_a_role_without_replication_cannot_make_the_slot(
    postgres: Postgres, name: str, plain_role: str
) -> None:
    postgres.execute(f"CREATE PUBLICATION {name} FOR TABLE {name}")
    source = load(postgres, tables=name, slotName=name, user=plain_role, password="plain-pw")
    with pytest.raises(SourceFailedError) as caught:
        SourceHarness(source, 1)
    cause = caught.value.__cause__
    assert isinstance(cause, ConnectorError)
    message = str(cause)
    assert message.startswith(
        f"option slotName: cannot create replication slot {name} in {where(postgres, plain_role)} ("
    )
    assert message.endswith("): the role needs the REPLICATION attribute")
    assert "plain-pw" not in message


def test_a_role_that_cannot_create_the_publication_is_told_how(
    postgres: Postgres, name: str, plain_role: str
) -> None:
    source = load(postgres, tables=name, slotName=name, user=plain_role, password="plain-pw")
    with pytest.raises(SourceFailedError) as caught:
        SourceHarness(source, 1)
    message = str(caught.value.__cause__)
    assert message.startswith(
        f"option publicationName: cannot create or extend publication {name} in "
        f"{where(postgres, plain_role)} (permission denied"
    )
    assert f"CREATE PUBLICATION {name} FOR TABLE ..." in message


def test_a_slot_dropped_under_the_log_is_data_loss(postgres: Postgres, name: str) -> None:
    harness = started(postgres, name)
    harness.read_available()
    (log,) = [s for ss in harness.reader_splits().values() for s in ss if isinstance(s, LogSplit)]
    postgres.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    postgres.execute(f"INSERT INTO {name} VALUES (2, 'b')")
    with pytest.raises(DataLossError) as caught:
        harness.read_available()  # the reader
    assert str(caught.value) == (
        f"replication slot {name} in {where(postgres)} is gone: the changes after LSN "
        f"{format_lsn(log.position)} cannot be read"
    )
    with pytest.raises(SourceFailedError) as failed:  # the planner
        harness._await(harness.coordinator.latest_positions([log]))
    harness.close()
    assert isinstance(failed.value.__cause__, DataLossError)
    assert str(failed.value.__cause__) == (
        f"replication slot {name} in {where(postgres)} is gone: the changes after LSN "
        f"{format_lsn(log.position)} cannot be read"
    )


def test_a_slot_consumed_by_someone_else_is_data_loss(postgres: Postgres, name: str) -> None:
    harness = started(postgres, name)
    harness.read_available()
    (log,) = [s for ss in harness.reader_splits().values() for s in ss if isinstance(s, LogSplit)]
    postgres.execute(f"INSERT INTO {name} VALUES (2, 'b')")
    postgres.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (name,))
    confirmed = postgres.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (name,)
    )[0][0]
    with pytest.raises(SourceFailedError) as failed:
        harness._await(harness.coordinator.latest_positions([log]))
    harness.close()
    assert isinstance(failed.value.__cause__, DataLossError)
    assert str(failed.value.__cause__) == (
        f"replication slot {name} has confirmed LSN {confirmed}, past this query's position "
        f"{format_lsn(log.position)}: another reader consumed the changes between"
    )


def test_the_errors_leave_no_password_in_reprs(tmp_path: Path, postgres: Postgres) -> None:
    source = data_source(conninfo=postgres.conninfo(), tables="t*", startupMode="snapshotOnly")
    assert PASSWORD not in repr(source) + repr(source.create_source())
