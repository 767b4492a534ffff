"""The type mapping: a SELECT and the pgoutput log give the same values, Arrow the declared
types, and unsupported types are refused by name."""

from __future__ import annotations

import pickle
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from splitflow.connectors.postgres.pgoutput import Insert, Relation, decode
from splitflow.connectors.postgres.types import ColumnType, TypeMapping, adapters, to_arrow
from splitflow.errors import ConfigurationError
from splitflow.testing.postgres import Postgres

COLUMNS = """
    id int PRIMARY KEY, i2 smallint, i8 bigint, f4 real, f8 double precision,
    n numeric(10,2), nu numeric, t text, vc varchar(10), bp char(5), nm name, ci citext,
    u uuid, js json, jb jsonb, b boolean, tstz timestamptz, ts timestamp, d date, by bytea,
    ai int[], at text[], an numeric(6,3)[], atz timestamptz[], ab boolean[]
"""

ROWS = [
    """(1, -32768, -9007199254740993, 1.5, -2.25e-300, -12345678.91, 3.141592653589793238,
        'héllo ✓', 'abc', 'ab', 'pg_name', 'MiXeD', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11',
        '{"a": [1, {"b": null}], "c": "x"}', '{"z": 1, "a": [true, 2.50]}', true,
        '2024-03-10 01:30:00.123456-05', '1999-12-31 23:59:59.999999', '0001-01-01',
        '\\x00ff0000', '{1,NULL,-3}', '{"a b",NULL,""}', '{1.5,NULL,-0.001}',
        '{"2024-01-01 00:00:00+00",NULL}', '{true,false,NULL}')""",
    """(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
    """(3, 0, 0, 'NaN', '-Infinity', 0, -0.000000000000000001, '', '', '', '', '',
        '00000000-0000-0000-0000-000000000000', '[]', '{}', false,
        '2024-07-01 12:00:00+00', '2024-07-01 12:00:00', '2024-02-29', '', '{}', '{}', '{}',
        '{}', '{}')""",
]

NEW_YORK = "America/New_York"


@pytest.fixture(scope="module")
def typed_table(postgres: Postgres) -> dict[str, Any]:
    """The table ``public.all_types`` with ROWS, read by a SELECT and from a pgoutput slot,
    both in a session whose TimeZone is New York."""
    with postgres.connect(options=f"-c TimeZone={NEW_YORK}") as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS citext")
        conn.execute(f"CREATE TABLE all_types ({COLUMNS})")
        conn.execute("CREATE PUBLICATION pub_types FOR TABLE all_types")
        conn.execute("SELECT pg_create_logical_replication_slot('slot_types', 'pgoutput')")
        try:
            for row in ROWS:
                conn.execute(f"INSERT INTO all_types VALUES {row}")
            attributes = conn.execute(
                "SELECT attname, atttypid::int, atttypmod, format_type(atttypid, atttypmod)"
                " FROM pg_attribute WHERE attrelid = 'all_types'::regclass AND attnum > 0"
                " AND NOT attisdropped ORDER BY attnum"
            ).fetchall()
            kinds = [
                TypeMapping.for_column("public.all_types", name, oid, typmod, type_name)
                for name, oid, typmod, type_name in attributes
            ]
            with psycopg.connect(
                postgres.conninfo(), options=f"-c TimeZone={NEW_YORK}", context=adapters()
            ) as snapshot:
                selected = snapshot.execute("SELECT * FROM all_types ORDER BY id").fetchall()
            messages = [
                decode(data)
                for (data,) in conn.execute(
                    "SELECT data FROM pg_logical_slot_peek_binary_changes('slot_types', NULL,"
                    " NULL, 'proto_version', '1', 'publication_names', 'pub_types')"
                ).fetchall()
            ]
        finally:
            conn.execute("SELECT pg_drop_replication_slot('slot_types')")
    relation = next(m for m in messages if isinstance(m, Relation))
    inserts = [m for m in messages if isinstance(m, Insert)]
    logged = [
        tuple(
            None if v is None else kind.from_text(v) for v, kind in zip(m.new, kinds, strict=True)
        )
        for m in inserts
    ]
    return {
        "attributes": attributes,
        "kinds": kinds,
        "selected": selected,
        "logged": logged,
        "relation": relation,
    }


def by_name(table: dict[str, Any], row: int) -> dict[str, Any]:
    names = [name for name, *_ in table["attributes"]]
    return dict(zip(names, table["selected"][row], strict=True))


def test_every_mapped_type_has_its_spark_and_arrow_type(typed_table: dict[str, Any]) -> None:
    kinds: list[ColumnType] = typed_table["kinds"]
    assert [(k.column, k.spark) for k in kinds] == [
        ("id", "int"),
        ("i2", "int"),
        ("i8", "bigint"),
        ("f4", "float"),
        ("f8", "double"),
        ("n", "decimal(10,2)"),
        ("nu", "decimal(38,18)"),
        ("t", "string"),
        ("vc", "string"),
        ("bp", "string"),
        ("nm", "string"),
        ("ci", "string"),
        ("u", "string"),
        ("js", "string"),
        ("jb", "string"),
        ("b", "boolean"),
        ("tstz", "timestamp"),
        ("ts", "timestamp_ntz"),
        ("d", "date"),
        ("by", "binary"),
        ("ai", "array<int>"),
        ("at", "array<string>"),
        ("an", "array<decimal(6,3)>"),
        ("atz", "array<timestamp>"),
        ("ab", "array<boolean>"),
    ]
    assert [k.arrow for k in kinds] == [
        pa.int32(),
        pa.int32(),
        pa.int64(),
        pa.float32(),
        pa.float64(),
        pa.decimal128(10, 2),
        pa.decimal128(38, 18),
        *[pa.string()] * 8,
        pa.bool_(),
        pa.timestamp("us", tz="UTC"),
        pa.timestamp("us"),
        pa.date32(),
        pa.binary(),
        pa.list_(pa.int32()),
        pa.list_(pa.string()),
        pa.list_(pa.decimal128(6, 3)),
        pa.list_(pa.timestamp("us", tz="UTC")),
        pa.list_(pa.bool_()),
    ]


def test_relation_message_carries_the_catalog_types(typed_table: dict[str, Any]) -> None:
    relation: Relation = typed_table["relation"]
    assert [(c.name, c.type_oid, c.type_modifier) for c in relation.columns] == [
        (name, oid, typmod) for name, oid, typmod, _ in typed_table["attributes"]
    ]


def test_select_returns_the_values_the_source_emits(typed_table: dict[str, Any]) -> None:
    row = by_name(typed_table, 0)
    assert row == {
        "id": 1,
        "i2": -32768,
        "i8": -9007199254740993,
        "f4": 1.5,
        "f8": -2.25e-300,
        "n": Decimal("-12345678.91"),
        "nu": Decimal("3.141592653589793238"),
        "t": "héllo ✓",
        "vc": "abc",
        "bp": "ab   ",
        "nm": "pg_name",
        "ci": "MiXeD",
        "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "js": '{"a": [1, {"b": null}], "c": "x"}',
        "jb": '{"a": [true, 2.50], "z": 1}',
        "b": True,
        "tstz": datetime(2024, 3, 10, 6, 30, 0, 123456, tzinfo=UTC),
        "ts": datetime(1999, 12, 31, 23, 59, 59, 999999),
        "d": date(1, 1, 1),
        "by": b"\x00\xff\x00\x00",
        "ai": [1, None, -3],
        "at": ["a b", None, ""],
        "an": [Decimal("1.500"), None, Decimal("-0.001")],
        "atz": [datetime(2024, 1, 1, tzinfo=UTC), None],
        "ab": [True, False, None],
    }
    assert repr(row["n"]) == "Decimal('-12345678.91')"
    # the session's TimeZone shows in tzinfo (not in the instant)
    assert row["tstz"].utcoffset() == timedelta(hours=-5)
    assert row["ts"].tzinfo is None
    assert by_name(typed_table, 1) == {"id": 2} | {
        name: None for name, *_ in typed_table["attributes"][1:]
    }


def in_utc(value: Any) -> Any:
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    if isinstance(value, list | tuple):
        return [in_utc(v) for v in value]
    return value


def test_log_values_equal_select_values(typed_table: dict[str, Any]) -> None:
    selected, logged = typed_table["selected"], typed_table["logged"]
    assert len(logged) == len(selected) == 3
    for select_row, log_row in zip(selected, logged, strict=True):
        assert [v for v in log_row if v == v] == [v for v in select_row if v == v]  # NaN
        # exactly the same values (Decimal scale, str vs UUID, ...) once instants are in UTC
        assert repr(in_utc(log_row)) == repr(in_utc(select_row))
    tstz = logged[0][16]
    assert tstz == datetime(2024, 3, 10, 6, 30, 0, 123456, tzinfo=UTC)
    assert tstz.utcoffset() == timedelta(0)  # the log's text carries the offset: UTC here
    assert logged[2][3] != logged[2][3]  # real NaN survives both paths
    assert logged[2][4] == float("-inf")


def test_to_arrow_builds_arrays_of_the_declared_types(typed_table: dict[str, Any]) -> None:
    kinds: list[ColumnType] = typed_table["kinds"]
    for rows in (typed_table["selected"], typed_table["logged"]):
        arrays = to_arrow(rows, kinds)
        assert [a.type for a in arrays] == [k.arrow for k in kinds]
        columns = {k.column: a.to_pylist() for k, a in zip(kinds, arrays, strict=True)}
        assert columns["tstz"] == [
            datetime(2024, 3, 10, 6, 30, 0, 123456, tzinfo=UTC),
            None,
            datetime(2024, 7, 1, 12, tzinfo=UTC),
        ]
        assert all(v is None or v.utcoffset() == timedelta(0) for v in columns["tstz"])
        assert columns["nu"] == [Decimal("3.141592653589793238"), None, Decimal("-1E-18")]
        assert columns["u"] == [
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            None,
            "0" * 8 + "-0000" * 3 + "-" + "0" * 12,
        ]
        assert columns["by"] == [b"\x00\xff\x00\x00", None, b""]
        assert columns["an"] == [[Decimal("1.500"), None, Decimal("-0.001")], None, []]
        assert columns["jb"] == ['{"a": [true, 2.50], "z": 1}', None, "{}"]
        assert columns["d"] == [date(1, 1, 1), None, date(2024, 2, 29)]


def test_to_arrow_rejects_a_numeric_beyond_its_decimal_naming_the_column() -> None:
    nu = TypeMapping.for_column("public.all_types", "nu", 1700, -1, "numeric")
    fits = Decimal("-12345678901234567890.123456789012345678")
    assert to_arrow([(fits,)], [nu])[0].to_pylist() == [fits]
    for bad in (Decimal("3.14159265358979323846"), Decimal("1E+20"), Decimal("NaN")):
        with pytest.raises(ConfigurationError, match=r"public\.all_types\.nu \(numeric"):
            to_arrow([(Decimal(1),), (bad,)], [nu])
    narrow = TypeMapping.for_column("s.t", "an", 1231, ((6 << 16) | 3) + 4, "numeric(6,3)[]")
    with pytest.raises(ConfigurationError, match=r"s\.t\.an .*does not fit array<decimal\(6,3\)>"):
        to_arrow([([Decimal("1000.5")],)], [narrow])


def test_to_arrow_rejects_a_multidimensional_array_naming_the_column() -> None:
    ai = TypeMapping.for_column("public.grid", "cells", 1007, -1, "integer[]")
    value = ai.from_text(b"{{1,2},{3,4}}")
    assert value == [[1, 2], [3, 4]]
    with pytest.raises(ConfigurationError, match=r"public\.grid\.cells .*multi-dimensional"):
        to_arrow([([1],), (value,)], [ai])


def test_to_arrow_turns_uuid_objects_into_strings() -> None:
    import uuid

    u = TypeMapping.for_column("t", "u", 2950, -1, "uuid")
    au = TypeMapping.for_column("t", "au", 2951, -1, "uuid[]")
    value = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    arrays = to_arrow([(value, [value, None]), (None, None)], [u, au])
    assert arrays[0].to_pylist() == [str(value), None]
    assert arrays[1].to_pylist() == [[str(value), None], None]


def test_to_arrow_converts_aware_datetimes_to_utc() -> None:
    tstz = TypeMapping.for_column("t", "at", 1184, -1, "timestamp with time zone")
    local = datetime(2024, 1, 1, 12, tzinfo=timezone(timedelta(hours=9)))
    array = to_arrow([(local,)], [tstz])[0]
    assert array.type == pa.timestamp("us", tz="UTC")
    assert array.cast(pa.int64()).to_pylist() == [
        int((local - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))
    ]
    assert array.to_pylist()[0].hour == 3


@pytest.mark.parametrize(
    ("oid", "typmod", "type_name", "spark"),
    [
        (1700, ((38 << 16) | 0) + 4, "numeric(38,0)", "decimal(38,0)"),
        (1700, ((5 << 16) | 0x7FE) + 4, "numeric(5,-2)", "decimal(7,0)"),
        (1700, ((2 << 16) | 5) + 4, "numeric(2,5)", "decimal(5,5)"),
        (1231, -1, "numeric[]", "array<decimal(38,18)>"),
        (1042, 9, "character(5)", "string"),
        (1001, -1, "bytea[]", "array<binary>"),
        (17000, -1, "public.citext", "string"),
    ],
)
def test_numeric_modifiers_and_names_map(oid: int, typmod: int, type_name: str, spark: str) -> None:
    assert TypeMapping.for_column("t", "c", oid, typmod, type_name).spark == spark


@pytest.mark.parametrize(
    ("oid", "typmod", "type_name"),
    [
        (600, -1, "point"),
        (1186, -1, "interval"),
        (1187, -1, "interval[]"),
        (790, -1, "money"),
        (26, -1, "oid"),
        (17001, -1, "mood"),  # an enum
        (1700, ((39 << 16) | 2) + 4, "numeric(39,2)"),
    ],
)
def test_unsupported_types_are_refused_naming_the_column(
    oid: int, typmod: int, type_name: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        TypeMapping.for_column("public.shapes", "location", oid, typmod, type_name)
    message = str(caught.value)
    assert f"column public.shapes.location has PostgreSQL type {type_name!r}" in message
    assert "exclude the table" in message
    assert "change the column's type" in message


def test_unsupported_types_in_a_real_table_are_refused(postgres: Postgres) -> None:
    with postgres.connect() as conn:
        conn.execute("CREATE TABLE odd_types (id int PRIMARY KEY, p point, i interval)")
        attributes = conn.execute(
            "SELECT attname, atttypid::int, atttypmod, format_type(atttypid, atttypmod)"
            " FROM pg_attribute WHERE attrelid = 'odd_types'::regclass AND attnum > 1"
            " ORDER BY attnum"
        ).fetchall()
    for name, oid, typmod, type_name in attributes:
        with pytest.raises(ConfigurationError, match=rf"public\.odd_types\.{name} .*{type_name!r}"):
            TypeMapping.for_column("public.odd_types", name, oid, typmod, type_name)
    assert [a[3] for a in attributes] == ["point", "interval"]


def test_column_types_pickle_and_load_after_unpickling() -> None:
    kind = TypeMapping.for_column("public.t", "j", 3802, -1, "jsonb")
    copy = pickle.loads(pickle.dumps(kind))
    assert copy == kind
    assert copy.from_text(b'{"a": 1}') == '{"a": 1}'


def test_adapters_load_json_as_text_and_leave_the_global_adapters_alone(
    postgres: Postgres,
) -> None:
    with psycopg.connect(postgres.conninfo(), context=adapters()) as conn:
        assert conn.execute(
            "SELECT '{\"b\": 1}'::json, '{\"b\": 1}'::jsonb, gen_random_uuid() IS NOT NULL,"
            " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid"
        ).fetchone() == ('{"b": 1}', '{"b": 1}', True, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
        binary = conn.cursor(binary=True)
        assert binary.execute(
            "SELECT '{\"b\": 1}'::json, '{\"b\": 1}'::jsonb,"
            " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid"
        ).fetchone() == ('{"b": 1}', '{"b": 1}', "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
    with psycopg.connect(postgres.conninfo()) as plain:
        assert plain.execute("SELECT '{\"b\": 1}'::jsonb").fetchone() == ({"b": 1},)


def test_a_chunk_read_by_adbc_gives_the_arrays_the_log_path_gives(
    postgres: Postgres, typed_table: dict[str, Any]
) -> None:
    """The snapshot reads chunks with ADBC straight into Arrow; every mapped type must come
    out as ``to_arrow`` makes it from the loaders' values (what the log emits), NULLs and
    empty strings apart."""
    from splitflow.connectors.postgres.snapshot import connect, select_list, to_columns

    kinds: list[ColumnType] = typed_table["kinds"]
    columns = [(k.column, k) for k in kinds]
    with connect(postgres.conninfo()) as conn, conn.cursor() as cursor:
        cursor.execute(f"SELECT {select_list(columns)} FROM all_types ORDER BY id")
        read = cursor.fetch_arrow_table()
    copied = to_columns(read, columns, "all_types")
    expected = to_arrow(typed_table["logged"], kinds)
    assert read.num_rows == 3
    for kind, got, want in zip(kinds, copied, expected, strict=True):
        assert got.type == kind.arrow, kind.column
        assert repr(got.to_pylist()) == repr(want.to_pylist()), kind.column
    assert copied[7].to_pylist() == ["héllo ✓", None, ""]  # NULL and '' stay apart


@pytest.mark.parametrize("scale", range(19))
def test_a_chunk_read_keeps_numeric_values_exact_at_every_scale(
    postgres: Postgres, scale: int
) -> None:
    """Older ADBC drivers corrupted some numeric scales; every scale must read exactly."""
    from splitflow.connectors.postgres.snapshot import connect, select_list, to_columns

    table = f"numeric_scale_{scale}"
    postgres.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, c numeric(38, {scale}))")
    values = ["0", "1.01", "1.0123456789", "-98765.4321", "0.000000000000000001", "100000000"]
    for i, value in enumerate(values):
        postgres.execute(f"INSERT INTO {table} VALUES ({i}, {value})")
    kind = TypeMapping.for_column(f"public.{table}", "c", 1700, ((38 << 16) | scale) + 4, "")
    with connect(postgres.conninfo()) as conn, conn.cursor() as cursor:
        cursor.execute(f"SELECT {select_list([('c', kind)])} FROM {table} ORDER BY id")
        (column,) = to_columns(cursor.fetch_arrow_table(), [("c", kind)], table)
    truth = [Decimal(r[0]) for r in postgres.execute(f"SELECT c FROM {table} ORDER BY id")]
    assert column.to_pylist() == truth


def test_the_chunk_connection_fails_naming_the_server_and_not_the_password(
    postgres: Postgres,
) -> None:
    from splitflow.connectors.postgres.snapshot import connect
    from splitflow.errors import ConnectorError

    wrong = postgres.conninfo(password="not-the-pw-1234")
    with pytest.raises(ConnectorError) as caught:
        connect(wrong, "splitflow@127.0.0.1/splitflow")
    message = str(caught.value)
    assert message.startswith("cannot connect to PostgreSQL splitflow@127.0.0.1/splitflow (ADBC):")
    assert "password authentication failed" in message
    assert "not-the-pw-1234" not in message
