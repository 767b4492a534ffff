"""Decode ``pgoutput`` logical replication messages, protocol version 1.

These are the values of the ``data`` column of::

    SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes(
        slot, upto_lsn, upto_nchanges, 'proto_version', '1', 'publication_names', 'pub')

one message per row. :func:`decode` turns one into a frozen dataclass. The formats are
PostgreSQL's "Logical Replication Message Formats" (protocol chapter); all integers are
big-endian and signed except LSNs, OIDs and xids, which are unsigned::

    Begin     'B' Int64 final_lsn, Int64 commit_ts, Int32 xid
    Commit    'C' Int8 flags, Int64 commit_lsn, Int64 end_lsn, Int64 commit_ts
    Origin    'O' Int64 commit_lsn, String name
    Relation  'R' Int32 oid, String namespace, String name, Int8 replica_identity,
                  Int16 ncolumns, then per column: Int8 flags (1 = key), String name,
                  Int32 type_oid, Int32 type_modifier
    Type      'Y' Int32 oid, String namespace, String name
    Insert    'I' Int32 relation_oid, 'N' TupleData
    Update    'U' Int32 relation_oid, ['K' TupleData | 'O' TupleData], 'N' TupleData
    Delete    'D' Int32 relation_oid, 'K' TupleData | 'O' TupleData
    Truncate  'T' Int32 nrelations, Int8 options (1 CASCADE, 2 RESTART IDENTITY),
                  nrelations x Int32 relation_oid
    Message   'M' Int8 flags (1 = transactional), Int64 lsn, String prefix,
                  Int32 length, Byte[length] content

    TupleData Int16 ncolumns, then per column one of
              'n' (NULL), 'u' (unchanged TOASTed value), 't' Int32 length + Byte[length]
              (the value in text format), 'b' Int32 length + Byte[length] (binary format)

Strings are NUL-terminated (UTF-8: the slot's database encoding). Timestamps are
microseconds since 2000-01-01 UTC and decode to UTC-aware :class:`~datetime.datetime`.

Example:

>>> decode(b"I" + (16385).to_bytes(4, "big") + b"N\\x00\\x02t\\x00\\x00\\x00\\x012n")
Insert(relation_oid=16385, new=(b'2', None))
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, TypeAlias

__all__ = [
    "UNCHANGED_TOAST",
    "Begin",
    "Commit",
    "Delete",
    "Insert",
    "Message",
    "Origin",
    "PgOutputMessage",
    "Relation",
    "RelationColumn",
    "Truncate",
    "TupleData",
    "Type",
    "Update",
    "decode",
    "format_lsn",
    "parse_lsn",
]


class _UnchangedToast:
    """The type of :data:`UNCHANGED_TOAST` (one instance; compare with ``is``)."""

    _instance: _UnchangedToast | None = None

    def __new__(cls) -> _UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


#: A column of an Update whose TOASTed value did not change and was not sent: the new
#: value equals the old one, which the message does not carry.
UNCHANGED_TOAST: Final = _UnchangedToast()

#: Column values of one row, in the Relation's column order: None for NULL,
#: :data:`UNCHANGED_TOAST`, or the value's bytes (text format unless the slot was asked for
#: binary).
TupleData: TypeAlias = tuple[bytes | _UnchangedToast | None, ...]

_PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)


def _timestamp(micros: int) -> datetime:
    return _PG_EPOCH + timedelta(microseconds=micros)


def format_lsn(lsn: int) -> str:
    """An LSN in PostgreSQL's ``X/X`` notation.

    >>> format_lsn((1 << 32) | 0x6B3748)
    '1/6B3748'
    """
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """An LSN from PostgreSQL's ``X/X`` notation (the inverse of :func:`format_lsn`).

    >>> parse_lsn("1/6B3748") == (1 << 32) | 0x6B3748
    True
    """
    high, _, low = text.partition("/")
    if not low:
        raise ValueError(f"not an LSN: {text!r} (expected hex 'X/X')")
    return (int(high, 16) << 32) | int(low, 16)


@dataclass(frozen=True, slots=True)
class Begin:
    """Start of a transaction; ``final_lsn`` equals its Commit's ``commit_lsn``."""

    final_lsn: int
    commit_ts: datetime
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """End of a transaction: ``commit_lsn`` is where its commit record starts,
    ``end_lsn`` just after it (where decoding resumes)."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: datetime


@dataclass(frozen=True, slots=True)
class Origin:
    """The replication origin of the transaction (changes replayed from elsewhere)."""

    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """One column of a :class:`Relation` (generated columns are not sent)."""

    is_key: bool
    name: str
    type_oid: int
    type_modifier: int

    @property
    def flags(self) -> int:
        return 1 if self.is_key else 0


@dataclass(frozen=True, slots=True)
class Relation:
    """The schema of a table, sent before the first change to it in a session and again
    after it changes. ``replica_identity`` is ``pg_class.relreplident``: ``d`` (default:
    primary key), ``n`` (nothing), ``f`` (full), ``i`` (index)."""

    oid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Type:
    """A non-builtin data type used by a following Relation."""

    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """``key`` is sent when a replica-identity column changed (identity default/index),
    ``old`` when the identity is FULL; otherwise both are None."""

    relation_oid: int
    old: TupleData | None
    key: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    """Exactly one of ``key`` (identity default/index: the key columns set, others NULL)
    and ``old`` (identity FULL: the whole row) is set."""

    relation_oid: int
    old: TupleData | None
    key: TupleData | None


@dataclass(frozen=True, slots=True)
class Truncate:
    """``options``: bit 1 CASCADE, bit 2 RESTART IDENTITY."""

    relation_oids: tuple[int, ...]
    options: int

    @property
    def cascade(self) -> bool:
        return bool(self.options & 1)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & 2)


@dataclass(frozen=True, slots=True)
class Message:
    """A ``pg_logical_emit_message`` message (sent only with ``'messages', 'true'``)."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


