"""The CDC core without a database: PostgreSQL checkpoints written before the core existed
still decode to the same bytes, the log split drops a table's watermarks once it has passed
them (and how small that keeps it with 200 tables), and the chunk filter's position test."""

from __future__ import annotations

import base64
import dataclasses
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitflow.api.assigner import AssignerState
from splitflow.connectors.cdc.chunks import KeyStats, chunk_condition, cut_ahead, start_cut
from splitflow.connectors.cdc.splits import (
    CdcSplitCodec,
    CdcState,
    CdcStateCodec,
    ChunkFilter,
    ChunkReadEvent,
    ChunkSplit,
    Cut,
    LogSplit,
    PositionMark,
    check_mark_type,
    mark_tuple,
)
from splitflow.connectors.postgres import splits as pg
from splitflow.errors import ContractViolation

SAMPLE = Path(__file__).with_name("postgres_v1_offsets.json")
"""Encoded by the PostgreSQL connector's codecs before the CDC core existed (commit
ae66b52): chunk splits, a log split with three marks, and an enumerator state."""

OLD_EVENT = (
    "gASVzgAAAAAAAACMJHNwbGl0Zmxvdy5jb25uZWN0b3JzLnBvc3RncmVzLnNwbGl0c5SMDkNodW5rUmVhZEV2ZW50lJOU"
    "KYGUfZSMBG1hcmuUaACMCUNodW5rTWFya5STlCmBlH2UKIwIc3BsaXRfaWSUjA9wdWJsaWMub3JkZXJzIzCUjAV0YWJs"
    "ZZSMDXB1YmxpYy5vcmRlcnOUjAJsb5ROjAJoaZRLZIwEeG1pbpRN7gKMBHhtYXiUTfACjAN4aXCUTe4ChZSMBGhpZ2iU"
    "ShXsZQF1YnNiLg=="
)
"""A ChunkReadEvent as the state directory held it (pickled) before the core existed."""


def test_postgres_offsets_written_before_the_core_decode_and_encode_the_same() -> None:
    sample = json.loads(SAMPLE.read_text())
    codec, state_codec = pg.CdcSplitCodec(), pg.CdcStateCodec()
    assert (codec.version, state_codec.version) == (1, 2)
    splits = [codec.decode(s, sample["split_codec_version"]) for s in sample["splits"]]
    assert [codec.encode(s) for s in splits] == sample["splits"]
    assert json.dumps([codec.encode(s) for s in splits]) == json.dumps(sample["splits"])
    chunk, whole, log = splits
    assert chunk == ChunkSplit("public.orders", 1, "id", 100, None, 1)
    assert whole == ChunkSplit("public.lines", 0)
    assert isinstance(log, LogSplit)
    assert (log.split_id, log.position) == ("log:shop_orders", 23_400_000)
    assert next(pg.mark_of(m) for m in log.marks) == pg.ChunkMark(
        "public.orders#0", "public.orders", None, 100, 750, 752, (750,), 23_456_789
    )
    state = state_codec.decode(sample["state"], sample["state_codec_version"])
    assert sample["state_codec_version"] == 1  # version 2 holds the marks in pages
    encoded = state_codec.encode(state)
    assert encoded == {
        **sample["state"],
        "marks": {"0": sample["state"]["marks"]},  # one page
        "cuts": {},
    }
    assert state_codec.decode(json.loads(json.dumps(encoded)), 2) == state
    assert state.log_made
    assert state.log_start == 23_400_000
    assert [m.split_id for m in state.marks] == [
        "public.lines#0",
        "public.orders#0",
        "public.orders#1",
    ]


def test_a_chunk_read_event_pickled_before_the_core_still_loads() -> None:
    event = pickle.loads(base64.b64decode(OLD_EVENT))
    assert isinstance(event, ChunkReadEvent)
    assert event.mark == pg.ChunkMark(
        "public.orders#0", "public.orders", None, 100, 750, 752, (750,), 23_456_789
    )


# -- the log split drops the marks it has passed -----------------------------------------------


