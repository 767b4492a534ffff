"""A split that vanishes under a planned slice is data loss: fail, or skip when told to."""

from __future__ import annotations

import logging

import pytest

from splitflow.api.reader import InputStatus
from splitflow.errors import DataLossError
from splitflow.reader import Collector
from splitflow.testing import RecordingReaderContext, SequenceCatalog, SequenceSource
from splitflow.testing.sequence import SequenceSplit


def read_planned(source: SequenceSource) -> tuple[list[tuple[str, int]], RecordingReaderContext]:
    context = RecordingReaderContext()
    reader = source.create_reader(context)
    reader.start()
    reader.add_splits(
        [SequenceSplit("gone", position=2), SequenceSplit("kept", position=0)],
        stop_at={"gone": 8, "kept": 5},
    )
    reader.notify_no_more_splits()
    source.catalog.remove("gone")  # after planning, before reading: like a Spark task
    out: Collector[tuple[str, int]] = Collector()
    try:
        while reader.poll_next(out) is not InputStatus.END_OF_INPUT:
            pass
    finally:
        reader.close()
    return list(out), context


def test_a_split_vanishing_under_a_planned_slice_fails_naming_split_and_range() -> None:
    source = SequenceSource(SequenceCatalog({"gone": 10, "kept": 10}))
    with pytest.raises(DataLossError, match=r"records \[2, 8\) of split gone") as error:
        read_planned(source)
    assert error.value.split_id == "gone"
    assert "failOnDataLoss=false" in str(error.value)


def test_with_fail_on_data_loss_off_the_lost_split_ends_and_the_others_are_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = SequenceSource(SequenceCatalog({"gone": 10, "kept": 10}), fail_on_data_loss=False)
    with caplog.at_level(logging.WARNING, logger="splitflow.testing"):
        records, context = read_planned(source)
    assert records == [("kept", i) for i in range(5)]
    assert "gone" in context.finished_ids()  # ended: the enumerator forgets it
    assert "records [2, 8) of split gone are lost" in caplog.text
