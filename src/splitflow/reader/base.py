"""SourceReaderBase: a complete SourceReader from a SplitReader and a RecordEmitter.

The bookkeeping every connector would otherwise repeat, as Flink's ``SourceReaderBase``:
split states, slices, fetching (on the reader's thread or on fetcher threads), emitting,
snapshots, finished splits, removed splits, end of input, and errors.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic

from splitflow.api.events import (
    SliceEndedEvent,
    SourceEvent,
    SplitsFinishedEvent,
    SplitsRemovedEvent,
)
from splitflow.api.reader import InputStatus, ReaderOutput, SourceReader, SourceReaderContext
from splitflow.api.split import SplitState, SplitT
from splitflow.errors import ConfigurationError, ContractViolation, SplitOwnershipError
from splitflow.reader.emitter import RecordEmitter, T
from splitflow.reader.fetcher import (
    FetchedBatch,
    FetcherManager,
    SplitReaderFactory,
    SyncFetcherManager,
    ThreadedFetcherManager,
    describe_ids,
)
from splitflow.reader.split_reader import E, SplitSlice


@dataclass
class _Split(Generic[SplitT]):
    """A split this reader owns: its state, its slice's stop, and its assignment."""

    state: SplitState[SplitT]
    stop: int | None
    generation: int
    finished: bool = False


