"""Review findings on the ledger, backlog and byte-budget changes: each test fails today.

Fast (no Spark): the planner driven directly, the files source on a temporary directory.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from tests.spark.test_ledger import finish_splits, planner
from tests.spark.test_planner import FakeClock, Query

from splitflow.api.enumerator import SplitExtent
from splitflow.cli import main
from splitflow.connectors.files import FilesSource
from splitflow.spark.ledger import COMPACT_EVERY
from splitflow.spark.limits import ReadAll, share_bytes
from splitflow.spark.planner import Planner
from splitflow.testing.sequence import SequenceCatalog, SequenceSource, SequenceSplit


def write_file(directory: Path, name: str, rows: int) -> int:
    path = directory / name
    path.write_text("".join(json.dumps({"file": name, "n": i}) + "\n" for i in range(rows)))
    return path.stat().st_size


def admitting_one_file_at_a_time(tmp_path: Path, threshold: int | None) -> Planner[Any, Any]:
    source = FilesSource(str(tmp_path), "json", discovery_interval=1.0, max_files_per_batch=1)
    ticks = itertools.count()
    return Planner(source, 2, clock=lambda: float(next(ticks)), backlog_lag_threshold=threshold)


def test_share_bytes_reads_a_whole_backlog_that_fits_the_budget() -> None:
    assert share_bytes({"a": 10, "b": 5}, {"a": 0.1, "b": 0.2}, 10**9) == {"a": 10, "b": 5}


def test_files_waiting_for_admission_count_toward_the_lag_threshold(tmp_path: Path) -> None:
    p = admitting_one_file_at_a_time(tmp_path, threshold=1_000)
    start = p.initial_offset()  # empty directory: what comes later is live, not backlog
    waiting = sum(write_file(tmp_path, f"f{i}.json", 20) for i in range(10))
    assert waiting > 5_000
    p.latest_offset(start, ReadAll())
    assert p.in_backlog, f"{waiting} bytes behind, threshold 1000, still not in backlog"


def test_progress_lag_counts_files_waiting_for_admission(tmp_path: Path) -> None:
    p = admitting_one_file_at_a_time(tmp_path, threshold=None)
    start = p.initial_offset()
    sizes = [write_file(tmp_path, f"f{i}.json", 20) for i in range(10)]
    p.latest_offset(start, ReadAll())  # admits and plans one file in full
    assert p.lag()["totalLag"] >= sum(sizes) - max(sizes)


def test_default_backlog_boundary_is_what_exists_not_what_is_admitted() -> None:
    p: Planner[Any, Any] = Planner(SequenceSource(SequenceCatalog({"a": 0})), 1)
    p.initial_offset()
    enumerator: Any = p.coordinator.enumerator
    boundary = enumerator.backlog_boundary(SequenceSplit("x"), SplitExtent(0, available=100), True)
    p.close()
    assert boundary == 100


def test_inspect_an_older_batch_whose_ledger_was_discarded_fails_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = FakeClock()
    catalog = SequenceCatalog({"live": 1})
    state = tmp_path / "state"
    query = Query(planner(catalog, clock, state, retain_batches=1))
    finish_splits(query, catalog, clock, ["f-first"])
    first = query.offset
    for round_ in range(2 * COMPACT_EVERY):
        finish_splits(query, catalog, clock, [f"f{round_}"])
    query.planner.commit(query.offset)  # keeps only its own offset: deletes older files
    offsets = tmp_path / "chk" / "offsets"
    offsets.mkdir(parents=True)
    for batch, offset in ((0, first), (1, query.offset)):
        (offsets / str(batch)).write_text("v1\n{}\n" + json.dumps(offset) + "\n")
    assert not os.path.exists(state / "ledger" / f"snapshot-{first['ledger']['base']}.json")

    code = main(["inspect", str(tmp_path / "chk"), "--batch", "0", "--state-dir", str(state)])
    assert code == 2
    assert "batch 0" in capsys.readouterr().err
