"""Read a Spark streaming checkpoint's splitflow state offline (no Spark, no connector code).

Spark writes one file per micro-batch under ``<checkpoint>/offsets/<batch>``: a version line,
a metadata line, then one line per source with that source's offset. A splitflow offset is
a full checkpoint of the source (see :mod:`splitflow.spark.offset`; with ``stateDir``, its bulk
is in the state directory, :mod:`splitflow.spark.offsetstate`), so this shows, for a
batch: which slot owns each split, the slice the batch reads (``start`` to ``stop``),
what the enumerator holds itself, and what has finished; with an event-time column, each
held split's watermark (the latest event time read from it). A query with option ``stateDir``
keeps its splits and finished splits in the state directory: pass ``--state-dir`` to show
them (without it, an offset whose splits are there is an error, and only the count of the
finished splits is shown).

    python -m splitflow inspect /path/to/checkpoint            # the latest batch
    python -m splitflow inspect /path/to/checkpoint --batch 7  # a given batch
    python -m splitflow inspect /path/to/checkpoint --json     # machine-readable
    python -m splitflow inspect /path/to/checkpoint --state-dir /path/to/state
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from splitflow.errors import CheckpointStateError, ConfigurationError, IncompatibleCheckpointError
from splitflow.spark.eventtime import iso
from splitflow.spark.ledger import LedgerStore
from splitflow.spark.offset import FORMAT_3, OFFSET_FORMAT, READ_FORMATS
from splitflow.spark.offsetstate import WHOLE_OF, OffsetState, expand_offset
from splitflow.spark.snapshots import StateRef


@dataclass(frozen=True)
class SplitRow:
    split_id: str
    state: str  # "reading" (owned by a slot), "ending" (the batch reads its end and
    # finishes it), "unassigned" (enumerator), "finished"
    owner: int | None
    start: int | None
    stop: int | None
    boundary: int | None = None
    """The split's backlog boundary, while it has not reached it."""
    watermark: int | None = None
    """The latest event time read from the split (microseconds since the epoch), when the
    query has an event-time column; the offset keeps it for the splits the slots hold."""

    @property
    def records(self) -> int | None:
        if self.start is None or self.stop is None:
            return None
        return self.stop - self.start

    @property
    def to_boundary(self) -> int | None:
        """Records between where this batch leaves the split and its backlog boundary."""
        at = self.stop if self.stop is not None else self.start
        if self.boundary is None or at is None:
            return None
        return max(0, self.boundary - at)


@dataclass(frozen=True)
class SourceState:
    batch: int
    committed: bool
    source_index: int
    seq: int
    backlog: bool
    parallelism: int
    splits: list[SplitRow]
    ledger_size: int | None = None
    """Finished splits kept in the state directory's ledger, when not listed in ``splits``."""


def _batches(directory: str) -> list[int]:
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def read_checkpoint(
    checkpoint: str, batch: int | None = None, state_dir: str | None = None
) -> list[SourceState]:
    """The splitflow sources' state in ``batch`` (default: the latest) of ``checkpoint``.

    ``state_dir``: the query's ``stateDir``, where its splits and finished splits are kept.
    """
    offsets_dir = os.path.join(checkpoint, "offsets")
    batches = _batches(offsets_dir)
    if not batches:
        raise ConfigurationError(
            f"{checkpoint!r} is not a Spark streaming checkpoint: no offsets/<batch> files",
            option="checkpoint",
        )
    chosen = batches[-1] if batch is None else batch
    if chosen not in batches:
        raise ConfigurationError(
            f"batch {chosen} is not in {offsets_dir} (batches {batches[0]}..{batches[-1]})",
            option="batch",
        )
    with open(os.path.join(offsets_dir, str(chosen)), encoding="utf-8") as f:
        lines = f.read().splitlines()
    committed = chosen in _batches(os.path.join(checkpoint, "commits"))
    states = []
    for index, line in enumerate(lines[2:]):
        try:
            offset = json.loads(line)
        except json.JSONDecodeError:
            continue  # another source's offset in its own format
        if isinstance(offset, dict) and "splitflow" in offset:
            try:
                states.append(_source_state(chosen, committed, index, offset, state_dir))
            except CheckpointStateError as exc:
                raise CheckpointStateError(
                    f"batch {chosen}: {exc} (commits discard the state files of batches "
                    "older than the last stateRetainBatches)",
                    path=exc.path,
                ) from None
    return states


