"""Small offsets: with ``stateDir`` Spark's offset names files that hold the splits' state.

The offset of a batch stays a few hundred bytes whatever the number of splits; a replay
reads the same records from it (also after a newer snapshot superseded its base), a restart
restores from it at any parallelism, and every offset Spark keeps finds its files.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.spark.test_planner import (
    DISCOVERY,
    AgainAsItEndsSource,
    FakeClock,
    Query,
    as_spark_stores_it,
    assert_exactly_once,
    records_of,
)

from splitflow.api.events import SplitsFinishedEvent
from splitflow.errors import CheckpointStateError, ConfigurationError
from splitflow.spark.events import EventStore
from splitflow.spark.limits import MaxRecords
from splitflow.spark.offset import OffsetEncoder
from splitflow.spark.offsetstate import (
    COMPACT_EVERY,
    FULL,
    SMALL,
    OffsetState,
    difference,
    patched,
)
from splitflow.spark.planner import Planner
from splitflow.spark.snapshots import StateRef, from_json, to_json
from splitflow.testing.sequence import (
    SequenceCatalog,
    SequenceEnumerator,
    SequenceSource,
    SequenceSplit,
)

PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=200)

scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.text("ab", max_size=2)
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("abc", max_size=2), inner),
    max_leaves=12,
)
objects = st.dictionaries(st.text("abcd", max_size=2), documents, max_size=5)


@given(objects, objects)
@PROPERTY
def test_a_difference_patched_onto_the_old_document_gives_the_new(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    change = difference(old, new)
    stored = json.loads(json.dumps(change))  # as a delta file holds it
    assert patched(json.loads(json.dumps(old)), stored) == new
    assert (change == {}) == (old == new)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too: orjson refuses those
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(json_values)
@PROPERTY
def test_a_state_file_reads_back_as_json_would_have_written_it(value: Any) -> None:
    expected = json.loads(json.dumps(value))
    assert from_json(to_json(value)) == expected  # as the planner reads it
    assert json.loads(to_json(value)) == expected  # as any other tool reads it


@pytest.mark.parametrize("number", [2**64, -(2**63) - 1, 10**30], ids=str)
def test_integers_beyond_64_bits_read_back_exactly_from_state_files(number: int) -> None:
    # orjson cannot write them (json does), and would read them as floats
    written = to_json({"position": number})
    assert from_json(written) == {"position": number}
    assert type(from_json(written)["position"]) is int
    # a file json wrote before orjson marked its files
    assert from_json(json.dumps([number]).encode()) == [number]


def test_a_state_file_orjson_wrote_before_it_marked_its_files_reads_back() -> None:
    assert from_json(orjson.dumps({"slots": {"0": [["a", {"position": 3}, 5, 1]]}})) == {
        "slots": {"0": [["a", {"position": 3}, 5, 1]]}
    }


class Level(enum.IntEnum):
    HIGH = 2


@dataclass(frozen=True)
class NotJson:
    name: str


@pytest.mark.parametrize(
    "value", [{"level": Level.HIGH}, [Level.HIGH, "x"], {"a": {"b": (1, 2)}}], ids=repr
)
def test_a_state_file_holds_what_json_writes_for_subclasses_of_json_types(value: Any) -> None:
    assert json.loads(to_json(value)) == json.loads(json.dumps(value))


@pytest.mark.parametrize("value", [NotJson("x"), {"at": datetime(2026, 1, 1)}], ids=repr)
def test_what_json_cannot_write_is_refused_in_state_files_too(value: Any) -> None:
    with pytest.raises(TypeError):
        json.dumps(value)
    with pytest.raises(TypeError):
        to_json(value)


def planner(
    catalog: SequenceCatalog, clock: FakeClock, state: Path | None, parallelism: int = 2
) -> Planner[Any, Any]:
    source = SequenceSource(catalog, discovery_interval=DISCOVERY)
    return Planner(source, parallelism, clock=clock, state_dir=str(state) if state else None)


def one_split_at_a_time(query: Query, catalog: SequenceCatalog, batches: int) -> None:
    """``batches`` batches, each reading the 3 new records of one split (round robin)."""
    names = sorted(catalog.lengths())
    for n in range(batches):
        catalog.append(names[n % len(names)], 3)
        assert query.batch() is not None


def test_offsets_stay_small_whatever_the_number_of_splits(tmp_path: Path) -> None:
    sizes = {}
    for count in (10, 5_000):
        catalog = SequenceCatalog({f"s{i:05d}": 1 for i in range(count)})
        query = Query(planner(catalog, FakeClock(), tmp_path / str(count)))
        assert query.batch() is not None
        one_split_at_a_time(query, catalog, 5)
        assert query.offset["splitflow"] == SMALL
        assert "s00001" not in json.dumps(query.offset)
        sizes[count] = len(json.dumps(query.offset))
        restored = query.planner.read_offset(query.offset)
        assert sum(len(slot) for slot in restored.slots) == count
    assert sizes[5_000] < 600, sizes
    assert sizes[5_000] - sizes[10] < 20, sizes  # the reference's size count only

    catalog = SequenceCatalog({f"s{i:05d}": 1 for i in range(5_000)})
    inline = Query(planner(catalog, FakeClock(), None))
    assert inline.batch() is not None
    assert inline.offset["splitflow"] == FULL
    assert len(json.dumps(inline.offset)) > 100 * sizes[5_000]


def test_a_batch_writes_a_delta_the_size_of_what_it_changed(tmp_path: Path) -> None:
    catalog = SequenceCatalog({f"s{i:05d}": 1 for i in range(2_000)})
    query = Query(planner(catalog, FakeClock(), tmp_path))
    assert query.batch() is not None  # a snapshot: the first batch of the run
    one_split_at_a_time(query, catalog, 4)
    ref = StateRef.decode(query.offset["state"])
    files = tmp_path / "offsets"
    base = (files / f"snapshot-{ref.base}.json").stat().st_size
    deltas = [(files / f"delta-{d}.json").stat().st_size for d in ref.deltas]
    assert len(deltas) == 4
    # The first delta also drops the 2,000 backlog boundaries that the first batch reached
    # (the enumerator's state); each slice stays as the first batch left it.
    assert 5 * deltas[0] < base, (deltas, base)
    assert max(deltas[1:]) * 200 < base, (deltas, base)  # one split's slice, not 2,000
    # A split read on keeps its split encoding: the delta names only where its slice is now.
    last = orjson.loads((files / f"delta-{ref.deltas[-1]}.json").read_bytes())
    slot, change = next(iter(last["sub"]["slots"]["sub"].items()))
    slices = query.planner.planned(query.offset).slots[int(slot)]
    assert change == {"moved": {"s00003": [1, 4, query.offset["seq"]]}}, last
    assert any(s.body.split_id == "s00003" and s.records == 3 for s in slices)


def delta_of(state: Path, offset: Mapping[str, Any]) -> Any:
    """The last delta file ``offset`` names."""
    ref = StateRef.decode(offset["state"])
    return orjson.loads((state / "offsets" / f"delta-{ref.deltas[-1]}.json").read_bytes())


@pytest.mark.parametrize("rounds", [0, 2], ids=["after-a-snapshot", "after-deltas"])
def test_a_split_read_on_is_moved_in_the_delta_when_another_left_its_slot(
    tmp_path: Path, rounds: int
) -> None:
    """A slot that a split left is encoded whole, and compared whole with the state before
    (as the deltas since its snapshot left it): only the slice read since is written, as
    moved (it keeps its split), and the split that left is dropped."""
    catalog = SequenceCatalog({"a": 1, "b": 1, "c": 1})
    query = Query(planner(catalog, FakeClock(), tmp_path, parallelism=1))
    assert query.batch() is not None  # a snapshot
    for n in range(1, rounds + 1):
        catalog.append("a", 1)
        catalog.append("c", 1)
        assert query.batch() == [("a", n), ("c", n)]  # deltas that move a and c
    catalog.append("a", 2)
    catalog.seal("b")  # read to its end: it finishes, and leaves the slot
    assert query.batch() == [("a", rounds + 1), ("a", rounds + 2)]
    slot = delta_of(tmp_path, query.offset)["sub"]["slots"]["sub"]["0"]
    assert slot == {"moved": {"a": [rounds + 1, rounds + 3, query.offset["seq"]]}, "drop": ["b"]}
    assert query.planner.read_offset(query.offset) == query.planner.planned(query.offset)


class AgainTwice(SequenceEnumerator):
    """Assigns ``b`` again as it finishes, twice: a new split of the same id where the
    catalog ends it then."""

    times = 2

    def handle_source_event(self, reader_id: int, event: Any) -> None:
        super().handle_source_event(reader_id, event)
        if self.times and isinstance(event, SplitsFinishedEvent) and "b" in event.split_ids:
            self.times -= 1
            self._finished.pop("b", None)
            end = self._source.catalog.lengths()["b"]
            self.add_splits([SequenceSplit("b", position=end)])


class AgainTwiceSource(AgainAsItEndsSource):
    def create_enumerator(self, context: Any) -> Any:
        return AgainTwice(self, context, None)

    def restore_enumerator(self, context: Any, state: Any) -> Any:
        return AgainTwice(self, context, state)


@pytest.mark.parametrize("source", [AgainAsItEndsSource, AgainTwiceSource])
def test_a_slot_holding_a_split_id_twice_reads_back_whole_and_restarts_from_it(
    source: type[AgainAsItEndsSource], tmp_path: Path
) -> None:
    """A split read to its end and assigned again while it finishes leaves its slot with two
    slices of its id (twice in a row, with ``AgainTwiceSource``). The state keeps a slot's
    slices by split id, the new one's there and the ending one apart: the offset reads back
    as planned (a replay reads the same), counts the slices as the state holds them, and a
    restart from it holds the new split (before, the state kept the ending slice alone, and
    the restart failed with SplitOwnershipError: the new split in no reader's state)."""
    catalog = SequenceCatalog({"a": 2, "b": 2})
    query = Query(
        Planner(
            source(catalog, discovery_interval=DISCOVERY),
            1,
            clock=FakeClock(),
            state_dir=str(tmp_path / "state"),
        )
    )
    assert query.batch() is not None
    ends = []
    catalog.seal("b")
    for _ in range(2 if source is AgainTwiceSource else 1):
        catalog.append("b", 1)  # the b held reads it, to b's end
        catalog.append("a", 1)
        end = query.plan()
        assert end is not None
        planned = query.planner.planned(end)
        held = [(s.body.split_id, s.ends) for s in planned.slots[0]]
        assert sorted(held) == [("a", False), ("b", False), ("b", True)]
        assert StateRef.decode(end["state"]).size == 2  # as the state's files hold them
        assert query.planner.read_offset(end) == planned  # not only the ending slice of b
        query.run(end)
        ends.append(end)
    catalog.append("a", 1)
    query.drain()
    every = [(n, i) for n, count in catalog.lengths().items() for i in range(count)]
    assert_exactly_once(query.read, every)
    for at, end in enumerate(ends):
        before = query.batches[: query.ends.index(end) + 1]
        copy = tmp_path / f"restart-{at}"
        shutil.copytree(
            tmp_path / "state", copy
        )  # as the state was when the query stopped after end
        restarted = Query(
            Planner(
                source(catalog, discovery_interval=DISCOVERY),
                1,
                clock=FakeClock(),
                state_dir=str(copy),
            ),
            start=end,
        )
        restarted.drain()
        assert_exactly_once([r for b in before for r in b] + restarted.read, every)
        restarted.planner.close()


def test_after_a_state_of_format_6_the_state_is_written_whole(tmp_path: Path) -> None:
    """Format 6 wrote no ``moved``; its files read the same, but the first state after a
    restart from one is a snapshot, not a delta on them (as after any format before)."""
    catalog = SequenceCatalog({f"s{i:03d}": 1 for i in range(200)})
    query = Query(planner(catalog, FakeClock(), tmp_path))
    assert query.batch() is not None
    one_split_at_a_time(query, catalog, 3)
    last = query.offset
    assert last["splitflow"] == SMALL
    catalog.append("s150", 1)
    for version, written_whole in ((SMALL, False), (6, True)):
        restarted = Query(
            planner(catalog, FakeClock(), tmp_path), start={**last, "splitflow": version}
        )
        assert restarted.batch() == [("s150", 1)]
        ref = StateRef.decode(restarted.offset["state"])
        assert (ref.base == restarted.offset["seq"] and not ref.deltas) == written_whole, ref
        restarted.planner.close()


def test_a_snapshot_comes_after_at_most_compact_every_deltas_or_half_its_size(
    tmp_path: Path,
) -> None:
    catalog = SequenceCatalog({f"s{i:03d}": 1 for i in range(100)})
    query = Query(planner(catalog, FakeClock(), tmp_path))
    assert query.batch() is not None
    refs = []
    for _ in range(3 * COMPACT_EVERY):
        one_split_at_a_time(query, catalog, 1)
        refs.append(StateRef.decode(query.offset["state"]))
    assert all(len(ref.deltas) <= COMPACT_EVERY for ref in refs)
    assert len({ref.base for ref in refs}) >= 3  # the base moved on

    # Every split changing every batch: the deltas soon outgrow half the snapshot.
    files = tmp_path / "all" / "offsets"
    query = Query(planner(catalog, FakeClock(), tmp_path / "all"))
    bases = set()
    for _ in range(6):
        for name in catalog.lengths():
            catalog.append(name, 1)
        assert query.batch() is not None
        ref = StateRef.decode(query.offset["state"])
        base = (files / f"snapshot-{ref.base}.json").stat().st_size
        deltas = [(files / f"delta-{d}.json").stat().st_size for d in ref.deltas]
        assert 2 * sum(deltas) <= base, (ref, deltas, base)
        bases.add(ref.base)
    assert len(bases) >= 2, bases


def test_a_replay_reads_the_same_records_after_a_newer_snapshot_superseded_its_base(
    tmp_path: Path,
) -> None:
    """A driver that restarts and replays an old batch (another process: a fresh planner on
    the same directory) gets the same tasks, from that batch's base and deltas."""
    clock = FakeClock()
    catalog = SequenceCatalog({f"s{i:02d}": 2 for i in range(30)})
    query = Query(planner(catalog, clock, tmp_path))
    assert query.batch() is not None
    one_split_at_a_time(query, catalog, 2 * COMPACT_EVERY + 5)
    newest = StateRef.decode(query.ends[-1]["state"]).base
    superseded = [
        (end, records)
        for end, records in zip(query.ends, query.batches, strict=True)
        if StateRef.decode(end["state"]).base < newest and StateRef.decode(end["state"]).deltas
    ]
    assert superseded
    for end, records in superseded:
        again = planner(catalog, clock, tmp_path)
        assert records_of(end, again) == records
        again.close()


def test_every_offset_reads_back_as_the_checkpoint_the_planner_took(tmp_path: Path) -> None:
    """Expanded from its files, each batch's offset is the one the planner built: every
    slice, the enumerator's state, the watermarks (a restarted driver's view of it)."""
    clock = FakeClock()
    catalog = SequenceCatalog({f"s{i:02d}": 2 for i in range(25)})
    query = Query(planner(catalog, clock, tmp_path))
    for n in range(2 * COMPACT_EVERY + 3):
        if n % 7 == 3:
            catalog.add(f"new{n}", 2)  # discovered: the enumerator's state changes too
            clock.advance(DISCOVERY)
        one_split_at_a_time(query, catalog, 1)
        assert query.planner.read_offset(query.offset) == query.planner.planned(query.offset)


@pytest.mark.parametrize("parallelism", [1, 2, 5])
def test_a_restart_from_any_kept_offset_reads_on_exactly_once(
    tmp_path: Path, parallelism: int
) -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({f"s{i:02d}": 2 for i in range(12)})
    query = Query(planner(catalog, clock, tmp_path))
    assert query.batch() is not None
    one_split_at_a_time(query, catalog, COMPACT_EVERY + 7)
    query.planner.close()
    middle = len(query.ends) // 2
    start = query.ends[middle - 1]  # a rollback: the later offsets and commits deleted
    restarted = Query(planner(catalog, clock, tmp_path, parallelism), start=start)
    for name in sorted(catalog.lengths())[:3]:
        catalog.append(name, 4)
    restarted.drain(MaxRecords(10))
    read_before = [r for batch in query.batches[:middle] for r in batch]
    assert_exactly_once(read_before + restarted.read, catalog.records())
    restored = restarted.planner.read_offset(restarted.offset)
    assert restored.parallelism == parallelism


@pytest.mark.parametrize("state_dir", [True, False], ids=["stateDir", "inline"])
def test_a_restart_goes_on_with_the_offsets_an_uninterrupted_run_writes(
    tmp_path: Path, state_dir: bool
) -> None:
    """A restored planner keeps each slice as the offset it restored from left it (not one
    that reads nothing from the split's position), so the offsets after a restart at the
    same parallelism are those of a run that did not stop; a restore re-encodes and writes
    only what the next batch changes."""
    runs = []
    for name in ("uninterrupted", "restarted"):
        clock = FakeClock()
        catalog = SequenceCatalog({f"s{i:02d}": 2 for i in range(12)})
        state = tmp_path / name if state_dir else None
        query = Query(planner(catalog, clock, state, 3))
        assert query.batch() is not None
        one_split_at_a_time(query, catalog, 5)
        restored_from = query.offset
        if name == "restarted":
            query.planner.close()
            query = Query(planner(catalog, clock, state, 3), start=restored_from)
        one_split_at_a_time(query, catalog, 3)
        runs.append([query.planner.read_offset(end).slots for end in query.ends[-3:]])
    uninterrupted, restarted = runs
    assert restarted == uninterrupted
    # slices read batches ago keep the batch that read them (not 0: "none read")
    assert {s.seq for slot in restarted[0] for s in slot} - {0}
    if state_dir:  # the first batch after the restart wrote a delta on the files restored from
        before, after = (
            StateRef.decode(restored_from["state"]),
            StateRef.decode(query.ends[0]["state"]),
        )
        assert after.base == before.base
        assert after.deltas == (*before.deltas, after.deltas[-1])


def test_a_restore_reuses_the_encoded_slices_of_the_offset_it_restored_from(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({f"s{i:02d}": 2 for i in range(8)})
    query = Query(planner(catalog, clock, None, 2))
    assert query.batch() is not None
    one_split_at_a_time(query, catalog, 2)
    restored = planner(catalog, clock, None, 2)
    catalog.append("s03", 1)
    end = restored.latest_offset(query.offset, MaxRecords(10))
    kept = {e[0]: e for slot in query.offset["slots"] for e in slot}
    entries = [e for slot in end["slots"] for e in slot]
    assert {e[0] for e in entries if e is kept[e[0]]} == set(kept) - {"s03"}
    assert [e for e in entries if e[0] == "s03"] != [kept["s03"]]  # read by the batch

    # Entries written by other codec versions are not reused: encoded anew, as before
    offset = restored.read_offset(query.offset)
    encoder = OffsetEncoder(restored.source)
    encoder.seed(offset, {**query.offset, "codecs": [1, 99]})
    anew = encoder.encode(offset)
    assert anew["slots"] == query.offset["slots"]
    assert not any(e is kept[e[0]] for slot in anew["slots"] for e in slot)
    encoder.seed(offset, query.offset)
    again = encoder.encode(offset)
    assert all(e is kept[e[0]] for slot in again["slots"] for e in slot)


def test_commits_delete_the_files_no_kept_offset_refers_to(tmp_path: Path) -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({f"s{i:02d}": 2 for i in range(10)})
    source = SequenceSource(catalog, discovery_interval=DISCOVERY)
    retain = 5
    query = Query(Planner(source, 2, clock=clock, state_dir=str(tmp_path), retain_batches=retain))
    assert query.batch() is not None
    one_split_at_a_time(query, catalog, 3 * COMPACT_EVERY)
    query.planner.commit(query.offset)
    kept = [end for end in query.ends if end["seq"] > query.ends[-1]["seq"] - retain]
    referred: set[str] = set()
    for end in kept:
        ref = StateRef.decode(end["state"])
        referred |= {f"snapshot-{ref.base}.json", *(f"delta-{d}.json" for d in ref.deltas)}
        planner(catalog, clock, tmp_path).read_offset(end)  # every kept offset reads back
    assert set(os.listdir(tmp_path / "offsets")) == referred


def test_a_missing_state_file_or_directory_is_an_error_naming_it(tmp_path: Path) -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"a": 2, "b": 2})
    query = Query(planner(catalog, clock, tmp_path))
    one_split_at_a_time(query, catalog, 3)
    with pytest.raises(ConfigurationError, match="stateDir") as caught:
        planner(catalog, clock, None).latest_offset(query.offset, MaxRecords(10))
    assert caught.value.option == "stateDir"
    ref = StateRef.decode(query.offset["state"])
    missing = tmp_path / "offsets" / f"snapshot-{ref.base}.json"
    missing.unlink()
    with pytest.raises(CheckpointStateError, match=f"{missing} is missing"):
        OffsetState(str(tmp_path)).expand(query.offset)


