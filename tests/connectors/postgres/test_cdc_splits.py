"""Unit tests of the chunk watermark's visibility test and the log's chunk filter."""

from __future__ import annotations

import pytest

from splitflow.connectors.postgres.splits import ChunkFilter, ChunkMark
from splitflow.errors import ConnectorError

EPOCH = 1 << 32


def mark(xmin: int, xmax: int, xip: tuple[int, ...] = (), **kw: object) -> ChunkMark:
    fields = {"split_id": "t#0", "table": "public.t", "lo": None, "hi": None, "high": 1000}
    fields.update(kw)
    return ChunkMark(xmin=xmin, xmax=xmax, xip=xip, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("xid", "visible"),
    [(99, True), (100, True), (105, False), (107, True), (110, False), (4000, False)],
)
def test_a_transaction_is_seen_exactly_when_the_snapshot_saw_it(xid: int, visible: bool) -> None:
    assert mark(100, 110, (105, 108)).sees(xid) is visible


def test_ids_are_compared_within_the_snapshots_epoch() -> None:
    """pgoutput gives 32-bit ids, pg_current_snapshot 64-bit ones with the epoch."""
    across = mark(EPOCH + 5, EPOCH + 20, (EPOCH + 10,))
    assert across.sees(3)  # EPOCH + 3: before xmin
    assert across.sees(0xFFFFFFF0)  # the previous epoch's end: long committed
    assert not across.sees(10)  # EPOCH + 10: in progress at the snapshot
    assert not across.sees(25)  # EPOCH + 25: after the snapshot
    before = mark(0xFFFFFFF0, 0xFFFFFFFA)
    assert not before.sees(2)  # the next epoch's start: after the snapshot


def test_the_filter_judges_a_key_by_its_own_chunk_and_only_below_its_high_mark() -> None:
    low = mark(100, 100, split_id="t#0", lo=None, hi=500, high=1000)
    high = mark(200, 200, split_id="t#1", lo=500, hi=None, high=2000)
    chunks = ChunkFilter([high, low])
    assert chunks.already_read("public.t", 10, 150, 900) is False  # chunk 0 did not see 150
    assert chunks.already_read("public.t", 700, 150, 900) is True  # chunk 1 did
    assert chunks.already_read("public.t", 10, 90, 1500) is False  # past chunk 0's high mark
    assert chunks.already_read("public.other", 10, 90, 900) is False  # no chunk: not read


def test_a_key_no_watermark_covers_is_an_error_not_a_guess() -> None:
    only_upper = ChunkFilter([mark(100, 100, lo=500, hi=None)])
    expected = r"no chunk watermark of table public\.t covers key 10"
    with pytest.raises(ConnectorError, match=expected):
        only_upper.already_read("public.t", 10, 50, 900)


def test_a_null_chunk_key_is_judged_by_the_first_chunk() -> None:
    """The first chunk's rows include those whose chunk key is NULL (a table without a
    primary key cut by option chunkKeyColumn)."""
    low = mark(100, 100, split_id="t#0", lo=None, hi=500, high=1000)
    high = mark(200, 200, split_id="t#1", lo=500, hi=None, high=2000)
    chunks = ChunkFilter([high, low])
    assert chunks.already_read("public.t", None, 90, 900) is True  # chunk 0 saw 90
    assert chunks.already_read("public.t", None, 150, 900) is False  # chunk 0 did not see 150
    one = ChunkFilter([mark(100, 100)])  # a table read as one chunk: any key, or none
    assert one.already_read("public.t", None, 90, 900) is True
    assert one.already_read("public.t", 7, 90, 900) is True


def test_a_null_key_without_the_first_chunks_watermark_is_an_error() -> None:
    only_upper = ChunkFilter([mark(100, 100, lo=500, hi=None)])
    with pytest.raises(ConnectorError, match=r"covers key NULL \(the nearest is chunk t#0\)"):
        only_upper.already_read("public.t", None, 50, 900)
