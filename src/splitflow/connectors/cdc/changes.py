"""Schema changes in the change log: what changed, whether a restart can follow it, and the
record of the query's schema in ``stateDir``.

A log reader compares the schema each change was written under with the query's description
of the table (:class:`~.schema.Table`). When they differ it ends its slice just before the
transaction of that change and reports a :class:`SchemaChange` (option ``schemaChanges``
``stop``), so no micro-batch holds a table's rows under two schemas. The enumerator records
the table's new description (:class:`SchemaRecord`) and stops the query with a
:class:`~splitflow.errors.SchemaChangedError`; the restarted query loads its schema from
the record, not from the database's catalog (which may be ahead of the log), and reads on
from the change. So each change costs one restart, as Delta's schema tracking does.

A change a restart cannot follow always fails the query without recording (``fail``): a
type change that is not a widening (:func:`widens`), a dropped key or chunk key column.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from splitflow.api.events import SourceEvent
from splitflow.connectors.cdc.schema import ColumnKind, Table
from splitflow.errors import ConfigurationError, IncompatibleCheckpointError, SchemaChangedError

MODES = ("stop", "fail")
"""Option ``schemaChanges``: ``stop`` (record the new schema, stop the query to be
restarted), ``fail`` (stop without recording)."""


def parse_schema_changes(text: str | None) -> str:
    """Option ``schemaChanges`` (default ``stop``), or a ConfigurationError naming it."""
    value = (text or "stop").strip().lower()
    if value not in MODES:
        raise ConfigurationError(
            f"option schemaChanges must be stop or fail, not {text!r}", option="schemaChanges"
        )
    return value


_INTEGERS = ("tinyint", "smallint", "int", "bigint")
_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")


def widens(old: str, new: str) -> bool:
    """Whether Spark type ``new`` holds every value of ``old`` exactly (Delta's type
    widening): a larger integer, ``float`` to ``double``, an integer to ``double`` or to a
    decimal with room for it, a decimal with at least as many integer and fraction digits.

    >>> widens("int", "bigint"), widens("bigint", "int"), widens("decimal(10,2)", "decimal(12,4)")
    (True, False, True)
    """
    if old == new:
        return True
    if old in _INTEGERS and new in _INTEGERS:
        return _INTEGERS.index(new) > _INTEGERS.index(old)
    if new == "double":
        return old == "float" or old in _INTEGERS[:3]
    to = _DECIMAL.fullmatch(new)
    if to is None:
        return False
    precision, scale = int(to[1]), int(to[2])
    if old in _INTEGERS:
        digits = (3, 5, 10, 20)[_INTEGERS.index(old)]
        return precision - scale >= digits
    was = _DECIMAL.fullmatch(old)
    return (
        was is not None and scale >= int(was[2]) and precision - scale >= int(was[1]) - int(was[2])
    )


@dataclass(frozen=True)
class Difference:
    """How a table's columns changed: by name, and renamed where the columns have ids."""

    added: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    renamed: tuple[tuple[str, str], ...] = ()
    retyped: tuple[tuple[str, str, str], ...] = ()
    """``(column, old Spark type, new Spark type)``."""

    def __bool__(self) -> bool:
        return bool(self.added or self.dropped or self.renamed or self.retyped)

    def problem(self, old: Table[Any]) -> str | None:
        """Why no restart can follow the change, or None."""
        narrowed = [f"{c} {a} to {b}" for c, a, b in self.retyped if not widens(a, b)]
        if narrowed:
            return f"a type change that is not a widening ({', '.join(narrowed)})"
        lost = [c for c in dict.fromkeys((*old.key, old.chunk_key)) if c in self.dropped]
        if lost:
            return f"key column {', '.join(lost)} dropped"
        return None

    def __str__(self) -> str:
        parts = [f"added {', '.join(self.added)}"] if self.added else []
        parts += [f"dropped {', '.join(self.dropped)}"] if self.dropped else []
        parts += [f"renamed {a} to {b}" for a, b in self.renamed]
        parts += [f"{c} changed from {a} to {b}" for c, a, b in self.retyped]
        return "; ".join(parts) or "no column changed"


def difference(old: Table[Any], new: Table[Any]) -> Difference:
    """What changed from ``old`` to ``new`` as Spark sees the columns (a change of the
    database's type that keeps the Spark type is none)."""
    before = {n: k.spark for n, k in old.columns}
    after = {n: k.spark for n, k in new.columns}
    renamed: list[tuple[str, str]] = []
    if old.ids and new.ids:
        name_of = dict(zip(old.ids, (n for n, _ in old.columns), strict=True))
        for (name, _), column_id in zip(new.columns, new.ids, strict=True):
            was = name_of.get(column_id)
            if was is not None and was != name and was not in after and name not in before:
                renamed.append((was, name))
    moved = {a for a, _ in renamed} | {b for _, b in renamed}
    retyped = [(n, before[n], t) for n, t in after.items() if n in before and before[n] != t]
    retyped += [(b, before[a], after[b]) for a, b in renamed if before[a] != after[b]]
    return Difference(
        tuple(n for n in after if n not in before and n not in moved),
        tuple(n for n in before if n not in after and n not in moved),
        tuple(renamed),
        tuple(retyped),
    )