def test_a_delta_that_does_not_apply_is_an_error_naming_the_state(tmp_path: Path) -> None:
    catalog = SequenceCatalog({f"s{i:02d}": 2 for i in range(50)})
    query = Query(planner(catalog, FakeClock(), tmp_path, parallelism=1))
    one_split_at_a_time(query, catalog, 3)
    ref = StateRef.decode(query.offset["state"])
    path = tmp_path / "offsets" / f"delta-{ref.deltas[-1]}.json"
    delta = orjson.loads(path.read_bytes())
    slot = delta["sub"]["slots"]["sub"]["0"]
    slot["moved"] = {"x": next(iter(slot["moved"].values()))}  # a split the state lacks
    path.write_bytes(to_json(delta))
    with pytest.raises(CheckpointStateError, match=f"delta {ref.deltas[-1]} does not apply"):
        OffsetState(str(tmp_path)).expand(query.offset)


def test_moved_keeps_an_entry_s_split_and_takes_the_rest() -> None:
    document = {"a": ["a", {"n": "a"}, 0, 2, 1, 1], "b": ["b", {"n": "b"}, 0, 1, 1]}
    change = {"moved": {"a": [2, 4, 3]}, "set": {"c": ["c", {"n": "c"}, 0, 0, 0]}}
    assert patched(document, change) == {
        "a": ["a", {"n": "a"}, 2, 4, 3],
        "b": ["b", {"n": "b"}, 0, 1, 1],
        "c": ["c", {"n": "c"}, 0, 0, 0],
    }


