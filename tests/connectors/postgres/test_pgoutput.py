"""The pgoutput decoder, on what a real PostgreSQL 15 sends and on hand-built bytes."""

from __future__ import annotations

import itertools
import pickle
import struct
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from splitflow.connectors.postgres.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Relation,
    RelationColumn,
    Truncate,
    Type,
    Update,
    decode,
    format_lsn,
    parse_lsn,
)
from splitflow.testing.postgres import Postgres

_names = itertools.count()


class Slot:
    """A table's publication and pgoutput slot, peeked through one autocommit connection."""

    def __init__(self, postgres: Postgres, table: str) -> None:
        n = next(_names)
        self.conn = postgres.connect()
        self.publication = f"pub_{table}_{n}"
        self.slot = f"slot_{table}_{n}"
        self.conn.execute(f"CREATE PUBLICATION {self.publication} FOR TABLE {table}")
        self.conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,))

    def peek(self, upto: int | None = None, **options: str) -> list[tuple[int, int, Any]]:
        """``(row lsn, xid, decoded message)`` of every change up to ``upto``."""
        extra = [item for pair in options.items() for item in pair]
        placeholders = "".join(", %s" for _ in extra)
        rows = self.conn.execute(
            "SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_peek_binary_changes("
            f"%s, %s::pg_lsn, NULL, 'proto_version', '1', 'publication_names', %s{placeholders})",
            (self.slot, None if upto is None else format_lsn(upto), self.publication, *extra),
        ).fetchall()
        return [(parse_lsn(lsn), xid, decode(data)) for lsn, xid, data in rows]

    def messages(self, **options: str) -> list[PgOutputMessage]:
        return [message for _, _, message in self.peek(**options)]

    def close(self) -> None:
        self.conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        self.conn.close()


@pytest.fixture
def conn(postgres: Postgres) -> Iterator[Any]:
    with postgres.connect() as connection:
        yield connection


def open_slot(postgres: Postgres, request: pytest.FixtureRequest, table: str) -> Slot:
    slot = Slot(postgres, table)
    request.addfinalizer(slot.close)
    return slot


def kinds(messages: list[PgOutputMessage]) -> list[str]:
    return [type(m).__name__ for m in messages]


def test_insert_update_delete_truncate_decode_in_commit_order(
    postgres: Postgres, conn: Any, request: pytest.FixtureRequest
) -> None:
    conn.execute("CREATE TABLE po_basic (id int PRIMARY KEY, name text, note varchar(20))")
    oid = conn.execute("SELECT 'po_basic'::regclass::oid::bigint").fetchone()[0]
    slot = open_slot(postgres, request, "po_basic")
    before = datetime.now(UTC)

    conn.execute("INSERT INTO po_basic VALUES (1, 'a', NULL)")
    conn.execute("UPDATE po_basic SET name = 'b' WHERE id = 1")
    conn.execute("UPDATE po_basic SET id = 2 WHERE id = 1")  # the key changes: 'K' tuple
    conn.execute("DELETE FROM po_basic WHERE id = 2")
    with conn.transaction():
        conn.execute("INSERT INTO po_basic VALUES (3, 'c', 'x'), (4, '', 'y')")
        conn.execute("UPDATE po_basic SET note = NULL WHERE id = 3")
        multi_xid = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
    conn.execute("TRUNCATE po_basic")

    peeked = slot.peek()
    messages = [m for _, _, m in peeked]
    assert kinds(messages) == [
        *("Begin", "Relation", "Insert", "Commit"),
        *("Begin", "Update", "Commit"),
        *("Begin", "Update", "Commit"),
        *("Begin", "Delete", "Commit"),
        *("Begin", "Insert", "Insert", "Update", "Commit"),
        *("Begin", "Relation", "Truncate", "Commit"),  # TRUNCATE resends the schema
    ]
    assert messages[1] == Relation(
        oid=oid,
        namespace="public",
        name="po_basic",
        replica_identity="d",
        columns=(
            RelationColumn(is_key=True, name="id", type_oid=23, type_modifier=-1),
            RelationColumn(is_key=False, name="name", type_oid=25, type_modifier=-1),
            RelationColumn(is_key=False, name="note", type_oid=1043, type_modifier=24),
        ),
    )
    assert messages[1].columns[0].flags == 1
    assert messages[1].columns[1].flags == 0
    assert messages[-3] == messages[1]
    changes = [m for m in messages if not isinstance(m, Begin | Commit | Relation)]
    assert changes == [
        Insert(oid, (b"1", b"a", None)),
        Update(oid, old=None, key=None, new=(b"1", b"b", None)),
        Update(oid, old=None, key=(b"1", None, None), new=(b"2", b"b", None)),
        Delete(oid, old=None, key=(b"2", None, None)),
        Insert(oid, (b"3", b"c", b"x")),
        Insert(oid, (b"4", b"", b"y")),
        Update(oid, old=None, key=None, new=(b"3", b"c", None)),
        Truncate((oid,), options=0),
    ]

    begins = [(i, m) for i, m in enumerate(messages) if isinstance(m, Begin)]
    commits = [(i, m) for i, m in enumerate(messages) if isinstance(m, Commit)]
    assert len(begins) == len(commits) == 6
    previous_end = 0
    for (bi, begin), (ci, commit) in zip(begins, commits, strict=True):
        # every row of a transaction carries its xid
        assert {peeked[i][1] for i in range(bi, ci + 1)} == {begin.xid}
        assert begin.final_lsn == commit.commit_lsn
        assert commit.end_lsn > commit.commit_lsn
        assert commit.commit_lsn >= previous_end  # transactions do not overlap, in order
        assert peeked[ci][0] == commit.end_lsn  # a Commit row's lsn is the end LSN
        assert begin.commit_ts == commit.commit_ts
        assert commit.flags == 0
        assert commit.commit_ts.tzinfo is UTC
        assert before - timedelta(seconds=5) < commit.commit_ts < datetime.now(UTC)
        previous_end = commit.end_lsn
    assert [b.xid for _, b in begins] == sorted(b.xid for _, b in begins)
    assert begins[4][1].xid == multi_xid


