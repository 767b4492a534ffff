"""Plans micro-batches on the driver: micro-batch = checkpoint. No pyspark import here.

The planner runs a source's coordinator in the driver-side streaming runner process and
treats each of the ``parallelism`` reader slots as a reader that is always at the end of
the last planned batch: a slot's state is its splits, each at the position the batch
stops at. Planning batch ``n`` means: let the enumerator act (discovery, assignment,
finished and removed splits), learn how far every split can be read now
(``latest_positions``), cut each split's slice ``[position, stop)`` to the read limit, take
checkpoint ``n`` and encode all of it as Spark's end offset of the batch.

So Spark's offset of a batch holds everything: the enumerator's snapshot, every slot's
splits and each split's slice (with ``stateDir``, the bulk of it in files the offset names:
:mod:`splitflow.spark.offsetstate`). ``partitions(start, end)`` reads only ``end``, which
makes a replay after a crash read exactly the same records, and a restart (with the same or
another parallelism) restores the coordinator from the start offset through the
global-restore path: slots report their splits and the enumerator redistributes them.

The offset's format and the batch's tasks are :mod:`splitflow.spark.offset`; the read
limits and how a budget is shared over splits, :mod:`splitflow.spark.limits`; event-time
alignment, :mod:`splitflow.spark.alignment`.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from operator import add, attrgetter, is_not, ne
from typing import Any, Generic, cast

import numpy as np

from splitflow.api.enumerator import EnumStateT, SplitExtent
from splitflow.api.events import (
    BacklogFinishedEvent,
    BacklogStartedEvent,
    SliceEndedEvent,
    SourceEvent,
    SplitEventTimesEvent,
    SplitsFinishedEvent,
    SplitsRemovedEvent,
)
from splitflow.api.source import ReadPinner, Source, SupportsPinnedReads
from splitflow.api.split import JsonDict, LedgerCodec, SplitT
from splitflow.coordinator.checkpoint import redistribute_reader_states
from splitflow.coordinator.coordinator import (
    AddSplits,
    NoMoreSplits,
    ReaderEvent,
    ReaderMessage,
    SourceCoordinator,
)
from splitflow.coordinator.scheduler import ManualScheduler
from splitflow.errors import (
    CheckpointStateError,
    ConfigurationError,
    IncompatibleCheckpointError,
)
from splitflow.spark.alignment import Aligner, Alignment, capped
from splitflow.spark.events import EventStore
from splitflow.spark.eventtime import EventTimeSettings, iso
from splitflow.spark.ledger import LedgerStore
from splitflow.spark.limits import (
    BacklogAware,
    Backlogs,
    MinRecords,
    ReadLimit,
    exact_sum,
    largest,
    reads_under,
)
from splitflow.spark.offset import OFFSET_FORMAT, BatchOffset, OffsetEncoder, Slice, at
from splitflow.spark.offsetstate import OffsetState, expand_offset
from splitflow.spark.snapshots import RETAIN_BATCHES
from splitflow.spark.statedir import Owner, StateStore
from splitflow.spark.table import SlotReads, SplitTable, holds_none

log = logging.getLogger("splitflow.spark")

INITIAL: JsonDict = {"splitflow": OFFSET_FORMAT, "seq": 0, "initial": True}
"""The offset before the first batch, as Spark gets it: small whatever the split count."""

LEDGER_WARNING = 10_000
"""Finished splits in offsets beyond which a query without ``stateDir`` gets a warning."""

_BODY, _STOP = attrgetter("body"), attrgetter("stop")  # of a Slice
_new = tuple.__new__


# -- the planner -------------------------------------------------------------------------------


class Planner(Generic[SplitT, EnumStateT]):
    """The driver half of the Spark runtime for one source and one query run.

    Called by: the streaming runner's main thread, one call at a time (Spark's contract).
    """

    def __init__(
        self,
        source: Source[Any, SplitT, EnumStateT],
        parallelism: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        state_dir: str | StateStore | None = None,
        backlog_lag_threshold: int | None = None,
        event_time: EventTimeSettings | None = None,
        retain_batches: int = RETAIN_BATCHES,
    ) -> None:
        self.source = source
        self.event_time = event_time
        self.parallelism = parallelism
        self.backlog_lag_threshold = backlog_lag_threshold
        self._events = EventStore(state_dir) if state_dir else None
        self._owner = Owner(state_dir) if state_dir else None
        codec = source.enumerator_state_codec
        self._ledgers: LedgerCodec[EnumStateT] | None = (
            codec if isinstance(codec, LedgerCodec) else None
        )
        self._ledger = LedgerStore(state_dir) if state_dir and self._ledgers else None
        self._offsets = OffsetState(state_dir) if state_dir else None  # small offsets
        self._warned_ledger = False
        self.retain_batches = retain_batches  # offsets Spark keeps (their state files stay)
        self._resumed_at: int | None = None  # restored from this batch; stale state not dropped
        self._events_through = 0
        self._to_readers: dict[int, list[SourceEvent]] = {}
        self._clock = clock
        self._coordinator: SourceCoordinator[SplitT, EnumStateT] | None = None
        self._scheduler = ManualScheduler()
        # Each slot's held splits (split id -> split), each at its position but those in
        # _stale: a batch that reads a split moves only its slice (_pieces) and its row in
        # _table on, and the split object is brought to the slice's stop (_current) only
        # when the enumerator is to see it.
        self._slots: dict[int, dict[str, SplitT]] = {}
        self._stale: set[str] = set()
        self._last: BatchOffset[SplitT, EnumStateT] | None = None
        self._pumped_at = 0.0
        self._last_batch_at = 0.0
        self._target: dict[str, int] | None = None  # AvailableNow: positions to stop at
        self._fix_target = False  # AvailableNow: fix the target at the next planning call
        self._latest_extents: dict[str, SplitExtent] | None = None  # of the last latestOffset
        self._unsorted: set[int] = set()  # slots whose dict is not in split id order
        self._encoder = OffsetEncoder(source)  # reuses what the last offset encoded
        self._slot_of: dict[str, int] = {}  # split id -> the slot that holds it
        self._left = 0  # how many times a split left a slot (_forget)
        self._joined: set[str] | None = None  # while _snapshot watches: the splits assigned
        # Each held split's position and extent in arrays: backlogs, ends and lags.
        self._table = SplitTable()
        # Each held split's extent, as last learnt (_extents), and the backlog boundaries
        # seen at the last planning: a planning checks only the splits whose boundary
        # changed since, those _changed (rewound or assigned since its checks), and those
        # _reached (read up to the boundary seen then).
        self._changed: set[str] = set()
        self._reached: set[str] = set()
        self._extent_of: dict[str, SplitExtent] = {}
        self._token: object | None = None  # of the enumerator's changed_positions
        self._unknown: set[str] = set()  # held splits assigned since the last _extents
        self._boundaries_seen: dict[str, int] = {}
        # Each slot's held splits' slices in the next offset unless a batch reads them: the
        # slice the batch that read it last made (or one that reads nothing, since it was
        # assigned); in the order of the slot's dict in _slots.
        self._pieces: dict[int, dict[str, Slice[SplitT]]] = {}
        # While a restore hands the slots their splits: split id -> the split at the position
        # reading resumes from, as the offset restored from gives it, and its slice there.
        self._resumes: dict[str, tuple[SplitT, Slice[SplitT]]] = {}
        self._initial = False  # checkpoint 0 taken (by initial_offset)
        self._event_times: dict[str, int] = {}  # split id -> watermark (latest event time read)
        self._aligner: Aligner[SplitT] | None = None  # with maxEventTimeDrift, per run
        self._aligned: Alignment | None = None  # how the last batch was aligned
        self._pinner: ReadPinner[SplitT] | None = None  # made at the first pin
        self._pinned: set[int] = set()  # batches pinned (or resumed) in this run, not released
        self._froze = False  # a start froze the objects of the process (_quietly)

    progress_splits = 50
    """At most this many splits are listed one by one in :meth:`lag` (the most lagging)."""

    # -- lifecycle ------------------------------------------------------------------------

    def _start(self, restore_from: BatchOffset[SplitT, EnumStateT] | None) -> None:
        self.close()
        if self._owner is not None:
            self._owner.begin(restore_from.owner if restore_from else None)
        self._scheduler = ManualScheduler()
        self._slots = {slot: {} for slot in range(self.parallelism)}
        self._stale = set()
        self._pieces = {slot: {} for slot in range(self.parallelism)}
        self._unsorted = set()
        self._slot_of = {}
        self._table = SplitTable()
        self._changed, self._reached = set(), set()
        self._extent_of, self._token, self._unknown = {}, None, set()
        self._boundaries_seen = {}
        self._to_readers = {}  # before start: the enumerator may send events from start() on
        self._coordinator = SourceCoordinator(
            self.source,
            self.parallelism,
            self,
            scheduler=self._scheduler,
            restored_state=self._restored_state(restore_from),
        )
        self._settle(self._coordinator.start())
        resumes = restore_from.resumes() if restore_from else {}
        states = redistribute_reader_states(
            {slot: [split for split, _ in kept] for slot, kept in resumes.items()},
            self.parallelism,
        )
        self._resumes = {
            split.split_id: (split, s) for kept in resumes.values() for split, s in kept
        }
        for slot in range(self.parallelism):
            self._settle(self._coordinator.register_reader(slot, "driver", states.get(slot, [])))
        self._resumes = {}
        self._last = restore_from
        self._event_times = dict(restore_from.event_times) if restore_from else {}
        self._aligner, self._aligned = self._new_aligner(), None
        self._latest_extents = None
        self._events_through = restore_from.events_through if restore_from else 0
        self._resumed_at = restore_from.seq if restore_from else None
        self._pumped_at = self._last_batch_at = self._clock()

    def _restored_state(self, offset: BatchOffset[SplitT, EnumStateT] | None) -> EnumStateT | None:
        """The enumerator state of ``offset``, its ledger read back from the state directory."""
        ref = offset.ledger if offset else None
        if ref is not None and self._ledgers is None:
            codec = type(self.source.enumerator_state_codec).__name__
            raise IncompatibleCheckpointError(
                f"enumerator state: the checkpoint keeps a ledger in the state directory but "
                f"the source's state codec {codec} is not a LedgerCodec",
                found="a ledger",
                expected="none",
            )
        if ref is not None and self._ledger is None:
            raise ConfigurationError(
                f"option stateDir: the checkpoint keeps the enumerator's finished splits in a "
                f"state directory (ledger of batch {ref.base}); run the query with its stateDir",
                option="stateDir",
            )
        ids = self._ledger.load(ref) if self._ledger is not None else frozenset()
        if offset is None or ref is None or self._ledgers is None:
            return offset.enumerator if offset else None
        return self._ledgers.join_ledger(offset.enumerator, ids)

    @contextlib.contextmanager
    def _quietly(self) -> Iterator[None]:
        """A start (fresh or restored) makes O(splits) objects that live on: in a process
        that plans batches, no collection runs while it does (at 100k splits a start set
        off some twenty that visited every object made so far), and what exists when it
        is done is frozen (:func:`gc.freeze`: every object of the process), so that no
        later collection visits it again. A frozen object is still freed when the last
        reference to it goes; only a reference cycle among frozen objects waits for
        :meth:`close` (which unfreezes)."""
        if not _QUIET_START:
            yield
            return
        enabled = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            gc.freeze()
            self._froze = True
            if enabled:
                gc.enable()

    def close(self) -> None:
        if self._froze:  # a process may plan on (another query, a test): collect it again
            gc.unfreeze()
            self._froze = False
        if self._coordinator is not None:
            self._coordinator.close()
            self._coordinator = None
        if self._pinner is not None:
            self._pinner.close()
            self._pinner = None

    @property
    def coordinator(self) -> SourceCoordinator[SplitT, EnumStateT]:
        if self._coordinator is None:
            raise RuntimeError("the planner has not started")
        return self._coordinator

    # -- the gateway: the coordinator's messages to the virtual readers --------------------

    def send(self, reader_id: int, message: ReaderMessage[SplitT]) -> None:
        slot = self._slots[reader_id]
        if isinstance(message, AddSplits):
            ids = [split.split_id for split in message.splits]
            slot.update(zip(ids, message.splits, strict=True))
            pieces = list(map(self._new_piece, ids, message.splits))
            self._pieces[reader_id].update(zip(ids, pieces, strict=True))
            self._slot_of.update(dict.fromkeys(ids, reader_id))
            self._stale.difference_update(ids)
            positions = [split.position for split in message.splits]
            self._table.add(ids, reader_id, positions, list(map(_BODY, pieces)))
            if self._joined is not None:
                self._joined.update(ids)
            self._changed.update(ids)
            self._unknown.update(ids)
            self._unsorted.add(reader_id)
        elif isinstance(message, ReaderEvent) and isinstance(message.event, SplitsRemovedEvent):
            for split_id in message.event.split_ids:
                if slot.pop(split_id, None) is not None:
                    self._forget(split_id)
        elif isinstance(message, ReaderEvent):
            self._to_readers.setdefault(reader_id, []).append(message.event)
        elif isinstance(message, NoMoreSplits):
            pass  # a slot ends when its splits end; nothing to do

    def _new_piece(self, split_id: str, split: SplitT) -> Slice[SplitT]:
        """The slice of a split a slot is given: none read (from its position), unless a
        restore gives it back as the offset restored from left it (the same object): then
        that offset's slice, as if the run had not stopped (its encoding is reused)."""
        resumed = self._resumes.get(split_id)
        if resumed is not None and resumed[0] is split:
            return resumed[1]
        return Slice(split, split.position, split.position)

    # -- driving the coordinator ------------------------------------------------------------

    def _settle(self, future: Any = None) -> Any:
        self._scheduler.run_until_idle()
        failure = self.coordinator.failure
        if failure is not None:
            raise failure
        return None if future is None else future.result()

    def _pump(self) -> None:
        now = self._clock()
        self._scheduler.advance(max(0.0, now - self._pumped_at))
        self._pumped_at = now
        self._settle()

    def _ensure(self, start: Mapping[str, Any] | None) -> None:
        """Start fresh, or restore from ``start`` unless it is the batch planned last."""
        if not start or start.get("seq") == 0:  # the initial offset: nothing to restore
            if self._coordinator is None or not self._planned_last(INITIAL):
                self._start(None)
            return
        if self._coordinator is not None and self._planned_last(start):
            return  # the batch planned last: no need to decode the whole offset
        if self._coordinator is not None:  # a restore over a run: its cycles go before a freeze
            self.close()
            gc.collect()
        with self._quietly():
            whole = self._expand(start)
            decoded = BatchOffset.decode(whole, self.source)
            log.info("splitflow: restoring the coordinator from batch offset %d", decoded.seq)
            self._start(decoded)
            self._encoder.seed(decoded, whole)

    # -- Spark's calls ------------------------------------------------------------------------

    def initial_offset(self) -> JsonDict:
        """Offset before the first batch: everything assigned, nothing read. Idempotent.

        Spark calls it twice on a fresh start, and after ``prepare_available_now`` (which
        may already have started the coordinator) under ``trigger(availableNow=True)``.
        The offset Spark gets is :data:`INITIAL`, whatever the split count: Spark logs no
        batch's start, only ends, and hands the initial offset back only to the run that
        made it (as batch 0's start); a restarted run asks for it anew and starts fresh.
        """
        if not self._initial:
            with self._quietly():
                if self._coordinator is None:
                    self._start(None)
                self._pump()
                if self._fix_target:
                    self._fix_target_now()
                self._snapshot(0, None)  # checkpoint 0: everything assigned, nothing read
            self._initial = True
        return dict(INITIAL)

    def prepare_available_now(self) -> None:
        """Read what exists when the run starts, nothing that appears later.

        Spark calls this before it says which offset the run resumes from, so the target
        (each split's extent) is fixed by the run's first planning call, from the
        coordinator in its right state: started fresh, or restored from the offset.
        """
        self._target = None
        self._fix_target = True
        if self._coordinator is not None:
            self._fix_target_now()

    def _fix_target_now(self) -> None:
        self._target = {sid: extent.exists_to for sid, extent in self._extents().items()}
        self._fix_target = False
        self._learnt(None)  # every backlog is capped anew

    def latest_offset(self, start: Mapping[str, Any], limit: ReadLimit) -> JsonDict:
        """Plan the next batch from ``start``; returns ``start`` when there is nothing new."""
        self._ensure(start)
        if self._owner is not None:
            self._owner.check()
        self._drop_abandoned_state()
        self._release_pins(int(start["seq"]))
        self._apply_reader_events(int(start["seq"]))
        self._pump()
        if self._fix_target:
            self._fix_target_now()
        extents = self._extents()
        while self._finish(self._table.ended()):  # the enumerator may assign others, ended too
            extents = self._extents()
        self._latest_extents = extents
        if _QUIET_START:
            _collect_young_in_proportion(len(self._slot_of))
        self._track_backlog(extents)
        self._changed, self._reached = set(), set()  # checked: from here on, what changes
        # After the enumerator's steps above, which may remove splits (the aligner's steps
        # below may too: the backlogs are taken again after them).
        backlogs = self._table.backlogs()
        if isinstance(limit, BacklogAware):
            limit = limit.backlog if self.in_backlog else limit.live
        sized = limit.then if isinstance(limit, MinRecords) else limit
        if self._aligner is not None:
            held = {
                sid: split
                for slot in self._current().values()
                for sid, split in slot.items()
                if sid in extents
            }
            aligned = self._aligner.align(
                held,
                extents,
                backlogs.as_dict(),
                sized,
                self._event_times,
                now=self._clock(),
                available_now=self._target is not None,
            )
            waiting = self._table.backlogs().as_dict()  # without splits removed meanwhile
            backlogs = Backlogs.of(capped(waiting, aligned.caps, aligned.positions))
            self._aligned = aligned
        if isinstance(limit, MinRecords):
            waited = self._clock() - self._last_batch_at
            enough = backlogs.total() >= limit.records
            if not enough and waited < limit.max_delay and self._target is None:
                return dict(start)
        reads = self._table.placed(reads_under(sized, backlogs, extents))
        if not len(reads.ids):
            return dict(start)  # nothing to read: Spark plans no batch
        seq = (self._last.seq if self._last else 0) + 1
        offset = self._snapshot(seq, reads, self._table.read_to_end(reads))
        self._last_batch_at = self._clock()
        encoded = offset.encode(self.source, self._encoder)
        if self._offsets is None:
            return encoded
        return self._offsets.compact(encoded, self._encoder.changed, self._encoder.since)

    def planned(self, end: Mapping[str, Any]) -> BatchOffset[SplitT, EnumStateT]:
        """``end`` decoded; without decoding when it is the offset this planner planned last.

        ``partitions(start, end)`` follows ``latestOffset`` in the same runner process, so
        within a run ``end`` is the offset just planned; after a restart it is decoded.
        Spark asks for a batch's partitions once it recorded the batch's offset: from then
        on the state directory is this query's (a restart replays the batch with its token).
        """
        if self._last is not None and self._planned_last(end):
            if self._owner is not None:
                self._owner.confirm()
            return self._last
        return self._decode(end)

    def _decode(self, offset: Mapping[str, Any]) -> BatchOffset[SplitT, EnumStateT]:
        """A Spark offset of this query (a small one: its state read from ``stateDir``); the
        state files this planner writes next build on it."""
        return BatchOffset.decode(self._expand(offset), self.source)

    def _expand(self, offset: Mapping[str, Any]) -> JsonDict:
        """A Spark offset of this query, whole (see :meth:`_decode`)."""
        if self._owner is not None and offset.get("state") is not None:
            self._owner.expect(offset.get("owner"))
        return expand_offset(offset, self._offsets)

    def read_offset(self, offset: Mapping[str, Any]) -> BatchOffset[SplitT, EnumStateT]:
        """A Spark offset of this query, read as a restarted driver reads it, without
        changing what this planner writes next (for tools and tests). The initial offset
        holds no state: only the planner that made it, before it plans a batch, reads it."""
        if offset.get("initial") and self._last is not None and self._planned_last(offset):
            return self._last
        state = OffsetState(self._offsets.store) if self._offsets is not None else None
        return BatchOffset.decode(expand_offset(offset, state), self.source)

    def pin(self, offset: BatchOffset[SplitT, EnumStateT]) -> SourceEvent | None:
        """The event every task of batch ``offset`` hands its reader first, from the source's
        :class:`~splitflow.api.source.ReadPinner` (None: the source pins nothing, or the
        batch reads nothing). Called for every evaluation of the batch; the pinner answers
        the same while the pin is held, until the batch completes.

        With ``stateDir`` the event is kept with the batch's reader events before any task
        gets it, and a restarted driver that evaluates the batch again (a replay after a
        crash) hands it to the pinner's ``resume``, which may keep it: then the replay
        reads what the first evaluation read."""
        if not isinstance(self.source, SupportsPinnedReads):
            return None
        reads = [s.split for slot in range(offset.parallelism) for s in offset.reading(slot)]
        if not reads:
            return None
        if self._pinner is None:
            self._pinner = self.source.create_read_pinner()
        seq = offset.seq
        if self._events is None or seq in self._pinned:
            return self._pinner.pin(seq, reads)
        kept = self._events.read_pin(seq)
        if kept is None:
            pin = self._pinner.pin(seq, reads)
        else:
            pin = self._pinner.resume(seq, reads, kept)
        if pin is not None and pin != kept:
            self._events.write_pin(seq, pin)
        self._pinned.add(seq)
        return pin

    def _release_pins(self, completed: int) -> None:
        """Batches up to ``completed`` completed: no evaluation of them follows."""
        if self._pinner is not None:
            self._pinner.release(completed)
        self._pinned = {seq for seq in self._pinned if seq > completed}

    def _planned_last(self, offset: Mapping[str, Any]) -> bool:
        """Whether ``offset`` is the one this planner planned last (same checkpoint seq)."""
        return self._last is not None and offset.get("seq") == self._last.seq

    def commit(self, end: Mapping[str, Any]) -> None:
        seq = int(end["seq"])
        self._release_pins(seq)
        if self._coordinator is not None and seq > 0:
            self._settle(self._coordinator.notify_checkpoint_complete(seq))
        if self._owner is not None and seq > 0:
            self._owner.confirm()
        oldest = seq - self.retain_batches + 1  # Spark keeps no older offset than this one's
        if self._events is not None:
            self._events.keep_from(oldest)
        if self._ledger is not None:
            self._ledger.keep_from(oldest)
        if self._offsets is not None:
            self._offsets.keep_from(oldest)

    def _drop_abandoned_state(self) -> None:
        """Once per run, after a restore from batch k and the owner check: delete the state
        files of batches after k, which no offset Spark keeps refers to (rolled back, or lost
        in a crash); the batches planned next write their own. See the clean-up rules in
        :mod:`splitflow.spark.snapshots` and :mod:`splitflow.spark.events`."""
        seq, self._resumed_at = self._resumed_at, None
        if seq is not None and self._events is not None:
            self._events.resume_at(seq)
        if seq is not None and self._ledger is not None:
            self._ledger.resume_at(seq)
        if seq is not None and self._offsets is not None:
            self._offsets.resume_at(seq)

    def _apply_reader_events(self, completed: int) -> None:
        """Hand the enumerator the events of batches up to ``completed``, once each.

        Events of a slot that a restart with less parallelism removed are facts of a batch
        that completed (a chunk's watermark, a quarantined range): they go to the enumerator
        as from slot ``slot % parallelism``, a registered reader. A reader's
        SplitsFinishedEvent is left out: the planner finished the split when it planned the
        batch that read it to its end. A SliceEndedEvent moves its split back to where the
        slice ended (:meth:`_rewind`), so the batch planned next reads on from there.

        The last planned batch's tasks must all have written (:meth:`_check_events_written`).
        """
        if self._events is not None:
            for seq in range(self._events_through + 1, completed + 1):
                slots, events = self._events.read(seq)
                if self._last is not None and self._last.seq == seq:
                    self._check_events_written(self._last, slots)
                for slot, event in events:
                    if isinstance(event, SplitEventTimesEvent):  # the runtime's, not the source's
                        self._observe_event_times(event)
                    elif isinstance(event, SliceEndedEvent):
                        self._rewind(event)
                    elif not isinstance(event, SplitsFinishedEvent):
                        reader = slot % self.parallelism
                        self._settle(self.coordinator.handle_source_event(reader, event))
        self._events_through = max(self._events_through, completed)

    def _rewind(self, event: SliceEndedEvent) -> None:
        """A reader ended a slice early: the split's next slice starts where it ended."""
        sid = event.split_id
        piece = self._pieces.get(self._slot_of.get(sid, -1), {}).get(sid)
        if piece is not None and event.position < piece.stop:
            self._pieces[self._slot_of[sid]][sid] = Slice(
                piece.body, event.position, event.position
            )
            self._stale.add(sid)
            self._table.move([sid], [event.position])
            self._changed.add(sid)

    def _check_events_written(
        self, batch: BatchOffset[SplitT, EnumStateT], slots: set[int]
    ) -> None:
        """Every task of a batch writes its reader events, none or some, once it has read its
        slices to the end; ``slots`` wrote for ``batch``. A slot with tasks and nothing
        written means the executors write elsewhere (a local stateDir on a cluster) or the
        sink read the batch only in part or not at all (``limit``, a foreachBatch function
        that skips its DataFrame): those tasks' events are lost. A CheckpointStateError for a
        source that :attr:`~splitflow.api.source.Source.needs_reader_events` (a CDC snapshot
        would never start its log), else a warning."""
        missing = [s for s in range(batch.parallelism) if batch.has_tasks(s) and s not in slots]
        if not missing or self._events is None:
            return
        where = self._events.store.where(self._events.root)
        message = (
            f"batch {batch.seq} completed, but the tasks of slot(s) "
            f"{', '.join(map(str, missing))} left no reader events in {where} (option "
            "stateDir): the executors write elsewhere (on a cluster, stateDir must be a store "
            "every node reaches, not a local path), or the sink did not read the whole batch "
            "(limit, or a foreachBatch function that skips its DataFrame)"
        )
        if self.source.needs_reader_events:
            raise CheckpointStateError(
                f"option stateDir: {message}; the source needs them: make every batch read "
                "whole, with stateDir where the executors write",
                path=where,
            )
        log.warning("splitflow: %s; those tasks' events are lost", message)

    # -- event time ---------------------------------------------------------------------------

    def _new_aligner(self) -> Aligner[SplitT] | None:
        settings = self.event_time
        if settings is None or settings.max_drift is None:
            return None
        return Aligner(
            settings,
            lambda splits: self._settle(self.coordinator.event_times(splits)),
            lambda splits, bound: self._settle(self.coordinator.positions_after(splits, bound)),
        )

    def _observe_event_times(self, event: SplitEventTimesEvent) -> None:
        for sid, event_time in event.event_times:
            self._event_times[sid] = max(event_time, self._event_times.get(sid, event_time))

    # -- internals ----------------------------------------------------------------------------

    def _cap(self, split_id: str, extent: SplitExtent) -> int:
        """How far a batch may read the split: under ``availableNow``, what existed at the
        run's start (a split made since, unless it holds data older than itself: none)."""
        if self._target is None:
            return extent.latest
        if split_id not in self._target and extent.preexisting:
            self._target[split_id] = extent.exists_to
        return min(extent.latest, self._target.get(split_id, 0))

    def _extents(self) -> dict[str, SplitExtent]:
        """How far each held split can be read now (the planner's own dict, kept up to date
        from call to call: read it within one planning); notes in the table the extents of
        the splits whose extent may have changed since the last call.

        From the enumerator's ``changed_positions`` where it tracks changes (then, after
        its first call in a run, only the splits assigned since are asked for), else
        ``latest_positions`` of every split, its changes found by identity (at C speed
        while the splits are the same, else one look-up a split).
        """
        coordinator = self.coordinator
        tracked = self._settle(coordinator.changed_positions(self._token))
        if tracked is None:  # ask for every held split
            self._token, self._unknown = None, set()
            held = [s for slot in self._current().values() for s in slot.values()]
            extents = dict(self._settle(coordinator.latest_positions(held))) if held else {}
            moved = _changed_keys(self._extent_of, extents, is_not)
            self._extent_of = extents
            self._learnt(moved)
            return extents
        first, (self._token, changes) = self._token is None, tracked
        extents = self._extent_of
        if first:  # at a start, or after the source could not tell: ask for every split
            extents.clear()
            ask = [s for slot in self._current().values() for s in slot.values()]
            asked, self._unknown = set(self._slot_of), set()
        else:
            asked, self._unknown = self._unknown, set()  # splits assigned from now: next call
            # Unless some are to be asked (noted below, with those), the changes go into the
            # table from the source's own mapping (a small dict), which finds which are held.
            noted = not asked and self._learnt(changes.keys(), cast(Mapping[str, Any], changes))
            if noted and not holds_none(changes.values()):
                extents.update(changes)  # all held, none gone: at C speed
            else:
                for sid in changes.keys() & self._slot_of.keys():
                    extent = changes[sid]
                    if extent is None:
                        extents.pop(sid, None)
                    else:
                        extents[sid] = extent
            slots = self._current(asked)
            ask = [slots[self._slot_of[sid]][sid] for sid in sorted(asked)]
        told = self._settle(coordinator.latest_positions(ask)) if ask else {}
        asked = asked & self._slot_of.keys()  # not those that left their slot meanwhile
        kept = told.keys() & asked  # what the source was asked and told, nothing else
        extents.update(told if len(kept) == len(told) else {sid: told[sid] for sid in kept})
        missing = asked - kept  # cannot be told now: asked again at the next call
        for sid in missing:
            extents.pop(sid, None)
        self._unknown |= missing
        if first or asked:
            self._learnt(None if first else changes.keys() | asked)
        return extents

    def _current(self, sids: Iterable[str] | None = None) -> dict[int, dict[str, SplitT]]:
        """:attr:`_slots` with every split (or those ``sids`` names) at its position: the
        stop of its slice."""
        stale = self._stale if sids is None else self._stale.intersection(sids)
        for sid in stale:
            slot_id = self._slot_of[sid]
            piece = self._pieces[slot_id][sid]
            self._slots[slot_id][sid] = at(piece.body, piece.stop)
        if sids is None:
            self._stale = set()
        else:
            self._stale -= stale
        return self._slots

    def _learnt(
        self, moved: Iterable[str] | None, told: Mapping[str, SplitExtent] | None = None
    ) -> bool:
        """The extents of held splits ``moved`` (None: every held split) into the table, from
        ``told`` (default: :attr:`_extent_of`); whether every one of them is held."""
        capped = self._cap if self._target is not None else None
        extents = self._extent_of if told is None else told
        return self._table.note(self._slot_of if moved is None else moved, extents, capped)

    def _forget(self, split_id: str) -> None:
        """Split ``split_id`` left its slot (finished or removed)."""
        self._left += 1
        self._table.remove(split_id)
        self._stale.discard(split_id)
        slot_id = self._slot_of.pop(split_id, None)
        if slot_id is not None:
            self._pieces[slot_id].pop(split_id, None)
        self._extent_of.pop(split_id, None)
        self._unknown.discard(split_id)

    def _finish(self, ended: Mapping[int, Sequence[str]]) -> bool:
        """Take the splits ``ended`` names out of their slots and tell the enumerator they
        finished (it may assign others, or clean up what they read once a checkpoint that
        records them completes); whether there were any."""
        for slot_id, sids in ended.items():
            if sids:
                for sid in sids:
                    if self._slots[slot_id].pop(sid, None) is not None:  # not finished before
                        self._forget(sid)
                event = SplitsFinishedEvent(tuple(sids))
                self._settle(self.coordinator.handle_source_event(slot_id, event))
        return any(ended.values())

    @property
    def in_backlog(self) -> bool:
        """Whether the source is processing backlog now (the enumerator's flag)."""
        return self.coordinator.context.is_processing_backlog

    def _track_backlog(self, extents: Mapping[str, SplitExtent]) -> None:
        """Tell the enumerator which splits reached their backlog boundary, and which fell
        behind again (over :attr:`backlog_lag_threshold` records in all, outside backlog:
        each lagging split gets its latest position as its new boundary).

        The positions are those after the last planned batch, which has completed: a
        split's event is sent when the first batch that read up to its boundary is done,
        whatever its tasks' retries. Being derived from positions, these changes need no
        batch of their own: an enumerator restored from an offset without them gets them
        again when the next batch is planned.
        """
        boundaries = self._settle(self.coordinator.backlog_boundaries())
        seen, self._boundaries_seen = self._boundaries_seen, boundaries
        # a split reaches its boundary as it moves, or anew
        moved = self._changed | self._reached
        check = (_changed_keys(seen, boundaries, ne) | moved) & boundaries.keys()
        reached: dict[int, list[str]] = {}
        for sid in check:
            slot_id = self._slot_of.get(sid)
            if slot_id is not None and self._pieces[slot_id][sid].stop >= boundaries[sid]:
                reached.setdefault(slot_id, []).append(sid)
        for slot_id, sids in sorted(reached.items()):
            event: SourceEvent = BacklogFinishedEvent(tuple(sorted(sids)))
            self._settle(self.coordinator.handle_source_event(slot_id, event))
        threshold = self.backlog_lag_threshold
        if threshold is None or self.in_backlog:
            return
        lags = self._table.lags()
        lag = exact_sum(lags)  # what exists counts, admitted or not
        if lag <= threshold:
            return
        log.info("splitflow: %d records behind (over %d): processing backlog again", lag, threshold)
        behind = [  # all made before any is handled (which may remove splits)
            (slot_id, BacklogStartedEvent.of({sid: extents[sid].exists_to for sid in sids}))
            for slot_id, sids in self._table.lagging(lags).items()
        ]
        for slot_id, event in behind:
            self._settle(self.coordinator.handle_source_event(slot_id, event))

    def _sorted_slot(self, slot_id: int) -> dict[str, SplitT]:
        """Slot ``slot_id``'s splits in split id order (sorted again only after additions),
        and its slices (:attr:`_pieces`) in the same order."""
        if slot_id in self._unsorted:
            self._slots[slot_id] = dict(sorted(self._slots[slot_id].items()))
            pieces = self._pieces[slot_id]
            self._pieces[slot_id] = {sid: pieces[sid] for sid in self._slots[slot_id]}
            self._unsorted.discard(slot_id)
        return self._slots[slot_id]

    def _slices(
        self, slot_id: int, group: SlotReads | None, seq: int, moved: bool
    ) -> tuple[tuple[Slice[SplitT], ...], tuple[Slice[SplitT], ...]]:
        """Slot ``slot_id``'s slices (in split id order) after batch ``seq`` reads ``group``
        of its splits, and the slices of those; its read splits' slices move on to where the
        batch stops (the split objects stay: :meth:`_current`). ``moved``: the table's rows
        of the splits read are where the batch stops (:meth:`SplitTable.advance`), and
        their slices are made from those rows, else from the slices they had.

        Only the slices of the splits the batch reads are made anew: every other split keeps
        the slice object it had (``_pieces``), which saves the encoder and the state file
        their work (:class:`OffsetEncoder`).
        """
        self._sorted_slot(slot_id)
        pieces = self._pieces[slot_id]
        if group is None:
            return tuple(pieces.values()), ()
        read = group.ids
        # A new slice from where the last one stopped, of the same split: made by maps, as
        # Slice's own __new__ makes them (at 1M splits this runs 100k times a batch).
        if moved:  # from the rows: no look-up of a split's slice
            at = self._table.position[group.rows]
            bodies, starts, stops = (
                self._table.body[group.rows].tolist(),
                (at - group.values).tolist(),
                at.tolist(),
            )
        else:
            was = list(map(pieces.__getitem__, read))
            bodies, starts = list(map(_BODY, was)), list(map(_STOP, was))
            stops = list(map(add, starts, group.values.tolist()))
        made = tuple(
            map(
                _new,
                itertools.repeat(Slice),
                zip(bodies, starts, stops, itertools.repeat(seq), itertools.repeat(False)),
            )
        )
        pieces.update(zip(read, made, strict=True))
        self._stale.update(read)
        if seen := self._boundaries_seen:  # a boundary that changes is checked anyway
            reached = zip(read, stops, strict=True)
            self._reached.update(sid for sid, stop in reached if stop >= seen.get(sid, stop + 1))
        return tuple(pieces.values()), made

    def _snapshot(
        self,
        seq: int,
        reads: Backlogs | None,
        ends: Mapping[int, Sequence[str]] | None = None,
    ) -> BatchOffset[SplitT, EnumStateT]:
        """Take checkpoint ``seq`` with every slot reading ``reads`` (of held splits, with
        their rows: :meth:`SplitTable.placed`) more records per split.

        The splits ``ends`` names (per slot) are read to their final position: they are
        finished before the checkpoint, so that it records them finished and the batch
        that reads their last records is the last batch that holds them (no batch of its
        own to record the finish; a source that cleans up what a split read does it when
        this batch commits). They keep their slice in the offset, marked ``ends``.
        """
        ends = ends or {}
        ending = {
            slot_id: [self._pieces[slot_id][sid] for sid in sids]
            for slot_id, sids in ends.items()
            if sids
        }
        counts: dict[str, int] = {}  # records each split reads
        by_slot: dict[int, SlotReads] = {}  # the splits read, of each slot
        if reads is not None:  # by the table's rows, which finishing splits may reuse
            counts = reads.as_dict()
            by_slot = self._table.slots_of(reads)
            self._table.advance(reads)
        backlog = self.coordinator.context.is_processing_backlog  # while the batch reads
        left, self._joined = self._left, set()
        try:
            self._finish(ends)
            enumerator = self._settle(self.coordinator.checkpoint(seq))
        finally:
            joined, self._joined = self._joined, None
        # Meanwhile the enumerator may have removed splits (besides those that ended) or
        # assigned again splits the batch reads: then the reads are grouped by their rows as
        # they are now (looked up, those still held), their slices made from the slices
        # they had, and their rows moved after. Those that ended are read by their ending
        # slices, also when the enumerator assigned their ids again meanwhile.
        settled = self._left - left == sum(map(len, ends.values())) and not any(
            sid in counts for sid in joined
        )
        ended = {sid for sids in ends.values() for sid in sids}
        if not settled:
            on = {sid: n for sid, n in counts.items() if sid not in ended}
            by_slot = self._table.slots_of(self._table.placed(Backlogs.of(on)))
        ledger = None
        if self._ledgers is not None:
            stripped, ids = self._ledgers.split_ledger(enumerator)
            if self._ledger is not None:
                enumerator, ledger = stripped, self._ledger.write(seq, ids)
            elif len(ids) > LEDGER_WARNING and not self._warned_ledger:
                self._warned_ledger = True
                log.warning(
                    "splitflow: %d finished splits are copied into every offset; set option "
                    "stateDir to keep them in a state directory instead",
                    len(ids),
                )
        slots: list[tuple[Slice[SplitT], ...]] = []
        reading: list[tuple[Slice[SplitT], ...]] = []
        for slot_id in range(self.parallelism):
            group = by_slot.get(slot_id)
            if group is not None and slot_id in ending:  # read by their ending slices
                kept = [i for i, sid in enumerate(group.ids) if sid not in ended]
                still = [group.ids[i] for i in kept]
                group = SlotReads(still, group.rows[kept], group.values[kept])
            slices, read = self._slices(slot_id, group, seq, settled)
            if not settled and group is not None:
                self._table.move(group.ids, [piece.stop for piece in read])
            if slot_id in ending:
                slices = tuple(
                    sorted(
                        (
                            *slices,
                            *(
                                Slice(p.body, p.stop, p.stop + counts[p.body.split_id], seq, True)
                                for p in ending[slot_id]
                            ),
                        ),
                        key=lambda piece: piece.body.split_id,
                    )
                )
                read = tuple(p for p in slices if p.seq == seq and p.records > 0)
            slots.append(slices)
            reading.append(read)
        self._settle(self.coordinator.release_held_messages())
        to_readers: dict[int, list[SourceEvent]] = {}
        if self._last is not None:  # events whose slot had no task in the last batch wait on
            for slot_id, waiting in self._last.to_readers.items():
                if slot_id >= self.parallelism:
                    log.warning("splitflow: dropping events for slot %d (rescaled)", slot_id)
                elif not self._last.has_tasks(slot_id):
                    to_readers.setdefault(slot_id, []).extend(waiting)
        for slot_id, queued in self._to_readers.items():
            to_readers.setdefault(slot_id, []).extend(queued)
        self._to_readers = {}
        if self._event_times:
            held = {s.body.split_id for slices in slots for s in slices}
            for sid in [sid for sid in self._event_times if sid not in held]:
                del self._event_times[sid]  # finished or removed
        self._last = BatchOffset(
            seq,
            enumerator,
            tuple(slots),
            backlog,
            self._events_through,
            {slot: tuple(events) for slot, events in to_readers.items()},
            ledger,
            dict(self._event_times),
            self._owner.token if self._owner else None,
            tuple(reading),
        )
        return self._last

    def lag(self) -> dict[str, Any]:
        """Progress for ``query.lastProgress`` (Spark's ``reportLatestOffset``).

        Totals, each slot's split count and lag, the backlog flag, and per split its owner,
        position, latest position and lag: every split when there are at most
        :attr:`progress_splits` of them, else the most lagging ones (the report is sent on
        every trigger and kept in every progress event, so it must not grow with the source).
        """
        extents = self._latest_extents  # Spark asks right after latestOffset
        if extents is None:  # before this run planned: from the extents now
            extents = self._extents() if self._coordinator is not None else {}
        boundaries = (
            self._settle(self.coordinator.backlog_boundaries()) if self._coordinator else {}
        )
        table = self._table
        lags = table.lags()
        slots = [  # none before the start (no slots)
            {"splits": len(self._slots[slot_id]), "lag": lag}
            for slot_id, lag in enumerate(table.slot_lags(lags, len(self._slots)))
        ]
        lagging = np.flatnonzero(lags > 0)
        if len(lagging) > self.progress_splits:  # a tie goes to the lower row
            lagging = lagging[largest(self.progress_splits, lags[lagging])]
        top = sorted(lagging.tolist(), key=lambda row: (-lags[row], row))  # most lagging first
        listed = [(sid, self._slot_of[sid]) for sid in table.ids[top].tolist()]
        if len(listed) < self.progress_splits:  # then splits that do not lag, in order
            named = {sid for sid, _ in listed}
            listed.extend(
                itertools.islice(
                    (
                        (sid, slot_id)
                        for slot_id in sorted(self._slots)
                        for sid in self._sorted_slot(slot_id)
                        if sid not in named
                    ),
                    self.progress_splits - len(listed),
                )
            )
        rows = {}
        for sid, slot_id in listed:
            position = self._pieces[slot_id][sid].stop
            extent = extents.get(sid)
            row = {
                "owner": slot_id,
                "position": position,
                "latest": None if extent is None else extent.latest,
                "lag": None if extent is None else max(0, extent.exists_to - position),
            }
            if extent is not None and extent.available is not None:
                row["available"] = extent.available
            if sid in boundaries:
                row["backlogBoundary"] = boundaries[sid]
                row["toBoundary"] = max(0, boundaries[sid] - position)
            row.update(self._split_event_time(sid))
            rows[sid] = row
        return {
            "splitCount": sum(s["splits"] for s in slots),
            "totalLag": sum(s["lag"] for s in slots),
            "slots": slots,
            "splits": rows,
            "backlog": bool(self._coordinator and self.in_backlog),
            "backlogSplits": len(boundaries),
            **self._event_time_report(),
        }

    def _split_event_time(self, split_id: str) -> dict[str, Any]:
        """A split's watermark, and how the last batch aligned it, for :meth:`lag`."""
        if self.event_time is None:
            return {}
        row: dict[str, Any] = {"watermark": iso(self._event_times.get(split_id))}
        aligned = self._aligned
        if aligned is not None:
            row["idle"] = split_id in aligned.idle
            row["paused"] = split_id in aligned.paused
            current = aligned.current.get(split_id)
            if current is not None and aligned.watermark is not None:
                row["drift"] = (current - aligned.watermark) / 1_000_000
        return row

    def _event_time_report(self) -> dict[str, Any]:
        settings = self.event_time
        if settings is None:
            return {}
        report: dict[str, Any] = {"eventTimeColumn": settings.column}
        if settings.max_drift is not None:
            aligned = self._aligned
            report["maxEventTimeDrift"] = settings.max_drift / 1_000_000
            report["alignedWatermark"] = iso(aligned.watermark) if aligned else None
            report["alignmentLimit"] = iso(aligned.limit) if aligned else None
            report["idleSplits"] = len(aligned.idle) if aligned else 0
            report["pausedSplits"] = len(aligned.paused) if aligned else 0
        return report