# What a query does between two batches: append to a split, add one, end one (seal: read
# to its end, it finishes), remove one, restart the planner from the last offset.
steps = st.lists(
    st.tuples(st.sampled_from(["append", "add", "seal", "remove", "restart"]), st.integers(0, 99)),
    min_size=1,
    max_size=25,
)


@given(steps, st.sampled_from([1, 3]), st.booleans())
@settings(derandomize=True, database=None, deadline=None, max_examples=60)
def test_offsets_built_from_the_last_ones_equal_offsets_built_whole(
    tmp_path_factory: pytest.TempPathFactory,
    script: list[tuple[str, int]],
    parallelism: int,
    state_dir: bool,
) -> None:
    """The planner reuses the last offset's slices, encoded entries and state document
    (only what a batch changed is made anew); every offset must equal the one made whole
    from the checkpoint: its encoding, its slices that read, its state read back, and the
    records read are each read once."""
    clock = FakeClock()
    catalog = SequenceCatalog({f"s{i:02d}": 3 for i in range(7)})
    state = tmp_path_factory.mktemp("state") if state_dir else None
    query = Query(planner(catalog, clock, state, parallelism))
    added = 0
    for step, n in script:
        names = sorted(catalog.lengths())
        open_names = [name for name in names if not catalog.is_sealed(name)]
        if step == "append" and open_names:
            catalog.append(open_names[n % len(open_names)], 1 + n % 4)
        elif step == "add":
            added += 1
            catalog.add(f"new{added:02d}", n % 5)
            clock.advance(DISCOVERY)
        elif step == "seal" and open_names:
            catalog.seal(open_names[n % len(open_names)])
        elif step == "remove" and names and n % 3 == 0:
            # only a split read to its end: removing unread records would lose them
            done = [x for x in names if catalog.length(x) == sum(r[0] == x for r in query.read)]
            if done:
                catalog.remove(done[n % len(done)])
                clock.advance(DISCOVERY)
        elif step == "restart":
            query.planner.close()
            read = query.read
            query = Query(planner(catalog, clock, state, parallelism), start=query.offset)
            query.read = read
        query.batch(MaxRecords(1 + n % 6))
        offset = query.planner.planned(query.offset)
        whole = offset.encode(query.source)  # a fresh encoder: nothing reused
        if query.offset.get("splitflow") == FULL:
            assert query.offset == as_spark_stores_it(whole)
        again = query.planner.read_offset(query.offset)
        assert again == offset
        assert as_spark_stores_it(again.encode(query.source)) == as_spark_stores_it(whole)
        for slot in range(offset.parallelism):
            read = tuple(s for s in offset.slots[slot] if s.seq == offset.seq and s.records > 0)
            assert offset.reading(slot) == read
            assert again.reading(slot) == read
        assert_progress_is_as_computed_whole(query.planner)
    query.drain()
    removed = {name for name, _ in query.read} - set(catalog.lengths())
    expected = catalog.records() + [r for r in query.read if r[0] in removed]
    assert_exactly_once(query.read, expected)


