"""``apply_changes`` on a real Delta table (delta-rs), batches given as Arrow tables.

The end-to-end run (PostgreSQL, Spark, a crash between the Delta commit and Spark's) is
``tests/spark/test_cdc_mirror_e2e.py``. Tables are read back with delta-rs's own query
engine: ``DeltaTable.to_pyarrow_table`` reads through pyarrow's thread pool, which sometimes
aborts the interpreter at exit (delta-rs issue 2184).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from splitflow.cdc import Applied, apply_changes
from splitflow.errors import ConfigurationError

deltalake = pytest.importorskip("deltalake", reason="needs the delta extra (deltalake)")

APP = "test-app"


def changes(*rows: tuple[int, str, str | None, int], table: str = "public.t") -> pa.Table:
    """CDC rows ``(id, op, name, lsn)`` with the source's metadata columns."""
    return pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "name": pa.array([r[2] for r in rows], pa.string()),
            "op": [r[1] for r in rows],
            "lsn": pa.array([r[3] for r in rows], pa.int64()),
            "commit_ts": pa.array([None] * len(rows), pa.timestamp("us", tz="UTC")),
            "table": [table] * len(rows),
        }
    )


def read(uri: Path) -> list[dict[str, Any]]:
    table = deltalake.DeltaTable(str(uri))
    result = deltalake.QueryBuilder().register("t", table).execute("SELECT * FROM t ORDER BY id")
    return pa.table(result.read_all()).to_pylist()


def apply(uri: Path, batch: pa.Table, batch_id: int, **options: Any) -> Applied:
    return apply_changes(batch, batch_id, str(uri), keys=["id"], app_id=APP, **options)


def test_the_first_batch_creates_the_table_and_later_ones_insert_update_and_delete(
    tmp_path: Path,
) -> None:
    uri = tmp_path / "t"
    first = apply(uri, changes((1, "r", "a", 10), (2, "r", "b", 10), (3, "r", "c", 10)), 0)
    second = apply(uri, changes((1, "u", "A", 20), (2, "d", None, 21), (4, "c", "d", 22)), 1)

    assert (first.inserted, first.skipped) == (3, False)
    assert (second.inserted, second.updated, second.deleted) == (1, 1, 1)
    assert read(uri) == [
        {"id": 1, "name": "A"},
        {"id": 3, "name": "c"},
        {"id": 4, "name": "d"},
    ]
    assert deltalake.DeltaTable(str(uri)).transaction_version(APP) == 1


def test_the_last_change_of_a_key_wins_by_lsn_then_by_the_order_they_came_in(
    tmp_path: Path,
) -> None:
    uri = tmp_path / "t"
    apply(uri, changes((1, "r", "a", 10), (2, "r", "b", 10)), 0)
    batch = changes(
        (1, "u", "late", 30),
        (1, "u", "early", 20),
        (2, "d", None, 25),  # one transaction: deleted, then inserted again
        (2, "c", "again", 25),
        (3, "c", "new", 25),  # inserted and deleted in one transaction
        (3, "d", None, 25),
    )
    apply(uri, batch, 1)

    assert read(uri) == [{"id": 1, "name": "late"}, {"id": 2, "name": "again"}]


def test_a_batch_applied_again_changes_nothing(tmp_path: Path) -> None:
    """A crash after the Delta commit and before Spark's: Spark runs the batch again."""
    uri = tmp_path / "t"
    apply(uri, changes((1, "r", "a", 10), (2, "r", "b", 10)), 0)
    batch = changes((1, "u", "A", 20), (2, "d", None, 20), (3, "c", "c", 20))
    apply(uri, batch, 1)
    before = read(uri), deltalake.DeltaTable(str(uri)).version()

    again = apply(uri, batch, 1)
    older = apply(uri, changes((1, "d", None, 15)), 0)

    assert (again.skipped, older.skipped) == (True, True)
    assert (read(uri), deltalake.DeltaTable(str(uri)).version()) == before
    assert apply(uri, changes((1, "d", None, 30)), 2).deleted == 1


class Unreadable:
    """A batch that fails the test if it is read."""

    def where(self, condition: Any) -> Unreadable:
        return self

    def __getitem__(self, name: str) -> Any:
        return name

    def toArrow(self) -> pa.Table:
        raise AssertionError("a batch the table has already was read")


