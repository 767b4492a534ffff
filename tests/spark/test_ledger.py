"""The enumerator's ledger in the state directory: out of Spark's offsets, exact, restorable.

A source that finishes many splits (a files source remembers every file it read) must not
copy the finished ids into each of the offsets Spark keeps: with ``stateDir`` they live in
``<stateDir>/ledger`` (a snapshot every few changes, a delta per batch that changed them)
and the offset names the files.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.spark.test_planner import DISCOVERY, FakeClock, Query, assert_exactly_once

from splitflow.api.events import SplitEventTimesEvent
from splitflow.errors import CheckpointStateError, ConfigurationError
from splitflow.inspect import read_checkpoint
from splitflow.spark.events import EventStore
from splitflow.spark.ledger import COMPACT_EVERY, LedgerStore
from splitflow.spark.limits import ReadAll
from splitflow.spark.planner import Planner
from splitflow.spark.snapshots import RETAIN_BATCHES, StateRef
from splitflow.testing.sequence import SequenceCatalog, SequenceSource

PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=60)


# -- the store ------------------------------------------------------------------------------------


@given(
    st.lists(
        st.tuples(st.sets(st.integers(0, 40), max_size=6), st.sets(st.integers(0, 40))),
        min_size=1,
        max_size=3 * COMPACT_EVERY,
    )
)
@PROPERTY
def test_every_ledger_written_loads_back_exactly(steps: list[tuple[set[int], set[int]]]) -> None:
    with _tmpdir() as state_dir:
        store = LedgerStore(state_dir)
        ids: set[str] = set()
        written: list[tuple[StateRef, frozenset[str]]] = []
        for seq, (added, dropped) in enumerate(steps):
            ids |= {f"s{i}" for i in added}
            ids -= {f"s{i}" for i in dropped if i % 3 == 0}  # mostly grows
            written.append((store.write(seq, frozenset(ids)), frozenset(ids)))
        for ref, expected in written:  # a fresh store, as after a restart
            assert LedgerStore(state_dir).load(ref) == expected
            assert ref.size == len(expected)
            assert len(ref.deltas) <= COMPACT_EVERY


def test_a_batch_that_changes_nothing_writes_nothing(tmp_path: Path) -> None:
    store = LedgerStore(str(tmp_path))
    first = store.write(1, frozenset({"a"}))
    assert store.write(2, frozenset({"a"})) == first
    second = store.write(3, frozenset({"a", "b"}))
    assert second == StateRef(1, (3,), 2)
    assert sorted(os.listdir(tmp_path / "ledger")) == ["delta-3.json", "snapshot-1.json"]
    delta = json.loads((tmp_path / "ledger" / "delta-3.json").read_text())
    assert delta == {"add": ["b"], "drop": []}


def test_the_ledger_is_written_whole_again_after_compact_every_deltas(tmp_path: Path) -> None:
    store = LedgerStore(str(tmp_path))
    refs = [store.write(seq, frozenset(f"s{i}" for i in range(seq + 1))) for seq in range(25)]
    assert [r.base for r in refs] == [0] * 11 + [11] * 11 + [22] * 3
    assert refs[10].deltas == tuple(range(1, 11))
    assert refs[11] == StateRef(11, (), 12)


def test_committing_deletes_only_files_no_kept_offset_needs(tmp_path: Path) -> None:
    store = LedgerStore(str(tmp_path))
    refs = [store.write(seq, frozenset(f"s{i}" for i in range(seq + 1))) for seq in range(14)]
    store.keep_from(10)  # the oldest offset Spark keeps is batch 10's: base 0, nothing goes
    assert len(os.listdir(tmp_path / "ledger")) == 14
    store.keep_from(12)  # batch 12's: base 11
    assert sorted(os.listdir(tmp_path / "ledger")) == [
        "delta-12.json",
        "delta-13.json",
        "snapshot-11.json",
    ]
    for seq in (11, 12, 13):
        assert LedgerStore(str(tmp_path)).load(refs[seq]) == {f"s{i}" for i in range(seq + 1)}


def test_a_restore_deletes_the_files_of_later_batches_before_they_are_planned_again(
    tmp_path: Path,
) -> None:
    """Batches 0 to 14 ran (a snapshot at 11); the query is rolled back to batch 9. Planned
    again, batch 10 finishes nothing and batch 11 writes a delta where the abandoned
    snapshot was: had that snapshot stayed, committing batch 11 would take it for the base
    of the offsets kept and delete snapshot 0, which they read from."""
    store = LedgerStore(str(tmp_path))
    ids = [frozenset(f"s{i}" for i in range(seq + 1)) for seq in range(15)]
    refs = [store.write(seq, ids[seq]) for seq in range(15)]
    assert refs[11] == StateRef(11, (), 12)

    again = LedgerStore(str(tmp_path))
    assert again.load(refs[9]) == ids[9]
    again.resume_at(9)
    assert sorted(os.listdir(tmp_path / "ledger")) == sorted(
        ["snapshot-0.json", *(f"delta-{seq}.json" for seq in range(1, 10))]
    )
    assert again.write(10, ids[9]) == refs[9]
    replanned = again.write(11, ids[9] | {"late"})
    assert replanned == StateRef(0, (*range(1, 10), 11), 11)
    again.keep_from(11)
    assert LedgerStore(str(tmp_path)).load(replanned) == ids[9] | {"late"}
    assert LedgerStore(str(tmp_path)).load(refs[9]) == ids[9]


def test_a_missing_ledger_file_is_an_error_naming_the_file(tmp_path: Path) -> None:
    store = LedgerStore(str(tmp_path))
    ref = store.write(4, frozenset({"a"}))
    os.remove(tmp_path / "ledger" / "snapshot-4.json")
    with pytest.raises(CheckpointStateError, match=r"snapshot-4\.json is missing") as caught:
        LedgerStore(str(tmp_path)).load(ref)
    assert caught.value.path.endswith("snapshot-4.json")


def test_a_ledger_that_does_not_match_its_checkpoint_is_an_error(tmp_path: Path) -> None:
    store = LedgerStore(str(tmp_path))
    ref = store.write(1, frozenset({"a", "b"}))
    (tmp_path / "ledger" / "snapshot-1.json").write_text('{"ids": ["a"]}')
    with pytest.raises(CheckpointStateError, match="holds 1 ids where the checkpoint says 2"):
        LedgerStore(str(tmp_path)).load(ref)


# -- the planner ----------------------------------------------------------------------------------


def planner(
    catalog: SequenceCatalog,
    clock: FakeClock,
    state_dir: Path | None,
    retain_batches: int = RETAIN_BATCHES,
) -> Planner[Any, Any]:
    source = SequenceSource(catalog, discovery_interval=DISCOVERY)
    state = str(state_dir) if state_dir else None
    return Planner(source, 2, clock=clock, state_dir=state, retain_batches=retain_batches)


def finish_splits(
    query: Query, catalog: SequenceCatalog, clock: FakeClock, names: list[str]
) -> None:
    """Add ``names`` as sealed splits of 3 records each and read them to their end, then
    one record of split ``live`` (a batch after theirs)."""
    for name in names:
        catalog.add(name, 3)
        catalog.seal(name)
    clock.advance(DISCOVERY)
    query.drain()
    catalog.append("live", 1)
    query.drain()


def test_with_a_state_dir_offsets_stay_the_same_size_as_finished_splits_pile_up(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"live": 1})
    query = Query(planner(catalog, clock, tmp_path))
    sizes = []
    for round_ in range(4):
        finish_splits(query, catalog, clock, [f"file-{round_}-{i:03d}" for i in range(200)])
        sizes.append(len(json.dumps(query.offset)))
        assert "file-0-000" not in json.dumps(query.offset)
    assert max(sizes) - min(sizes) < 100, sizes  # bytes: the ledger reference only
    offset = query.planner.read_offset(query.offset)
    assert offset.ledger is not None
    assert offset.ledger.size == 800
    assert offset.enumerator.finished == frozenset()

    # Without a state directory the same run copies every finished id into every offset.
    catalog_inline, clock_inline = SequenceCatalog({"live": 1}), FakeClock()
    inline = Query(planner(catalog_inline, clock_inline, None))
    finish_splits(inline, catalog_inline, clock_inline, [f"f{i:03d}" for i in range(200)])
    assert len(inline.planner.read_offset(inline.offset).enumerator.finished) == 200


def test_a_restarted_query_never_reads_a_finished_split_again(tmp_path: Path) -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"live": 2})
    before = Query(planner(catalog, clock, tmp_path))
    finish_splits(before, catalog, clock, [f"f{i}" for i in range(30)])
    before.planner.close()

    after = Query(planner(catalog, clock, tmp_path), start=before.offset)
    catalog.append("live", 2)
    finish_splits(after, catalog, clock, ["g0", "g1"])
    assert_exactly_once(before.read + after.read, catalog.records())
    restored = after.planner.read_offset(after.offset)
    assert restored.ledger is not None
    assert LedgerStore(str(tmp_path)).load(restored.ledger) == {
        *(f"f{i}" for i in range(30)),
        "g0",
        "g1",
    }


def test_restoring_a_ledger_checkpoint_without_its_state_dir_names_the_option(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"live": 1})
    query = Query(planner(catalog, clock, tmp_path))
    finish_splits(query, catalog, clock, ["f0"])
    with pytest.raises(ConfigurationError, match="stateDir") as caught:
        planner(catalog, clock, None).latest_offset(query.offset, ReadAll())
    assert caught.value.option == "stateDir"


def test_commits_keep_the_ledger_directory_small(tmp_path: Path) -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"live": 1})
    query = Query(planner(catalog, clock, tmp_path, retain_batches=1))
    for round_ in range(3 * COMPACT_EVERY):
        finish_splits(query, catalog, clock, [f"f{round_}"])
    query.planner.commit(query.offset)
    assert len(os.listdir(tmp_path / "ledger")) <= COMPACT_EVERY + 1
    restarted = Query(planner(catalog, clock, tmp_path), start=query.offset)
    catalog.append("live", 1)
    clock.advance(DISCOVERY)
    restarted.drain()
    assert_exactly_once(query.read + restarted.read, catalog.records())


def test_after_150_batches_every_offset_spark_keeps_restores_and_older_state_is_gone(
    tmp_path: Path,
) -> None:
    """Spark keeps the offsets of its last 100 batches (``minBatchesToRetain``; here the
    default ``stateRetainBatches``). After 150 committed batches, the ledger and the reader
    events of every offset from batch 51 on are in the state directory, nothing older is,
    and a query rolled back to the oldest of them restores from it and reads on exactly
    once."""
    clock = FakeClock()
    catalog = SequenceCatalog({"live": 1})
    query = Query(planner(catalog, clock, tmp_path))
    events = EventStore(str(tmp_path))
    finished: dict[int, frozenset[str]] = {0: frozenset()}  # seq -> the ledger after it
    while len(query.ends) < 151:  # running batch 151 commits batch 150
        name = f"f{len(query.ends):03d}"
        catalog.add(name, 2)
        catalog.seal(name)
        clock.advance(DISCOVERY)
        if query.batch() is not None:
            seq = int(query.offset["seq"])
            events.write(seq, 0, slot=0, events=[SplitEventTimesEvent.of({"live": seq})])
            enumerator: Any = query.planner.coordinator.enumerator
            finished[seq] = enumerator.finished_splits()
    kept = [end for end in query.ends if end["seq"] >= 51]
    assert [end["seq"] for end in kept] == list(range(51, 152))
    referred = set()
    for end in kept:
        ref = StateRef.decode(end["ledger"])
        assert LedgerStore(str(tmp_path)).load(ref) == finished[end["seq"]]
        assert events.read(end["seq"])[1] == [(0, SplitEventTimesEvent.of({"live": end["seq"]}))]
        referred |= {f"snapshot-{ref.base}.json", *(f"delta-{d}.json" for d in ref.deltas)}
    assert set(os.listdir(tmp_path / "ledger")) == referred
    assert sorted(map(int, os.listdir(tmp_path / "events"))) == list(range(51, 152))
    older = next(end for end in query.ends if end["ledger"]["base"] < kept[0]["ledger"]["base"])
    with pytest.raises(CheckpointStateError, match="is missing"):
        LedgerStore(str(tmp_path)).load(StateRef.decode(older["ledger"]))

    rolled_back = Query(planner(catalog, clock, tmp_path), start=kept[0])
    catalog.append("live", 3)
    clock.advance(DISCOVERY)
    rolled_back.drain()
    read_before = [r for batch in query.batches[:51] for r in batch]
    assert_exactly_once(read_before + rolled_back.read, catalog.records())


def test_inspect_lists_ledger_splits_with_the_state_dir_and_asks_for_it_without(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"live": 1})
    query = Query(planner(catalog, clock, tmp_path / "state"))
    finish_splits(query, catalog, clock, ["f0", "f1"])
    offsets = tmp_path / "chk" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "0").write_text("v1\n{}\n" + json.dumps(query.offset) + "\n")

    with pytest.raises(ConfigurationError, match="pass --state-dir"):
        read_checkpoint(str(tmp_path / "chk"))  # its splits are in the state directory
    [listed] = read_checkpoint(str(tmp_path / "chk"), state_dir=str(tmp_path / "state"))
    assert sorted(r.split_id for r in listed.splits if r.state == "finished") == ["f0", "f1"]


def _tmpdir() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory()