def assert_progress_is_as_computed_whole(planner: Planner[Any, Any]) -> None:
    """The progress report (kept up to date batch by batch) against one computed from every
    held split's position and extent now."""
    planner.progress_splits = 3
    report = planner.lag()
    slots = planner._current()
    held = [split for slot in slots.values() for split in slot.values()]
    extents = planner._settle(planner.coordinator.latest_positions(held))
    lags = {
        sid: max(0, extents[sid].exists_to - split.position)
        for slot in slots.values()
        for sid, split in slot.items()
        if sid in extents
    }
    per_slot = [sum(lags.get(sid, 0) for sid in slots[i]) for i in range(len(slots))]
    assert [s["lag"] for s in report["slots"]] == per_slot
    assert [s["splits"] for s in report["slots"]] == [len(slots[i]) for i in range(len(slots))]
    assert report["totalLag"] == sum(per_slot)
    listed = report["splits"]
    assert len(listed) == min(3, len(lags))
    assert all(row["lag"] == lags[sid] for sid, row in listed.items())
    unlisted = [lag for sid, lag in lags.items() if sid not in listed]
    assert all(row["lag"] >= max(unlisted, default=0) for row in listed.values())


# -- checkpoints written in the formats before -----------------------------------------------

# What splitflow wrote (formats 1 and 2, before slices named the batch that read them) after
# two batches over splits a (5 records), b (3) and c (0) at parallelism 2: batch 1 read
# a[0, 2) and b[0, 2), batch 2 read a[2, 4) and b[2, 3).
_ENUMERATOR_THEN = {
    "split_codec": 1,
    "unassigned": {},
    "assigned": {"a": 0, "c": 0, "b": 1},
    "finished": [],
    "discovered": True,
    "backlog": {"a": 5, "b": 3},
    "backlog_held": False,
}
FORMAT_1_OFFSET = {
    "splitflow": 1,
    "seq": 2,
    "codecs": [1, 1],
    "enumerator": _ENUMERATOR_THEN,
    "slots": [
        [
            ["a", {"name": "a", "end": None, "position": 2}, 4],
            ["c", {"name": "c", "end": None, "position": 0}, 0],
        ],
        [["b", {"name": "b", "end": None, "position": 2}, 3]],
    ],
    "backlog": True,
    "events_through": 1,
    "to_readers": {},
}
_TOKEN = "aba65047662e4ab99575a6d93cd9ab26"
FORMAT_2_OFFSET = {
    "splitflow": 2,
    "seq": 2,
    "codecs": [1, 1],
    "backlog": True,
    "events_through": 1,
    "to_readers": {},
    "ledger": {"base": 0, "deltas": [], "size": 0},
    "owner": _TOKEN,
    "parallelism": 2,
    "state": {"base": 1, "deltas": [2], "size": 3},
}
FORMAT_2_FILES = {
    "owner.json": {"token": _TOKEN, "committed": True},
    "ledger/snapshot-0.json": {"ids": []},
    "offsets/snapshot-1.json": {
        "enumerator": _ENUMERATOR_THEN,
        "slots": {
            "0": {
                "a": ["a", {"name": "a", "end": None, "position": 0}, 2],
                "c": ["c", {"name": "c", "end": None, "position": 0}, 0],
            },
            "1": {"b": ["b", {"name": "b", "end": None, "position": 0}, 2]},
        },
        "event_times": {},
    },
    "offsets/delta-2.json": {
        "sub": {
            "slots": {
                "sub": {
                    "0": {"set": {"a": ["a", {"name": "a", "end": None, "position": 2}, 4]}},
                    "1": {"set": {"b": ["b", {"name": "b", "end": None, "position": 2}, 3]}},
                }
            }
        }
    },
}