def follow(old: Table[Any], columns: Sequence[tuple[str, Any]], ids: Sequence[int]) -> Table[Any]:
    """``old`` with the columns the log now writes it with: keys and renames followed."""
    new = dataclasses.replace(old, columns=tuple(columns), ids=tuple(ids), formerly=())
    renames = dict(difference(old, new).renamed)
    if not renames:
        return dataclasses.replace(new, formerly=old.formerly)
    history = dict(old.formerly)
    formerly = {renames.get(n, n): names for n, names in history.items() if n not in renames}
    for was, name in renames.items():
        formerly[name] = (was, *history.get(was, ()))
    return dataclasses.replace(
        new,
        key=tuple(renames.get(k, k) for k in old.key),
        chunk_key=renames.get(old.chunk_key, old.chunk_key),
        formerly=tuple(sorted(formerly.items())),
    )


def columns_shown(table: Table[Any]) -> tuple[str, ...]:
    """``name type`` of each column, for messages."""
    return tuple(f"{n} {k.spark}" for n, k in table.columns)


def not_followed(
    name: str, old: Table[Any] | None, new: Table[Any], where: str, what: str, why: str
) -> SchemaChangedError:
    """The error of a change the query does not go on from (nothing recorded): ``what``
    changed at ``where``, and ``why`` it is not followed."""
    return SchemaChangedError(
        f"table {name}'s schema changed at {where}: {what}; {why}: read the table again in a "
        "new query (new checkpoint and stateDir)",
        table=name,
        old=() if old is None else columns_shown(old),
        new=columns_shown(new),
        position=where,
        recorded=False,
    )


@dataclass(frozen=True)
class SchemaChange(SourceEvent):
    """Log reader -> enumerator: from log position ``position`` (``shown`` as the database
    shows it) the log writes ``table`` as ``new`` describes it; the reader ended its slice
    there (:class:`~splitflow.api.events.SliceEndedEvent`)."""

    table: str
    position: int
    shown: str
    new: Any
    """The table's description from then on (the database's :class:`~.schema.Table`)."""


class StateFile(Protocol):
    """One file of the query's state directory."""

    def read(self) -> bytes | None:
        """Its content; None when there is none."""
        ...

    def write(self, content: bytes) -> None:
        """Replace its content whole."""
        ...


class SchemaRecord:
    """The query's tables as the log writes them now, kept in ``stateDir``
    (``cdc-schema.json``), like Delta's schema tracking location.

    JSON, one entry per table: every field of the database's table description, the
    columns as ``[name, Spark type, the database's type]``; and the changes recorded so far,
    newest last. ``kind_codec``: the database's column types to JSON and back
    (``encode(kind)``, ``decode(table, column, data)``); ``table_type``: its
    :class:`~.schema.Table` class.
    """

    version = 1

    def __init__(
        self,
        file: StateFile,
        table_type: type[Table[Any]],
        encode_kind: Callable[[Any], Any],
        decode_kind: Callable[[str, str, Any], ColumnKind],
    ) -> None:
        self._file = file
        self._table_type = table_type
        self._encode_kind = encode_kind
        self._decode_kind = decode_kind

    def read(self) -> tuple[dict[str, Table[Any]], list[dict[str, Any]]] | None:
        """The recorded tables by name and the changes; None when nothing is recorded."""
        content = self._file.read()
        if content is None:
            return None
        data = json.loads(content)
        if data.get("version") != self.version:
            raise IncompatibleCheckpointError(
                "stateDir's cdc-schema.json", found=data.get("version"), expected=self.version
            )
        tables = {}
        for entry in data["tables"]:
            fields = {k: _tuples(v) for k, v in entry.items() if k != "columns"}
            name = fields["name"]
            fields["columns"] = tuple(
                (column, self._decode_kind(name, column, kind))
                for column, _, kind in entry["columns"]
            )
            tables[name] = self._table_type(**fields)
        return tables, list(data["changes"])

    def write(self, tables: Mapping[str, Table[Any]], changes: Sequence[Mapping[str, Any]]) -> None:
        entries = []
        for table in sorted(tables.values(), key=lambda t: t.name):
            entry = {f.name: getattr(table, f.name) for f in dataclasses.fields(table)}
            entry["columns"] = [[n, k.spark, self._encode_kind(k)] for n, k in table.columns]
            entries.append(entry)
        data = {"version": self.version, "tables": entries, "changes": list(changes)}
        self._file.write(json.dumps(data, indent=1, default=list).encode())


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value
