"""Keep a Delta Lake table equal to a table a CDC source reads, one micro-batch at a time.

For ``foreachBatch``::

    def mirror(batch_df, batch_id):
        apply_changes(batch_df, batch_id, "/lake/orders", keys=["id"], table="public.orders")

    spark.readStream.format("splitflow-postgres-cdc")...load().writeStream.foreachBatch(mirror)

Each batch: the rows of ``table`` (every row when None), reduced to the last change of each
key (the highest ``lsn``; of a transaction's changes to a key, the one that came last, as
the log gives them), then one Delta commit: the first batch creates the table, later ones
merge (``r``, ``c`` and ``u`` set the key's row, ``d`` removes it, columns the table lacks
are added). The commit records the batch as an application transaction (app id, batch id),
so a batch that Spark runs again after a crash between the Delta commit and its own finds
its id recorded and changes nothing: exactly once across driver crashes, as Delta's
``txnAppId``/``txnVersion`` writes from Spark. The app id defaults to the streaming query's
id, which a restart from the same checkpoint keeps and a new checkpoint changes.

A batch the table has already is not read at all, as Spark's own file sink and Delta's
writer skip one (a CDC replay returns what its first evaluation read, with ``stateDir``, so
reading it would be exact too, only slower).

Delta through the ``deltalake`` package (delta-rs, ``pip install 'splitflow[delta]'``): it
runs in the driver's Python process, where ``foreachBatch`` runs, and the batch is collected
there as Arrow.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from splitflow.connectors.cdc.schema import METADATA
from splitflow.errors import ConfigurationError

log = logging.getLogger("splitflow.cdc")

CHANGE_COLUMNS = tuple(name for name, _, _ in METADATA)
"""The columns a CDC source adds to a table's (``op``, ``lsn``, ``commit_ts``, ``table``)."""


@dataclass(frozen=True)
class Applied:
    """What :func:`apply_changes` did with a batch."""

    batch_id: int
    skipped: bool
    """The table had the batch already (a batch run again): nothing was written."""
    version: int
    """The Delta table's version after the batch."""
    inserted: int = 0
    updated: int = 0
    deleted: int = 0


