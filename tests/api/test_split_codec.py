"""Splits, split state, codecs, and the source checkpoint's versioned JSON form."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pickle
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest

from splitflow.api.assigner import AssignerState, AssignerStateCodec
from splitflow.api.events import SplitsFinishedEvent, SplitsRemovedEvent
from splitflow.api.reader import SourceReader, SourceReaderContext
from splitflow.api.source import Boundedness, Source
from splitflow.api.split import Codec, DataclassCodec, SplitState, with_position
from splitflow.coordinator import Checkpoint
from splitflow.errors import ContractViolation, IncompatibleCheckpointError


@dataclass(frozen=True)
class FileSplit:
    path: str
    ranges: tuple[tuple[int, int], ...] = ()
    tags: tuple[str, ...] = ()
    end: int | None = None
    position: int = 0

    @property
    def split_id(self) -> str:
        return self.path


class FileSource(Source[Any, FileSplit, AssignerState[FileSplit]]):
    """Only the codecs are used; ``split_version`` sets the split codec's version."""

    def __init__(self, split_version: int = 1) -> None:
        self.split_version = split_version

    @property
    def boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED

    def create_enumerator(self, context: Any) -> Any:
        raise NotImplementedError

    def restore_enumerator(self, context: Any, state: Any) -> Any:
        raise NotImplementedError

    def create_reader(self, context: SourceReaderContext) -> SourceReader[Any, FileSplit]:
        raise NotImplementedError

    @property
    def split_codec(self) -> Codec[FileSplit]:
        return DataclassCodec(FileSplit, version=self.split_version)

    @property
    def enumerator_state_codec(self) -> Codec[AssignerState[FileSplit]]:
        return AssignerStateCodec(self.split_codec)


A = FileSplit("/data/a", ranges=((0, 10), (20, 30)), tags=("hot", "eu"), end=30, position=7)
B = FileSplit("/data/b", position=3)


# -- DataclassCodec -----------------------------------------------------------------------


def test_dataclass_codec_encodes_fields_as_json_primitives_with_tuples_as_lists() -> None:
    assert DataclassCodec(FileSplit).encode(A) == {
        "path": "/data/a",
        "ranges": [[0, 10], [20, 30]],
        "tags": ["hot", "eu"],
        "end": 30,
        "position": 7,
    }


@pytest.mark.parametrize("split", [A, B, FileSplit("", end=None, position=0)])
def test_dataclass_codec_roundtrips_through_json(split: FileSplit) -> None:
    codec = DataclassCodec(FileSplit)
    text = json.dumps(codec.encode(split))
    decoded = codec.decode(json.loads(text), version=1)
    assert decoded == split
    assert isinstance(decoded.ranges, tuple)
    assert all(isinstance(r, tuple) for r in decoded.ranges)


@dataclass(frozen=True)
class Flat:
    name: str
    end: int | None = None
    position: int = 0


class Pair(NamedTuple):
    first: int
    second: int


@dataclass(frozen=True)
class FlatMore(Flat):
    zone: str = "eu"


@dataclass(frozen=True)
class FlatCached(Flat):
    @functools.cached_property
    def label(self) -> str:
        return self.name.upper()


class FlatOwnInit(Flat):
    """A subclass whose own ``__init__`` sets another attribute instead of ``position`` (the
    class default): its dict holds as many items as a plain ``Flat``'s, not its fields."""

    def __init__(self, name: str, end: int, zone: str) -> None:
        for key, value in (("name", name), ("end", end), ("zone", zone)):
            object.__setattr__(self, key, value)


@dataclass(frozen=True)
class Timed:
    name: str
    until: float | None = None
    marks: tuple[float, ...] = ()
    position: int = 0


