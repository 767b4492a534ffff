"""Cutting a table into chunk splits by an integer key, and the condition that selects one.

The database answers two questions about the chunk key (:class:`KeyStats` and a
``key_after`` function); the cut itself is the same for every database.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from splitflow.connectors.cdc.splits import ChunkSplit
from splitflow.errors import ConfigurationError

SPARSE = 4.0
"""Keys spread over more than this many values per row are cut by stepping through them in
key order (``ORDER BY key LIMIT 1 OFFSET chunkSize``) instead of evenly by value."""


class KeyStats(NamedTuple):
    """``SELECT min(key), max(key), count(key), count(*)`` of a table."""

    low: int | None
    high: int | None
    values: int
    rows: int


def cut(
    table: str,
    key: str,
    chunk_size: int,
    stats: KeyStats,
    key_after: Callable[[int, int], int | None],
) -> list[ChunkSplit]:
    """``table`` cut into chunks of about ``chunk_size`` rows by its integer column ``key``.

    Ranges of the key's values: even when the values are dense (at most :data:`SPARSE`
    values per row), found by stepping through them in order when they are sparse:
    ``key_after(k, n)`` is the value ``n`` rows after the first value ``>= k`` in key order
    (``WHERE key >= k ORDER BY key OFFSET n LIMIT 1``), None past the end. The first and
    last chunks are open, so a value inserted beyond the range known now still belongs to
    exactly one chunk, and the first also holds the rows whose key is NULL
    (:func:`chunk_condition`): every row is in exactly one chunk. A table of at most
    ``chunk_size`` rows is one (open) chunk.

    >>> stats = KeyStats(low=1, high=3000, values=3000, rows=3000)
    >>> [(c.lo, c.hi) for c in cut("db.t", "id", 1000, stats, lambda k, n: None)]
    [(None, 1001), (1001, 2001), (2001, None)]
    """
    low, high, values, rows = stats
    if low is None or high is None or rows <= chunk_size:
        return [ChunkSplit(table, 0, key)]
    bounds: list[int] = []
    spread = (high - low + 1) / values
    if spread <= SPARSE:
        step = max(1, math.ceil(chunk_size * spread))
        bounds = list(range(low + step, high + 1, step))
    else:
        at = low
        while True:
            found = key_after(at, chunk_size)
            if found is None:
                break
            at = int(found)
            bounds.append(at)
    edges: list[int | None] = [None, *bounds, None]
    return [ChunkSplit(table, i, key, edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def chunk_condition(split: ChunkSplit, quote: Callable[[str], str]) -> str:
    """The SQL condition that selects ``split``'s rows, empty for a whole table.

    ``lo <= key < hi`` with open ends left out; the first chunk (``lo`` None) of a cut table
    also takes the rows whose key is NULL, which no range holds. ``quote`` quotes the key
    column's name the database's way:

    >>> chunk_condition(ChunkSplit("db.t", 0, "aid", None, 100), lambda n: f"`{n}`")
    '(`aid` < 100 OR `aid` IS NULL)'
    >>> chunk_condition(ChunkSplit("db.t", 1, "aid", 100, 200), lambda n: f"`{n}`")
    '`aid` >= 100 AND `aid` < 200'
    """
    if not split.key:
        return ""
    key = quote(split.key)
    conditions = []
    if split.lo is not None:
        conditions.append(f"{key} >= {int(split.lo)}")
    if split.hi is not None:
        upper = f"{key} < {int(split.hi)}"
        conditions.append(upper if split.lo is not None else f"({upper} OR {key} IS NULL)")
    return " AND ".join(conditions)


def parse_chunk_keys(
    text: str, form: str, table_name: Callable[[str], str | None]
) -> tuple[tuple[str, str], ...]:
    """Option ``chunkKeyColumn``: one bare column name (for every table: ``("", column)``),
    or comma-separated ``<table>:column`` entries, one per table. ``form`` is how an entry
    looks in errors (``db.table:column``); ``table_name`` gives an entry's table name as the
    source names tables, or None when it is not one (it may raise its own error).

    >>> parse_chunk_keys("id", "t:c", str), parse_chunk_keys("a:x, b:y", "t:c", str)
    ((('', 'id'),), (('a', 'x'), ('b', 'y')))
    """
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if len(entries) == 1 and ":" not in entries[0]:
        return (("", entries[0]),)
    keys: dict[str, str] = {}
    for entry in entries:
        table, _, column = entry.rpartition(":")
        name = table_name(table.strip()) if table.strip() and column.strip() else None
        if name is None:
            raise ConfigurationError(
                f"option chunkKeyColumn: {entry!r} is not {form}; give one column name for "
                f"every table, or comma-separated {form} entries",
                option="chunkKeyColumn",
            )
        if name in keys:
            raise ConfigurationError(
                f"option chunkKeyColumn names table {name} twice", option="chunkKeyColumn"
            )
        keys[name] = column.strip()
    return tuple(keys.items())
