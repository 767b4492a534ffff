"""``apply_changes`` reads a CDC batch's field metadata (``splitflow.spark.cdc.spark_struct``):
which source table has each column, and a renamed column's former names. Batches are Spark
DataFrames made in the shared session; the end-to-end runs are in
``tests/spark/test_cdc_schema_changes_e2e.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from splitflow.cdc import apply_changes

deltalake = pytest.importorskip("deltalake", reason="needs the delta extra (deltalake)")

METADATA = "op string, lsn bigint, commit_ts timestamp, table string"


def batch(
    spark: Any, rows: list[tuple[Any, ...]], columns: list[tuple[str, str, dict[str, Any]]]
) -> Any:
    from pyspark.sql.types import DataType, StructField, StructType

    fields = [StructField(n, DataType.fromDDL(t), True, m) for n, t, m in columns]
    schema = StructType(fields + list(DataType.fromDDL(METADATA).fields))  # type: ignore[attr-defined]
    return spark.createDataFrame(rows, schema)


def read(uri: Path) -> list[dict[str, Any]]:
    table = deltalake.DeltaTable(str(uri))
    result = deltalake.QueryBuilder().register("t", table).execute("SELECT * FROM t ORDER BY id")
    return pa.table(result.read_all()).to_pylist()


def test_a_renamed_column_keeps_its_values_under_the_new_name(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    mine = {"splitflow.tables": ["public.t"]}
    before = [("id", "bigint", mine), ("payload", "string", mine)]
    after = [
        ("id", "bigint", mine),
        ("body", "string", {**mine, "splitflow.formerly": {"public.t": ["payload"]}}),
    ]
    apply_changes(
        batch(
            spark, [(1, "a", "r", 1, None, "public.t"), (2, "b", "r", 1, None, "public.t")], before
        ),
        0,
        uri,
        keys=["id"],
        app_id="a",
    )
    apply_changes(
        batch(spark, [(2, "B", "u", 5, None, "public.t")], after), 1, uri, keys=["id"], app_id="a"
    )

    assert read(Path(uri)) == [{"id": 1, "body": "a"}, {"id": 2, "body": "B"}]


def test_a_tables_columns_are_those_its_metadata_names(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    columns = [
        ("id", "bigint", {"splitflow.tables": ["public.t", "public.u"]}),
        ("name", "string", {"splitflow.tables": ["public.t"]}),
        ("price", "int", {"splitflow.tables": ["public.u"]}),
    ]
    rows = [(1, "a", None, "r", 1, None, "public.t"), (1, None, 9, "r", 1, None, "public.u")]
    apply_changes(batch(spark, rows, columns), 0, uri, keys=["id"], table="public.t", app_id="a")

    assert read(Path(uri)) == [{"id": 1, "name": "a"}]
