"""A Spark schema as the DDL the tests compare with."""

from __future__ import annotations

from pyspark.sql.types import StructType


def ddl(schema: StructType) -> str:
    """``schema`` as ``\\`name\\` type, ...`` (field metadata left out)."""
    return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in schema.fields)