@pytest.mark.parametrize(
    ("split", "field_name"),
    [
        (Timed("t", until=math.inf), "until"),
        (Timed("t", until=-math.inf), "until"),
        (Timed("t", until=math.nan), "until"),
        (Timed("t", marks=(1.5, math.inf)), "marks"),
    ],
)
def test_dataclass_codec_refuses_a_float_json_has_no_form_for_naming_the_field(
    split: Timed, field_name: str
) -> None:
    """JSON has no infinity or NaN: a checkpoint would hold ``null`` (orjson) or a token
    other readers refuse (``json``), so the split does not encode at all."""
    with pytest.raises(ContractViolation, match=rf"Timed\.{field_name} is .*no infinity or NaN"):
        DataclassCodec(Timed).encode(split)


def test_dataclass_codec_encodes_finite_floats_as_they_are() -> None:
    codec = DataclassCodec(Timed)
    split = Timed("t", until=1e300, marks=(0.5, -2.0), position=3)
    assert codec.encode(split) == {"name": "t", "until": 1e300, "marks": [0.5, -2.0], "position": 3}
    assert codec.decode(json.loads(json.dumps(codec.encode(split))), version=1) == split


def test_dataclass_codec_encodes_every_field_however_the_split_was_made() -> None:
    """A plain split's encoding is a copy of its instance dict (a fast path): the same as
    field by field, for splits made by the class, decoded, moved, or holding a tuple, and
    for a subclass or a split whose dict holds more than its fields, or other items."""
    codec = DataclassCodec(Flat)
    made = Flat("a", end=9, position=3)
    decoded = codec.decode({"position": 3, "name": "a", "end": 9}, 1)
    moved = with_position(Flat("a", end=9), 3)
    cached = FlatCached("a", end=9, position=3)
    assert cached.label == "A"  # its dict now holds the cached value too
    tupled = Flat("a", (1, 2), 3)  # type: ignore[arg-type]
    named = Flat("a", Pair(1, 2), 3)  # type: ignore[arg-type]  # a tuple subclass: a list too
    for split in (made, decoded, moved, cached, FlatMore("a", 9, 3), tupled, named):
        end = [1, 2] if split in (tupled, named) else 9
        expected = {"name": "a", "end": end, "position": 3}
        encoded = codec.encode(split)
        assert encoded == expected, split
        encoded["position"] = 99  # the encoding is the caller's: the split does not change
        assert split.position == 3
    assert codec.encode(FlatOwnInit("a", 9, "eu")) == {"name": "a", "end": 9, "position": 0}


def test_dataclass_codec_is_deterministic() -> None:
    codec = DataclassCodec(FileSplit)
    same = FileSplit("/data/a", ranges=((0, 10), (20, 30)), tags=("hot", "eu"), end=30, position=7)
    assert json.dumps(codec.encode(A)) == json.dumps(codec.encode(same))


def test_dataclass_codec_leaves_out_fields_that_are_not_init_arguments() -> None:
    @dataclass(frozen=True)
    class WithDerived:
        name: str
        position: int = 0
        cached: int = field(default=0, init=False)

    codec = DataclassCodec(WithDerived)
    assert codec.encode(WithDerived("x", 4)) == {"name": "x", "position": 4}
    assert codec.decode({"name": "x", "position": 4}, 1) == WithDerived("x", 4)


def test_dataclass_codec_reports_its_version() -> None:
    assert DataclassCodec(FileSplit).version == 1
    assert DataclassCodec(FileSplit, version=3).version == 3


def test_dataclass_codec_reads_its_own_version() -> None:
    codec = DataclassCodec(FileSplit, version=3)
    assert codec.decode(codec.encode(B), version=3) == B


@pytest.mark.parametrize(("written", "reads"), [(2, 1), (1, 2), (0, 1)])
def test_dataclass_codec_refuses_another_version(written: int, reads: int) -> None:
    codec = DataclassCodec(FileSplit, version=reads)
    with pytest.raises(IncompatibleCheckpointError) as info:
        codec.decode(codec.encode(B), version=written)
    assert info.value.found == written
    assert info.value.expected == reads
    assert str(info.value) == (
        f"FileSplit codec: found version {written}, this splitflow reads {reads}"
    )


