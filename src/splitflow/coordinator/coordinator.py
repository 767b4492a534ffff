"""The source coordinator: runs one split enumerator on one coordinator thread.

It is the runtime half of the enumerator's world (Flink's SourceCoordinator plus
SourceCoordinatorContext): readers register through it, their events reach the enumerator
through it, the enumerator's assignments reach readers through a :class:`ReaderGateway`,
and checkpoints are taken on its thread so they never interleave with an enumerator call.

Every public method may be called from any thread. It queues the work on the coordinator
thread and returns a :class:`concurrent.futures.Future`. Once the enumerator (or a handler
of ``call_async``) raised, the source is failed: every pending and later future fails with
:class:`~splitflow.errors.SourceFailedError` whose ``__cause__`` is that exception.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from operator import attrgetter
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

from splitflow.api.enumerator import (
    EnumStateT,
    ReaderInfo,
    SplitEnumerator,
    SplitExtent,
)
from splitflow.api.events import SourceEvent
from splitflow.api.source import Source, SupportsSplitReassignmentOnRecovery
from splitflow.api.split import SplitT
from splitflow.coordinator.metrics import SimpleMetricGroup
from splitflow.coordinator.scheduler import Cancellable, Scheduler, ThreadedScheduler
from splitflow.coordinator.tracker import SplitAssignmentTracker
from splitflow.errors import (
    CheckpointDeclinedError,
    ConfigurationError,
    ContractViolation,
    SourceFailedError,
)

log = logging.getLogger("splitflow.coordinator")
T = TypeVar("T")


# -- messages to readers ----------------------------------------------------------------


@dataclass(frozen=True)
class AddSplits(Generic[SplitT]):
    splits: tuple[SplitT, ...]


@dataclass(frozen=True)
class NoMoreSplits:
    pass


@dataclass(frozen=True)
class ReaderEvent:
    event: SourceEvent


ReaderMessage = AddSplits[SplitT] | NoMoreSplits | ReaderEvent


class ReaderGateway(Protocol[SplitT]):
    """How the runtime delivers the coordinator's messages to readers.

    Called by: the coordinator thread. Must not block; must deliver each reader's messages
    in order.
    """

    def send(self, reader_id: int, message: ReaderMessage[SplitT]) -> None: ...


# -- the enumerator's context -------------------------------------------------------------


class _PeriodicCall:
    def __init__(self) -> None:
        self.cancelled = False
        self.timer: Cancellable | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.timer is not None:
            self.timer.cancel()


_split_id = attrgetter("split_id")


class CoordinatorContext(Generic[SplitT]):
    """The :class:`~splitflow.api.enumerator.SplitEnumeratorContext` a coordinator provides."""

    def __init__(self, coordinator: SourceCoordinator[SplitT, Any]) -> None:
        self._coordinator = coordinator
        self.readers: dict[int, ReaderInfo[SplitT]] = {}
        self.signaled_no_more: set[int] = set()
        self.is_processing_backlog = False
        self.metrics = SimpleMetricGroup()

    @property
    def current_parallelism(self) -> int:
        return self._coordinator.parallelism

    @property
    def reports_splits_on_registration(self) -> bool:
        return self._coordinator.reports_splits_on_registration

    def registered_readers(self) -> Mapping[int, ReaderInfo[SplitT]]:
        # A read-only view, not a copy: O(1) per call, so R registrations cost O(R), not
        # O(R^2). Safe: readers change only on the coordinator thread, between enumerator calls.
        return MappingProxyType(self.readers)

    def assign_splits(self, assignment: Mapping[int, Sequence[SplitT]]) -> None:
        seen: set[str] = set()
        count = 0
        for reader, splits in assignment.items():
            if reader not in self.readers:
                raise ContractViolation(
                    f"assign_splits: reader {reader} is not registered "
                    f"(registered: {sorted(self.readers)})"
                )
            if reader in self.signaled_no_more and splits:
                raise ContractViolation(
                    f"assign_splits: reader {reader} was already told there are no more splits"
                )
            seen.update(map(_split_id, splits))
            count += len(splits)
        if len(seen) < count:
            ids = Counter(map(_split_id, (s for ss in assignment.values() for s in ss)))
            twice = min(sid for sid, n in ids.items() if n > 1)
            raise ContractViolation(f"assign_splits: split {twice} assigned twice in one call")
        frozen = {r: tuple(ss) for r, ss in assignment.items() if ss}
        self._coordinator.tracker.record_split_assignment(frozen)
        self.metrics.counter("splits_assigned").inc(len(seen))
        for reader, splits in sorted(frozen.items()):
            self._coordinator.send(reader, AddSplits(splits))

    def signal_no_more_splits(self, reader_id: int) -> None:
        if reader_id not in self.readers:
            raise ContractViolation(f"signal_no_more_splits: reader {reader_id} is not registered")
        if reader_id in self.signaled_no_more:
            return  # idempotent: a finished reader is never told twice (FLINK-40586)
        self.signaled_no_more.add(reader_id)
        self._coordinator.send(reader_id, NoMoreSplits())

    def send_event_to_source_reader(self, reader_id: int, event: SourceEvent) -> None:
        if reader_id not in self.readers:
            raise ContractViolation(
                f"send_event_to_source_reader: reader {reader_id} is not registered"
            )
        self._coordinator.send(reader_id, ReaderEvent(event))

    def call_async(
        self,
        callable: Callable[[], T],
        handler: Callable[[T | None, BaseException | None], None],
        *,
        initial_delay: float = 0.0,
        period: float | None = None,
    ) -> Cancellable:
        if period is not None and not period > 0:
            raise ContractViolation(
                f"call_async: period must be above 0 seconds, got {period!r} (a call that "
                "repeats at once would never let the coordinator do anything else)"
            )
        scheduler = self._coordinator.scheduler
        call = _PeriodicCall()

        def run() -> None:
            if call.cancelled:
                return
            try:
                result: T | None = callable()
                error: BaseException | None = None
            except Exception as exc:  # handed to the handler, which decides
                result, error = None, exc
            scheduler.run_on_coordinator(lambda: deliver(result, error))

        def deliver(result: T | None, error: BaseException | None) -> None:
            if call.cancelled:
                return
            if not self._coordinator.guard(lambda: handler(result, error)):
                return
            if period is None:
                self._coordinator.periodic_calls.discard(call)  # a one-off is done
            elif not call.cancelled:
                call.timer = scheduler.schedule(period, lambda: scheduler.run_on_worker(run))

        if initial_delay > 0:
            call.timer = scheduler.schedule(initial_delay, lambda: scheduler.run_on_worker(run))
        else:
            scheduler.run_on_worker(run)
        self._coordinator.periodic_calls.add(call)
        return call

    def run_in_coordinator_thread(self, fn: Callable[[], None]) -> None:
        def run() -> None:
            self._coordinator.guard(fn)

        self._coordinator.scheduler.run_on_coordinator(run)

    def set_is_processing_backlog(self, is_backlog: bool) -> None:
        if is_backlog != self.is_processing_backlog:
            log.info("source %s processing backlog", "is" if is_backlog else "is no longer")
        self.is_processing_backlog = is_backlog


# -- the coordinator ----------------------------------------------------------------------


class SourceCoordinator(Generic[SplitT, EnumStateT]):
    """Runs the enumerator of ``source`` for ``parallelism`` readers.

    ``restored_state`` is the enumerator part of a checkpoint (global restore); without it
    the enumerator starts fresh. ``on_failure`` is called once, on the coordinator thread,
    with the exception that failed the source.
    """

    def __init__(
        self,
        source: Source[Any, SplitT, EnumStateT],
        parallelism: int,
        gateway: ReaderGateway[SplitT],
        *,
        scheduler: Scheduler | None = None,
        restored_state: EnumStateT | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        if parallelism < 1:
            raise ConfigurationError(
                f"parallelism must be at least 1, got {parallelism}", option="parallelism"
            )
        self.source = source
        self.parallelism = parallelism
        self.gateway = gateway
        self.scheduler: Scheduler = scheduler or ThreadedScheduler()
        self.reports_splits_on_registration = isinstance(
            source, SupportsSplitReassignmentOnRecovery
        )
        self.tracker: SplitAssignmentTracker[SplitT] = SplitAssignmentTracker()
        self.context: CoordinatorContext[SplitT] = CoordinatorContext(self)
        self.periodic_calls: set[_PeriodicCall] = set()  # scheduled calls, cancelled on close
        self._restored_state = restored_state
        self._enumerator: SplitEnumerator[SplitT, EnumStateT] | None = None
        self._on_failure = on_failure
        self._failure: BaseException | None = None
        self._held: list[tuple[int, ReaderMessage[SplitT]]] | None = None
        self._closed = False
        self._lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------------------

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    @property
    def enumerator(self) -> SplitEnumerator[SplitT, EnumStateT]:
        if self._enumerator is None:
            raise ContractViolation("the coordinator has not started its enumerator yet")
        return self._enumerator

    def guard(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` on the coordinator thread; an exception fails the source."""
        if self._failure is not None or self._closed:
            return False
        try:
            fn()
            return True
        except BaseException as exc:
            self._fail(exc)
            return False

    def _fail(self, exc: BaseException) -> None:
        if self._failure is not None:
            return
        self._failure = exc
        log.error("source coordinator failed: %s", exc, exc_info=exc)
        for call in self.periodic_calls:
            call.cancel()
        if self._on_failure is not None:
            try:
                self._on_failure(exc)
            except Exception:
                log.exception("the on_failure callback raised")

    def _submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        if self._closed:  # the scheduler is shut down: nothing queued now would ever run
            future.set_exception(SourceFailedError("the source coordinator is closed"))
            return future

        def task() -> None:
            if self._failure is not None:
                future.set_exception(self._failed_error())
                return
            if self._closed:
                future.set_exception(SourceFailedError("the source coordinator is closed"))
                return
            try:
                future.set_result(fn())
            except BaseException as exc:
                if isinstance(exc, CheckpointDeclinedError):
                    future.set_exception(exc)  # declined is not a failure of the source
                    return
                self._fail(exc)
                future.set_exception(self._failed_error())

        self.scheduler.run_on_coordinator(task)
        return future

    def _failed_error(self) -> SourceFailedError:
        error = SourceFailedError(f"the source failed: {self._failure!r}")
        error.__cause__ = self._failure
        return error

    def send(self, reader_id: int, message: ReaderMessage[SplitT]) -> None:
        """Deliver now, or hold while a checkpoint is between coordinator and readers."""
        if self._held is not None:
            self._held.append((reader_id, message))
        else:
            self.gateway.send(reader_id, message)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> Future[None]:
        def start() -> None:
            if self._restored_state is None:
                self._enumerator = self.source.create_enumerator(self.context)
            else:
                self._enumerator = self.source.restore_enumerator(
                    self.context, self._restored_state
                )
            self._enumerator.start()

        return self._submit(start)

    def close(self) -> None:
        """Close the enumerator and stop all threads. Idempotent; never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True  # from now on nothing new is queued
        for call in list(self.periodic_calls):
            call.cancel()

        def close_enumerator() -> None:
            try:
                if self._enumerator is not None:
                    self._enumerator.close()
            except Exception:
                log.exception("closing the split enumerator failed")

        scheduler = self.scheduler
        if isinstance(scheduler, ThreadedScheduler) and not scheduler.in_coordinator_thread():
            done = threading.Event()

            def close_and_signal() -> None:
                close_enumerator()
                done.set()

            scheduler.run_on_coordinator(close_and_signal)
            done.wait(timeout=10)
        else:  # on the coordinator thread already (ManualScheduler, or called from a handler)
            close_enumerator()
        scheduler.shutdown()

    # -- readers --------------------------------------------------------------------------

    def register_reader(
        self, reader_id: int, location: str | None = None, reported_splits: Sequence[SplitT] = ()
    ) -> Future[None]:
        """A reader (re)started and registers, with the splits it hands back (FLIP-537)."""

        def register() -> None:
            if not 0 <= reader_id < self.parallelism:
                raise ContractViolation(
                    f"reader {reader_id} registered but parallelism is {self.parallelism}"
                )
            if reader_id in self.context.readers:
                raise ContractViolation(f"reader {reader_id} registered twice without failing")
            if reported_splits and not self.reports_splits_on_registration:
                raise ContractViolation(
                    f"reader {reader_id} reported splits but {type(self.source).__name__} does "
                    "not implement SupportsSplitReassignmentOnRecovery"
                )
            self.context.readers[reader_id] = ReaderInfo(
                reader_id, location, tuple(reported_splits)
            )
            self.enumerator.add_reader(reader_id)

        return self._submit(register)

    def reader_failed(self, reader_id: int, restored_checkpoint_id: int | None) -> Future[None]:
        """Partial failover: ``reader_id`` failed and restarts from ``restored_checkpoint_id``.

        Unregisters it, drops messages held for it, and gives the enumerator back what it
        was assigned after that checkpoint (``add_splits_back``). It registers again later.
        """

        def failed() -> None:
            self.context.readers.pop(reader_id, None)
            self.context.signaled_no_more.discard(reader_id)
            if self._held is not None:
                self._held = [(r, m) for r, m in self._held if r != reader_id]
            splits = self.tracker.get_and_remove_uncheckpointed_assignment(
                reader_id, restored_checkpoint_id
            )
            if splits:
                self.enumerator.add_splits_back(splits, reader_id)

        return self._submit(failed)

    def handle_source_event(self, reader_id: int, event: SourceEvent) -> Future[None]:
        def handle() -> None:
            self._require_registered(reader_id, "handle_source_event")
            self.enumerator.handle_source_event(reader_id, event)

        return self._submit(handle)

    def handle_split_request(self, reader_id: int, host: str | None = None) -> Future[None]:
        def handle() -> None:
            self._require_registered(reader_id, "handle_split_request")
            self.enumerator.handle_split_request(reader_id, host)

        return self._submit(handle)

    def _require_registered(self, reader_id: int, what: str) -> None:
        if reader_id not in self.context.readers:
            raise ContractViolation(f"{what}: reader {reader_id} is not registered")

    def latest_positions(self, splits: Sequence[SplitT]) -> Future[Mapping[str, SplitExtent]]:
        return self._submit(lambda: self.enumerator.latest_positions(splits))

    def changed_positions(
        self, since: object | None
    ) -> Future[tuple[object, Mapping[str, SplitExtent | None]] | None]:
        return self._submit(lambda: self.enumerator.changed_positions(since))

    def event_times(self, splits: Sequence[SplitT]) -> Future[Mapping[str, int]]:
        return self._submit(lambda: dict(self.enumerator.event_times(splits)))

    def positions_after(
        self, splits: Sequence[SplitT], event_time: int
    ) -> Future[Mapping[str, int]]:
        return self._submit(lambda: dict(self.enumerator.positions_after(splits, event_time)))

    def backlog_boundaries(self) -> Future[Mapping[str, int]]:
        return self._submit(lambda: dict(self.enumerator.backlog_boundaries()))

    def run(self, fn: Callable[[SplitEnumerator[SplitT, EnumStateT]], T]) -> Future[T]:
        """Run ``fn(enumerator)`` on the coordinator thread (inspection, tests)."""
        return self._submit(lambda: fn(self.enumerator))

    # -- checkpoints ------------------------------------------------------------------------

    def checkpoint(self, checkpoint_id: int) -> Future[EnumStateT]:
        """Snapshot the enumerator; hold messages to readers until they snapshot too.

        Declined (:class:`~splitflow.errors.CheckpointDeclinedError`) while not every reader
        is registered: a reader's reported splits must reach the enumerator before any
        checkpoint, or they could be in neither the enumerator's nor a reader's state.
        After the readers snapshotted, call :meth:`release_held_messages`.
        """

        def snapshot() -> EnumStateT:
            missing = sorted(set(range(self.parallelism)) - self.context.readers.keys())
            if missing:
                raise CheckpointDeclinedError(
                    f"checkpoint {checkpoint_id} declined: readers {missing} are not registered"
                )
            if self._held is None:  # a second checkpoint before release keeps what is held
                self._held = []
            self.tracker.on_checkpoint(checkpoint_id)
            return self.enumerator.snapshot_state(checkpoint_id)

        return self._submit(snapshot)

    def release_held_messages(self) -> Future[None]:
        """The readers took their snapshot: deliver what was held since the checkpoint."""

        def release() -> None:
            held, self._held = self._held or [], None
            for reader_id, message in held:
                self.gateway.send(reader_id, message)

        return self._submit(release)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> Future[None]:
        def complete() -> None:
            self.tracker.on_checkpoint_complete(checkpoint_id)
            self.enumerator.notify_checkpoint_complete(checkpoint_id)

        return self._submit(complete)
