"""One type mapping: every mapped MariaDB type gives the same value from a snapshot chunk and
from the binlog, and an unmapped type fails at load naming ``db.table.column``."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from tests.connectors.cdc.harness_suite import Harness, rows_of
from tests.connectors.mysql.test_mysql_cdc_harness import load
from tests.support.mariadb import MariaDB
from tests.support.schema import ddl

pytest.importorskip("pymysqlreplication", reason="pip install -e '.[mysql]'")

from splitflow.connectors.mysql import catalog
from splitflow.connectors.mysql.options import MySqlOptions
from splitflow.connectors.mysql.types import TypeMapping, to_arrow
from splitflow.errors import ConfigurationError
from splitflow.spark.cdc import spark_struct
from splitflow.testing.harness import SourceHarness

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning"),
]

_names = itertools.count()

COLUMNS = """id INT PRIMARY KEY,
 ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT UNSIGNED, mi MEDIUMINT, miu MEDIUMINT UNSIGNED,
 i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED, y YEAR,
 f FLOAT, d DOUBLE, de DECIMAL(10,3), de38 DECIMAL(38,10),
 c CHAR(5), vc VARCHAR(10), t TEXT, lt LONGTEXT, j JSON, e ENUM('x','y','z'), s SET('a','b','c'),
 bn BINARY(4), vb VARBINARY(8), bl BLOB,
 dt DATE, dtt DATETIME, dt6 DATETIME(6), ts TIMESTAMP NULL, ts3 TIMESTAMP(3) NULL,
 b1 BIT(1), b9 BIT(9), bo BOOLEAN"""

FULL = (
    "1, -128, 255, 65535, -8388608, 16777215, -2147483648, 4294967295, -9223372036854775808, "
    "18446744073709551615, 2024, 1.1, 2.2, 123.456, 1234567890123456789012345678.0123456789, "
    "'ab', 'héllo😀', 'long text', REPEAT('x', 300), '{\"a\": [1, 2.5, \"x\"]}', 'y', 'a,c', "
    "'ab', 'x\\0y', UNHEX('626C6F62FF'), '2024-02-29', '2024-01-02 03:04:05', "
    "'2024-01-02 03:04:05.123456', '2024-06-01 12:00:00', '2024-06-01 12:00:00.5', b'1', "
    "b'101010101', TRUE"
)
EDGES = "(id, c, vc, s, e, bn, b1, b9) VALUES (2, 'a  ', 'b  ', '', 'x', 'a', b'0', b'0')"

EXPECTED_FULL = {
    "ti": -128,
    "tiu": 255,
    "si": 65535,
    "mi": -8388608,
    "miu": 16777215,
    "i": -2147483648,
    "iu": 4294967295,
    "bi": -9223372036854775808,
    "biu": Decimal(18446744073709551615),
    "y": 2024,
    "d": 2.2,
    "de": Decimal("123.456"),
    "de38": Decimal("1234567890123456789012345678.0123456789"),
    "c": "ab",
    "vc": "héllo😀",
    "j": '{"a": [1, 2.5, "x"]}',
    "e": "y",
    "s": "a,c",
    "bn": b"ab\0\0",
    "vb": b"x\0y",
    "bl": b"blob\xff",
    "dt": date(2024, 2, 29),
    "dtt": datetime(2024, 1, 2, 3, 4, 5),
    "dt6": datetime(2024, 1, 2, 3, 4, 5, 123456),
    "ts": datetime(2024, 6, 1, 12, 0, tzinfo=UTC),
    "ts3": datetime(2024, 6, 1, 12, 0, 0, 500000, tzinfo=UTC),
    "b1": True,
    "b9": 0b101010101,
    "bo": 1,
}


def values(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("op", "lsn", "commit_ts", "table")}


def test_every_type_reads_the_same_from_a_chunk_and_from_the_binlog(mariadb: MariaDB) -> None:
    """The rows in the table before the log starts come as ``r``; the same rows inserted
    again (other ids) after it come as ``c``: every column must be equal."""
    table = f"types{next(_names)}"
    mariadb.execute(f"CREATE TABLE {table} ({COLUMNS})")
    mariadb.execute(f"INSERT INTO {table} VALUES ({FULL})")
    mariadb.execute(f"INSERT INTO {table} {EDGES}")
    harness: Harness = SourceHarness(load(mariadb, tableName=table), 1)
    harness.read_available()
    mariadb.execute(f"INSERT INTO {table} VALUES ({FULL.replace('1, ', '101, ', 1)})")
    mariadb.execute(f"INSERT INTO {table} {EDGES.replace('(2,', '(102,')}")
    harness.read_available()
    harness.complete(harness.checkpoint())
    rows = {(r["op"], r["id"]): values(r) for r in rows_of(harness.committed())}
    harness.close()
    assert sorted(rows) == [("c", 101), ("c", 102), ("r", 1), ("r", 2)]
    for snapshot, log in ((("r", 1), ("c", 101)), (("r", 2), ("c", 102))):
        a, b = dict(rows[snapshot], id=None), dict(rows[log], id=None)
        assert a == b, {k: (a[k], b[k]) for k in a if a[k] != b[k]}
    full = rows[("r", 1)]
    assert {k: full[k] for k in EXPECTED_FULL} == EXPECTED_FULL
    assert (
        pa.array([full["f"]], pa.float32()).to_pylist() == pa.array([1.1], pa.float32()).to_pylist()
    )
    edges = rows[("r", 2)]
    assert (edges["c"], edges["vc"], edges["s"], edges["bn"]) == ("a", "b  ", "", b"a\0\0\0")
    assert (edges["b1"], edges["b9"]) == (False, 0)


def test_the_schema_is_the_mapped_types(mariadb: MariaDB) -> None:
    table = f"types{next(_names)}"
    mariadb.execute(f"CREATE TABLE {table} ({COLUMNS})")
    schema = ddl(spark_struct(load(mariadb, tableName=table)))
    assert schema.startswith(
        "`id` int, `ti` int, `tiu` int, `si` int, `mi` int, `miu` int, `i` int, "
        "`iu` bigint, `bi` bigint, `biu` decimal(20,0), `y` int, `f` float, `d` double, "
        "`de` decimal(10,3), `de38` decimal(38,10), `c` string, `vc` string, `t` string, "
        "`lt` string, `j` string, `e` string, `s` string, `bn` binary, `vb` binary, "
        "`bl` binary, `dt` date, `dtt` timestamp_ntz, `dt6` timestamp_ntz, `ts` timestamp, "
        "`ts3` timestamp, `b1` boolean, `b9` bigint, `bo` int, "
    )
    assert schema.endswith("`op` string, `lsn` bigint, `commit_ts` timestamp, `table` string")


@pytest.mark.parametrize(
    ("ddl", "shown"),
    [
        ("tm TIME", "'time'"),
        ("b64 BIT(64)", "'bit(64)'"),
        ("g POINT", "'point'"),
        ("u UUID", "'uuid'"),
        ("de DECIMAL(65,2)", "'decimal(65,2)' ... (precision 65 is above"),
    ],
)
def test_an_unmapped_type_fails_at_load_naming_the_column(
    mariadb: MariaDB, ddl: str, shown: str
) -> None:
    table = f"types{next(_names)}"
    mariadb.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, {ddl})")
    with pytest.raises(ConfigurationError) as failed:
        load(mariadb, tableName=table)
    message = str(failed.value)
    column = ddl.split()[0]
    assert message.startswith(
        f"column splitflow.{table}.{column} has type {shown.split(' ...')[0]}"
    )
    if "..." in shown:
        assert shown.split("... ")[1] in message
    assert "Leave the table out of tableName" in message


def test_a_value_that_does_not_fit_names_the_column() -> None:
    kind = TypeMapping.for_column("db.t", "n", "int", "int(11)")
    with pytest.raises(Exception, match=r"column db\.t\.n \(int\(11\), read as int\)"):
        to_arrow([[2**40]], [kind])


def test_options_name_the_server_without_the_password(mariadb: MariaDB) -> None:
    settings = mariadb.connection_settings()
    options = MySqlOptions.parse(
        {
            "hostname": settings["host"],
            "port": str(settings["port"]),
            "username": settings["user"],
            "password": settings["password"],
            "databaseName": "splitflow",
            "tableName": "nothing",
        }
    )
    with catalog.connect(options) as conn:
        assert catalog.query(conn, "SELECT @@session.time_zone") == [("+00:00",)]
    assert settings["password"] not in repr(options)
