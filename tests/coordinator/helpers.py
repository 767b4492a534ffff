"""Test doubles shared by the coordinator and api tests.

``Split``: the smallest split there is. ``RecordingGateway``: a ReaderGateway that keeps every
message. ``RecordingEnumerator``: records every call (and the thread it ran on) and runs
optional scripted behaviour. ``FakeSource`` / ``ReassigningFakeSource``: sources that build a
given enumerator, without and with FLIP-537 reassignment on recovery.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from splitflow.api.enumerator import SplitEnumerator, SplitEnumeratorContext
from splitflow.api.events import SourceEvent
from splitflow.api.reader import SourceReader, SourceReaderContext
from splitflow.api.source import Boundedness, Source, SupportsSplitReassignmentOnRecovery
from splitflow.api.split import Codec, DataclassCodec
from splitflow.coordinator import (
    AddSplits,
    ManualScheduler,
    NoMoreSplits,
    ReaderEvent,
    ReaderMessage,
    Scheduler,
    SourceCoordinator,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Split:
    """A split that is only an id and a position."""

    split_id: str
    position: int = 0


def splits(*ids: str) -> tuple[Split, ...]:
    return tuple(Split(i) for i in ids)


def ids(items: Sequence[Split]) -> list[str]:
    return [s.split_id for s in items]


class RecordingGateway:
    """A ReaderGateway that records ``(reader_id, message)`` in delivery order."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, ReaderMessage[Split]]] = []

    def send(self, reader_id: int, message: ReaderMessage[Split]) -> None:
        self.sent.append((reader_id, message))

    def messages(self, reader_id: int) -> list[ReaderMessage[Split]]:
        return [m for r, m in self.sent if r == reader_id]

    def added_ids(self, reader_id: int) -> list[str]:
        """Ids of every split sent to ``reader_id``, in order."""
        return [
            s.split_id
            for m in self.messages(reader_id)
            if isinstance(m, AddSplits)
            for s in m.splits
        ]

    def no_more_splits_count(self, reader_id: int) -> int:
        return sum(isinstance(m, NoMoreSplits) for m in self.messages(reader_id))

    def events(self, reader_id: int) -> list[SourceEvent]:
        return [m.event for m in self.messages(reader_id) if isinstance(m, ReaderEvent)]

    def clear(self) -> None:
        self.sent.clear()


@dataclass
class RecordingEnumerator(SplitEnumerator[Split, dict[str, Any]]):
    """Records each call as a tuple and the thread it ran on; ``on_*`` hooks script behaviour.

    A hook is called with the same arguments as the method (after recording). ``fail_in``
    names a method that raises ``error`` instead.
    """

    context: SplitEnumeratorContext[Split]
    restored: dict[str, Any] | None = None
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    fail_in: str | None = None
    error: BaseException = field(default_factory=lambda: RuntimeError("enumerator broke"))
    hooks: dict[str, Callable[..., Any]] = field(default_factory=dict)
    closed: int = 0

    def _record(self, name: str, *args: Any) -> Any:
        self.calls.append((name, *args))
        self.threads.append(threading.get_ident())
        if self.fail_in == name:
            raise self.error
        hook = self.hooks.get(name)
        return hook(*args) if hook is not None else None

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def start(self) -> None:
        self._record("start")

    def add_reader(self, reader_id: int) -> None:
        self._record("add_reader", reader_id)

    def handle_split_request(self, reader_id: int, host: str | None) -> None:
        self._record("handle_split_request", reader_id, host)

    def add_splits_back(self, splits: Sequence[Split], reader_id: int) -> None:
        self._record("add_splits_back", list(splits), reader_id)

    def handle_source_event(self, reader_id: int, event: SourceEvent) -> None:
        self._record("handle_source_event", reader_id, event)

    def snapshot_state(self, checkpoint_id: int) -> dict[str, Any]:
        result = self._record("snapshot_state", checkpoint_id)
        return result if result is not None else {"checkpoint": checkpoint_id}

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._record("notify_checkpoint_complete", checkpoint_id)

    def close(self) -> None:
        self.closed += 1
        self._record("close")


