"""A ready split enumerator: discovery, balanced assignment, FLIP-537 recovery, snapshots.

A connector subclasses :class:`AssigningSplitEnumerator`, implements
:meth:`~AssigningSplitEnumerator.discover_splits` (and, for Spark,
:meth:`~splitflow.api.enumerator.SplitEnumerator.latest_positions`), and gets:

* periodic or one-off discovery on the worker pool, new splits assigned as they appear;
* assignment through a pluggable :class:`~splitflow.api.assignment.AssignmentStrategy`,
  balanced least-loaded by default, only once every reader has registered, so the first
  reader to register does not get everything;
* the enumerator as the single source of truth for ownership, with the three split origins
  of FLIP-537 told apart (see :class:`~splitflow.api.source.SupportsSplitReassignmentOnRecovery`)
  and a redistribution over all readers after a global restore or a change of parallelism;
* snapshots that hold every split the enumerator owns, with its position, and only the ids
  of splits readers own (their positions live in the readers' state);
* splits that vanish from discovery removed and their owners told
  (:class:`~splitflow.api.events.SplitsRemovedEvent`), via an overridable hook;
* ``signal_no_more_splits`` once everything is assigned, when discovery is one-off;
* backlog tracking (FLIP-309, as Fluss proposes it): a split seen for the first time gets
  a backlog boundary (by default its latest position then, see :meth:`backlog_boundary`),
  kept in the snapshot until a :class:`~splitflow.api.events.BacklogFinishedEvent` says
  the split reached it; the source is processing backlog while any split has a boundary
  or a subclass holds the flag (:meth:`hold_backlog`, e.g. for a snapshot phase).

Ownership invariant, checked where it could break: every known split that has not finished
is owned by exactly one of the enumerator (unassigned, or awaiting its report after a
global restore) or one reader. Where the runtime would make it false (a reader restarts and
neither reports nor gets back a split the map says it owned), the enumerator raises
:class:`~splitflow.errors.SplitOwnershipError` instead of losing the split.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic

from splitflow.api.assignment import AssignmentStrategy, BalancedAssignment
from splitflow.api.enumerator import SplitEnumerator, SplitEnumeratorContext, SplitExtent
from splitflow.api.events import (
    BacklogFinishedEvent,
    BacklogStartedEvent,
    SourceEvent,
    SplitsFinishedEvent,
    SplitsRemovedEvent,
)
from splitflow.api.split import Codec, JsonDict, LedgerCodec, SplitT
from splitflow.errors import (
    ConfigurationError,
    ConnectorError,
    ContractViolation,
    DataLossError,
    IncompatibleCheckpointError,
    SplitOwnershipError,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AssignerState(Generic[SplitT]):
    """Snapshot of an :class:`AssigningSplitEnumerator`.

    ``unassigned``: splits the enumerator owns, at their positions (new, given back, or
    reported and not yet assigned again). ``assigned``: split id -> owning reader; those
    splits' positions are in the readers' state, which reports them on restore.
    ``finished``: ids of splits read to their end (never assigned again).
    ``discovered``: the first discovery has completed.
    ``backlog``: split id -> backlog boundary, for splits that have not reached it.
    ``backlog_held``: the enumerator itself says the source is processing backlog.

    Snapshots share ``assigned`` and ``backlog`` with the snapshot before while they stay
    the same, and :class:`AssignerStateCodec` encodes them as they are: read them (and an
    encoded state), do not change them.
    """

    unassigned: tuple[SplitT, ...] = ()
    assigned: Mapping[str, int] = field(default_factory=dict)
    finished: frozenset[str] = frozenset()
    discovered: bool = False
    backlog: Mapping[str, int] = field(default_factory=dict)
    backlog_held: bool = False


def _as_dict(mapping: Mapping[str, int]) -> dict[str, int]:
    """``mapping`` as a JSON object: itself when it is a dict (a state's mappings are not
    changed once made, and a snapshot's encoding that shares them with the one before is
    found unchanged by identity), else a copy."""
    return mapping if type(mapping) is dict else dict(mapping)


class AssignerStateCodec(LedgerCodec[AssignerState[SplitT]]):
    """Encodes :class:`AssignerState` compactly: splits via the split codec, ids as strings.

    Its ledger is the set of finished split ids, the part of the state that grows.
    """

    version = 1

    def __init__(self, split_codec: Codec[SplitT]) -> None:
        self._splits = split_codec

    def encode(self, value: AssignerState[SplitT]) -> JsonDict:
        return {
            "split_codec": self._splits.version,
            "unassigned": {s.split_id: self._splits.encode(s) for s in value.unassigned},
            "assigned": _as_dict(value.assigned),
            "finished": sorted(value.finished),
            "discovered": value.discovered,
            "backlog": _as_dict(value.backlog),
            "backlog_held": value.backlog_held,
        }

    def decode(self, data: Mapping[str, Any], version: int) -> AssignerState[SplitT]:
        if version != self.version:
            raise IncompatibleCheckpointError("enumerator state", found=version, expected=1)
        split_version = int(data["split_codec"])
        return AssignerState(
            unassigned=tuple(
                self._splits.decode(s, split_version) for s in data["unassigned"].values()
            ),
            assigned={str(k): int(v) for k, v in data["assigned"].items()},
            finished=frozenset(data["finished"]),
            discovered=bool(data["discovered"]),
            backlog={str(k): int(v) for k, v in data.get("backlog", {}).items()},
            backlog_held=bool(data.get("backlog_held", False)),
        )

    def split_ledger(
        self, value: AssignerState[SplitT]
    ) -> tuple[AssignerState[SplitT], frozenset[str]]:
        return replace(value, finished=frozenset()), value.finished

    def join_ledger(
        self, value: AssignerState[SplitT], ledger: frozenset[str]
    ) -> AssignerState[SplitT]:
        return replace(value, finished=ledger)


class AssigningSplitEnumerator(SplitEnumerator[SplitT, AssignerState[SplitT]]):
    """Enumerator base for sources that support split reassignment on recovery.

    Subclass and implement :meth:`discover_splits`. Pass ``state`` when restoring.

    ``discovery_interval``: seconds between discoveries; ``None`` discovers once, and then
    every reader is told there are no more splits once all are assigned.

    A failed discovery goes to :meth:`on_discovery_error` (by default: the source fails),
    except a periodic one after the run's first successful discovery, whose error is
    transient (not a ConfigurationError, DataLossError or ContractViolation: the external
    system did not answer): it is logged and the next interval tries again, up to
    :attr:`discovery_attempts` failures in a row. Nothing is lost meanwhile: the splits
    already known are read on, and new ones come with the next discovery that succeeds.
    """

    discovery_attempts = 3
    """Periodic discoveries that may fail in a row, transiently, before the source fails."""

    def __init__(
        self,
        context: SplitEnumeratorContext[SplitT],
        *,
        strategy: AssignmentStrategy[SplitT] | None = None,
        discovery_interval: float | None = None,
        state: AssignerState[SplitT] | None = None,
    ) -> None:
        self.context = context
        self.strategy: AssignmentStrategy[SplitT] = strategy or BalancedAssignment()
        self.discovery_interval = discovery_interval
        state = state or AssignerState()
        if not context.reports_splits_on_registration:
            raise ContractViolation(
                f"{type(self).__name__} restores ownership from readers' reports: its source "
                "must implement SupportsSplitReassignmentOnRecovery"
            )
        self._unassigned: dict[str, SplitT] = {s.split_id: s for s in state.unassigned}
        self._owner: dict[str, int] = {}
        self._owned_by: dict[int, set[str]] = {}  # reader -> split ids: the inverse of _owner
        self._assigned: dict[str, SplitT] = {}
        # Global restore: splits readers held at the checkpoint, by former owner. They come
        # back in the readers' registration reports; until then the enumerator owns them.
        self._awaiting: dict[str, int] = dict(state.assigned)
        self._restoring = bool(self._awaiting)
        self._preferred: dict[str, int] = {}
        # Finished split id -> the reader that finished it in this run (None: restored).
        self._finished: dict[str, int | None] = dict.fromkeys(state.finished)
        self._discovered = state.discovered
        self._signaled: set[int] = set()
        self._removed: set[str] = set()  # removed upstream in this run: reports are stale
        self._backlog: dict[str, int] = dict(state.backlog)  # split id -> boundary
        self._backlog_held = state.backlog_held
        # Copies of _awaiting + _owner and of _backlog for snapshots and backlog_boundaries,
        # made again only after a change (None): unchanged snapshots share them, so a runtime
        # that compares snapshot after snapshot (Spark's, every batch) finds them the same
        # by identity instead of comparing every split's entry.
        self._assigned_copy: dict[str, int] | None = None
        self._backlog_copy: dict[str, int] | None = None
        self._listed = False  # a discovery completed in this run
        self._listing: tuple[object, dict[str, SplitT]] = ((), {})  # the last, by split id
        # Counts the changes to the splits known (held or finished) other than by moves
        # between those states; with the listing tuple after which the known splits were
        # exactly those listed (and finished ones): while both stay, a discovery that
        # returns the same tuple finds nothing new and nothing vanished, without comparing.
        self._known_changes = 0
        self._agreed: tuple[object, int] | None = None
        self._failed_discoveries = 0  # in a row, since the last one that completed

    # -- for subclasses -------------------------------------------------------------------

    @abstractmethod
    def discover_splits(self) -> Sequence[SplitT]:
        """Every split that exists now, new ones at the position reading should start.

        Called by: a worker thread (through ``call_async``), never the coordinator thread.
        Blocking: may block on I/O. Must not touch enumerator state.
        A known split missing from the result has vanished (see :meth:`on_splits_vanished`).
        Returning the very tuple returned last time says nothing changed: the ids of its
        splits are not read again, and unless the enumerator learnt of splits since other
        than by discovery (:meth:`add_splits`, a reader's report, :meth:`remove_splits`),
        they are not compared with the splits it holds either (at 100k splits, tens of
        milliseconds a discovery).
        """

    def on_discovery_error(self, error: BaseException) -> None:
        """Discovery raised ``error``. Default: fail the source with a ConnectorError."""
        raise ConnectorError(f"split discovery failed in {type(self).__name__}: {error}") from error

    def backlog_boundary(
        self, split: SplitT, extent: SplitExtent | None, at_start: bool
    ) -> int | None:
        """The backlog boundary of a split seen for the first time (``None``: no backlog).

        ``extent`` is what :meth:`latest_positions` says of the split now; ``at_start``
        whether the first discovery of this run (a fresh start or a restart) found it.
        Default: how far it exists then (``extent.exists_to``), so what exists when the
        split is first seen is its backlog. Override for another rule: the end of a
        snapshot, or no boundary for splits found later in the run when new splits are the
        live stream (new files are). A boundary at or before the split's position means it
        has nothing to catch up.
        """
        return None if extent is None else extent.exists_to

    def hold_backlog(self, held: bool) -> None:
        """Say the source is processing backlog whatever the splits' boundaries (or stop)."""
        self._backlog_held = held
        self._signal_backlog()

    def splits_to_come(self) -> bool:
        """Whether the enumerator will still add splits of its own, without a discovery (a
        table cut into chunks as they are read): while it is true, no reader is told there
        are no more splits. Call :meth:`add_splits` with them. Default: False."""
        return False

    def on_splits_vanished(self, split_ids: Sequence[str]) -> None:
        """Known, unfinished splits no longer exist. Default: drop them, tell their owners.

        Override to apply a data-loss policy (e.g. raise when a split vanished unread).
        """
        self.remove_splits(split_ids)

    # -- queries (also for subclasses and tests) ------------------------------------------

    def owners(self) -> Mapping[str, int]:
        """Split id -> reader, for every split a reader owns."""
        return dict(self._owner)

    def unassigned_splits(self) -> list[SplitT]:
        """Splits the enumerator owns and has not assigned, including those awaiting a report."""
        return list(self._unassigned.values())

    def awaiting_report(self) -> Mapping[str, int]:
        """After a global restore: split id -> former owner, for splits not yet reported."""
        return dict(self._awaiting)

    @property
    def discovered(self) -> bool:
        """Whether a discovery has completed (during the first one, still false)."""
        return self._discovered

    def finished_splits(self) -> frozenset[str]:
        return frozenset(self._finished)

    def backlog_boundaries(self) -> Mapping[str, int]:
        if self._backlog_copy is None:
            self._backlog_copy = dict(self._backlog)
        return self._backlog_copy

    # -- SplitEnumerator ------------------------------------------------------------------

    def start(self) -> None:
        self._signal_backlog()  # a restored state may be in backlog
        self.context.call_async(
            self.discover_splits, self._handle_discovery, period=self.discovery_interval
        )

    def add_reader(self, reader_id: int) -> None:
        info = self.context.registered_readers()[reader_id]
        self._signaled.discard(reader_id)
        for split in info.reported_splits:
            self._take_reported(split, reader_id)
        lost = self._owned_by.get(reader_id)
        if lost:
            raise SplitOwnershipError(
                f"reader {reader_id} registered again without reporting splits the enumerator "
                f"assigned to it ({', '.join(sorted(lost)[:10])}); they were neither in its "
                "restored state nor given back, so they would be lost",
                split_ids=tuple(sorted(lost)),
            )
        self._assign_pending()

    def add_splits_back(self, splits: Sequence[SplitT], reader_id: int) -> None:
        for split in splits:
            sid = split.split_id
            if self._rolls_back_with(sid, reader_id):
                self._take_back(split, reader_id)
            elif sid in self._owner:
                raise SplitOwnershipError(
                    f"split {sid} was given back by reader {reader_id} but reader "
                    f"{self._owner[sid]} owns it",
                    split_ids=(sid,),
                )
            # else: removed upstream, or finished by another reader: nothing comes back

    def handle_source_event(self, reader_id: int, event: SourceEvent) -> None:
        if isinstance(event, SplitsFinishedEvent):
            for sid in event.split_ids:
                if self._owner.get(sid) == reader_id:
                    self._release(sid)
                    self._backlog.pop(sid, None)
                    self._finished[sid] = reader_id
            self._maybe_signal_no_more_splits()
        elif isinstance(event, BacklogFinishedEvent):
            for sid in event.split_ids:
                self._backlog.pop(sid, None)
        elif isinstance(event, BacklogStartedEvent):
            known = self._unassigned.keys() | self._owner.keys() | self._awaiting.keys()
            self._backlog.update((s, b) for s, b in event.boundaries if s in known)
        self._backlog_copy = None
        self._signal_backlog()

    def snapshot_state(self, checkpoint_id: int) -> AssignerState[SplitT]:
        if self._assigned_copy is None:
            self._assigned_copy = dict(self._awaiting)
            self._assigned_copy.update(self._owner)
        return AssignerState(
            unassigned=tuple(self._unassigned.values()),
            assigned=self._assigned_copy,
            finished=frozenset(self._finished),
            discovered=self._discovered,
            backlog=self.backlog_boundaries(),
            backlog_held=self._backlog_held,
        )

    # -- helpers --------------------------------------------------------------------------

    def remove_splits(self, split_ids: Sequence[str]) -> None:
        """Forget splits entirely (deleted upstream) and tell their owners to stop reading."""
        by_owner: dict[int, list[str]] = {}
        self._known_changes += 1
        for sid in split_ids:
            owner = self._owner.get(sid)
            if owner is not None:
                by_owner.setdefault(owner, []).append(sid)
            self._release(sid)
            self._unassigned.pop(sid, None)
            self._awaiting.pop(sid, None)
            self._preferred.pop(sid, None)
            self._backlog.pop(sid, None)
            self._removed.add(sid)
        self._assigned_copy = self._backlog_copy = None
        registered = self.context.registered_readers()
        for owner, sids in sorted(by_owner.items()):
            if owner in registered:
                self.context.send_event_to_source_reader(owner, SplitsRemovedEvent(tuple(sids)))

    def _release(self, split_id: str) -> None:
        owner = self._owner.pop(split_id, None)
        if owner is not None:
            self._owned_by[owner].discard(split_id)
            self._assigned_copy = None
        self._assigned.pop(split_id, None)

    def _take_reported(self, split: SplitT, reader_id: int) -> None:
        sid = split.split_id
        if sid in self._awaiting:  # global restore: the reader's state is the split's state
            del self._awaiting[sid]
            self._assigned_copy = None
            self._take_back(split, reader_id)
        elif self._rolls_back_with(sid, reader_id):  # partial failover
            self._take_back(split, reader_id)
        elif not (sid in self._owner or sid in self._finished or sid in self._removed):
            self._take_back(split, reader_id)  # unknown to this enumerator: keep, lose nothing
        # else: stale (FLIP-537 case 4): another reader owns or finished it, or it was
        # removed upstream since the checkpoint the reader restored

    def _rolls_back_with(self, split_id: str, reader_id: int) -> bool:
        """Whether a failover of ``reader_id`` undoes its hold on ``split_id``.

        True when the reader owns the split, or finished it: a reader that restarts from a
        checkpoint still holding the split finished it after that checkpoint, so the finish
        is undone with everything else the reader did since.
        """
        return self._owner.get(split_id) == reader_id or (
            split_id in self._finished and self._finished[split_id] == reader_id
        )

    def _take_back(self, split: SplitT, reader_id: int) -> None:
        """The enumerator owns ``split`` again; it goes back to ``reader_id`` if it can."""
        sid = split.split_id
        self._known_changes += 1
        self._release(sid)
        self._finished.pop(sid, None)
        self._unassigned.setdefault(sid, split)
        self._preferred[sid] = reader_id

    def _retries_discovery(self, error: BaseException) -> bool:
        """Whether a failed discovery is left to the next interval (see the class)."""
        return (
            self._listed
            and self.discovery_interval is not None
            and self._failed_discoveries < self.discovery_attempts
            and not isinstance(error, ConfigurationError | DataLossError | ContractViolation)
        )

    def _handle_discovery(
        self, splits: Sequence[SplitT] | None, error: BaseException | None
    ) -> None:
        if error is not None:
            self._failed_discoveries += 1
            if self._retries_discovery(error):
                log.warning(
                    "%s: split discovery failed (%d of %d in a row; the next interval tries "
                    "again): %s",
                    type(self).__name__,
                    self._failed_discoveries,
                    self.discovery_attempts,
                    error,
                )
            else:
                self.on_discovery_error(error)
            return
        self._failed_discoveries = 0
        agreed = self._agreed
        if agreed is not None and splits is agreed[0] and agreed[1] == self._known_changes:
            self.add_splits(())  # nothing found, nothing vanished (see __init__)
            return
        if type(splits) is tuple and splits is self._listing[0]:
            current = self._listing[1]  # the same (immutable) listing: the same index
        else:
            current = {s.split_id: s for s in splits or ()}
            self._listing = (splits, current) if type(splits) is tuple else ((), {})
        found = current.keys()
        held = (self._unassigned.keys(), self._owner.keys(), self._awaiting.keys())
        # Set operations on the ids, in C, rather than a membership test per split in Python.
        vanished = sorted(set().union(*(ids - found for ids in held)))
        if vanished:
            self.on_splits_vanished(vanished)
        fresh = found - held[1] - held[0] - held[2] - self._finished.keys()  # most held first
        new = [s for sid, s in current.items() if sid in fresh] if fresh else []
        at_start, self._listed = not self._listed, True
        self._discovered = True
        known = self._known_changes + bool(new)
        self.add_splits(new, at_start=at_start)
        if not vanished and type(splits) is tuple and known == self._known_changes:
            self._agreed = (splits, known)

    def add_splits(self, splits: Sequence[SplitT], *, at_start: bool = False) -> None:
        """Own new ``splits`` and assign them, as discovery does with the splits it finds.

        For splits that appear other than by :meth:`discover_splits` (a change log that
        starts once a snapshot has been read). ``at_start``: whether the first discovery
        of this run found them (see :meth:`backlog_boundary`).
        Raises SplitOwnershipError for a split whose id a reader holds: a split id is
        added again only once its split finished or was removed.
        Called by: the coordinator thread.
        """
        owner, awaiting = self._owner, self._awaiting  # awaiting: held, as restored
        held = sorted({s.split_id for s in splits if s.split_id in owner or s.split_id in awaiting})
        if held:
            owners = ", ".join(
                f"{sid} (reader {owner.get(sid, awaiting.get(sid))})" for sid in held[:10]
            )
            raise SplitOwnershipError(
                f"the enumerator added {len(held)} split(s) that a reader holds: {owners}; "
                "a split id can be added again only once its split finished or was removed",
                split_ids=tuple(held),
            )
        extents = self.latest_positions(splits) if splits else {}
        self._known_changes += bool(splits)
        for split in splits:
            self._unassigned[split.split_id] = split
            boundary = self.backlog_boundary(split, extents.get(split.split_id), at_start)
            if boundary is not None and boundary > split.position:
                self._backlog[split.split_id] = boundary
                self._backlog_copy = None
        self._signal_backlog()
        self._assign_pending()

    def _assign_pending(self) -> None:
        registered = self.context.registered_readers()
        if len(registered) < self.context.current_parallelism:
            return  # wait for every reader: assigning now would load the early ones
        if self._restoring:
            self._finish_global_restore(sorted(registered))
        elif self._unassigned:
            candidates = [r for r in sorted(registered) if r not in self._signaled]
            loads = dict.fromkeys(candidates, 0.0)
            for sid, owner in self._owner.items():
                if owner in loads:
                    loads[owner] += self.strategy.weight(self._assigned[sid])
            # A partial failover gives splits back to the reader that had them (FLIP-537):
            # that restores the assignment as it was, balanced. New splits go by strategy.
            going_home: dict[int, list[SplitT]] = {}
            fresh: list[SplitT] = []
            for sid, split in self._unassigned.items():
                home = self._preferred.get(sid)
                if home is not None and home in loads:
                    going_home.setdefault(home, []).append(split)
                    loads[home] += self.strategy.weight(split)
                else:
                    fresh.append(split)
            assignment = self.strategy.assign(fresh, loads)
            for reader, splits in going_home.items():
                assignment.setdefault(reader, []).extend(splits)
            self._commit(assignment)
        self._maybe_signal_no_more_splits()

    def _finish_global_restore(self, readers: list[int]) -> None:
        if self._awaiting:
            missing = tuple(sorted(self._awaiting))
            raise SplitOwnershipError(
                f"every reader registered after a restore but {len(missing)} split(s) were in "
                f"no reader's report ({', '.join(missing[:10])}): the checkpoint's reader state "
                "does not match its enumerator state",
                split_ids=missing,
            )
        self._restoring = False
        held: dict[int, list[SplitT]] = {}
        unowned: list[SplitT] = []
        for sid, split in self._unassigned.items():
            holder = self._preferred.get(sid)
            if holder is None:
                unowned.append(split)
            else:
                held.setdefault(holder, []).append(split)
        self._commit(self.strategy.redistribute(held, readers, unowned))

    def _commit(self, assignment: Mapping[int, Sequence[SplitT]]) -> None:
        assignment = {r: list(ss) for r, ss in assignment.items() if ss}
        if not assignment:
            return
        for reader, splits in assignment.items():
            ids = [split.split_id for split in splits]
            for sid in ids:
                del self._unassigned[sid]
                self._preferred.pop(sid, None)
            self._owner.update(dict.fromkeys(ids, reader))
            self._assigned_copy = None
            self._owned_by.setdefault(reader, set()).update(ids)
            self._assigned.update(zip(ids, splits, strict=True))
        self.context.assign_splits(assignment)

    def _signal_backlog(self) -> None:
        self.context.set_is_processing_backlog(self._backlog_held or bool(self._backlog))

    def _maybe_signal_no_more_splits(self) -> None:
        if self.discovery_interval is not None or not self._discovered or self.splits_to_come():
            return
        if self._unassigned or self._awaiting:
            return
        for reader in sorted(self.context.registered_readers()):
            if reader not in self._signaled:
                self._signaled.add(reader)
                self.context.signal_no_more_splits(reader)