class SourceReaderBase(SourceReader[T, SplitT], Generic[E, T, SplitT]):
    """Reads splits with a :class:`~splitflow.reader.SplitReader` and emits with an emitter.

    Parameters
    ----------
    split_reader_factory
        Makes a split reader. Called once in synchronous mode, once per fetcher thread
        otherwise, on the reader's thread, when the first split reaches it.
    emitter
        Turns each fetched element into output and moves its split's position.
    context
        The runtime's context: finished splits are reported through it.
    fetch_threads
        ``0`` (default): fetch synchronously on the reader's thread, inside ``poll_next``
        and ``wait_available``, with one split reader for all splits: for split readers
        whose ``fetch`` does not block. ``N > 0``: ``N`` fetcher threads, each with its own
        split reader and a share of the splits, for I/O-bound sources.
    queue_capacity
        With fetcher threads: how many fetched batches may wait for ``poll_next`` before
        fetchers block (backpressure). At least 1.
    idle_backoff
        Seconds to wait before fetching again after a fetch returned nothing (cut short by
        :meth:`wake_up` and by split changes). Positive.

    Called by: the reader's thread, one method at a time (the :class:`SourceReader`
    contract), except :meth:`wake_up`, which any thread may call.
    Blocking: ``poll_next`` runs at most one fetch (synchronous mode) and emits at most one
    fetched batch; ``wait_available`` is where the reader waits.
    Guarantees:

    * each split's elements are emitted once, in order, in both fetch modes, and a snapshot
      holds each split at the position after the last element emitted before it;
    * a split with a stop (``add_splits(..., stop_at=...)``) never emits at or beyond its
      stop: an emitter that moves a split beyond its stop, or backwards, fails the reader
      with :class:`~splitflow.errors.ContractViolation`;
    * when splits end, ONE :class:`~splitflow.api.events.SplitsFinishedEvent` names them
      (after their last elements were emitted), never twice for a split; ended splits
      leave the snapshot, splits that only reached their stop stay in it at their stop;
    * a :class:`~splitflow.api.events.SplitsRemovedEvent` stops those splits and drops them
      from state, without a finished event; their elements still in flight are dropped;
    * ``END_OF_INPUT`` only after :meth:`notify_no_more_splits` and every split finished;
    * an exception of the split reader (in any of its methods, on any fetch thread) or of
      the emitter is raised from ``poll_next`` as the same exception object, with a note
      naming the splits involved; the reader is then failed and raises it again on every
      ``poll_next``. Split changes reach the split reader before its next fetch, so an
      error in ``handle_splits_changes`` also surfaces there, in both fetch modes.

    Example: a split reader over in-memory lists, read to the end.

    >>> from splitflow.reader import Positioned, PositionedEmitter, RecordsBySplits, SplitReader
    >>> from splitflow.testing.sequence import SequenceSplit
    >>> class ListSplitReader(SplitReader[Positioned[str], SequenceSplit]):
    ...     def __init__(self) -> None:
    ...         self.slices: dict[str, SplitSlice[SequenceSplit]] = {}
    ...     def handle_splits_changes(self, added: Sequence[SplitSlice[SequenceSplit]]) -> None:
    ...         self.slices.update((piece.split_id, piece) for piece in added)
    ...     def remove_splits(self, split_ids: Sequence[str]) -> None:
    ...         for split_id in split_ids:
    ...             del self.slices[split_id]
    ...     def fetch(self) -> RecordsBySplits[Positioned[str]]:
    ...         batch: RecordsBySplits[Positioned[str]] = RecordsBySplits()
    ...         for split_id, piece in self.slices.items():
    ...             end = piece.clamp(piece.split.end or 0)
    ...             batch.add_all(split_id, [
    ...                 Positioned(f"{split_id}{i}", i + 1) for i in range(piece.start, end)
    ...             ])
    ...             if end == piece.split.end:
    ...                 batch.mark_ended(split_id)
    ...             else:
    ...                 batch.mark_finished(split_id)
    ...         self.slices.clear()
    ...         return batch
    ...     def wake_up(self) -> None:
    ...         pass
    >>> class Context:
    ...     reader_id, location = 0, None
    ...     def send_source_event_to_coordinator(self, event: SourceEvent) -> None:
    ...         print("sent", event)
    ...     def send_split_request(self) -> None:
    ...         pass
    >>> reader = SourceReaderBase(ListSplitReader, PositionedEmitter(), Context())
    >>> reader.add_splits([SequenceSplit("a", end=2), SequenceSplit("b", end=9)], {"b": 3})
    >>> reader.notify_no_more_splits()
    >>> out: list[str] = []
    >>> class Output:
    ...     collect = out.append
    >>> reader.poll_next(Output())
    sent SplitsFinishedEvent(split_ids=('a',))
    <InputStatus.MORE_AVAILABLE: 'more'>
    >>> reader.poll_next(Output()), out
    (<InputStatus.END_OF_INPUT: 'end'>, ['a0', 'a1', 'b0', 'b1', 'b2'])
    >>> reader.snapshot_state(checkpoint_id=1)  # 'a' ended; 'b' stays, at its stop
    [SequenceSplit(name='b', end=9, position=3)]
    >>> reader.close()

    Subclass to add behaviour: override :meth:`on_split_finished`, or
    :meth:`handle_source_event` (calling ``super()``) for a connector's own events.
    """

    def __init__(
        self,
        split_reader_factory: SplitReaderFactory[E, SplitT],
        emitter: RecordEmitter[E, T, SplitT],
        context: SourceReaderContext,
        *,
        fetch_threads: int = 0,
        queue_capacity: int = 2,
        idle_backoff: float = 0.05,
    ) -> None:
        _check_int("fetch_threads", fetch_threads, 0)
        _check_int("queue_capacity", queue_capacity, 1)
        if not idle_backoff > 0:
            raise ConfigurationError(
                f"idle_backoff must be > 0 seconds, got {idle_backoff!r}", option="idle_backoff"
            )
        self.context = context
        self._emitter = emitter
        name = f"splitflow-reader-{context.reader_id}"
        self._fetchers: FetcherManager[E, SplitT]
        if fetch_threads == 0:
            self._fetchers = SyncFetcherManager(
                split_reader_factory, idle_backoff=idle_backoff, name=name
            )
        else:
            self._fetchers = ThreadedFetcherManager(
                split_reader_factory,
                threads=fetch_threads,
                queue_capacity=queue_capacity,
                idle_backoff=idle_backoff,
                name=name,
            )
        self._splits: dict[str, _Split[SplitT]] = {}
        self._unfinished: set[str] = set()
        self._ended: set[str] = set()
        self._generations = itertools.count(1)
        self._no_more_splits = False
        self._failure: BaseException | None = None
        self._closed = False

    # -- SourceReader ---------------------------------------------------------------------

    def add_splits(
        self, splits: Sequence[SplitT], stop_at: Mapping[str, int] | None = None
    ) -> None:
        """Take ownership of ``splits``; read each from its position, up to its stop if any.

        Called by: the reader's thread, before or after ``start``.
        Blocking: no; the split reader receives the slices on its fetch thread.
        Raises: :class:`~splitflow.errors.SplitOwnershipError` for a split this reader owns
        already (or saw end), or listed twice; :class:`~splitflow.errors.ContractViolation`
        after :meth:`notify_no_more_splits` or ``close``, for a stop before a split's
        position, or for a stop of a split not in ``splits``.
        """
        self._check_open("add_splits")
        if self._no_more_splits:
            raise ContractViolation(
                f"add_splits({describe_ids(s.split_id for s in splits)}) after "
                "notify_no_more_splits(): no split may be added any more"
            )
        stops = dict(stop_at or {})
        ids = [s.split_id for s in splits]
        seen: set[str] = set()
        taken = set()
        for sid in ids:
            if sid in seen or sid in self._splits or sid in self._ended:
                taken.add(sid)
            seen.add(sid)
        if taken:
            raise SplitOwnershipError(
                f"reader {self.context.reader_id} was given split(s) {describe_ids(taken)} "
                "that it owns already, has read to their end, or got twice in one call",
                split_ids=tuple(sorted(taken)),
            )
        strays = stops.keys() - set(ids)
        if strays:
            raise ContractViolation(
                f"stop_at names split(s) {describe_ids(strays)} that are not being added"
            )
        slices = [SplitSlice(split, stops.get(split.split_id)) for split in splits]
        assignments = []
        for piece in slices:
            generation = next(self._generations)
            entry = _Split(SplitState.of(piece.split), piece.stop, generation)
            self._splits[piece.split_id] = entry
            self._unfinished.add(piece.split_id)
            assignments.append((piece, generation))
        self._fetchers.add_splits(assignments)

    def notify_no_more_splits(self) -> None:
        """No split will be added any more; input ends once every split finished.

        Called by: the reader's thread. Idempotent (a repeated signal is harmless).
        """
        self._no_more_splits = True

    def poll_next(self, output: ReaderOutput[T]) -> InputStatus:
        """Emit one fetched batch into ``output``, if one is ready.

        Called by: the reader's thread. Blocking: in synchronous mode it runs one
        ``SplitReader.fetch``; otherwise it only takes a batch from the queue.
        Returns: ``MORE_AVAILABLE`` after a batch was processed (call again);
        ``NOTHING_AVAILABLE`` when nothing is ready (call ``wait_available``);
        ``END_OF_INPUT`` after ``notify_no_more_splits`` once every split finished.
        Raises: the split reader's or emitter's exception, unchanged (with a note naming the
        splits); :class:`~splitflow.errors.ContractViolation` when a split reader or
        emitter broke its contract.
        """
        self._check_open("poll_next")
        if self._failure is not None:
            raise self._failure
        try:
            batch = self._fetchers.poll()
            if batch is None:
                return InputStatus.END_OF_INPUT if self._at_end() else InputStatus.NOTHING_AVAILABLE
            self._process(batch, output)
        except BaseException as exc:
            self._failure = exc
            raise
        return InputStatus.MORE_AVAILABLE

    def wait_available(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until ``poll_next`` can make progress.

        Called by: the reader's thread. Blocking: yes, up to ``timeout``; returns at once
        when a batch, the end of input or an error is pending, and early (``False``) when
        :meth:`wake_up` is called. In synchronous mode it fetches (every ``idle_backoff``
        seconds while nothing is ready) and keeps the result for ``poll_next``.
        """
        self._check_open("wait_available")
        if self._failure is not None or self._at_end():
            return True
        try:
            return self._fetchers.wait(timeout)
        except BaseException as exc:
            self._failure = exc  # raised by the next poll_next
            return True

    def snapshot_state(self, checkpoint_id: int) -> list[SplitT]:
        """Every owned split that has not ended, at the first position not yet emitted.

        Called by: the reader's thread, between ``poll_next`` calls.
        Guarantees: identical in both fetch modes; a split that reached its stop is in it,
        at its stop; ended and removed splits are not.
        """
        return [entry.state.to_split() for entry in self._splits.values()]

    def handle_source_event(self, event: SourceEvent) -> None:
        """Handle an event from the enumerator: :class:`SplitsRemovedEvent` drops splits.

        Called by: the reader's thread. Unknown split ids (e.g. ended meanwhile) are ignored;
        other events are ignored (override, calling ``super()``, to handle your own).
        """
        if isinstance(event, SplitsRemovedEvent):
            self._remove(event.split_ids)

    def close(self) -> None:
        """Stop fetching: wake, stop and join fetcher threads; close every split reader.

        Called by: the reader's thread, last. Idempotent.
        Raises: an error of a split reader's ``close``;
        :class:`~splitflow.errors.ContractViolation` if a fetch ignored ``wake_up``.
        """
        if self._closed:
            return
        self._closed = True
        self._fetchers.close()

    # -- beyond SourceReader --------------------------------------------------------------

    def wake_up(self) -> None:
        """Make a running (or the next) ``wait_available`` return now.

        Called by: any thread (e.g. the runtime, when it has new splits or events for this
        reader). Blocking: no.
        """
        self._fetchers.wake_up()

    def on_split_finished(
        self, finished: Mapping[str, SplitState[SplitT]], ended: frozenset[str]
    ) -> None:
        """Hook: these splits finished; ``ended`` is the subset that ended. Default: nothing.

        Called by: the reader's thread, inside ``poll_next``, once per split, after its last
        element was emitted and after the :class:`SplitsFinishedEvent` was sent. ``finished``
        maps split id -> final state (a pull-based reader would request the next split).
        """

    def finished_split_ids(self) -> frozenset[str]:
        """Splits this reader is done with: reached their stop (still owned) or ended."""
        stopped = {sid for sid, entry in self._splits.items() if entry.finished}
        return frozenset(stopped | self._ended)

    def ended_split_ids(self) -> frozenset[str]:
        """Splits that ended in this reader (reported to the enumerator, not in snapshots)."""
        return frozenset(self._ended)

    def unfinished_split_ids(self) -> frozenset[str]:
        """Owned splits still being read (neither at their stop nor ended)."""
        return frozenset(self._unfinished)

    # -- internals ------------------------------------------------------------------------

    def _at_end(self) -> bool:
        return self._no_more_splits and not self._unfinished

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise ContractViolation(f"{method}() called on a closed {type(self).__name__}")

    def _live(self, split_id: str, batch: FetchedBatch[E]) -> _Split[SplitT] | None:
        """The split a batch's entry belongs to, or ``None`` if it was removed meanwhile."""
        entry = self._splits.get(split_id)
        if entry is None or entry.generation != batch.generations[split_id]:
            if split_id in self._ended:
                raise ContractViolation(
                    f"split reader ({batch.fetcher}) returned split {split_id!r} again after "
                    "it reported the split ended"
                )
            return None
        return entry

    def _process(self, batch: FetchedBatch[E], output: ReaderOutput[T]) -> None:
        records = batch.records
        emit = self._emitter.emit
        for_split = getattr(output, "for_split", None)  # a SplitOutputs
        for split_id, elements in records.records.items():
            entry = self._live(split_id, batch)
            if entry is None:
                continue  # removed while the batch was in flight
            if entry.finished:
                raise ContractViolation(
                    f"split reader ({batch.fetcher}) returned elements of split {split_id!r} "
                    "after it reported the split finished"
                )
            state, stop = entry.state, entry.stop
            out = output if for_split is None else for_split(split_id)
            for element in elements:
                before = state.position
                try:
                    emit(element, out, state)
                except BaseException as exc:
                    exc.add_note(
                        f"splitflow: raised by {type(self._emitter).__name__}.emit() for split "
                        f"{split_id!r} at position {before}"
                    )
                    raise
                if state.position < before or (stop is not None and state.position > stop):
                    self._bad_move(split_id, before, state.position, stop)
        self._finish(batch)

    def _finish(self, batch: FetchedBatch[E]) -> None:
        records = batch.records
        finished: dict[str, SplitState[SplitT]] = {}
        ended: list[str] = []
        for split_id in sorted(records.finished | records.ended):
            entry = self._live(split_id, batch)
            if entry is None or entry.finished:
                continue
            position = entry.state.position
            if split_id in records.ended:
                ended.append(split_id)
                del self._splits[split_id]
                self._ended.add(split_id)
            elif split_id in records.cut and entry.stop is not None and position < entry.stop:
                ended_early = SliceEndedEvent(split_id, position)
                self.context.send_source_event_to_coordinator(ended_early)
            elif entry.stop is None or position != entry.stop:
                raise ContractViolation(
                    f"split reader ({batch.fetcher}) reported split {split_id!r} finished at "
                    f"position {position}, but its slice stops at {entry.stop} and the split "
                    "did not end: report a split finished only at its stop, or ended"
                )
            entry.finished = True
            self._unfinished.discard(split_id)
            finished[split_id] = entry.state
        if not finished:
            return
        self._fetchers.splits_finished(finished.keys())
        if ended:
            self.context.send_source_event_to_coordinator(SplitsFinishedEvent(tuple(ended)))
        self.on_split_finished(finished, frozenset(ended))

    def _remove(self, split_ids: Collection[str]) -> None:
        owned = [sid for sid in split_ids if sid in self._splits]
        for sid in owned:
            del self._splits[sid]
            self._unfinished.discard(sid)
        if owned:
            self._fetchers.remove_splits(owned)

    def _bad_move(self, split_id: str, before: int, after: int, stop: int | None) -> None:
        emitter = type(self._emitter).__name__
        if after < before:
            raise ContractViolation(
                f"{emitter}.emit() moved split {split_id!r} back from {before} to {after}: "
                "positions never move backwards"
            )
        raise ContractViolation(
            f"split {split_id!r} moved from {before} to {after}, beyond its slice's stop "
            f"{stop}: the split reader must not return elements at or beyond the stop"
        )


def _check_int(option: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(
            f"{option} must be an int >= {minimum}, got {value!r}", option=option
        )


__all__ = ["SourceReaderBase"]