def test_update_of_other_column_sends_large_value_as_unchanged_toast(
    postgres: Postgres, conn: Any, request: pytest.FixtureRequest
) -> None:
    conn.execute("CREATE TABLE po_toast (id int PRIMARY KEY, big text, small text)")
    conn.execute("ALTER TABLE po_toast ALTER COLUMN big SET STORAGE EXTERNAL")  # out of line
    slot = open_slot(postgres, request, "po_toast")
    big = "".join(f"{i:05d}" for i in range(20_000))  # 100,000 bytes
    conn.execute("INSERT INTO po_toast VALUES (1, %s, 'x')", (big,))
    conn.execute("UPDATE po_toast SET small = 'y' WHERE id = 1")
    conn.execute("UPDATE po_toast SET big = 'short' WHERE id = 1")

    changes = [m for m in slot.messages() if isinstance(m, Insert | Update)]
    assert changes[0].new == (b"1", big.encode(), b"x")
    assert changes[1] == Update(changes[1].relation_oid, None, None, (b"1", UNCHANGED_TOAST, b"y"))
    assert changes[1].new[1] is UNCHANGED_TOAST
    assert changes[2].new == (b"1", b"short", b"y")


def test_replica_identity_full_sends_whole_old_rows(
    postgres: Postgres, conn: Any, request: pytest.FixtureRequest
) -> None:
    conn.execute("CREATE TABLE po_full (id int PRIMARY KEY, v text)")
    conn.execute("ALTER TABLE po_full REPLICA IDENTITY FULL")
    slot = open_slot(postgres, request, "po_full")
    conn.execute("INSERT INTO po_full VALUES (1, 'a')")
    conn.execute("UPDATE po_full SET v = NULL WHERE id = 1")
    conn.execute("DELETE FROM po_full")

    messages = slot.messages()
    relation = next(m for m in messages if isinstance(m, Relation))
    assert relation.replica_identity == "f"
    assert [c.is_key for c in relation.columns] == [True, True]  # FULL: every column is key
    oid = relation.oid
    assert [m for m in messages if isinstance(m, Update | Delete)] == [
        Update(oid, old=(b"1", b"a"), key=None, new=(b"1", None)),
        Delete(oid, old=(b"1", None), key=None),
    ]


def test_logical_decoding_messages_decode_when_asked_for(
    postgres: Postgres, conn: Any, request: pytest.FixtureRequest
) -> None:
    conn.execute("CREATE TABLE po_msg (id int PRIMARY KEY)")
    slot = open_slot(postgres, request, "po_msg")
    with conn.transaction():
        lsn = conn.execute(
            "SELECT pg_logical_emit_message(true, 'splitflow', '\\x00ff'::bytea)::text"
        ).fetchone()[0]
        conn.execute("INSERT INTO po_msg VALUES (7)")

    assert kinds(slot.messages()) == ["Begin", "Relation", "Insert", "Commit"]
    messages = slot.messages(messages="true")
    assert kinds(messages) == ["Begin", "Message", "Relation", "Insert", "Commit"]
    assert messages[1] == Message(
        transactional=True, lsn=parse_lsn(lsn), prefix="splitflow", content=b"\x00\xff"
    )


