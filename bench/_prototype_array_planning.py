"""A design prototype, not a benchmark of splitflow: what one micro-batch's planning costs
when the positions of the splits a query holds live in arrays (``docs/design.md``, "What a
batch costs now"), beside the planner of today on the same workload, in the same process.

The prototype does what the planner's per-split passes do, as NumPy operations over
``N`` splits in 8 slots: take the extents the source reports as changed (10% of the
splits get 10 records more per batch, a window that moves), compute every split's
backlog, pick what the batch reads (``all``: every backlog, the initial records read
before; ``max``: an even share of a 10,000-record budget over splits that all start
behind), order the slices by slot, encode the batch's state delta with ``orjson`` (split
ids, starts and stops of the splits read), make each task's list of slices from splits
encoded once without their position, move the positions on, and compute the total lag
and the 50 splits that lag most. It has no enumerator, no events, no discovery and no
state files: it is the floor such a design could reach, not a forecast of it. The
planner of today runs ``bench/planning_scale.py``'s workload of the same name with
``stateDir`` (``latestOffset``, ``reportLatestOffset``, ``partitions`` and ``commit``, JSON
in and out, discovery every batch), timed as that benchmark times it.

Usage::

    python bench/_prototype_array_planning.py            # 100k splits
    python bench/_prototype_array_planning.py 1000000    # 1M (the planner: prototype only)
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

import numpy as np
import orjson

from planning_scale import INITIAL_RECORDS, MAX_RECORDS, Run, _workload
from splitflow.spark.planner import collect_garbage_less_often

SLOTS = 8
APPENDED = 10
TOP = 50


def prototype(n: int, workload: str, batches: int) -> list[float]:
    """Seconds per batch of the array prototype."""
    ids = [f"s{i:07d}" for i in range(n)]
    bodies = [orjson.dumps({"name": sid, "end": None}) for sid in ids]  # without position
    slot = (np.arange(n) % SLOTS).astype(np.int16)
    latest = np.full(n, INITIAL_RECORDS, np.int64)
    # max: a query that is behind (nothing read yet); all: the initial records read
    position = np.zeros(n, np.int64) if workload == "max" else latest.copy()
    changing = max(1, n // 10)
    times = []
    for batch in range(batches):
        changed = (np.arange(changing) + batch * changing) % n
        began = time.perf_counter()
        latest[changed] += APPENDED
        backlog = latest - position
        read = np.flatnonzero(backlog > 0)
        share = backlog[read]
        if workload == "max":  # the budget shared evenly, the remainder one record each
            even, rest = divmod(MAX_RECORDS, len(read))
            share = np.minimum(share, even + (np.arange(len(read)) < rest))
            read, share = read[share > 0], share[share > 0]
        order = np.argsort(slot[read], kind="stable")
        read = read[order]
        start = position[read]
        stop = start + share[order]
        delta = orjson.dumps(
            {"ids": [ids[i] for i in read.tolist()], "start": start.tolist(), "stop": stop.tolist()}
        )
        bounds = np.searchsorted(slot[read], np.arange(SLOTS + 1))
        rows = list(
            zip(map(bodies.__getitem__, read.tolist()), start.tolist(), stop.tolist(), strict=True)
        )
        tasks = [rows[a:z] for a, z in itertools.pairwise(bounds.tolist())]
        position[read] = stop
        lag = latest - position
        total, top = int(lag.sum()), np.argpartition(lag, -TOP)[-TOP:]
        times.append(time.perf_counter() - began)
        if total < 0 or len(top) != TOP or sum(map(len, tasks)) != len(read) or not delta:
            raise AssertionError(f"batch {batch}: the prototype lost slices")
    return times


def planner(n: int, workload: str, batches: int) -> float:
    """Seconds per batch of today's planner: ``bench/planning_scale.py``'s own run of the
    workload with ``stateDir``, the sum of its phases' medians (what its RESULT reports)."""
    run = Run(n, SLOTS, "stateDir")
    _workload(run, workload, [f"s{i:07d}" for i in range(n)], batches)
    return run.batch(workload)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("splits", nargs="?", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=7)
    args = parser.parse_args()
    collect_garbage_less_often()  # as the streaming runner and planning_scale.py do
    print(f"{args.splits:,} splits, {SLOTS} slots, 10% changing, median ms per batch")
    print(f"{'workload':10}{'planner':>10}{'prototype':>11}")
    for workload in ("all", "max"):
        mine = statistics.median(prototype(args.splits, workload, args.batches)) * 1e3
        today = (
            f"{planner(args.splits, workload, args.batches) * 1e3:10.1f}"
            if args.splits <= 100_000
            else f"{'-':>10}"
        )
        print(f"{workload:10}{today}{mine:11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