@pytest.mark.parametrize(
    "written",
    [
        {"path": "/data/a", "position": 3, "size": 9},  # a field since removed
        {"position": 3},  # a field since added without a default
    ],
)
def test_dataclass_codec_refuses_fields_changed_without_a_new_version(written: dict) -> None:
    with pytest.raises(IncompatibleCheckpointError) as info:
        DataclassCodec(FileSplit).decode(written, version=1)
    assert str(info.value) == (
        f"FileSplit codec version 1: found fields {sorted(written)}, "
        "this splitflow reads ['end', 'path', 'position', 'ranges', 'tags']"
    )


def test_dataclass_codec_reads_a_checkpoint_from_before_a_field_with_a_default() -> None:
    assert DataclassCodec(FileSplit).decode({"path": "/data/b", "position": 3}, 1) == B


def test_dataclass_codec_needs_a_dataclass() -> None:
    class NotADataclass:
        pass

    with pytest.raises(ContractViolation, match="DataclassCodec needs a dataclass"):
        DataclassCodec(NotADataclass)


# -- with_position and SplitState ---------------------------------------------------------


def test_with_position_returns_a_moved_copy_and_leaves_the_split_alone() -> None:
    moved = with_position(A, 42)
    assert moved == FileSplit(A.path, A.ranges, A.tags, A.end, position=42)
    assert A.position == 7
    assert type(moved) is FileSplit


def test_with_position_refuses_a_split_that_is_not_a_dataclass_instance() -> None:
    class Plain:
        split_id = "p"
        position = 0

    with pytest.raises(ContractViolation, match="is not a dataclass instance"):
        with_position(Plain(), 1)  # type: ignore[type-var]
    with pytest.raises(ContractViolation):
        with_position(FileSplit, 1)  # type: ignore[type-var]


@dataclass(frozen=True)
class _Checked:
    name: str
    position: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.name.strip())


@dataclass(frozen=True, slots=True)
class _Slotted:
    name: str
    position: int = 0


@dataclass(frozen=True)
class _OwnInit:
    name: str
    position: int = 0

    def __init__(self, name: str, position: int = 0) -> None:
        object.__setattr__(self, "name", f"{name}.")
        object.__setattr__(self, "position", position)


@dataclass(frozen=True)
class _NotInit:
    name: str
    position: int = 0
    size: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", len(self.name) + self.position)


@dataclass(frozen=True)
class _CachedBase:
    name: str
    position: int = 0

    @functools.cached_property
    def key(self) -> str:
        return f"{self.name}@{self.position}"

    @functools.cached_property
    def size(self) -> int:
        return len(self.name)


@dataclass(frozen=True, slots=True)
class _SlottedOnCachedBase(_CachedBase):
    pass


def _cached_twice() -> _SlottedOnCachedBase:
    """Its instance dict holds the two cached values, as many entries as it has fields."""
    split = _SlottedOnCachedBase("m", 1)
    assert (split.key, split.size) == ("m@1", 1)
    return split


_ExecInit: Any = {}
exec(  # an __init__ of its own, compiled from a string as @dataclass compiles its own
    "def __init__(self, name, position=0):\n"
    "    object.__setattr__(self, 'name', name + '.')\n"
    "    object.__setattr__(self, 'position', position)\n",
    _ExecInit,
)
_ExecInit = dataclass(frozen=True)(
    type(
        "_ExecInit",
        (),
        {
            "__annotations__": {"name": str, "position": int},
            "position": 0,
            "__init__": _ExecInit["__init__"],
        },
    )
)


@dataclass
class _Clamped:
    name: str
    position: int = 0

    def __setattr__(self, key: str, value: Any) -> None:
        object.__setattr__(self, key, min(value, 50) if key == "position" else value)


KINDS = [
    A,
    B,
    _Checked(" c ", 1),
    _Slotted("s", 2),
    _OwnInit("o", 3),
    _NotInit("n", 4),
    _cached_twice(),
    _ExecInit("x", 5),
    _Clamped("c", 6),
]
"""Splits of plain dataclasses and of every kind that is not plain."""