PgOutputMessage: TypeAlias = (
    Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | Message
)

_B = struct.Struct(">b")
_H = struct.Struct(">h")
_I = struct.Struct(">I")
_i = struct.Struct(">i")
_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">bQQq")
_Q = struct.Struct(">Q")
_MESSAGE_HEAD = struct.Struct(">bQ")
_COLUMN_TAIL = struct.Struct(">Ii")
_TRUNCATE_HEAD = struct.Struct(">ib")


class _Reader:
    """A cursor over one message; every read checks the bounds."""

    __slots__ = ("data", "kind", "pos")

    def __init__(self, data: bytes, kind: str) -> None:
        self.data = data
        self.kind = kind
        self.pos = 1

    def _truncated(self, wanted: int) -> ValueError:
        return ValueError(
            f"truncated pgoutput {self.kind!r} message: needs {wanted} more byte(s) at offset "
            f"{self.pos}, has {len(self.data) - self.pos} (message is {len(self.data)} bytes)"
        )

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        end = self.pos + fmt.size
        if end > len(self.data):
            raise self._truncated(fmt.size)
        values: tuple[int, ...] = fmt.unpack_from(self.data, self.pos)
        self.pos = end
        return values

    def read_int(self, fmt: struct.Struct) -> int:
        return self.unpack(fmt)[0]

    def byte(self) -> str:
        if self.pos >= len(self.data):
            raise self._truncated(1)
        self.pos += 1
        return chr(self.data[self.pos - 1])

    def read_bytes(self, n: int) -> bytes:
        if n < 0:
            raise ValueError(f"pgoutput {self.kind!r} message: negative length {n}")
        end = self.pos + n
        if end > len(self.data):
            raise self._truncated(n)
        value = self.data[self.pos : end]
        self.pos = end
        return value

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise ValueError(
                f"truncated pgoutput {self.kind!r} message: unterminated string at offset "
                f"{self.pos}"
            )
        value = self.data[self.pos : end].decode()
        self.pos = end + 1
        return value

    def tuple_data(self) -> TupleData:
        count = self.read_int(_H)
        values: list[bytes | _UnchangedToast | None] = []
        for _ in range(count):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED_TOAST)
            elif kind in ("t", "b"):
                values.append(self.read_bytes(self.read_int(_i)))
            else:
                raise ValueError(
                    f"pgoutput {self.kind!r} message: unknown column kind {kind!r} at offset "
                    f"{self.pos - 1} (expected 'n', 'u', 't' or 'b')"
                )
        return tuple(values)

    def done(self) -> None:
        if self.pos != len(self.data):
            raise ValueError(
                f"pgoutput {self.kind!r} message: {len(self.data) - self.pos} unexpected "
                f"trailing byte(s) at offset {self.pos}"
            )


