"""Splits made as they are read: a bounded number of them ahead of the readers.

A source over something it can cut as it goes (a table by key range, a key space, a very
large object by byte range) need not make every split when it starts: the planning of
each micro-batch costs what the live splits cost, and a table of a billion rows is
120,000 chunks. Flink CDC cuts chunks as readers ask for them; :class:`SplitsAhead` does
that for an :class:`~splitflow.api.assigner.AssigningSplitEnumerator`. The enumerator
keeps **cursors** (where the making of splits goes on: a few numbers each, kept in its
checkpoints) and asks for more splits whenever splits finish, so that a window of them
stays live. The CDC sources use it (:mod:`splitflow.connectors.cdc.source`)::

    class MyEnumerator(AssigningSplitEnumerator[RangeSplit]):
        def __init__(self, context, state):
            super().__init__(context, state=state.assigner)
            self._ahead = SplitsAhead(
                context, make=next_ranges, add=self.add_splits, key=lambda c: c.name,
                cursors=state.cursors,
            )

        def add_splits(self, splits, *, at_start=False):  # after a discovery, or a make
            super().add_splits(splits, at_start=at_start)
            self._refill()

        def handle_source_event(self, reader_id, event):
            super().handle_source_event(reader_id, event)
            if isinstance(event, SplitsFinishedEvent):
                self._refill()

        def _refill(self):                   # the splits not finished: 8 at most
            live = len(self.owners()) + len(self.unassigned_splits()) + len(self.awaiting_report())
            self._ahead.refill(window=8, live=live)

        def splits_to_come(self):
            return self._ahead.pending       # no reader hears "no more splits" before

        def snapshot_state(self, checkpoint_id):
            return MyState(super().snapshot_state(checkpoint_id), self._ahead.cursors)

``next_ranges(cursors, n)`` runs on a worker thread (it may query the upstream system) and
returns the next (at most) ``n`` splits and the cursors that go on. Splits made from a
cursor hold data that existed before they did: report them with
``SplitExtent(preexisting=True)``, so that ``trigger(availableNow=True)`` reads them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from splitflow.api.enumerator import SplitEnumeratorContext
from splitflow.api.split import SplitT
from splitflow.errors import ConfigurationError, ConnectorError, ContractViolation, DataLossError

CursorT = TypeVar("CursorT")

log = logging.getLogger("splitflow.api.ahead")

Made = tuple[list[SplitT], Sequence[CursorT]]


class SplitsAhead(Generic[SplitT, CursorT]):
    """The cursors of an enumerator's splits still to be made, and the making of the next.

    ``make(cursors, n)``: the next (at most) ``n`` splits from ``cursors`` in their order,
    and the cursors that go on after them (a cursor made to its end is left out). Called
    by: a worker thread; may block; must not touch enumerator state. ``add(splits)``: what
    the enumerator does with made splits (usually :meth:`add_splits`); called by: the
    coordinator thread. ``key(cursor)``: a cursor's name, unique among the cursors.

    A failed ``make`` is tried again after :attr:`retry_delay` seconds (times the failures
    so far), up to ``attempts`` failures in a row; refills wait for it. A ConfigurationError,
    DataLossError or ContractViolation fails the source at once. Nothing is lost meanwhile:
    the cursors stay where they were, and the splits made so far are read on.
    """

    retry_delay = 1.0
    """Seconds before a failed make is tried again (times the failures in a row)."""

    def __init__(
        self,
        context: SplitEnumeratorContext[SplitT],
        make: Callable[[Sequence[CursorT], int], Made[SplitT, CursorT]],
        add: Callable[[Sequence[SplitT]], None],
        key: Callable[[CursorT], str],
        cursors: Sequence[CursorT] = (),
        attempts: int = 3,
    ) -> None:
        self._context = context
        self._make = make
        self._add = add
        self._key = key
        self._cursors: dict[str, CursorT] = {key(c): c for c in cursors}
        self._attempts = attempts
        self._making = False  # a make runs on a worker thread
        self._failures = 0  # in a row

    @property
    def cursors(self) -> tuple[CursorT, ...]:
        """The cursors that go on, by name: what a checkpoint keeps."""
        return tuple(self._cursors[k] for k in sorted(self._cursors))

    @property
    def pending(self) -> bool:
        """Whether splits are still to be made (a cursor goes on, or a make runs)."""
        return bool(self._cursors) or self._making

    def extend(self, cursors: Sequence[CursorT]) -> None:
        """More cursors (from a discovery). Called by: the coordinator thread."""
        self._cursors.update((self._key(c), c) for c in cursors)

    def refill(self, window: int, live: int) -> None:
        """Make ``window - live`` more splits, on a worker thread, unless that is none, no
        cursor goes on, or a make already runs. Called by: the coordinator thread, when
        splits finish (and the enumerator's ``live`` splits are fewer)."""
        want = window - live
        if want <= 0 or not self._cursors or self._making:
            return
        self._making = True
        self._start(self.cursors, want, delay=0.0)

    def _start(self, taken: Sequence[CursorT], want: int, delay: float) -> None:
        self._context.call_async(
            lambda: self._make(taken, want),
            lambda made, error: self._made(taken, want, made, error),
            initial_delay=delay,
        )

    def _made(
        self,
        taken: Sequence[CursorT],
        want: int,
        made: Made[SplitT, CursorT] | None,
        error: BaseException | None,
    ) -> None:
        names = ", ".join(self._key(c) for c in taken)
        if made is None:
            self._failures += 1
            fatal = isinstance(error, ConfigurationError | DataLossError | ContractViolation)
            if fatal or self._failures >= self._attempts:
                self._making = False
                raise ConnectorError(
                    f"making the next splits of {names} failed ({self._failures} time(s) in a "
                    f"row): {error}"
                ) from error
            delay = self.retry_delay * self._failures
            log.warning(
                "splitflow: making the next splits of %s failed (again in %.0f s): %s",
                names,
                delay,
                error,
            )
            self._start(taken, want, delay)  # the same make: nothing else changed the cursors
            return
        self._making = False
        self._failures = 0
        splits, rest = made
        if not splits and rest:
            raise ContractViolation(
                f"making the next splits of {names} made none, and cursors go on: a make "
                "returns at least one split, or drops the cursors it has made to their end"
            )
        for cursor in taken:  # a discovery may have added other cursors meanwhile
            self._cursors.pop(self._key(cursor), None)
        self.extend(rest)
        self._add(splits)
