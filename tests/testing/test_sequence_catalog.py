"""The sequence catalog's versions: what ``changes`` and ``versions`` tell, in memory and
across processes, and the discovery that builds on them."""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import MagicMock

import pytest

from splitflow.testing import SequenceCatalog
from splitflow.testing.sequence import SequenceEnumerator, SequenceSource


@pytest.fixture(params=["memory", "file"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> SequenceCatalog:
    path = str(tmp_path / "catalog.json") if request.param == "file" else None
    return SequenceCatalog({"a": 1, "b": 2, "c": 3}, path=path)


def test_changes_since_a_version_are_every_split_added_appended_sealed_or_removed_since(
    catalog: SequenceCatalog,
) -> None:
    start, nothing = catalog.changes(None)
    assert nothing == {}
    catalog.append("a", 4)
    middle, _ = catalog.changes(None)
    catalog.add("d", 7)
    catalog.seal("b")
    catalog.remove("c")
    catalog.append("a", 1)
    version, changed = catalog.changes(start)
    assert changed == {"a": (6, False), "b": (2, True), "c": None, "d": (7, False)}
    assert catalog.changes(middle)[1] == {
        "a": (6, False),
        "b": (2, True),
        "c": None,
        "d": (7, False),
    }
    assert catalog.changes(version) == (version, {})


def test_a_process_reading_the_file_sees_the_changes_another_made(tmp_path: Path) -> None:
    path = str(tmp_path / "catalog.json")
    writer = SequenceCatalog({"a": 1, "b": 2}, path=path)
    reader = SequenceCatalog.named(writer.key)  # as a Spark runner process opens it
    version, _ = reader.changes(None)
    writer.append("b", 3)
    assert reader.changes(version)[1] == {"b": (5, False)}


def test_a_catalog_written_over_a_file_goes_on_from_its_version_everything_changed(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "catalog.json")
    first = SequenceCatalog({"a": 1, "b": 2}, path=path)
    first.append("a", 1)
    version, _ = first.changes(None)
    SequenceCatalog({"b": 9, "z": 1}, path=path)
    assert first.changes(version)[1] == {"a": None, "b": (9, False), "z": (1, False)}


def test_a_version_newer_than_the_catalog_cannot_tell_what_changed(
    catalog: SequenceCatalog,
) -> None:
    catalog.append("a", 1)
    version, _ = catalog.changes(None)
    assert catalog.changes(version + 5) == (version, None)


def test_the_members_version_moves_only_when_a_split_is_added_or_removed(
    catalog: SequenceCatalog,
) -> None:
    version, members = catalog.versions()
    catalog.append("a", 4)
    catalog.seal("b")
    assert catalog.versions() == (version + 2, members)
    catalog.add("d")
    added = catalog.versions()
    assert added == (version + 3, version + 3)
    catalog.remove("c")
    assert catalog.versions() == (version + 4, version + 4)
    if catalog.path is not None:  # another process reads both from the file
        assert SequenceCatalog.named(catalog.key).versions() == catalog.versions()


def test_a_catalog_file_without_a_members_version_counts_every_split_as_new(
    tmp_path: Path,
) -> None:
    """A file written before the members version: the catalog's version stands for it (a
    listing made before is listed again)."""
    path = tmp_path / "catalog.json"
    SequenceCatalog({"a": 1}, path=str(path)).append("a", 2)
    data = json.loads(path.read_text())
    del data["members"]
    path.write_text(json.dumps(data))
    version, members = SequenceCatalog(path=str(path)).versions()
    assert members == version == data["version"]


@pytest.mark.parametrize("bounded", [False, True])
def test_discovery_lists_the_catalog_again_only_when_its_splits_may_differ(
    catalog: SequenceCatalog, bounded: bool
) -> None:
    """The same tuple while no split was added or removed (bounded: nor appended to, which
    moves the splits' ends); a listing of the catalog otherwise."""
    source = SequenceSource(catalog, bounded=bounded)
    enumerator = SequenceEnumerator(source, MagicMock(), None)
    first = enumerator.discover_splits()
    assert [s.name for s in first] == ["a", "b", "c"]
    catalog.append("a", 1)
    catalog.seal("b")
    after = enumerator.discover_splits()
    assert (after is first) is not bounded
    if bounded:
        assert [(s.name, s.end) for s in after] == [("a", 2), ("b", 2), ("c", 3)]
    assert enumerator.discover_splits() is after
    catalog.add("d", 1)
    added = enumerator.discover_splits()
    assert [s.name for s in added] == ["a", "b", "c", "d"]
    assert added[:3] == after  # the splits kept are the same
    catalog.remove("a")
    assert [s.name for s in enumerator.discover_splits()] == ["b", "c", "d"]
