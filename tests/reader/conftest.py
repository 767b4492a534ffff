"""Fixtures for reader tests: both fetch modes, and readers closed (no thread leaked)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.reader.fakes import WAIT, Reader, RecordingContext, Script, fetcher_threads, make_reader

from splitflow.testing.sequence import SequenceCatalog

NewReader = Callable[..., tuple[Reader, RecordingContext, Script]]


@pytest.fixture(params=[0, 2], ids=["sync", "threaded"])
def fetch_threads(request: pytest.FixtureRequest) -> int:
    """Every test that takes this runs with fetching on the reader's thread and on 2 threads."""
    return int(request.param)


@pytest.fixture
def new_reader() -> Iterator[NewReader]:
    """``make_reader``, closing every reader it made after the test, then checking threads."""
    made: list[Reader] = []

    def new(catalog: SequenceCatalog, script: Script | None = None, **options: Any) -> Any:
        reader, context, script = make_reader(catalog, script, **options)
        made.append(reader)
        return reader, context, script

    yield new
    for reader in made:
        with contextlib.suppress(Exception):
            reader.close()
    for thread in fetcher_threads():
        thread.join(WAIT)
    assert not fetcher_threads(), "a fetcher thread outlived its reader's close()"