@pytest.mark.parametrize("split", KINDS, ids=lambda split: type(split).__name__)
def test_with_position_is_dataclasses_replace(split: Any) -> None:
    """The copy made without calling ``__init__`` (plain dataclasses) and the one made by
    ``dataclasses.replace`` (the others) are the same."""
    moved = with_position(split, 99)
    expected = dataclasses.replace(split, position=99)
    assert moved == expected
    assert moved is not split
    if hasattr(split, "__dict__"):
        assert vars(moved) == vars(expected)
    if type(split).__hash__ is not None:
        assert hash(moved) == hash(expected)


def _tuples(value: Any) -> Any:
    return tuple(map(_tuples, value)) if type(value) is list else value


@pytest.mark.parametrize("split", KINDS, ids=lambda split: type(split).__name__)
def test_dataclass_codec_decodes_what_the_class_would_make(split: Any) -> None:
    """Decoding fills a plain dataclass's instance dict without calling ``__init__``, and
    calls the class for the others: both give what the class makes of the fields."""
    codec = DataclassCodec(type(split))
    data = json.loads(json.dumps(codec.encode(split)))
    decoded = codec.decode(data, codec.version)
    expected = type(split)(**{k: _tuples(v) for k, v in data.items()})
    assert type(decoded) is type(split)
    assert decoded == expected
    if hasattr(expected, "__dict__"):
        assert vars(decoded) == vars(expected)
    if type(split).__hash__ is not None:
        assert hash(decoded) == hash(expected)


def test_with_position_computes_a_cached_property_anew() -> None:
    split = _CachedBase("c", 1)
    assert split.key == "c@1"  # cached in the instance dict
    moved = with_position(split, 5)
    assert moved.key == "c@5"
    assert moved == _CachedBase("c", 5)


def test_split_state_starts_at_the_splits_position_and_snapshots_where_it_got_to() -> None:
    state = SplitState.of(B)
    assert state.position == 3
    assert state.split_id == "/data/b"

    state.position = 11

    assert state.to_split() == FileSplit("/data/b", position=11)
    assert B.position == 3


# -- pickling (splits, events and states travel between processes) ------------------------


@pytest.mark.parametrize(
    "value",
    [
        A,
        SplitsFinishedEvent(("/data/a",)),
        SplitsRemovedEvent(("/data/a", "/data/b")),
        AssignerState((A,), {"/data/b": 1}, frozenset({"/data/c"}), True),
    ],
    ids=["split", "finished-event", "removed-event", "assigner-state"],
)
def test_values_that_travel_between_processes_pickle(value: object) -> None:
    assert pickle.loads(pickle.dumps(value)) == value


# -- AssignerStateCodec -------------------------------------------------------------------


def test_assigner_state_roundtrips_through_json_with_positions() -> None:
    codec = AssignerStateCodec(DataclassCodec(FileSplit))
    state = AssignerState(
        unassigned=(A, B),
        assigned={"/data/x": 0, "/data/y": 2},
        finished=frozenset({"/data/z", "/data/w"}),
        discovered=True,
    )

    encoded = codec.encode(state)
    decoded = codec.decode(json.loads(json.dumps(encoded)), codec.version)

    assert decoded == state
    assert [s.position for s in decoded.unassigned] == [7, 3]
    assert encoded["finished"] == ["/data/w", "/data/z"]  # sorted: deterministic
    assert encoded["split_codec"] == 1


def test_assigner_state_codec_refuses_another_version() -> None:
    codec = AssignerStateCodec(DataclassCodec(FileSplit))
    with pytest.raises(IncompatibleCheckpointError) as info:
        codec.decode(codec.encode(AssignerState()), version=2)
    assert (info.value.found, info.value.expected) == (2, 1)