# The same two batches as formats 3 (whole) and 4 (small) wrote them, before slices named
# where they start: an entry is [split id, split at its start, stop, the batch that read it].
def _split(name: str, position: int) -> dict[str, Any]:
    return {"name": name, "end": None, "position": position}


FORMAT_3_OFFSET = {
    **FORMAT_1_OFFSET,
    "splitflow": 3,
    "slots": [
        [["a", _split("a", 2), 4, 2], ["c", _split("c", 0), 0, 0]],
        [["b", _split("b", 2), 3, 2]],
    ],
}
FORMAT_4_OFFSET = {**FORMAT_2_OFFSET, "splitflow": 4}
FORMAT_4_FILES = {
    **FORMAT_2_FILES,
    "offsets/snapshot-1.json": {
        "enumerator": _ENUMERATOR_THEN,
        "slots": {
            "0": {"a": ["a", _split("a", 0), 2, 1], "c": ["c", _split("c", 0), 0, 0]},
            "1": {"b": ["b", _split("b", 0), 2, 1]},
        },
        "event_times": {},
    },
    "offsets/delta-2.json": {
        "sub": {
            "slots": {
                "sub": {
                    "0": {"set": {"a": ["a", _split("a", 2), 4, 2]}},
                    "1": {"set": {"b": ["b", _split("b", 2), 3, 2]}},
                }
            }
        }
    },
}
# Format 6, before deltas named the slices that moved on: every changed entry set whole.
FORMAT_6_OFFSET = {**FORMAT_2_OFFSET, "splitflow": 6}
FORMAT_6_FILES = {
    **FORMAT_2_FILES,
    "offsets/snapshot-1.json": {
        "enumerator": _ENUMERATOR_THEN,
        "slots": {
            "0": {"a": ["a", _split("a", 0), 0, 2, 1], "c": ["c", _split("c", 0), 0, 0, 0]},
            "1": {"b": ["b", _split("b", 0), 0, 2, 1]},
        },
        "event_times": {},
    },
    "offsets/delta-2.json": {
        "sub": {
            "slots": {
                "sub": {
                    "0": {"set": {"a": ["a", _split("a", 0), 2, 4, 2]}},
                    "1": {"set": {"b": ["b", _split("b", 0), 2, 3, 2]}},
                }
            }
        }
    },
}
OLD_FORMATS = {
    1: (FORMAT_1_OFFSET, None),
    2: (FORMAT_2_OFFSET, FORMAT_2_FILES),
    3: (FORMAT_3_OFFSET, None),
    4: (FORMAT_4_OFFSET, FORMAT_4_FILES),
    6: (FORMAT_6_OFFSET, FORMAT_6_FILES),
}


