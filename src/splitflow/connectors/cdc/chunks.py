"""Cutting a table into chunk splits by an integer key, and the condition that selects one.

The database answers two questions about the chunk key (:class:`KeyStats` and a
``key_after`` function); the cut itself is the same for every database.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import NamedTuple

from splitflow.connectors.cdc.splits import ChunkSplit, Cut
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


KeyAfter = Callable[[str, str, int, int], int | None]
"""``key_after(table, key, k, n)``: the value of ``table``'s chunk key ``key`` that comes ``n``
rows after the first value ``>= k`` in key order (``WHERE key >= k ORDER BY key OFFSET n
LIMIT 1``), None past the end."""


def start_cut(table: str, key: str, chunk_size: int, stats: KeyStats) -> Cut:
    """The cut of ``table`` into chunks of about ``chunk_size`` rows by its integer column
    ``key`` (empty: no chunk key, one chunk), nothing cut yet (see :func:`next_chunks`)."""
    low, high, values, rows = stats
    if not key or low is None or high is None or rows <= chunk_size:
        return Cut(table, key)
    spread = (high - low + 1) / values
    step = max(1, math.ceil(chunk_size * spread)) if spread <= SPARSE else 0
    return Cut(table, key, chunk_size, low, high, step)


def next_chunks(cut: Cut, n: int, key_after: KeyAfter) -> tuple[list[ChunkSplit], Cut | None]:
    """The next (at most) ``n`` chunks of ``cut``, and the cut after them (None: the table
    is cut whole).

    Ranges of the key's values: even when the values are dense (at most :data:`SPARSE`
    values per row), found by stepping through them in order with ``key_after`` when they
    are sparse. The first and last chunks are open, so a value inserted beyond the range
    known at the start still belongs to exactly one chunk, and the first also holds the rows
    whose key is NULL (:func:`chunk_condition`): every row is in exactly one chunk.
    """
    chunks: list[ChunkSplit] = []
    rest: Cut | None = cut
    while rest is not None and len(chunks) < n:
        if rest.low is None:  # one chunk: the whole table
            chunks.append(ChunkSplit(rest.table, 0, rest.key))
            rest = None
            continue
        at = rest.low if rest.lo is None else rest.lo
        if rest.step:
            bound: int | None = at + rest.step if at + rest.step <= rest.high else None
        else:
            found = key_after(rest.table, rest.key, at, rest.size)
            # a value held by more rows than a chunk: the chunk is that value's rows
            bound = None if found is None else max(int(found), at + 1)
        chunks.append(ChunkSplit(rest.table, rest.index, rest.key, rest.lo, bound))
        rest = None if bound is None else replace(rest, index=rest.index + 1, lo=bound)
    return chunks, rest


def cut_ahead(
    cuts: Sequence[Cut], n: int | None, key_after: KeyAfter
) -> tuple[list[ChunkSplit], tuple[Cut, ...]]:
    """The next (at most) ``n`` chunks of ``cuts`` (None: every chunk), table by table in
    order, and the cuts that go on after them.

    >>> stats = KeyStats(low=1, high=3000, values=3000, rows=3000)
    >>> chunks, rest = cut_ahead([start_cut("db.t", "id", 1000, stats)], 2, None)
    >>> [(c.lo, c.hi) for c in chunks], rest[0].lo
    ([(None, 1001), (1001, 2001)], 2001)
    >>> [(c.lo, c.hi) for c in cut_ahead(rest, None, None)[0]]
    [(2001, None)]
    """
    chunks: list[ChunkSplit] = []
    rest: list[Cut] = []
    for cut in cuts:
        left = sys.maxsize if n is None else n - len(chunks)
        if left <= 0:
            rest.append(cut)
            continue
        more, after = next_chunks(cut, left, key_after)
        chunks.extend(more)
        if after is not None:
            rest.append(after)
    return chunks, tuple(rest)


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
