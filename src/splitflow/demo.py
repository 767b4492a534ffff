"""An in-process demo of the coordinator: assignment, discovery, failover, rescale, exactly-once.

Runs the deterministic harness over a generated sequence source and prints what the
enumerator does at each step. Every record is counted at the end: the run fails loudly if
one was lost or read twice. (The Spark runtime will replace this as the main job.)
"""

from __future__ import annotations

from collections.abc import Callable

from splitflow.api.assigner import AssignerState
from splitflow.api.assignment import BalancedAssignment, HashAssignment
from splitflow.testing import SequenceCatalog, SequenceSource, SourceHarness, count_duplicates
from splitflow.testing.sequence import SequenceRecord, SequenceSplit

Harness = SourceHarness[SequenceRecord, SequenceSplit, AssignerState[SequenceSplit]]


def _table(title: str, harness: Harness) -> str:
    lines = [title]
    for reader, splits in harness.reader_splits().items():
        names = " ".join(sorted(s.split_id for s in splits))
        lines.append(f"  reader {reader}: {len(splits):2d} splits  {names}")
    return "\n".join(lines)


def _many_small_topics(strategy_name: str) -> dict[int, int]:
    """FLINK-31762: 20 topics of 3 partitions over 8 readers; partitions per reader."""
    splits = [SequenceSplit(f"topic{t:02d}-{p}") for t in range(20) for p in range(3)]
    loads = dict.fromkeys(range(8), 0.0)
    if strategy_name == "hash":
        hashed = HashAssignment[SequenceSplit](
            key=lambda s: (s.name.rsplit("-", 1)[0], int(s.name.rsplit("-", 1)[1]))
        )
        result = hashed.assign(splits, loads)
    else:
        result = BalancedAssignment[SequenceSplit]().assign(splits, loads)
    return {r: len(result.get(r, [])) for r in range(8)}


def run(echo: Callable[[str], None] = print) -> int:
    """Run the demo; returns the number of records read exactly once."""
    catalog = SequenceCatalog({f"part-{i:02d}": 50 + 25 * (i % 4) for i in range(12)})
    source = SequenceSource(catalog, discovery_interval=5.0, fetch_size=20)
    harness: Harness = SourceHarness(source, 4)
    harness.settle()
    echo(_table("1. 12 splits discovered, balanced over 4 readers:", harness))

    for reader in harness.slots:
        harness.poll(reader, max_polls=2)
    checkpoint = harness.checkpoint()
    harness.complete(checkpoint)
    echo(f"2. readers read {len(harness.committed())} records; checkpoint {checkpoint} completed")

    for i in range(12, 16):
        catalog.add(f"part-{i:02d}", 40)
    harness.advance(5.0)
    echo(_table("3. 4 new splits found by periodic discovery, given to the least loaded:", harness))

    before = {r: {s.split_id for s in ss} for r, ss in harness.reader_splits().items()}
    harness.poll(2, max_polls=3)
    harness.fail_reader(2)
    after = {r: {s.split_id for s in ss} for r, ss in harness.reader_splits().items()}
    kept = all(after[r] == before[r] for r in before if r != 2)
    echo(
        _table(
            "4. reader 2 failed and restarted from the checkpoint (others untouched: "
            f"{'yes' if kept else 'NO'}):",
            harness,
        )
    )

    harness.complete(harness.checkpoint())
    owner_before = {s.split_id: r for r, ss in harness.reader_splits().items() for s in ss}
    harness.restore(parallelism=6)
    moved = sum(
        1
        for r, ss in harness.reader_splits().items()
        for s in ss
        if owner_before.get(s.split_id) != r
    )
    echo(
        _table(
            f"5. restored with 6 readers: {moved} of {len(owner_before)} splits moved "
            "(the fewest that balance 6 readers):",
            harness,
        )
    )

    harness.advance(5.0)
    harness.read_available()
    harness.complete(harness.checkpoint())
    committed = harness.committed()
    harness.close()
    duplicates = count_duplicates(committed)
    expected = catalog.records()
    if duplicates or sorted(committed) != expected:
        raise SystemExit(
            f"EXACTLY-ONCE VIOLATED: {len(committed)} committed, {len(expected)} expected, "
            f"{len(duplicates)} duplicated"
        )
    echo(f"6. all {len(expected)} records committed exactly once across failover and rescale")

    echo("7. FLINK-31762, 20 topics x 3 partitions over 8 readers (partitions per reader):")
    for name in ("hash", "balanced"):
        loads = _many_small_topics(name)
        spread = max(loads.values()) - min(loads.values())
        echo(f"  {name:8s} {list(loads.values())}  spread {spread}")
    return len(expected)