def _begin(r: _Reader) -> Begin:
    final_lsn, ts, xid = r.unpack(_BEGIN)
    return Begin(final_lsn, _timestamp(ts), xid)


def _commit(r: _Reader) -> Commit:
    flags, commit_lsn, end_lsn, ts = r.unpack(_COMMIT)
    return Commit(flags, commit_lsn, end_lsn, _timestamp(ts))


def _origin(r: _Reader) -> Origin:
    return Origin(r.read_int(_Q), r.string())


def _relation(r: _Reader) -> Relation:
    oid = r.read_int(_I)
    namespace = r.string()
    name = r.string()
    identity = r.byte()
    columns = []
    for _ in range(r.read_int(_H)):
        flags = r.read_int(_B)
        column = r.string()
        type_oid, type_modifier = r.unpack(_COLUMN_TAIL)
        columns.append(RelationColumn(bool(flags & 1), column, type_oid, type_modifier))
    return Relation(oid, namespace, name, identity, tuple(columns))


def _type(r: _Reader) -> Type:
    return Type(r.read_int(_I), r.string(), r.string())


def _expect(r: _Reader, allowed: str) -> str:
    marker = r.byte()
    if marker not in allowed:
        raise ValueError(
            f"pgoutput {r.kind!r} message: unexpected tuple marker {marker!r} at offset "
            f"{r.pos - 1} (expected one of {', '.join(repr(c) for c in allowed)})"
        )
    return marker


def _insert(r: _Reader) -> Insert:
    oid = r.read_int(_I)
    _expect(r, "N")
    return Insert(oid, r.tuple_data())


def _update(r: _Reader) -> Update:
    oid = r.read_int(_I)
    old = key = None
    marker = _expect(r, "KON")
    if marker != "N":
        if marker == "K":
            key = r.tuple_data()
        else:
            old = r.tuple_data()
        _expect(r, "N")
    return Update(oid, old, key, r.tuple_data())


def _delete(r: _Reader) -> Delete:
    oid = r.read_int(_I)
    if _expect(r, "KO") == "K":
        return Delete(oid, None, r.tuple_data())
    return Delete(oid, r.tuple_data(), None)


def _truncate(r: _Reader) -> Truncate:
    count, options = r.unpack(_TRUNCATE_HEAD)
    if count < 0:
        raise ValueError(f"pgoutput 'T' message: negative relation count {count}")
    return Truncate(tuple(r.read_int(_I) for _ in range(count)), options)


def _message(r: _Reader) -> Message:
    flags, lsn = r.unpack(_MESSAGE_HEAD)
    prefix = r.string()
    content = r.read_bytes(r.read_int(_i))
    return Message(bool(flags & 1), lsn, prefix, content)


_DECODERS: Final[dict[str, Callable[[_Reader], PgOutputMessage]]] = {
    "B": _begin,
    "C": _commit,
    "O": _origin,
    "R": _relation,
    "Y": _type,
    "I": _insert,
    "U": _update,
    "D": _delete,
    "T": _truncate,
    "M": _message,
}


def decode(data: bytes) -> PgOutputMessage:
    """Decode one pgoutput (protocol version 1) message.

    Raises ValueError, naming the message type byte, for an empty, unknown, truncated or
    over-long message (protocol 2+ streaming messages, ``S``/``E``/``c``/``A``, are unknown
    here: request ``proto_version`` 1).

    >>> decode(bytes.fromhex("42" "0000000001000028" "0000000000000000" "000002e9"))
    Begin(final_lsn=16777256, commit_ts=datetime.datetime(2000, 1, 1, 0, 0, tzinfo=datetime.timezone.utc), xid=745)
    >>> decode(b"X")
    Traceback (most recent call last):
    ...
    ValueError: unknown pgoutput message type b'X' (1 bytes); this decoder reads protocol version 1
    """  # noqa: E501
    if not data:
        raise ValueError("empty pgoutput message (no message type byte)")
    kind = chr(data[0])
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise ValueError(
            f"unknown pgoutput message type {bytes(data[:1])!r} ({len(data)} bytes); this "
            "decoder reads protocol version 1"
        )
    reader = _Reader(bytes(data), kind)
    message = decoder(reader)
    reader.done()
    return message