@pytest.mark.parametrize("parallelism", [2, 3])
@pytest.mark.parametrize("version", sorted(OLD_FORMATS), ids=lambda v: f"format {v}")
def test_a_checkpoint_of_a_format_before_replays_its_batch_and_restarts(
    tmp_path: Path, version: int, parallelism: int
) -> None:
    written, files = OLD_FORMATS[version]
    small = files is not None
    state = tmp_path / "state" if small else None
    if state is not None and files is not None:
        for name, content in files.items():
            (state / name).parent.mkdir(parents=True, exist_ok=True)
            (state / name).write_text(json.dumps(content))
        events = EventStore(str(state))
        for seq in (1, 2):  # each batch's two tasks wrote their (no) reader events
            for slot in (0, 1):
                events.write(seq, slot, slot, [])
    offset = as_spark_stores_it(written)
    catalog = SequenceCatalog({"a": 5, "b": 3, "c": 0})
    replay = planner(catalog, FakeClock(), state, parallelism)
    assert sorted(records_of(offset, replay)) == [("a", 2), ("a", 3), ("b", 2)]

    catalog.append("c", 2)
    query = Query(planner(catalog, FakeClock(), state, parallelism), start=offset)
    query.drain()
    assert sorted(query.read) == [("a", 4), ("c", 0), ("c", 1)]
    assert query.offset["splitflow"] == (SMALL if small else FULL)
    if small:  # the state after older files is written whole, not as a delta on them
        first = query.ends[0]
        assert first["state"]["base"] == first["seq"]
        assert first["state"]["deltas"] == []