def test_peek_upto_lsn_returns_transactions_whose_commit_starts_before_it(
    postgres: Postgres, conn: Any, request: pytest.FixtureRequest
) -> None:
    conn.execute("CREATE TABLE po_upto (id int PRIMARY KEY)")
    slot = open_slot(postgres, request, "po_upto")
    for i in range(3):
        conn.execute("INSERT INTO po_upto VALUES (%s)", (i,))
    commits = [m for m in slot.messages() if isinstance(m, Commit)]
    second = commits[1]

    def included(upto: int) -> list[int]:
        return [m.commit_lsn for _, _, m in slot.peek(upto) if isinstance(m, Commit)]

    first_lsn = commits[0].commit_lsn
    assert included(second.commit_lsn - 1) == [first_lsn]
    assert included(second.commit_lsn) == [first_lsn]  # starts AT upto: left out
    assert included(second.commit_lsn + 1) == [first_lsn, second.commit_lsn]
    assert included(second.end_lsn) == [first_lsn, second.commit_lsn]
    assert included(second.end_lsn + 1) == [first_lsn, second.commit_lsn]


def test_peek_upto_lsn_takes_a_commit_that_opens_a_wal_page_from_the_page_start(
    postgres: Postgres, conn: Any, request: pytest.FixtureRequest
) -> None:
    """The exception to the rule above: peek stops after the first record that ENDS at or
    after upto_lsn. The record before a commit that is the first record of a WAL page ends
    at the page start, 24 bytes (the page header) before the commit, so an upto_lsn in
    ``(page start, commit_lsn]`` returns that transaction although its commit starts at or
    after upto_lsn. Filter on ``Begin.final_lsn`` for an exact ``commit_lsn < upto``."""
    block = int(conn.execute("SHOW wal_block_size").fetchone()[0])
    conn.execute("CREATE TABLE po_page (id int PRIMARY KEY, pad text)")
    slot = open_slot(postgres, request, "po_page")
    probe = open_slot(postgres, request, "po_page")  # consumed with get, to find the commit
    target = None
    for i in range(20_000):
        # rows of varying size, so commit records land at every 8-byte offset of a page
        conn.execute("INSERT INTO po_page VALUES (%s, %s)", (i, "x" * (i % 13)))
        if i % 100 == 99:
            rows = probe.conn.execute(
                "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
                "'proto_version', '1', 'publication_names', %s)",
                (probe.slot, probe.publication),
            ).fetchall()
            found = [
                m
                for m in (decode(data) for (data,) in rows)
                if isinstance(m, Commit) and m.commit_lsn % block == 24
            ]
            if found:
                target = found[0]
                break
    assert target is not None, "no commit record opened a WAL page"
    page_start = target.commit_lsn - 24

    def includes_target(upto: int) -> bool:
        return any(isinstance(m, Commit) and m == target for _, _, m in slot.peek(upto))

    assert not includes_target(page_start)
    assert includes_target(page_start + 1)
    assert includes_target(target.commit_lsn)  # starts AT upto, yet returned
    assert includes_target(target.commit_lsn + 1)


# -- hand-built bytes -----------------------------------------------------------------------


def _s(text: str) -> bytes:
    return text.encode() + b"\0"


def _tuple(*values: bytes | str | None) -> bytes:
    out = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "u":
            out += b"u"
        else:
            assert isinstance(v, bytes)
            out += b"t" + struct.pack(">i", len(v)) + v
    return out


RELATION = (
    b"R"
    + struct.pack(">I", 16385)
    + _s("sales")
    + _s("orders")
    + b"i"
    + struct.pack(">h", 2)
    + b"\x01"
    + _s("id")
    + struct.pack(">Ii", 20, -1)
    + b"\x00"
    + _s("price")
    + struct.pack(">Ii", 1700, ((10 << 16) | 2) + 4)
)


