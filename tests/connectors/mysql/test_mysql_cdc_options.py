"""The MySQL/MariaDB CDC source's options (Flink CDC's names in Spark's spelling, and Flink's
own as aliases) and its bad input: each error names the option, the table or the server,
and never the password."""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path

import pytest
from tests.connectors.cdc.harness_suite import Harness, rows_of
from tests.connectors.mysql.test_mysql_cdc_harness import load
from tests.support.mariadb import PASSWORD, MariaDB, free_port

pytest.importorskip("pymysqlreplication", reason="pip install -e '.[mysql]'")

from splitflow.connectors.mysql import catalog
from splitflow.connectors.mysql.options import MySqlOptions
from splitflow.errors import ConfigurationError, ConnectorError, SourceFailedError
from splitflow.testing.harness import SourceHarness

pytestmark = pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning")

_names = itertools.count()
BASE = {"username": "cdc", "password": PASSWORD, "databaseName": "shop", "tableName": "orders"}


def parse(**options: str) -> MySqlOptions:
    return MySqlOptions.parse({**BASE, **options})


def test_flink_cdc_names_and_their_spark_spelling_are_one_option() -> None:
    flink = MySqlOptions.parse(
        {
            "hostname": "db",
            "port": "3307",
            "username": "cdc",
            "password": PASSWORD,
            "database-name": "shop_[0-9]+",
            "table-name": "orders|lines",
            "server-id": "5400-5409",
            "scan.incremental.snapshot.chunk.size": "100",
            "scan.startup.mode": "latest-offset",
            "connect.timeout": "3s",
        }
    )
    spark = MySqlOptions.parse(
        {
            "hostname": "db",
            "port": "3307",
            "username": "cdc",
            "password": PASSWORD,
            "databasename": "shop_[0-9]+",  # Spark passes option names lower-cased
            "tableName": "orders|lines",
            "serverId": "5400-5409",
            "chunkSize": "100",
            "startupMode": "latest",
            "connectTimeout": "3s",
        }
    )
    assert flink == spark
    assert (flink.mode, flink.server_ids, flink.chunk_size) == ("latest", (5400, 5409), 100)
    assert flink.matches("shop_12", "lines")
    assert not flink.matches("shop_x", "lines")
    assert not flink.matches("shop_1", "orders_archive")
    assert parse(**{"scan.startup.mode": "snapshot"}).mode == "snapshotOnly"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"chunkSize": "5", "scan.incremental.snapshot.chunk.size": "6"}, "same option"),
        ({"startupMode": "timestamp"}, "startupMode must be initial, latest"),
        ({"serverId": "1"}, "serverId: '1' is not a server id"),
        ({"serverId": "6000-5999"}, "is not a server id or a range"),
        ({"tableName": "orders("}, "tableName: 'orders(' is not a regular expression"),
        ({"tableName": ""}, "tableName is required"),
        ({"username": ""}, "username is required"),
        ({"chunkSize": "0"}, "chunkSize: '0' is not a whole number"),
        ({"chunkKeyColumn": "shop.orders:id, orders:id"}, "is not db.table:column"),
        ({"tabelName": "x"}, "unknown option 'tabelName' for splitflow-mysql-cdc (did you mean"),
    ],
)
def test_a_bad_option_fails_naming_it(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError) as failed:
        parse(**options)
    assert message in str(failed.value)
    assert PASSWORD not in str(failed.value)


def test_the_password_is_in_no_repr() -> None:
    options = parse()
    assert PASSWORD not in repr(options)
    assert options.where == "cdc@localhost:3306"


def test_every_reader_gets_its_own_server_ids() -> None:
    options = parse(serverId="5400-5405")
    ids = [options.server_id(r, rewind) for r in range(3) for rewind in (False, True)]
    assert ids == [5400, 5401, 5402, 5403, 5404, 5405]


# -- against a server ---------------------------------------------------------------------------


def test_a_wrong_password_names_the_server_and_not_the_password(mariadb: MariaDB) -> None:
    with pytest.raises(ConnectorError) as failed:
        load(mariadb, password="wrong-" + PASSWORD, tableName="nothing")
    message = str(failed.value)
    assert message.startswith(f"cannot connect to MySQL splitflow@127.0.0.1:{mariadb.port}: ")
    assert "Access denied" in message
    assert PASSWORD not in message


def test_an_unreachable_server_fails_within_the_timeout() -> None:
    options = parse(hostname="127.0.0.1", port=str(free_port()), connectTimeout="1s")
    with pytest.raises(ConnectorError, match=r"cannot connect to MySQL cdc@127\.0\.0\.1:\d+: "):
        catalog.connect(options)


def test_a_missing_table_named_without_a_pattern_fails_at_load(mariadb: MariaDB) -> None:
    with pytest.raises(ConfigurationError, match=r"option tableName: table splitflow\.absent "):
        load(mariadb, tableName="absent")
    assert load(mariadb, tableName="absent_.*").tables == {}  # a pattern may match nothing yet


def test_a_table_that_is_not_innodb_fails_at_load(mariadb: MariaDB) -> None:
    table = f"myisam{next(_names)}"
    mariadb.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY) ENGINE=MyISAM")
    with pytest.raises(ConfigurationError, match=rf"table splitflow\.{table} uses the MyISAM"):
        load(mariadb, tableName=table)


@pytest.mark.parametrize(
    ("column", "message"),
    [
        ("absent", "column splitflow.{t}.absent does not exist"),
        ("w", "column splitflow.{t}.w is varchar: chunks are cut by an integer column"),
        ("v", "column splitflow.{t}.v is not in the primary key of splitflow.{t} (id)"),
    ],
)
def test_a_bad_chunk_key_column_fails_at_load(mariadb: MariaDB, column: str, message: str) -> None:
    table = f"chunked{next(_names)}"
    mariadb.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT, w VARCHAR(5))")
    with pytest.raises(ConfigurationError) as failed:
        load(mariadb, tableName=table, chunkKeyColumn=f"splitflow.{table}:{column}")
    assert message.format(t=table) in str(failed.value)


def test_a_column_added_after_the_query_started_fails_naming_it(mariadb: MariaDB) -> None:
    table = f"grown{next(_names)}"
    mariadb.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT)")
    mariadb.execute(f"INSERT INTO {table} VALUES (1, 1)")
    harness: Harness = SourceHarness(load(mariadb, tableName=table), 1)
    try:
        harness.read_available()
        assert [r["id"] for r in rows_of(harness.emitted())] == [1]
        mariadb.execute(f"ALTER TABLE {table} ADD COLUMN extra INT")
        mariadb.execute(f"INSERT INTO {table} VALUES (2, 2, 2)")
        with pytest.raises(ConnectorError, match=f"table splitflow.{table} has column extra"):
            harness.read_available()
    finally:
        with contextlib.suppress(ConnectorError, SourceFailedError):
            harness.close()


def test_a_statement_based_binlog_fails_when_the_stream_starts(tmp_path: Path) -> None:
    with MariaDB.start(tmp_path, {"binlog-format": "STATEMENT"}) as db:
        db.execute("CREATE TABLE t (id INT PRIMARY KEY)")
        source = load(db, tableName="t")  # a snapshot needs nothing
        with pytest.raises(SourceFailedError) as failed:
            SourceHarness(source, 1).read_available()  # discovery fails as the source starts
        message = str(failed.value.__cause__)
        assert f"MySQL splitflow@127.0.0.1:{db.port} has binlog_format=STATEMENT" in message
        assert "--binlog-format=ROW" in message
        assert PASSWORD not in message
