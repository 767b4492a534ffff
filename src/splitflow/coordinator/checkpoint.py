"""A source checkpoint: the enumerator's snapshot plus every reader's splits.

This is one consistent cut: every split not finished is either in the enumerator's state or
in exactly one reader's list, at the position reading resumes. It encodes to a small,
versioned dict of JSON primitives (it travels in Spark offsets).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic

from splitflow.api.enumerator import EnumStateT
from splitflow.api.source import Source
from splitflow.api.split import JsonDict, SplitT
from splitflow.errors import IncompatibleCheckpointError

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Checkpoint(Generic[SplitT, EnumStateT]):
    checkpoint_id: int
    enumerator: EnumStateT
    readers: Mapping[int, tuple[SplitT, ...]] = field(default_factory=dict)

    @property
    def parallelism(self) -> int:
        return len(self.readers)

    def encode(self, source: Source[Any, SplitT, EnumStateT]) -> JsonDict:
        splits = source.split_codec
        enum_codec = source.enumerator_state_codec
        return {
            "format": FORMAT_VERSION,
            "id": self.checkpoint_id,
            "codecs": [enum_codec.version, splits.version],
            "enumerator": enum_codec.encode(self.enumerator),
            "readers": {
                str(r): [splits.encode(s) for s in ss] for r, ss in sorted(self.readers.items())
            },
        }

    def to_json(self, source: Source[Any, SplitT, EnumStateT]) -> str:
        return json.dumps(self.encode(source), separators=(",", ":"), sort_keys=True)

    @classmethod
    def decode(
        cls, data: Mapping[str, Any], source: Source[Any, SplitT, EnumStateT]
    ) -> Checkpoint[SplitT, EnumStateT]:
        if data.get("format") != FORMAT_VERSION:
            raise IncompatibleCheckpointError(
                "source checkpoint format", found=data.get("format"), expected=FORMAT_VERSION
            )
        enum_version, split_version = data["codecs"]
        splits = source.split_codec
        return cls(
            checkpoint_id=int(data["id"]),
            enumerator=source.enumerator_state_codec.decode(data["enumerator"], enum_version),
            readers={
                int(r): tuple(splits.decode(s, split_version) for s in ss)
                for r, ss in data["readers"].items()
            },
        )


def redistribute_reader_states(
    states: Mapping[int, Sequence[SplitT]], parallelism: int
) -> dict[int, list[SplitT]]:
    """Hand the readers' states of a checkpoint to ``parallelism`` new readers.

    The same parallelism keeps each state with its reader; another one deals old reader
    ``i``'s state to new reader ``i % parallelism`` (as Flink redistributes list state).
    Nothing is dropped: sources that reassign on recovery then report these splits and the
    enumerator balances them.
    """
    result: dict[int, list[SplitT]] = {r: [] for r in range(parallelism)}
    for old, splits in sorted(states.items()):
        result[old % parallelism].extend(splits)
    return result