def marks(tables: int, chunks: int, high: int = 1000, step: int = 10) -> tuple[Any, ...]:
    """``chunks`` PostgreSQL marks per table; table ``i``'s highs end at ``high + i*step``."""
    out = []
    for t in range(tables):
        name = f"public.table_{t:03d}"
        for c in range(chunks):
            lo = None if c == 0 else c * 8096
            hi = None if c == chunks - 1 else (c + 1) * 8096
            mark = pg.ChunkMark(
                f"{name}#{c}",
                name,
                lo,
                hi,
                7_000 + t,
                7_010 + t,
                (7_005,),
                high + t * step - (chunks - 1 - c),
            )
            out.append(pg.mark_tuple(mark))
    return tuple(out)


def test_a_tables_marks_stay_until_the_log_passes_all_of_them() -> None:
    split = LogSplit("slot", 900, marks(3, 2))  # highs: t0 999,1000  t1 1009,1010  t2 1019,1020
    assert len(split.marks) == 6
    assert {m[1] for m in dataclasses.replace(split, position=1000).marks} == {
        "public.table_001",
        "public.table_002",
    }
    assert {m[1] for m in dataclasses.replace(split, position=1009).marks} == {
        "public.table_001",  # 1009 passed its first chunk's high, not its second's
        "public.table_002",
    }
    assert {m[1] for m in dataclasses.replace(split, position=1010).marks} == {"public.table_002"}
    assert dataclasses.replace(split, position=5000).marks == ()
    assert dataclasses.replace(split, position=5000) == LogSplit("slot", 5000)


def test_a_decoded_split_past_its_marks_carries_none() -> None:
    codec = CdcSplitCodec("test")
    encoded = codec.encode(LogSplit("slot", 900, marks(2, 2)))
    encoded["position"] = 2000  # a checkpoint taken later
    assert codec.decode(encoded, 1) == LogSplit("slot", 2000)


def test_dropping_passed_marks_changes_no_decision_of_the_filter() -> None:
    """Every change the log reads from its position on is judged the same with and without
    the marks the split dropped: none of them held it."""
    full = marks(3, 2)
    for position in (900, 1000, 1009, 1010, 1020, 1500):
        kept = ChunkFilter([pg.mark_of(m) for m in LogSplit("s", position, full).marks])
        every = ChunkFilter([pg.mark_of(m) for m in full])
        for table in ("public.table_000", "public.table_001", "public.table_002"):
            for key in (None, 5, 9000, 20_000):
                for at in range(position, 1030):
                    assert kept.holds(table, key, at, 7_001) == every.holds(table, key, at, 7_001)


