"""The sequence catalog's versions: what ``changes`` tells, in memory and across processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitflow.testing import SequenceCatalog


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