def test_assigner_state_codec_refuses_splits_written_by_another_split_codec_version() -> None:
    written = AssignerStateCodec(DataclassCodec(FileSplit, version=2)).encode(
        AssignerState(unassigned=(B,))
    )
    reader = AssignerStateCodec(DataclassCodec(FileSplit, version=1))
    with pytest.raises(IncompatibleCheckpointError) as info:
        reader.decode(written, version=1)
    assert (info.value.found, info.value.expected) == (2, 1)


# -- Checkpoint ---------------------------------------------------------------------------


def _checkpoint() -> Checkpoint[FileSplit, AssignerState[FileSplit]]:
    return Checkpoint(
        checkpoint_id=12,
        enumerator=AssignerState(
            unassigned=(A,),
            assigned={"/data/b": 1, "/data/c": 0},
            finished=frozenset({"/data/old"}),
            discovered=True,
        ),
        readers={1: (B,), 0: (FileSplit("/data/c", position=99),), 2: ()},
    )


def test_checkpoint_roundtrips_through_json() -> None:
    source = FileSource()
    checkpoint = _checkpoint()

    text = checkpoint.to_json(source)
    decoded = Checkpoint.decode(json.loads(text), source)

    assert decoded == checkpoint
    assert decoded.readers[0][0].position == 99
    assert sorted(decoded.readers) == [0, 1, 2]
    assert decoded.parallelism == 3


def test_checkpoint_encoding_is_small_versioned_primitives() -> None:
    encoded = _checkpoint().encode(FileSource())

    assert encoded["format"] == 1
    assert encoded["id"] == 12
    assert encoded["codecs"] == [1, 1]
    assert list(encoded["readers"]) == ["0", "1", "2"]
    assert encoded["readers"]["0"] == [
        {"path": "/data/c", "ranges": [], "tags": [], "end": None, "position": 99}
    ]
    assert json.loads(json.dumps(encoded)) == encoded


def test_checkpoint_json_is_the_same_for_equal_checkpoints() -> None:
    source = FileSource()
    one = _checkpoint()
    other = Checkpoint(
        checkpoint_id=12,
        enumerator=AssignerState(
            unassigned=(A,),
            assigned={"/data/c": 0, "/data/b": 1},  # other insertion order
            finished=frozenset({"/data/old"}),
            discovered=True,
        ),
        readers={2: (), 0: (FileSplit("/data/c", position=99),), 1: (B,)},
    )
    assert one.to_json(source) == other.to_json(source)


@pytest.mark.parametrize(("fmt", "found"), [(2, 2), (0, 0), ("1", "1"), (None, None)])
def test_checkpoint_of_another_format_is_refused(fmt: object, found: object) -> None:
    data = _checkpoint().encode(FileSource())
    data["format"] = fmt
    with pytest.raises(IncompatibleCheckpointError) as info:
        Checkpoint.decode(data, FileSource())
    assert (info.value.found, info.value.expected) == (found, 1)


def test_checkpoint_without_a_format_is_refused() -> None:
    data = _checkpoint().encode(FileSource())
    del data["format"]
    with pytest.raises(IncompatibleCheckpointError) as info:
        Checkpoint.decode(data, FileSource())
    assert info.value.found is None


def test_checkpoint_whose_enumerator_codec_version_is_unknown_is_refused() -> None:
    data = _checkpoint().encode(FileSource())
    data["codecs"] = [9, 1]
    with pytest.raises(IncompatibleCheckpointError) as info:
        Checkpoint.decode(data, FileSource())
    assert (info.value.found, info.value.expected) == (9, 1)


def test_checkpoint_written_with_another_split_codec_version_is_refused() -> None:
    data = json.loads(_checkpoint().to_json(FileSource(split_version=2)))
    with pytest.raises(IncompatibleCheckpointError) as info:
        Checkpoint.decode(data, FileSource(split_version=1))
    assert (info.value.found, info.value.expected) == (2, 1)


def test_checkpoint_written_with_a_newer_split_codec_reads_back_with_the_same_codec() -> None:
    source = FileSource(split_version=2)
    checkpoint = _checkpoint()
    assert Checkpoint.decode(json.loads(checkpoint.to_json(source)), source) == checkpoint