def test_the_log_split_with_200_tables_shrinks_as_the_log_passes_their_marks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 19, item 3: measured, the log split's encoded size (what every Spark offset
    holds) with 200 tables of 4 chunks each (PostgreSQL marks; MySQL's are smaller)."""
    codec = CdcSplitCodec("test")
    every = marks(200, 4, high=10_000, step=100)  # table i finished at about 10,000 + 100 i

    def size(position: int) -> int:
        return len(json.dumps(codec.encode(LogSplit("shop_orders", position, every))))

    start, half, past = size(9_000), size(20_000), size(40_000)
    positions = tuple(m[:4] + m[-1:] for m in every)  # MySQL's marks: PositionMark

    def mysql(position: int) -> int:
        return len(json.dumps(codec.encode(LogSplit("binlog", position, positions))))

    with capsys.disabled():
        print(
            f"\nlog split, 200 tables x 4 chunks: PostgreSQL marks {start:,} bytes at the "
            f"start, {half:,} once the log passed half the tables, {past:,} once past all; "
            f"MySQL marks {mysql(9_000):,}, {mysql(20_000):,}, {mysql(40_000):,}"
        )
    assert start > 50_000
    assert 0.4 < half / start < 0.6
    assert past < 100
    assert mysql(40_000) < 100


# -- the core's pieces ------------------------------------------------------------------------


def test_a_position_mark_holds_exactly_the_changes_before_its_position() -> None:
    chunks = ChunkFilter(
        [
            PositionMark("db.t#0", "db.t", None, 100, 50),
            PositionMark("db.t#1", "db.t", 100, None, 60),
        ]
    )
    assert chunks.holds("db.t", 5, 49)
    assert not chunks.holds("db.t", 5, 50)
    assert chunks.holds("db.t", 500, 59)
    assert not chunks.holds("db.t", 500, 60)
    assert chunks.holds("db.t", None, 49)  # a NULL key: the first chunk's
    assert not chunks.holds("db.other", 5, 1)


def test_a_mark_class_must_lead_with_the_chunk_and_end_with_high() -> None:
    check_mark_type(PositionMark)
    check_mark_type(pg.ChunkMark)

    @dataclasses.dataclass(frozen=True)
    class Backwards:
        high: int
        split_id: str

    with pytest.raises(ContractViolation, match="must be a dataclass whose fields start"):
        check_mark_type(Backwards)
    assert mark_tuple(PositionMark("t#0", "t", None, None, 7)) == ("t#0", "t", None, None, 7)


def test_sparse_keys_are_cut_by_stepping_and_dense_ones_evenly() -> None:
    keys = [1, *range(1_000_000, 10_000_000, 1_000_000)]

    def key_after(table: str, key: str, at: int, n: int) -> int | None:
        later = [k for k in keys if k >= at]
        return later[n] if n < len(later) else None

    def cut(table: str, key: str, size: int, stats: KeyStats) -> list[ChunkSplit]:
        return cut_ahead([start_cut(table, key, size, stats)], None, key_after)[0]

    stats = KeyStats(min(keys), max(keys), len(keys), len(keys))
    assert [(c.lo, c.hi) for c in cut("db.t", "id", 3, stats)] == [
        (None, 3_000_000),
        (3_000_000, 6_000_000),
        (6_000_000, 9_000_000),
        (9_000_000, None),
    ]
    assert cut("db.t", "id", 10, KeyStats(None, None, 0, 0)) == [ChunkSplit("db.t", 0, "id")]
    assert chunk_condition(ChunkSplit("db.t", 0), lambda n: n) == ""


@given(
    keys=st.lists(st.integers(-1000, 1_000_000), min_size=0, max_size=300, unique=True),
    size=st.integers(1, 40),
    steps=st.lists(st.integers(1, 7), min_size=1, max_size=20),
)
def test_a_cut_taken_a_few_chunks_at_a_time_is_the_whole_cut(
    keys: list[int], size: int, steps: list[int]
) -> None:
    """Cutting ahead a few chunks at a time (the cut's state through its codec between
    takes, as a restore would) gives the chunks of the whole cut, in order; every key lies
    in exactly one of them."""
    keys.sort()

    def key_after(table: str, key: str, at: int, n: int) -> int | None:
        later = [k for k in keys if k >= at]
        return later[n] if n < len(later) else None

    stats = KeyStats(min(keys, default=None), max(keys, default=None), len(keys), len(keys))
    start = start_cut("db.t", "id", size, stats)
    whole = cut_ahead([start], None, key_after)[0]
    codec = CdcStateCodec(PositionMark)
    taken: list[ChunkSplit] = []
    cuts: tuple[Cut, ...] = (start,)
    for n in steps * 1000:
        if not cuts:
            break
        chunks, cuts = cut_ahead(cuts, n, key_after)
        assert 0 < len(chunks) <= n
        taken += chunks
        state = CdcState(AssignerState(), cuts=cuts)
        cuts = codec.decode(json.loads(json.dumps(codec.encode(state))), codec.version).cuts
    assert taken == whole
    assert [c.index for c in taken] == list(range(len(taken)))
    for k in keys:
        holding = [c for c in taken if (c.lo is None or c.lo <= k) and (c.hi is None or k < c.hi)]
        assert len(holding) == 1, (k, holding)


@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 10_000)), max_size=60))
def test_the_state_codec_encodes_marks_as_a_fresh_codec_does_as_they_come_and_are_replaced(
    ops: list[tuple[bool, int]],
) -> None:
    """The codec encodes full pages of marks once; as marks are added, or replaced (taken out
    and added last, as the enumerator does for a chunk read again), every encoding equals
    a fresh codec's, and decodes to the marks."""
    codec = CdcStateCodec(PositionMark)
    codec.PAGE = 4  # type: ignore[misc]
    marks: dict[str, PositionMark] = {}
    for n, (replace, high) in enumerate(ops):
        sid = f"t#{high % max(1, len(marks))}" if replace and marks else f"t#{n}"
        marks.pop(sid, None)
        marks[sid] = PositionMark(sid, "t", None, None, high)
        state = CdcState(AssignerState(), marks=tuple(marks.values()))
        fresh = CdcStateCodec(PositionMark)
        fresh.PAGE = 4  # type: ignore[misc]
        encoded = codec.encode(state)
        assert encoded == fresh.encode(state)
        assert codec.decode(json.loads(json.dumps(encoded)), 2).marks == state.marks
