"""Random sequences of everything that moves splits, with the ownership invariants checked
after every step and exactly-once checked at the end.

Steps: new splits appear and are discovered, records are appended, readers read, splits
finish (sealed and read to the end), checkpoints are taken and completed, a reader fails
(partial failover), the whole job restores, or restores with another parallelism.

After every step:
* every split the enumerator ever discovered and that has not finished has exactly one
  holder: the enumerator or one reader; no split has two;
* committed output holds no record twice;
* right after a global restore or rescale, reader loads differ by at most one split;
* a partial failover leaves the other readers' splits where they were.
At the end, after reading everything: committed output == every record, once.
"""

from __future__ import annotations

import contextlib
import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from splitflow.api.assigner import AssignerState
from splitflow.errors import CheckpointDeclinedError
from splitflow.testing import (
    SequenceCatalog,
    SequenceSource,
    SequenceSplit,
    SourceHarness,
    assigning_enumerator_owned,
    count_duplicates,
)

Harness = SourceHarness[tuple[str, int], SequenceSplit, AssignerState[SequenceSplit]]


class SplitOwnership(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.catalog = SequenceCatalog()
        self.names = (f"s{i:03d}" for i in itertools.count())
        self.source = SequenceSource(self.catalog, discovery_interval=1.0, fetch_size=3)
        self.harness: Harness = SourceHarness(self.source, 3)
        self.discovered: set[str] = set()
        self.open_checkpoints: list[int] = []

    # -- the world changes --------------------------------------------------------------

    @rule(length=st.integers(0, 12))
    def new_split(self, length: int) -> None:
        self.catalog.add(next(self.names), length)

    @precondition(lambda self: self._unsealed())
    @rule(data=st.data(), count=st.integers(1, 10))
    def append_records(self, data: st.DataObject, count: int) -> None:
        name = data.draw(st.sampled_from(self._unsealed()))
        self.catalog.append(name, count)

    @precondition(lambda self: self._unsealed())
    @rule(data=st.data())
    def seal_split(self, data: st.DataObject) -> None:
        self.catalog.seal(data.draw(st.sampled_from(self._unsealed())))

    def _unsealed(self) -> list[str]:
        return sorted(n for n in self.catalog.lengths() if not self.catalog.is_sealed(n))

    # -- the job runs -------------------------------------------------------------------

    @rule()
    def discover(self) -> None:
        names = set(self.catalog.lengths())
        self.harness.advance(1.0)
        self.discovered |= names

    @rule(data=st.data(), polls=st.integers(1, 4))
    def read(self, data: st.DataObject, polls: int) -> None:
        reader = data.draw(st.sampled_from(sorted(self.harness.slots)))
        self.harness.poll(reader, max_polls=polls)
        self.harness.settle()

    @rule()
    def checkpoint(self) -> None:
        with contextlib.suppress(CheckpointDeclinedError):
            self.open_checkpoints.append(self.harness.checkpoint())

    @rule()
    def checkpoint_and_complete(self) -> None:
        with contextlib.suppress(CheckpointDeclinedError):
            self.harness.complete(self.harness.checkpoint())
            self.open_checkpoints = []

    @precondition(lambda self: self.open_checkpoints)
    @rule(latest=st.booleans())
    def complete_checkpoint(self, latest: bool) -> None:
        checkpoint_id = self.open_checkpoints[-1] if latest else self.open_checkpoints[0]
        self.harness.complete(checkpoint_id)
        self.open_checkpoints = [c for c in self.open_checkpoints if c > checkpoint_id]

    # -- failures -----------------------------------------------------------------------

    @rule(data=st.data())
    def fail_reader(self, data: st.DataObject) -> None:
        reader = data.draw(st.sampled_from(sorted(self.harness.slots)))
        before = self._split_ids_by_reader()
        self.harness.fail_reader(reader)
        self.open_checkpoints = []  # a failure aborts checkpoints in flight
        after = self._split_ids_by_reader()
        for other, split_ids in before.items():
            if other != reader:
                assert after[other] == split_ids, f"reader {other} lost or gained splits"

    @rule()
    def global_restore(self) -> None:
        self._restore(None)

    @rule(parallelism=st.integers(1, 6))
    def rescale(self, parallelism: int) -> None:
        self._restore(parallelism)

    def _restore(self, parallelism: int | None) -> None:
        names = set(self.catalog.lengths())
        self.harness.restore(parallelism)
        self.discovered |= names  # a restarted enumerator discovers at start
        self.open_checkpoints = []
        loads = self.harness.loads()
        assert max(loads.values()) - min(loads.values()) <= 1, f"unbalanced: {loads}"

    def _split_ids_by_reader(self) -> dict[int, set[str]]:
        return {r: {s.split_id for s in ss} for r, ss in self.harness.reader_splits().items()}

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def every_open_split_has_exactly_one_holder(self) -> None:
        owners = self.harness.ownership(assigning_enumerator_owned)
        finished = self.harness.coordinator.run(lambda e: e.finished_splits())  # type: ignore[attr-defined]
        self.harness.scheduler.run_until_idle()
        done = finished.result()
        doubly = {sid: who for sid, who in owners.items() if len(who) > 1}
        assert not doubly, f"owned twice: {doubly}"
        lost = sorted(sid for sid in self.discovered - done if sid not in owners)
        assert not lost, f"discovered, unfinished, and owned by nobody: {lost}"

    @invariant()
    def nothing_committed_twice(self) -> None:
        duplicates = count_duplicates(self.harness.committed())
        assert not duplicates, f"committed twice: {duplicates}"

    def teardown(self) -> None:
        try:
            self.harness.advance(1.0)
            self.harness.read_available()
            self.harness.complete(self.harness.checkpoint())
            committed = self.harness.committed()
            assert not count_duplicates(committed)
            assert sorted(committed) == self.catalog.records()
        finally:
            self.harness.close()


TestSplitOwnership = SplitOwnership.TestCase
TestSplitOwnership.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