def _source_state(
    batch: int, committed: bool, index: int, offset: dict[str, Any], state_dir: str | None
) -> SourceState:
    if offset.get("splitflow") in WHOLE_OF and state_dir is None:
        raise ConfigurationError(
            f"batch {batch}: the query keeps its splits in its state directory: pass "
            "--state-dir (option stateDir of the query)",
            option="state-dir",
        )
    offset = expand_offset(offset, OffsetState(state_dir) if state_dir else None)
    if offset.get("splitflow") not in READ_FORMATS:
        raise IncompatibleCheckpointError(
            f"batch {batch}: splitflow offset",
            found=offset.get("splitflow"),
            expected=OFFSET_FORMAT,
        )
    rows = []
    enumerator = offset.get("enumerator", {})
    boundaries = enumerator.get("backlog", {})
    event_times = {k: int(v) for k, v in offset.get("event_times", {}).items()}
    ending = set()
    seq = int(offset["seq"])
    for slot, slices in enumerate(offset["slots"]):
        for entry in slices:
            split_id, split = entry[0], entry[1]
            if offset["splitflow"] == OFFSET_FORMAT:  # [..., start, stop, read by, (1: ends)]
                begin, stop, read_by, *ends = entry[2:]
            elif offset["splitflow"] == FORMAT_3:  # [..., stop, the batch that read it, (1)]
                begin = split["position"]
                stop, read_by, *ends = entry[2:]
            else:  # format 1: [..., stop, (1 if it ends)]
                begin, read_by = split["position"], seq
                stop, *ends = entry[2:]
            start = int(begin) if read_by == seq else int(stop)
            boundary = boundaries.get(split_id)
            watermark = event_times.get(split_id)
            state = "ending" if ends else "reading"
            rows.append(SplitRow(split_id, state, slot, start, int(stop), boundary, watermark))
            if ends:
                ending.add(split_id)
    for split_id, split in enumerator.get("unassigned", {}).items():
        position = split.get("position")
        boundary = boundaries.get(split_id)
        watermark = event_times.get(split_id)
        rows.append(SplitRow(split_id, "unassigned", None, position, None, boundary, watermark))
    finished = list(enumerator.get("finished", []))
    ledger_size = None
    if "ledger" in offset:
        ref = StateRef.decode(offset["ledger"])
        if state_dir is None:
            ledger_size = ref.size
        else:
            finished.extend(sorted(LedgerStore(state_dir).load(ref)))
    for split_id in finished:
        if split_id in ending:  # listed once, as the batch reads its end
            continue
        rows.append(SplitRow(str(split_id), "finished", None, None, None))
    return SourceState(
        batch=batch,
        committed=committed,
        source_index=index,
        seq=int(offset["seq"]),
        backlog=bool(offset.get("backlog", False)),
        parallelism=len(offset["slots"]),
        splits=sorted(rows, key=lambda r: (r.state not in ("reading", "ending"), r.split_id)),
        ledger_size=ledger_size,
    )


ID_WIDTH = 60
"""Split ids longer than this are shown by their end (a path's end tells files apart)."""


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def format_table(states: list[SourceState]) -> str:
    out = []
    for state in states:
        loads = [sum(1 for r in state.splits if r.owner == s) for s in range(state.parallelism)]
        out.append(
            f"batch {state.batch} ({'committed' if state.committed else 'NOT committed'}), "
            f"source #{state.source_index}: checkpoint {state.seq}, "
            f"{state.parallelism} slots with {loads} splits, "
            f"backlog {'yes' if state.backlog else 'no'}"
        )
        if state.ledger_size is not None:
            out.append(
                f"  {state.ledger_size} finished splits in the state directory's ledger "
                "(--state-dir lists them)"
            )
        width = min(ID_WIDTH, max([5, *(len(r.split_id) for r in state.splits)]))
        event_time = any(r.watermark is not None for r in state.splits)
        out.append(
            f"  {'split':{width}s} {'state':10s} {'slot':>4s} {'start':>12s} {'stop':>12s} "
            f"{'rows':>10s} {'backlog to':>12s} {'to go':>10s}"
            + (" watermark" if event_time else "")
        )

        def cell(value: int | None, width: int) -> str:
            return f"{'' if value is None else value:>{width}}"

        for row in state.splits:
            out.append(
                f"  {_fit(row.split_id, width):{width}s} {row.state:10s} {cell(row.owner, 4)} "
                f"{cell(row.start, 12)} {cell(row.stop, 12)} {cell(row.records, 10)} "
                f"{cell(row.boundary, 12)} {cell(row.to_boundary, 10)}"
                + (f" {iso(row.watermark) or ''}" if event_time else "")
            )
    return "\n".join(out) if out else "no splitflow source in this batch"


def to_json(states: list[SourceState]) -> str:
    return json.dumps(
        [
            {
                "batch": s.batch,
                "committed": s.committed,
                "source": s.source_index,
                "checkpoint": s.seq,
                "backlog": s.backlog,
                "parallelism": s.parallelism,
                "ledger_size": s.ledger_size,
                "splits": [
                    {
                        "id": r.split_id,
                        "state": r.state,
                        "slot": r.owner,
                        "start": r.start,
                        "stop": r.stop,
                        "backlog_boundary": r.boundary,
                        "to_boundary": r.to_boundary,
                        "watermark_us": r.watermark,
                    }
                    for r in s.splits
                ],
            }
            for s in states
        ],
        indent=2,
    )
