"""Record emitters: turn a fetched element into output and move its split's position.

The emitter is the only place a split's position moves. A split reader returns elements; the
emitter knows where each one ends, writes what it carries to the output and sets
``state.position`` to the first position after it. A snapshot taken after an ``emit`` then
resumes right after that element: this is how "snapshot resumes right after the last
emitted record" holds, in Flink's flink-connector-base and here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, NamedTuple, TypeVar

from splitflow.api.reader import ReaderOutput
from splitflow.api.split import SplitState, SplitT

E_contra = TypeVar("E_contra", contravariant=True)
T = TypeVar("T")


class RecordEmitter(ABC, Generic[E_contra, T, SplitT]):
    """Turns one fetched element into output records and advances the split's state.

    Called by: the reader's thread, inside ``poll_next``, once per element, in split order.
    Blocking: must not block (it only transforms and collects).
    Guarantees required: after ``emit`` returns, ``state.position`` is the first position
    not covered by this or any earlier element of the split. It never moves backwards, and
    never beyond the slice's stop (the reader fails with
    :class:`~splitflow.errors.ContractViolation` if it does). If ``emit`` raises, the
    position must not have moved.
    """

    @abstractmethod
    def emit(self, element: E_contra, output: ReaderOutput[T], state: SplitState[SplitT]) -> None:
        """Collect what ``element`` carries into ``output``; set ``state.position`` after it."""


class Positioned(NamedTuple, Generic[T]):
    """An element that carries its own next position: ``value`` covers up to ``next_position``.

    ``value`` may be one record or a batch (a ``pyarrow.RecordBatch`` of rows 100..199 is
    ``Positioned(batch, 200)``). ``next_position`` is exclusive: the first position after it.
    """

    value: T
    next_position: int


class PositionedEmitter(RecordEmitter[Positioned[T], T, SplitT]):
    """Emits ``element.value`` and moves the split to ``element.next_position``.

    The default emitter for split readers that know each element's end position.

    >>> from splitflow.api.split import SplitState
    >>> from splitflow.testing.sequence import SequenceSplit
    >>> out: list[tuple[str, int]] = []
    >>> class ListOutput:
    ...     def collect(self, record: tuple[str, int]) -> None:
    ...         out.append(record)
    >>> state = SplitState.of(SequenceSplit("a", position=4))
    >>> PositionedEmitter().emit(Positioned(("a", 4), 5), ListOutput(), state)
    >>> out, state.position, state.to_split()
    ([('a', 4)], 5, SequenceSplit(name='a', end=None, position=5))
    """

    def emit(
        self, element: Positioned[T], output: ReaderOutput[T], state: SplitState[SplitT]
    ) -> None:
        output.collect(element.value)
        state.position = element.next_position


__all__ = ["Positioned", "PositionedEmitter", "RecordEmitter"]
