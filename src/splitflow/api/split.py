"""Splits, their mutable reading state, and codecs that turn both into small primitive dicts.

A split is an immutable value: a unit of work (a partition, a bucket, a file, a table chunk)
plus the position where reading it resumes. Reading advances a separate, mutable
:class:`SplitState`; a snapshot turns the state back into a split at its new position.

Positions are integers in the split's own order (an offset, a row index, a byte offset, a
log sequence number): comparable, cheap to store in Spark offsets, and subtractable so that
lag is ``latest - position``. Reading a split on Spark means reading a slice
``[start, stop)`` of positions that the driver planned; a replay reads the same slice.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from splitflow.errors import ContractViolation, IncompatibleCheckpointError

JsonDict = dict[str, Any]
"""A dict of JSON primitives (str, int, float, bool, None, lists and dicts of them)."""


class SourceSplit(Protocol):
    """What splitflow needs of a split: a stable id and a resume position.

    Implement a split as a ``@dataclass(frozen=True)`` with a ``position: int`` field and a
    ``split_id`` field or property; splitflow moves it to a new position with
    :func:`dataclasses.replace`. Splits travel in checkpoints and in Spark offsets, so keep
    them small: identity and position, not data. The runtime reads ``split_id`` a few
    times per held split and planned batch (and uses it as a dict key), so keep it cheap:
    at 100k splits, an id built anew on each read costs tens of milliseconds a batch.

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class PartitionSplit:
    ...     topic: str
    ...     partition: int
    ...     position: int = 0
    ...     @property
    ...     def split_id(self) -> str:
    ...         return f"{self.topic}-{self.partition}"
    >>> with_position(PartitionSplit("orders", 3), 42)
    PartitionSplit(topic='orders', partition=3, position=42)
    """

    @property
    def split_id(self) -> str:
        """Identifies the split among all splits of its source, forever (never reused)."""
        ...

    @property
    def position(self) -> int:
        """The first position not yet read: reading resumes here."""
        ...


SplitT = TypeVar("SplitT", bound=SourceSplit)
T = TypeVar("T")


def with_position(split: SplitT, position: int) -> SplitT:
    """Return ``split`` moved to ``position`` (the split itself is never changed).

    The same as :func:`dataclasses.replace` (``split`` with ``position`` changed), about four
    times faster for a plain dataclass: one whose ``__init__`` and ``__setattr__`` are
    those ``@dataclass`` writes (no ``__post_init__``, no init-only or non-init fields), with
    no ``__slots__`` in its classes and an instance dict that holds nothing but its fields
    (no cached property). The runtime moves a split once per batch that reads it, and once
    per split at a restore.
    """
    fields = _PLAIN_FIELDS.get(type(split))
    if fields is None:
        fields = _plain_fields(split)
    values = getattr(split, "__dict__", None)
    if fields and values is not None and len(values) == fields:
        moved = _new(type(split))
        moved.__dict__.update(values)
        _set(moved, "position", position)
        return moved
    return cast(SplitT, dataclasses.replace(cast(Any, split), position=position))


_new = object.__new__
_set = object.__setattr__
_PLAIN_FIELDS: dict[type, int] = {}
"""Split class -> its field count when :func:`with_position` may copy its instance dict
(0: it may not, :func:`dataclasses.replace` it)."""


def _plain_fields(split: object) -> int:
    """How many fields a plain dataclass instance ``split`` has (see :func:`with_position`);
    0 when its class is not plain. Raises ContractViolation for a non-dataclass."""
    cls = type(split)
    if not dataclasses.is_dataclass(split) or isinstance(split, type):
        raise ContractViolation(
            f"split {split!r} is not a dataclass instance: implement splits as "
            "@dataclass(frozen=True) with a `position: int` field"
        )
    fields = dataclasses.fields(split)
    plain = _is_plain(cls) and any(f.name == "position" for f in fields)
    _PLAIN_FIELDS[cls] = len(fields) if plain else 0
    return _PLAIN_FIELDS[cls]


def _is_plain(cls: type[object]) -> bool:
    """Whether dataclass ``cls`` is plain: an instance is its fields in its dict, set by the
    ``__init__`` that ``@dataclass`` wrote and nothing else (see :func:`with_position`), so
    filling a new instance's dict makes the same object as calling the class."""
    fields = dataclasses.fields(cast(Any, cls))
    return (
        not hasattr(cls, "__post_init__")
        and len(fields) == len(getattr(cls, "__dataclass_fields__", ()))  # no InitVar, ClassVar
        and all(f.init for f in fields)
        and not any("__slots__" in vars(base) for base in cls.__mro__)  # fields in the dict
        and _made_by_dataclass(cls.__init__)
        and (cls.__setattr__ is object.__setattr__ or _made_by_dataclass(cls.__setattr__))
    )


def _made_by_dataclass(method: object) -> bool:
    """Whether ``method`` is one ``@dataclass`` wrote (not the class's own)."""
    code = getattr(method, "__code__", None)
    name = getattr(method, "__name__", "")
    return getattr(code, "co_qualname", None) == f"__create_fn__.<locals>.{name}"


@dataclass
class SplitState(Generic[SplitT]):
    """The mutable reading progress of one split inside one reader.

    Called by: the reader's thread only (never shared between threads).
    Guarantees: ``to_split()`` returns the split at ``position``, which is what a snapshot
    stores; reading resumes exactly there after a restore.
    """

    split: SplitT
    position: int

    @classmethod
    def of(cls, split: SplitT) -> SplitState[SplitT]:
        """The state of a split that has not been read past its own position."""
        return cls(split, split.position)

    @property
    def split_id(self) -> str:
        return self.split.split_id

    def to_split(self) -> SplitT:
        return with_position(self.split, self.position)