def test_hand_built_messages_decode() -> None:
    assert decode(RELATION) == Relation(
        16385,
        "sales",
        "orders",
        "i",
        (RelationColumn(True, "id", 20, -1), RelationColumn(False, "price", 1700, 655366)),
    )
    ts = 86_400_000_000 + 1  # one day and 1 us after 2000-01-01
    assert decode(b"B" + struct.pack(">QqI", 2**40 + 8, ts, 4_000_000_000)) == Begin(
        2**40 + 8, datetime(2000, 1, 2, 0, 0, 0, 1, tzinfo=UTC), 4_000_000_000
    )
    assert decode(b"C" + struct.pack(">bQQq", 0, 16, 64, -1)) == Commit(
        0, 16, 64, datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    )
    assert decode(b"O" + struct.pack(">Q", 99) + _s("node_a")) == Origin(99, "node_a")
    assert decode(b"Y" + struct.pack(">I", 70000) + _s("public") + _s("mood")) == Type(
        70000, "public", "mood"
    )
    update = b"U" + struct.pack(">I", 5) + b"O" + _tuple(b"1", None) + b"N" + _tuple(b"1", "u")
    assert decode(update) == Update(5, old=(b"1", None), key=None, new=(b"1", UNCHANGED_TOAST))
    assert decode(b"D" + struct.pack(">I", 5) + b"O" + _tuple(b"x")) == Delete(5, (b"x",), None)
    binary = b"I" + struct.pack(">I", 5) + b"N" + b"\x00\x01b\x00\x00\x00\x02\x00\x07"
    assert decode(binary) == Insert(5, (b"\x00\x07",))
    truncate = decode(b"T" + struct.pack(">ib", 2, 3) + struct.pack(">II", 5, 6))
    assert truncate == Truncate((5, 6), 3)
    assert isinstance(truncate, Truncate)
    assert (truncate.cascade, truncate.restart_identity) == (True, True)
    assert decode(b"M\x00" + struct.pack(">Q", 7) + _s("p") + b"\x00\x00\x00\x00") == Message(
        False, 7, "p", b""
    )


def test_unchanged_toast_is_one_object_that_survives_pickling() -> None:
    assert pickle.loads(pickle.dumps(UNCHANGED_TOAST)) is UNCHANGED_TOAST
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"
    assert type(UNCHANGED_TOAST)() is UNCHANGED_TOAST


def test_unknown_and_empty_messages_are_rejected_naming_the_type_byte() -> None:
    with pytest.raises(ValueError, match=r"unknown pgoutput message type b'S'"):
        decode(b"S\x00\x00\x00\x01")  # a protocol-2 stream start
    with pytest.raises(ValueError, match=r"unknown pgoutput message type b'\\x00'"):
        decode(b"\x00")
    with pytest.raises(ValueError, match="empty pgoutput message"):
        decode(b"")


@pytest.mark.parametrize("cut", range(1, len(RELATION)))
def test_every_truncation_of_a_relation_is_rejected(cut: int) -> None:
    with pytest.raises(ValueError, match=r"pgoutput 'R' message"):
        decode(RELATION[:cut])


def test_malformed_messages_are_rejected_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"truncated pgoutput 'B' message: needs 20 more"):
        decode(b"B\x00\x00\x00\x00")
    with pytest.raises(ValueError, match=r"'C' message: 1 unexpected trailing byte"):
        decode(b"C" + struct.pack(">bQQq", 0, 1, 2, 3) + b"\x00")
    with pytest.raises(ValueError, match=r"'I' message: unknown column kind 'x'"):
        decode(b"I" + struct.pack(">I", 5) + b"N\x00\x01x")
    with pytest.raises(ValueError, match=r"'I' message: unexpected tuple marker 'K'"):
        decode(b"I" + struct.pack(">I", 5) + b"K" + _tuple(b"1"))
    with pytest.raises(ValueError, match=r"'D' message: unexpected tuple marker 'N'"):
        decode(b"D" + struct.pack(">I", 5) + b"N" + _tuple(b"1"))
    with pytest.raises(ValueError, match=r"truncated pgoutput 'I' message: needs 10 more"):
        decode(b"I" + struct.pack(">I", 5) + b"N\x00\x01t\x00\x00\x00\x0aabc")
    with pytest.raises(ValueError, match=r"'I' message: negative length -2"):
        decode(b"I" + struct.pack(">I", 5) + b"N\x00\x01t\xff\xff\xff\xfe")
    with pytest.raises(ValueError, match=r"'O' message: unterminated string"):
        decode(b"O" + struct.pack(">Q", 1) + b"abc")


def test_lsn_text_round_trips() -> None:
    assert format_lsn(0) == "0/0"
    assert format_lsn(0xAB_0000_00FF) == "AB/FF"
    assert parse_lsn("AB/FF") == 0xAB_0000_00FF
    assert parse_lsn(format_lsn(2**64 - 1)) == 2**64 - 1
    with pytest.raises(ValueError, match="not an LSN"):
        parse_lsn("16")