class FakeSource(Source[Any, Split, dict[str, Any]]):
    """Builds enumerators with ``factory(context, restored_state)``; no reader side."""

    def __init__(
        self,
        factory: Callable[[SplitEnumeratorContext[Split], Any], SplitEnumerator[Split, Any]]
        | None = None,
    ) -> None:
        self.factory = factory or (lambda ctx, state: RecordingEnumerator(ctx, state))
        self.created: list[SplitEnumerator[Split, Any]] = []
        self.creator_threads: list[int] = []
        self.restored_from: list[Any] = []

    @property
    def boundedness(self) -> Boundedness:
        return Boundedness.CONTINUOUS_UNBOUNDED

    def create_enumerator(
        self, context: SplitEnumeratorContext[Split]
    ) -> SplitEnumerator[Split, Any]:
        return self._make(context, None)

    def restore_enumerator(
        self, context: SplitEnumeratorContext[Split], state: Any
    ) -> SplitEnumerator[Split, Any]:
        self.restored_from.append(state)
        return self._make(context, state)

    def _make(self, context: SplitEnumeratorContext[Split], state: Any) -> Any:
        enumerator = self.factory(context, state)
        self.created.append(enumerator)
        self.creator_threads.append(threading.get_ident())
        return enumerator

    def create_reader(self, context: SourceReaderContext) -> SourceReader[Any, Split]:
        raise NotImplementedError("these tests drive the enumerator side only")

    @property
    def split_codec(self) -> Codec[Split]:
        return DataclassCodec(Split)

    @property
    def enumerator_state_codec(self) -> Codec[dict[str, Any]]:
        raise NotImplementedError


class ReassigningFakeSource(FakeSource, SupportsSplitReassignmentOnRecovery):
    """A FakeSource whose readers report their restored splits at registration (FLIP-537)."""


def result(scheduler: ManualScheduler, future: Future[T]) -> T:
    """Run the scheduler until idle and return the future's result (raises its error)."""
    scheduler.run_until_idle()
    assert future.done(), "the future did not complete once the scheduler was idle"
    return future.result(timeout=0)


def error(scheduler: ManualScheduler, future: Future[Any]) -> BaseException:
    """Run the scheduler until idle and return the future's exception (it must have one)."""
    scheduler.run_until_idle()
    assert future.done(), "the future did not complete once the scheduler was idle"
    exc = future.exception(timeout=0)
    assert exc is not None, f"expected the future to fail, it returned {future.result()!r}"
    return exc


@dataclass
class Harness:
    """A coordinator on a ManualScheduler with a recording gateway."""

    source: FakeSource
    coordinator: SourceCoordinator[Split, Any]
    scheduler: ManualScheduler
    gateway: RecordingGateway
    failures: list[BaseException]

    @property
    def enumerator(self) -> Any:
        return self.coordinator.enumerator

    def run(self, future: Future[T]) -> T:
        return result(self.scheduler, future)

    def fail(self, future: Future[Any]) -> BaseException:
        return error(self.scheduler, future)

    def register_all(self) -> None:
        for reader in range(self.coordinator.parallelism):
            self.run(self.coordinator.register_reader(reader, f"host-{reader}"))


def make_harness(
    source: FakeSource | None = None,
    parallelism: int = 2,
    *,
    restored_state: Any = None,
    start: bool = True,
    scheduler: Scheduler | None = None,
) -> Harness:
    source = source or FakeSource()
    manual = scheduler if scheduler is not None else ManualScheduler()
    assert isinstance(manual, ManualScheduler)
    gateway = RecordingGateway()
    failures: list[BaseException] = []
    coordinator: SourceCoordinator[Split, Any] = SourceCoordinator(
        source,
        parallelism,
        gateway,
        scheduler=manual,
        restored_state=restored_state,
        on_failure=failures.append,
    )
    harness = Harness(source, coordinator, manual, gateway, failures)
    if start:
        harness.run(coordinator.start())
    return harness
