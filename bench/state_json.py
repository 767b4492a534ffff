"""Writing and reading the offset state of ``stateDir`` as JSON: ``json.dumps`` against the
state files' writer (:func:`splitflow.spark.snapshots.to_json`, orjson), and ``json.loads``
against their reader (:func:`~splitflow.spark.snapshots.from_json`), side by side, at 100k
splits.

Builds the state a planner keeps for its snapshot files, as ``bench/planning_scale.py``
does: the real :class:`~splitflow.spark.planner.Planner` (no Spark) on the
:class:`~splitflow.testing.sequence.SequenceSource` over ``N`` splits with 8 reader slots
and ``stateDir`` in a temporary folder, after 3 batches that read 10,000 records each.
Then it times, alternating the two in each round, ``json.dumps(state, separators=(",",
":")).encode()`` (what the files were written with before) and ``to_json(state)``, checks
that both give the same document, and times reading it back with ``json.loads`` (how the
files were read before) and ``from_json`` (how they are read: orjson, for what orjson wrote).

The last line is ``RESULT state_write_speedup_100k=<json.dumps time / to_json time>
state_read_speedup_100k=<json.loads time / from_json time> target=>=10,>=1.5``: medians of
per-round ratios over ``--rounds`` (7) rounds. A full snapshot of the state is written every
few batches (about one in three at 100k splits with 10% of them changing), so its cost is a
share of every batch; a restart reads one, and its deltas. ``--quick`` (a few seconds) runs
10k splits and names its metrics ``..._10k``. A missed target prints ``MISS`` before
``RESULT``.

Usage::

    python bench/state_json.py             # 100k splits
    python bench/state_json.py --quick     # 10k splits
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from planning_scale import INITIAL_RECORDS, MAX_RECORDS, Clock, Runner, _append, _label
from splitflow.spark.limits import MaxRecords
from splitflow.spark.planner import collect_garbage_less_often
from splitflow.spark.snapshots import from_json, to_json
from splitflow.testing.sequence import SequenceCatalog, SequenceSource

TARGET = 10.0  # writing
TARGET_READ = 1.5


def state_of(n_splits: int, state_dir: str) -> Any:
    """The planner's offset state document after 3 batches at ``n_splits`` splits."""
    names = [f"topic-{i:06d}" for i in range(n_splits)]
    catalog = SequenceCatalog(dict.fromkeys(names, INITIAL_RECORDS))
    source = SequenceSource(catalog, discovery_interval=1.0)
    clock = Clock()
    runner = Runner(source, 8, clock, state_dir)
    start = runner.initial_offset()
    for batch in range(3):
        _append(catalog, names, batch)
        clock.now += 1.0
        start = runner.latest_offset(start, MaxRecords(MAX_RECORDS))
    offsets = runner.planner._offsets
    if offsets is None:
        raise RuntimeError("the planner keeps no offset state: stateDir was not set")
    state = offsets._state
    runner.planner.close()
    return state


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="10k splits")
    parser.add_argument("--splits", type=int, help="split count (default 100k, 10k with --quick)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    args = parser.parse_args(argv)
    logging.getLogger("splitflow.spark").setLevel(logging.ERROR)  # no executors here
    collect_garbage_less_often()  # what the streaming runner does
    n_splits = args.splits or (10_000 if args.quick else 100_000)

    print(f"$ {' '.join(['python', 'bench/state_json.py', *sys.argv[1:]])}")
    with tempfile.TemporaryDirectory() as state_dir:
        state = state_of(n_splits, state_dir)
    old = json.dumps(state, separators=(",", ":")).encode()
    new = to_json(state)
    if not json.loads(old) == json.loads(new) == from_json(new):
        print("the two writers (or readers) gave different documents", file=sys.stderr)
        return 1
    print(f"state_json: {n_splits:,} splits, a state of {len(new):,} bytes, {args.rounds} rounds")

    def dumps() -> bytes:
        return json.dumps(state, separators=(",", ":")).encode()

    times: dict[str, list[float]] = {
        "json.dumps": [],
        "to_json": [],
        "json.loads": [],
        "from_json": [],
    }
    pairs: list[list[tuple[str, Callable[[], object]]]] = [
        [("json.dumps", dumps), ("to_json", lambda: to_json(state))],
        [("json.loads", lambda: json.loads(new)), ("from_json", lambda: from_json(new))],
    ]
    for round_ in range(args.rounds + 1):  # the first round warms up, untimed
        for pair in pairs:
            for name, run in pair if round_ % 2 else pair[::-1]:
                t = _seconds(run)
                if round_:
                    times[name].append(t)
    for name, ts in times.items():
        print(f"{name:<12}{statistics.median(ts) * 1e3:9.1f} ms (median)")
    results = []
    for (old_name, new_name), what, target in (
        (("json.dumps", "to_json"), "write", TARGET),
        (("json.loads", "from_json"), "read", TARGET_READ),
    ):
        ratios = [a / b for a, b in zip(times[old_name], times[new_name], strict=True)]
        speedup = statistics.median(ratios)
        metric = f"state_{what}_speedup_{_label(n_splits)}"
        if speedup < target:
            print(f"MISS {metric}={speedup:.1f} is below the target {target:g}")
        results.append(f"{metric}={speedup:.1f}")
    print(f"RESULT {' '.join(results)} target=>={TARGET:g},>={TARGET_READ:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