def _changed_keys(
    before: Mapping[str, Any], now: Mapping[str, Any], differ: Callable[[Any, Any], bool]
) -> set[str]:
    """The keys whose values ``differ`` from ``before`` to ``now``, new keys and those gone:
    at C speed when the two have the same keys in the same order, else one look-up a key."""
    if len(before) == len(now) and list(before) == list(now):
        return set(itertools.compress(now, map(differ, now.values(), before.values())))
    gone = object()
    changed = {key for key, value in now.items() if differ(before.get(key, gone), value)}
    changed.update(key for key in before if key not in now)
    return changed


def collect_garbage_less_often() -> None:
    """Raise CPython's cyclic-GC thresholds in a process that plans batches.

    Each batch builds and parses offsets of O(splits) objects; with the default thresholds
    (700, 10, 10) that sets off a full collection every batch or two, and a full collection
    visits every live object (at 100k splits: 136 full collections, 28.8 s in a run of
    ``bench/planning_scale.py``; with these thresholds, 1 in 3.6 s). Called once in Spark's
    streaming runner process, which serves one source; thresholds already higher are kept.

    It also makes the planners of the process start quietly (:meth:`Planner._quietly`),
    and collect the youngest generation in proportion to the splits they hold
    (:func:`_collect_young_in_proportion`).
    """
    global _QUIET_START
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, 50_000), max(gen1, 20), max(gen2, 10))
    _QUIET_START = True


def _collect_young_in_proportion(held: int) -> None:
    """In a process that plans batches, let as many tracked objects as three times the
    ``held`` splits be made (and not freed) before the youngest generation is collected.

    A batch makes container objects in proportion to the splits it reads and the splits
    held (each slot's slices, the offset's entries), and drops those of the batch before
    at its end: one that reads every split makes two per split (its slice and the slice's
    entry), and a few more. A collection that falls within a batch visits every young
    object alive and what each refers to, and moves them to the next generation, whose
    collections visit them again: at 1M splits, 100k of them read a batch, the youngest
    generation was collected four times a batch (60 to 80 ms) and the next one every few
    batches (160 to 300 ms). With this bound no collection falls within a batch; cyclic
    garbage waits until that many objects were made and not freed (the live objects are
    several times as many). The threshold only rises."""
    gen0, gen1, gen2 = gc.get_threshold()
    if 3 * held > gen0:
        gc.set_threshold(3 * held, gen1, gen2)


_QUIET_START = False
"""Whether this process plans batches (:func:`collect_garbage_less_often` was called)."""