def apply_changes(
    batch: Any,
    batch_id: int,
    table_uri: str,
    *,
    keys: Sequence[str],
    table: str | None = None,
    columns: Sequence[str] | None = None,
    app_id: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> Applied:
    """Apply one micro-batch of a CDC source's rows to the Delta table at ``table_uri``.

    ``batch``: the batch as ``foreachBatch`` gives it (a Spark DataFrame), or a
    ``pyarrow.Table`` of the same columns. ``keys``: the table's primary key columns.
    ``table``: apply only the rows of this source table (column ``table``, e.g.
    ``public.orders``); None: every row. ``columns``: the table's columns (default: every
    column of the batch but the four the source adds); when the source reads several
    tables, its rows hold the union of their columns, so name this table's.
    ``app_id``: the id the batches are recorded under (default: the streaming query's id;
    needed outside ``foreachBatch``). ``storage_options``: for ``deltalake`` (an object
    store's credentials). See the module doc.
    """
    keys = tuple(keys)
    if not keys:
        raise ConfigurationError(
            "apply_changes: keys is empty; a table without a primary key is a multiset of "
            "rows (docs/postgres-cdc.md) and cannot be merged by key",
            option="keys",
        )
    app = app_id or _query_app_id(batch)
    storage = dict(storage_options or {})
    target = _open(table_uri, storage)
    if target is not None:  # before the batch is read: see the module doc
        done = target.transaction_version(app)
        if done is not None and done >= batch_id:
            log.info(
                "splitflow: %s has batch %d of %s already (through batch %d): skipped",
                table_uri,
                batch_id,
                app,
                done,
            )
            return Applied(batch_id, True, target.version())
    rows = _rows(batch, table)
    fields = _field_metadata(rows)
    rows = rows.cast(pa.schema([f.remove_metadata() for f in rows.schema]))
    names = (
        list(columns)
        if columns is not None
        else [
            n
            for n in rows.column_names
            if n not in CHANGE_COLUMNS and (table is None or _has(fields.get(n, {}), table))
        ]
    )
    missing = [n for n in (*names, "op", "lsn") if n not in rows.column_names]
    if missing or not set(keys) <= set(names):
        raise ConfigurationError(
            f"apply_changes: the batch has no column {', '.join(missing or keys)} "
            f"(it has {', '.join(rows.column_names)}; keys and columns must be among them)",
            option="columns" if missing else "keys",
        )
    changes = latest_per_key(rows, keys).select([*names, "op"])
    commit = _commit_properties(app, batch_id)
    if target is None:
        return _create(changes, batch_id, table_uri, commit, storage)
    formerly = {n: _formerly(fields.get(n, {}), table) for n in names}
    target = _follow_schema(target, changes.drop_columns(["op"]).schema, formerly, storage)
    return _merge(target, changes, keys, batch_id, commit)


def _field_metadata(rows: pa.Table) -> dict[str, dict[str, Any]]:
    """Each column's Spark field metadata (Spark's ``toArrow`` keeps it in the Arrow
    field's, as JSON under ``SPARK::metadata::json``)."""
    found = {}
    for field in rows.schema:
        text = (field.metadata or {}).get(b"SPARK::metadata::json")
        if text:
            found[field.name] = json.loads(text)
    return found


def _has(metadata: Mapping[str, Any], table: str) -> bool:
    """Whether the column is ``table``'s by its field metadata (no metadata: it is)."""
    return table in metadata.get("splitflow.tables", (table,))


def _formerly(metadata: Mapping[str, Any], table: str | None) -> tuple[str, ...]:
    """The column's names before renames, newest first (``splitflow.formerly``)."""
    by_table = metadata.get("splitflow.formerly", {})
    if table is not None:
        return tuple(by_table.get(table, ()))
    return tuple(name for names in by_table.values() for name in names)


def _follow_schema(
    target: Any,
    schema: pa.Schema,
    formerly: Mapping[str, tuple[str, ...]],
    storage: dict[str, str],
) -> Any:
    """The table with the source table's schema changes that a merge cannot make: a column
    renamed (by the batch's field metadata, see :func:`splitflow.spark.cdc.spark_struct`),
    dropped (the table has it, the batch does not) or widened. The table is rewritten
    whole, once, in a commit of its own; a batch run again finds nothing to change. A
    column the batch adds is left to the merge."""
    from deltalake import QueryBuilder, Schema, write_deltalake

    have = {f.name: f.type for f in target.schema().fields}
    want = {f.name: f.type for f in Schema.from_arrow(schema).fields}
    renames = {
        old: name
        for name in want
        if name not in have
        for old in formerly.get(name, ())[:1]
        if old in have and old not in want
    }
    dropped = [n for n in have if n not in want and n not in renames]
    retyped = [n for n in want if n in have and have[n] != want[n]]
    if not (renames or dropped or retyped):
        return target
    log.info(
        "splitflow: %s follows the source's schema: renamed %s, dropped %s, retyped %s",
        target.table_uri,
        renames or "none",
        dropped or "none",
        retyped or "none",
    )
    rows = pa.table(QueryBuilder().register("t", target).execute("SELECT * FROM t").read_all())
    rows = rows.drop_columns(dropped).rename_columns(
        [renames.get(n, n) for n in rows.column_names if n not in dropped]
    )
    types = {f.name: f.type for f in schema}
    rows = rows.cast(
        pa.schema([pa.field(n, types.get(n, rows.schema.field(n).type)) for n in rows.column_names])
    )
    write_deltalake(
        target.table_uri, rows, mode="overwrite", schema_mode="overwrite", storage_options=storage
    )
    return _open(target.table_uri, storage)


def latest_per_key(rows: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The last change of each key among ``rows``: the highest ``lsn``, and of a key's
    changes with the same ``lsn`` (one transaction's), the one that came last.

    >>> rows = pa.table({"id": [1, 2, 1, 1], "op": ["c", "c", "u", "d"], "lsn": [5, 5, 7, 7]})
    >>> latest_per_key(rows, ["id"]).to_pylist()
    [{'id': 1, 'op': 'd', 'lsn': 7}, {'id': 2, 'op': 'c', 'lsn': 5}]
    """
    count = rows.num_rows
    if count == 0:
        return rows
    arrival = pa.array(np.arange(count, dtype=np.int64))
    order_by = pa.table([*(rows[k] for k in keys), rows["lsn"], arrival], [*keys, "lsn", "_"])
    order = pc.sort_indices(
        order_by, [(k, "ascending") for k in keys] + [("lsn", "ascending"), ("_", "ascending")]
    )
    last: Any = None  # in that order, a row is its key's last when the next has another key
    for key in keys:
        column = order_by[key].take(order)
        differs = pc.fill_null(pc.not_equal(column.slice(0, count - 1), column.slice(1)), True)
        last = differs if last is None else pc.or_(last, differs)
    keep = pa.chunked_array([*last.chunks, pa.array([True])], pa.bool_())
    return rows.take(pc.filter(order, keep))


def _open(table_uri: str, storage: dict[str, str]) -> Any:
    """The Delta table at ``table_uri``, or None where there is none yet."""
    try:
        from deltalake import DeltaTable
    except ImportError as error:
        raise ImportError(
            "apply_changes writes Delta tables with the deltalake package: "
            "pip install 'splitflow[delta]'"
        ) from error
    if not DeltaTable.is_deltatable(table_uri, storage):
        return None
    return DeltaTable(table_uri, storage_options=storage)


def _commit_properties(app: str, batch_id: int) -> Any:
    from deltalake import CommitProperties, Transaction

    return CommitProperties(app_transactions=[Transaction(app, batch_id)])


def _create(
    changes: pa.Table, batch_id: int, table_uri: str, commit: Any, storage: dict[str, str]
) -> Applied:
    """The table made from the first batch: its rows that are not deletes."""
    from deltalake import DeltaTable, write_deltalake

    rows = changes.filter(pc.not_equal(changes["op"], "d")).drop_columns(["op"])
    write_deltalake(
        table_uri, rows, mode="append", storage_options=storage, commit_properties=commit
    )
    version = DeltaTable(table_uri, storage_options=storage).version()
    return Applied(batch_id, False, version, inserted=rows.num_rows)


def _merge(
    target: Any, changes: pa.Table, keys: tuple[str, ...], batch_id: int, commit: Any
) -> Applied:
    if changes.num_rows == 0:  # nothing to commit; running it again changes nothing either
        return Applied(batch_id, False, target.version())
    predicate = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in keys)
    metrics = (
        target.merge(
            changes,
            predicate,
            source_alias="s",
            target_alias="t",
            merge_schema=True,
            streamed_exec=False,  # the batch is in memory: delta-rs prunes files by its keys
            commit_properties=commit,
        )
        .when_matched_delete("s.`op` = 'd'")
        .when_matched_update_all("s.`op` <> 'd'", except_cols=["op"])
        .when_not_matched_insert_all("s.`op` <> 'd'", except_cols=["op"])
        .execute()
    )
    return Applied(
        batch_id,
        False,
        target.version(),
        inserted=int(metrics["num_target_rows_inserted"]),
        updated=int(metrics["num_target_rows_updated"]),
        deleted=int(metrics["num_target_rows_deleted"]),
    )


def _rows(batch: Any, table: str | None) -> pa.Table:
    """The batch's rows of ``table`` (all for None) as Arrow."""
    if isinstance(batch, pa.Table):
        if table is None:
            return batch
        return batch.filter(pc.equal(batch["table"], table))
    frame = batch if table is None else batch.where(batch["table"] == table)
    return frame.toArrow()


def _query_app_id(batch: Any) -> str:
    """``splitflow-<query id>`` of the streaming query whose ``foreachBatch`` runs now."""
    try:
        query = batch.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    except Exception:  # a pyarrow table, Spark Connect: no context to ask
        query = None
    if not query:
        raise ConfigurationError(
            "apply_changes: pass app_id (the id the table records its batches under); "
            "only inside a streaming query's foreachBatch is it the query's id by default",
            option="app_id",
        )
    return f"splitflow-{query}"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