class Codec(ABC, Generic[T]):
    """Turns a value into a small dict of JSON primitives and back (finite floats only: JSON
    has no infinity or NaN, and the runtime writes them as ``null``).

    ``version`` is written beside the encoded values of a checkpoint; ``decode`` receives the
    version that wrote ``data`` and must read every version it has ever written, or raise
    :class:`~splitflow.errors.IncompatibleCheckpointError`.
    """

    version: int = 1

    @abstractmethod
    def encode(self, value: T) -> JsonDict:
        """Encode ``value``. Must be deterministic: equal values give equal dicts. What it
        returns must be new (or never changed afterwards): the runtime keeps an encoded
        state to write only what the next one changes (``stateDir``), so a list or dict
        that the value or the codec holds and later changes in place must be copied."""

    @abstractmethod
    def decode(self, data: Mapping[str, Any], version: int) -> T:
        """Decode what ``encode`` of codec version ``version`` produced."""


class LedgerCodec(Codec[T]):
    """A codec for state that holds a set of ids which only grows, or nearly: its *ledger*.

    The ids of finished splits are the usual ledger: a files source remembers every file
    it has read so that it never reads one twice, so its state grows with the files seen.
    A runtime that keeps many checkpoints (Spark keeps an offset per batch) stores the
    ledger apart and incrementally, and the rest of the state in each checkpoint; a runtime
    that does not uses ``encode`` and ``decode``, which keep carrying the whole state.
    ``join_ledger(*split_ledger(value))`` must equal ``value``.
    """

    @abstractmethod
    def split_ledger(self, value: T) -> tuple[T, frozenset[str]]:
        """``value`` with an empty ledger, and its ledger."""

    @abstractmethod
    def join_ledger(self, value: T, ledger: frozenset[str]) -> T:
        """``value`` (whose ledger is empty) with ``ledger``."""


class DataclassCodec(Codec[T]):
    """Codec for a flat dataclass whose fields are JSON primitives or tuples of them.

    Lists in the encoded form come back as tuples (frozen dataclasses hold tuples). A float
    that is infinite or NaN has no JSON form: encoding it raises
    :class:`~splitflow.errors.ContractViolation` naming the field (instead of a checkpoint
    that would hold ``null``).

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class FileSplit:
    ...     path: str
    ...     position: int = 0
    ...     @property
    ...     def split_id(self) -> str:
    ...         return self.path
    >>> codec = DataclassCodec(FileSplit)
    >>> codec.encode(FileSplit("/data/a.parquet", 7))
    {'path': '/data/a.parquet', 'position': 7}
    >>> codec.decode({'path': '/data/a.parquet', 'position': 7}, version=1)
    FileSplit(path='/data/a.parquet', position=7)
    """

    def __init__(self, cls: type[T], version: int = 1) -> None:
        if not dataclasses.is_dataclass(cls):
            raise ContractViolation(f"DataclassCodec needs a dataclass, got {cls!r}")
        self._cls = cls
        fields = [f for f in dataclasses.fields(cls) if f.init]
        self._fields = tuple(f.name for f in fields)
        self._names = frozenset(self._fields)
        self._required = frozenset(
            f.name for f in fields if f.default is f.default_factory is dataclasses.MISSING
        )
        self.version = version
        # An instance of a plain class (_is_plain) with every field given is decoded by
        # filling its dict: about 3x faster than calling the class.
        self._plain = len(self._fields) if _is_plain(cls) else -1

    def encode(self, value: T) -> JsonDict:
        values = getattr(value, "__dict__", None)
        if (
            values is not None
            and len(values) == self._plain
            and type(value) is self._cls
            and _SCALARS.issuperset(map(type, values.values()))
        ):  # a plain instance's dict is its fields: a copy, when each is a JSON scalar
            return dict(values)
        encoded = {name: _to_json(getattr(value, name)) for name in self._fields}
        for name, field in encoded.items():
            if not _finite(field):
                raise ContractViolation(
                    f"{self._cls.__name__}.{name} is {getattr(value, name)!r}: "
                    f"{self._cls.__name__} is encoded to JSON (checkpoints, offsets), which "
                    "has no infinity or NaN; use None, or a finite bound"
                )
        return encoded

    def decode(self, data: Mapping[str, Any], version: int) -> T:
        if version != self.version:
            raise IncompatibleCheckpointError(
                f"{self._cls.__name__} codec", found=version, expected=self.version
            )
        if not self._required <= data.keys() <= self._names:
            # the dataclass changed without a new codec version
            raise IncompatibleCheckpointError(
                f"{self._cls.__name__} codec version {version}",
                found=sorted(data),
                expected=sorted(self._fields),
                of="fields",
            )
        if list in map(type, data.values()):  # a C-level scan: most splits hold no list
            return self._cls(**{k: _from_json(v) for k, v in data.items()})
        if len(data) == self._plain:
            value = _new(self._cls)
            value.__dict__.update(data)
            return value
        return self._cls(**data)


_SCALARS = frozenset((str, int, bool, type(None)))
"""The JSON scalars a plain instance's dict is copied with (a float is checked first)."""


def _finite(value: object) -> bool:
    """Whether ``value`` (encoded) holds no infinite or NaN float."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(map(_finite, value))
    return True


def _to_json(value: object) -> object:
    if isinstance(value, tuple | list):
        return [_to_json(v) for v in value]
    return value


def _from_json(value: object) -> object:
    if isinstance(value, list):
        return tuple(_from_json(v) for v in value)
    return value