def test_a_batch_the_table_has_already_is_not_read(tmp_path: Path) -> None:
    """A CDC source's replay reads its chunks under a new snapshot, and the log filters by
    the last read's watermarks: a replay read and then dropped would lose changes."""
    uri = tmp_path / "t"
    apply(uri, changes((1, "r", "a", 10)), 0)
    apply(uri, changes((1, "u", "b", 20)), 1)

    assert apply(uri, Unreadable(), 1, table="public.t").skipped
    with pytest.raises(AssertionError, match="was read"):
        apply(uri, Unreadable(), 2)


def test_a_column_the_table_lacks_is_added_to_its_schema(tmp_path: Path) -> None:
    uri = tmp_path / "t"
    apply(uri, changes((1, "r", "a", 10)), 0)
    batch = changes((2, "c", "b", 20)).append_column("price", pa.array([5], pa.int32()))
    apply(uri, batch, 1)

    assert read(uri) == [
        {"id": 1, "name": "a", "price": None},
        {"id": 2, "name": "b", "price": 5},
    ]
    fields = {f.name: f.type.type for f in deltalake.DeltaTable(str(uri)).schema().fields}
    assert fields == {"id": "long", "name": "string", "price": "integer"}


def test_a_column_the_batch_no_longer_has_is_dropped_and_a_wider_type_is_taken(
    tmp_path: Path,
) -> None:
    uri = tmp_path / "t"
    apply(
        uri,
        changes((1, "r", "a", 10), (2, "r", "b", 10)).append_column(
            "n", pa.array([1, 2], pa.int32())
        ),
        0,
    )
    later = (
        changes((2, "u", "b", 20))
        .drop_columns(["name"])
        .append_column("n", pa.array([3], pa.int64()))
    )
    apply(uri, later, 1)
    again = apply(uri, later, 1)

    assert read(uri) == [{"id": 1, "n": 1}, {"id": 2, "n": 3}]
    fields = {f.name: f.type.type for f in deltalake.DeltaTable(str(uri)).schema().fields}
    assert fields == {"id": "long", "n": "long"}
    assert again.skipped


def test_only_the_named_tables_rows_and_columns_are_applied(tmp_path: Path) -> None:
    uri = tmp_path / "t"
    both = pa.concat_tables(
        [
            changes((1, "r", "mine", 10)).append_column("other", pa.array([None], pa.int64())),
            changes((1, "r", None, 10), table="public.x").append_column("other", pa.array([7])),
        ]
    )
    apply(uri, both, 0, table="public.t", columns=["id", "name"])

    assert read(uri) == [{"id": 1, "name": "mine"}]


def test_deletes_in_the_first_batch_leave_their_keys_out(tmp_path: Path) -> None:
    uri = tmp_path / "t"
    apply(uri, changes((1, "c", "a", 10), (1, "d", None, 11), (2, "c", "b", 12)), 0)

    assert read(uri) == [{"id": 2, "name": "b"}]


def test_bad_arguments_name_what_is_wrong(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    batch = changes((1, "c", "a", 10))
    with pytest.raises(ConfigurationError, match="keys is empty") as empty:
        apply_changes(batch, 0, uri, keys=[], app_id=APP)
    with pytest.raises(ConfigurationError, match="no column sku") as missing:
        apply_changes(batch, 0, uri, keys=["sku"], app_id=APP)
    with pytest.raises(ConfigurationError, match="no column price") as column:
        apply_changes(batch, 0, uri, keys=["id"], columns=["id", "price"], app_id=APP)
    with pytest.raises(ConfigurationError, match="pass app_id") as app:
        apply_changes(batch, 0, uri, keys=["id"])

    assert [e.value.option for e in (empty, missing, column, app)] == [
        "keys",
        "keys",
        "columns",
        "app_id",
    ]
    assert not (tmp_path / "t").exists()


def test_without_deltalake_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "deltalake", None)  # import deltalake raises
    with pytest.raises(ImportError, match=r"pip install 'splitflow\[delta\]'"):
        apply(tmp_path / "t", changes((1, "c", "a", 10)), 0)
