"""What a schema change is (``splitflow.connectors.cdc.changes``): the difference between two
descriptions of a table, which changes a restart can follow, renames by column id and the
history of names, and ``run_restarting``'s choice of which failed queries to start again."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from splitflow.connectors.cdc.changes import Difference, difference, follow, widens
from splitflow.connectors.cdc.schema import Table
from splitflow.errors import SchemaChangedError


@dataclasses.dataclass(frozen=True)
class Kind:
    spark: str
    arrow: Any = None


def table(*columns: tuple[str, str], ids: tuple[int, ...] = (), key: str = "id") -> Table[Kind]:
    return Table("s.t", tuple((n, Kind(t)) for n, t in columns), (key,), key, ids)


@pytest.mark.parametrize(
    ("old", "new", "widened"),
    [
        ("tinyint", "smallint", True),
        ("int", "bigint", True),
        ("bigint", "int", False),
        ("float", "double", True),
        ("int", "double", True),
        ("bigint", "double", False),
        ("int", "decimal(10,0)", True),
        ("int", "decimal(10,1)", False),
        ("decimal(10,2)", "decimal(12,4)", True),
        ("decimal(10,2)", "decimal(10,3)", False),
        ("string", "int", False),
        ("int", "string", False),
    ],
)
def test_a_widening_holds_every_value_of_the_old_type(old: str, new: str, widened: bool) -> None:
    assert widens(old, new) is widened


def test_added_dropped_and_retyped_columns_are_found_by_name() -> None:
    old = table(("id", "bigint"), ("a", "int"), ("b", "string"))
    new = table(("id", "bigint"), ("a", "bigint"), ("c", "string"))

    assert difference(old, new) == Difference(("c",), ("b",), (), (("a", "int", "bigint"),))
    assert not difference(old, old)


def test_a_column_whose_id_stays_under_another_name_was_renamed() -> None:
    old = table(("id", "bigint"), ("a", "int"), ids=(1, 2))
    renamed = table(("id", "bigint"), ("b", "int"), ids=(1, 2))
    replaced = table(("id", "bigint"), ("b", "int"), ids=(1, 3))

    assert str(difference(old, renamed)) == "renamed a to b"
    assert str(difference(old, replaced)) == "added b; dropped a"


def test_following_renames_keeps_the_key_and_every_former_name() -> None:
    first = table(("id", "bigint"), ("a", "int"), ids=(1, 2))
    second = follow(first, [("key", Kind("bigint")), ("a", Kind("int"))], [1, 2])
    third = follow(second, [("key", Kind("bigint")), ("c", Kind("int"))], [1, 2])

    assert (third.key, third.chunk_key) == (("key",), "key")
    assert dict(third.formerly) == {"key": ("id",), "c": ("a",)}
    again = follow(third, [("k2", Kind("bigint")), ("c", Kind("int"))], [1, 2])
    assert dict(again.formerly) == {"k2": ("key", "id"), "c": ("a",)}


def test_only_a_narrowing_or_a_lost_key_is_beyond_a_restart() -> None:
    old = table(("id", "bigint"), ("a", "int"))
    assert difference(old, table(("id", "bigint"), ("a", "bigint"))).problem(old) is None
    assert difference(old, table(("id", "bigint"))).problem(old) is None
    narrowed = difference(old, table(("id", "int"), ("a", "int"))).problem(old)
    assert narrowed == "a type change that is not a widening (id bigint to int)"
    lost = difference(old, table(("a", "int"))).problem(old)
    assert lost == "key column id dropped"


class FakeQuery:
    """A started query that ends with ``error`` (None: without one)."""

    def __init__(self, error: str | None) -> None:
        self.error = None if error is None else RuntimeError(error)
        self.stopped = False

    def awaitTermination(self) -> None:
        if self.error is not None:
            raise self.error

    def exception(self) -> Exception | None:
        return self.error

    def stop(self) -> None:
        self.stopped = True


def recorded_change() -> str:
    return (
        f"... splitflow.errors.SchemaChangedError: table t: added x; {SchemaChangedError.RECORDED}"
    )


def test_run_restarting_starts_again_only_after_a_recorded_schema_change() -> None:
    from splitflow.spark import run_restarting

    ends = [recorded_change(), recorded_change(), None]
    queries = [FakeQuery(e) for e in ends]
    assert run_restarting(lambda: queries.pop(0)) is not None
    assert not queries

    failing = [FakeQuery("SchemaChangedError: table t: dropped id; key column id dropped")]
    with pytest.raises(RuntimeError, match="key column id dropped"):
        run_restarting(lambda: failing.pop(0))
    other = [FakeQuery("ConnectorError: the server is gone")]
    with pytest.raises(RuntimeError, match="server is gone"):
        run_restarting(lambda: other.pop(0))
    endless = [FakeQuery(recorded_change()) for _ in range(3)]
    with pytest.raises(RuntimeError, match="added x"):
        run_restarting(lambda: endless.pop(0), max_restarts=1)
    assert len(endless) == 1
