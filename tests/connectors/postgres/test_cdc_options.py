"""PostgresOptions.parse: every option is checked before a query starts, each error names its
option, and the password never shows in what the source prints."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict
from tests.support.schema import ddl

from splitflow.connectors.postgres.catalog import Table
from splitflow.connectors.postgres.options import PostgresOptions
from splitflow.connectors.postgres.source import PostgresCdcSource
from splitflow.errors import ConfigurationError
from splitflow.testing.postgres import PASSWORD, Postgres

SECRET = "hunter2-Zq9"
CONNINFO = f"host=db.example port=6543 user=alice password={SECRET} dbname=shop"


def parse(**options: str) -> PostgresOptions:
    return PostgresOptions.parse({"tables": "orders", "slotName": "s1", **options})


def refused(option: str, **options: str) -> str:
    """The message of the ConfigurationError ``options`` raise; it must name ``option``."""
    with pytest.raises(ConfigurationError) as caught:
        PostgresOptions.parse(options)
    assert caught.value.option == option
    return str(caught.value)


# -- unknown options -------------------------------------------------------------------------


def test_unknown_option_is_refused_with_the_nearest_known_name() -> None:
    message = refused("tabels", tabels="orders", slotName="s1")
    assert message == "unknown option 'tabels' for splitflow-postgres-cdc (did you mean 'tables'?)"
    assert "did you mean 'slotName'?" in refused(
        "slotnme", tables="t", slotnme="s1"
    )  # as documented


def test_unknown_option_far_from_every_name_gets_no_hint() -> None:
    message = refused("zzzzzz", tables="t", slotName="s1", zzzzzz="1")
    assert message == "unknown option 'zzzzzz' for splitflow-postgres-cdc"


def test_options_of_the_runtime_are_accepted_when_the_caller_knows_them() -> None:
    options = {"tables": "t", "slotName": "s1", "parallelism": "4"}
    with pytest.raises(ConfigurationError, match="unknown option 'parallelism'"):
        PostgresOptions.parse(options)
    assert PostgresOptions.parse(options, known={"parallelism"}).tables == ("public.t",)
    with pytest.raises(ConfigurationError, match="did you mean 'parallelism'"):
        PostgresOptions.parse({**options, "parallelsm": "4"}, known={"parallelism"})


def test_option_names_are_case_insensitive() -> None:
    options = PostgresOptions.parse({"TABLES": "t", "SlotName": "s1", "ChunkSize": "7"})
    assert (options.tables, options.slot, options.chunk_size) == (("public.t",), "s1", 7)


# -- startupMode and the slot ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "mode"),
    [
        ("initial", "initial"),
        ("INITIAL", "initial"),
        ("latest", "latest"),
        (" Latest ", "latest"),
        ("snapshotOnly", "snapshotOnly"),
        ("snapshotonly", "snapshotOnly"),
        ("SNAPSHOTONLY", "snapshotOnly"),
    ],
)
def test_startup_mode_is_case_insensitive(given: str, mode: str) -> None:
    assert parse(startupMode=given).mode == mode


def test_startup_mode_defaults_to_initial() -> None:
    assert parse().mode == "initial"


def test_bad_startup_mode_names_the_option_and_the_choices() -> None:
    message = refused("startupMode", tables="t", slotName="s1", startupMode="earliest")
    assert message == ("option startupMode must be initial, latest or snapshotOnly, not 'earliest'")


def test_bad_schema_changes_names_the_option_and_the_choices() -> None:
    message = refused("schemaChanges", tables="t", slotName="s1", schemaChanges="evolve")
    assert message == "option schemaChanges must be stop or fail, not 'evolve'"
    assert PostgresOptions.parse({"tables": "t"}).schema_changes == "stop"
    assert PostgresOptions.parse({"tables": "t", "schemaChanges": "FAIL"}).schema_changes == "fail"


@pytest.mark.parametrize("mode", ["initial", "latest"])
def test_slot_name_is_required_when_the_log_is_read(mode: str) -> None:
    for slot in ({}, {"slotName": "  "}):
        options = PostgresOptions.parse({"tables": "t", "startupMode": mode, **slot})
        with pytest.raises(ConfigurationError) as caught:
            options.check_streaming()  # a stream's start; spark.read needs no slot
        assert caught.value.option == "slotName"
        assert str(caught.value).startswith(f"option slotName is required with startupMode={mode}")


def test_snapshot_only_needs_no_slot() -> None:
    options = PostgresOptions.parse({"tables": "t", "startupMode": "snapshotOnly"})
    assert (options.slot, options.publication) == ("", "")


@pytest.mark.parametrize("slot", ["My_Slot", "slot-1", "1slot", "s" * 64, "a.b", "sl ot"])
def test_bad_slot_names_are_refused(slot: str) -> None:
    message = refused("slotName", tables="t", slotName=slot)
    assert message == (
        f"option slotName {slot!r}: use lower-case letters, digits and underscores, at most 63"
    )


@pytest.mark.parametrize("slot", ["_s", "s" * 63, "cdc_orders_2"])
def test_good_slot_names_are_accepted(slot: str) -> None:
    assert parse(slotName=slot).slot == slot


def test_publication_defaults_to_the_slot_name_and_is_checked() -> None:
    assert parse(slotName="cdc_a").publication == "cdc_a"
    assert parse(slotName="cdc_a", publicationName="pub_b").publication == "pub_b"
    message = refused("publicationName", tables="t", slotName="s1", publicationName="Pub-B")
    assert message == (
        "option publicationName 'Pub-B': use lower-case letters, digits and underscores, at most 63"
    )


# -- tables -------------------------------------------------------------------------------------


@pytest.mark.parametrize("tables", [None, "", " , ,"])
def test_tables_are_required(tables: str | None) -> None:
    options = {"slotName": "s1"} if tables is None else {"slotName": "s1", "tables": tables}
    message = refused("tables", **options)
    assert message.startswith("option tables is required")


def test_unqualified_tables_are_in_public() -> None:
    assert parse(tables=" orders , sales.items,x_* ").tables == (
        "public.orders",
        "sales.items",
        "public.x_*",
    )


@pytest.mark.parametrize("bad", ["a.b.c", ".t", "s.", "."])
def test_a_name_that_is_not_schema_table_is_refused(bad: str) -> None:
    message = refused("tables", tables=f"ok, {bad}", slotName="s1")
    assert message == f"option tables: {bad!r} is not a schema.table name or pattern"


def test_patterns_match_like_fnmatch_case_sensitively() -> None:
    options = parse(tables="orders_*, s?.items, audit.log_[0-9]")
    matched = {
        "public.orders_2024": True,
        "public.orders_": True,
        "public.orders": False,
        "public.ORDERS_1": False,
        "s1.items": True,
        "sx.items": True,
        "s12.items": False,
        "audit.log_7": True,
        "audit.log_x": False,
        "other.orders_1": False,
    }
    assert {name: options.matches(name) for name in matched} == matched


def test_a_plain_name_matches_only_itself() -> None:
    options = parse(tables="orders")
    assert options.matches("public.orders")
    assert not options.matches("public.orders2")
    assert not options.matches("other.orders")


# -- chunkKeyColumn -------------------------------------------------------------------------------


def test_chunk_key_column_is_one_name_for_every_table_or_table_column_entries() -> None:
    assert parse().chunk_keys == ()
    every = parse(chunkKeyColumn=" aid ")
    assert every.chunk_keys == (("", "aid"),)
    assert (every.chunk_key("public.a"), every.chunk_key("s.b")) == ("aid", "aid")
    named = parse(chunkKeyColumn="history:aid, sales.items : item_id")
    assert named.chunk_keys == (("public.history", "aid"), ("sales.items", "item_id"))
    assert named.chunk_key("public.history") == "aid"
    assert named.chunk_key("sales.items") == "item_id"
    assert named.chunk_key("public.items") is None


@pytest.mark.parametrize("bad", ["aid, history:bid", "aid,bid", "history:", ":aid"])
def test_chunk_key_column_that_mixes_forms_or_lacks_a_part_is_refused(bad: str) -> None:
    message = refused("chunkKeyColumn", tables="t", slotName="s1", chunkKeyColumn=bad)
    assert message.startswith("option chunkKeyColumn: ")
    assert message.endswith(
        "is not table:column; give one column name for every table, or comma-separated "
        "table:column entries"
    )


def test_chunk_key_column_that_names_a_table_twice_is_refused() -> None:
    message = refused("chunkKeyColumn", tables="t", chunkKeyColumn="t:a, public.t:b")
    assert message == "option chunkKeyColumn names table public.t twice"


def test_chunk_key_column_with_a_bad_table_name_is_refused() -> None:
    message = refused("chunkKeyColumn", tables="t", chunkKeyColumn="a.b.c:id")
    assert message == "option chunkKeyColumn: 'a.b.c' is not a schema.table name or pattern"


# -- the connection -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["nonsense", "host='unterminated", "password=x novalue"])
def test_invalid_conninfo_names_conninfo(bad: str) -> None:
    message = refused("conninfo", tables="t", slotName="s1", conninfo=bad)
    assert message == "option conninfo is not a valid libpq connection string"


def test_invalid_conninfo_with_a_password_does_not_show_it() -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse(conninfo=f"password={SECRET} host='unterminated")
    assert SECRET not in str(caught.value)
    assert caught.value.__cause__ is not None
    assert SECRET not in str(caught.value.__cause__)


def test_conninfo_gives_the_connection_and_where() -> None:
    options = parse(conninfo=CONNINFO)
    assert conninfo_to_dict(options.conninfo) == {
        "host": "db.example",
        "port": "6543",
        "user": "alice",
        "password": SECRET,
        "dbname": "shop",
        "connect_timeout": "10",
    }
    assert options.where == "alice@db.example:6543/shop"


def test_host_port_user_password_dbname_options_override_conninfo() -> None:
    options = parse(
        conninfo=CONNINFO, host="h2", port="7000", user="bob", password="pw2", dbname="d2"
    )
    assert conninfo_to_dict(options.conninfo) == {
        "host": "h2",
        "port": "7000",
        "user": "bob",
        "password": "pw2",
        "dbname": "d2",
        "connect_timeout": "10",
    }
    assert options.where == "bob@h2:7000/d2"


def test_without_conninfo_or_host_the_host_is_localhost() -> None:
    options = parse(user="u", port="5433")
    assert conninfo_to_dict(options.conninfo) == {
        "host": "localhost",
        "port": "5433",
        "user": "u",
        "connect_timeout": "10",
    }
    assert options.where == "u@localhost:5433/(default db)"


@pytest.mark.parametrize(("given", "seconds"), [("3s", "3"), ("250ms", "1"), ("2m", "120")])
def test_connect_timeout_goes_to_libpq_in_whole_seconds(given: str, seconds: str) -> None:
    options = parse(connectTimeout=given)
    assert conninfo_to_dict(options.conninfo)["connect_timeout"] == seconds


def test_bad_port_and_connect_timeout_name_their_option() -> None:
    assert "port" in refused("port", tables="t", slotName="s1", port="http")
    refused("connectTimeout", tables="t", slotName="s1", connectTimeout="soon")
    refused("chunkSize", tables="t", slotName="s1", chunkSize="0")


# -- the password never shows ---------------------------------------------------------------------


def shown(value: object) -> str:
    return repr(value) + str(value)


@pytest.mark.parametrize(
    "given",
    [
        {"password": SECRET},
        {"conninfo": CONNINFO},
        {"conninfo": f"postgresql://alice:{SECRET}@db.example:6543/shop"},
        {"conninfo": CONNINFO, "password": SECRET + "-2"},
    ],
)
def test_the_password_is_not_in_the_options_repr_nor_the_sources(given: dict[str, str]) -> None:
    options = parse(**given)
    assert SECRET in options.conninfo  # it is there, to connect with
    assert SECRET not in shown(options)
    assert "password" not in shown(options)
    source = PostgresCdcSource(options, [Table("public.orders", (), ("id",), "id")])
    assert SECRET not in shown(source)
    assert shown(source).startswith("PostgresCdcSource(PostgresOptions(where=")


def test_the_password_is_not_in_the_spark_data_source_repr(postgres: Postgres) -> None:
    from splitflow.spark.postgres import PostgresCdcDataSource

    postgres.execute("CREATE TABLE opt_shown (id int PRIMARY KEY, v text)")
    for options in (
        {"conninfo": postgres.conninfo(), "tables": "opt_shown", "slotName": "opt_s"},
        {
            "host": postgres.host,
            "port": str(postgres.port),
            "user": "splitflow",
            "password": PASSWORD,
            "dbname": "splitflow",
            "tables": "opt_shown",
            "startupMode": "snapshotOnly",
        },
    ):
        source = PostgresCdcDataSource({k.lower(): v for k, v in options.items()})
        assert PASSWORD not in shown(source)
        assert PASSWORD not in shown(source.create_source())
        assert f"splitflow@127.0.0.1:{postgres.port}/splitflow" in repr(source)
        assert ddl(source.schema()) == (
            "`id` int, `v` string, `op` string, `lsn` bigint, `commit_ts` timestamp, `table` string"
        )


def test_the_spark_data_source_refuses_unknown_options_with_a_hint(postgres: Postgres) -> None:
    from splitflow.spark.postgres import PostgresCdcDataSource

    with pytest.raises(ConfigurationError, match=r"did you mean 'parallelism'\?") as caught:
        PostgresCdcDataSource({"conninfo": postgres.conninfo(), "tables": "t", "parallelsm": "2"})
    assert caught.value.option == "parallelsm"
