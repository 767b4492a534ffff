"""A CDC snapshot batch merged into a Delta table by ``apply_changes``, against a plain
``write_deltalake`` append of the same rows.

The rows: N snapshot reads (``op`` ``r``) of a table ``(id bigint, qty int, name string,
price double, created timestamp)`` with the four columns a CDC source adds, as Arrow. The
Delta table already holds the N rows of an earlier snapshot batch (other ids), as when a
snapshot runs over several batches. Side by side, alternating over the rounds (after one
that warms up and is not counted), each into a fresh copy of that table:

* **append**: ``write_deltalake(mode="append")`` of the table's columns, the least a
  Delta writer does with the rows;
* **apply_changes**: the whole batch as ``foreachBatch`` would give it as Arrow: its rows
  reduced to the last change per key, merged by key (``MERGE``: update, delete, insert),
  committed with the batch's application transaction.

Each prints its time and rows/s; the score is median(apply_changes rows/s) /
median(append rows/s). A merge joins the batch with the table's keys besides writing the
rows, so it is slower by nature; the target says it stays within 4x of the append.

    python bench/cdc_mirror.py           # 1,000,000 rows, 3 rounds
    python bench/cdc_mirror.py --quick   # 200,000 rows, 2 rounds (well under a minute)

Last line: ``RESULT merge_vs_append=<x> target=0.25``; below the target, a ``MISS`` line
comes before it.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from splitflow.cdc import apply_changes

TARGET = 0.25
COLUMNS = ("id", "qty", "name", "price", "created")


def snapshot(first_id: int, rows: int) -> pa.Table:
    """``rows`` snapshot reads of ids ``first_id..``, with the CDC source's columns."""
    ids = np.arange(first_id, first_id + rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "qty": (ids % 1000).astype(np.int32),
            "name": pa.array([f"name-{i % 9973}" for i in range(rows)]),
            "price": ids.astype(np.float64) / 100,
            "created": pa.array(ids * 1_000_000, pa.timestamp("us", tz="UTC")),
            "op": pa.array(["r"] * rows),
            "lsn": pa.array(np.full(rows, 1_000, dtype=np.int64)),
            "commit_ts": pa.nulls(rows, pa.timestamp("us", tz="UTC")),
            "table": pa.array(["public.items"] * rows),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200,000 rows, 2 rounds")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rows = args.rows or (200_000 if args.quick else 1_000_000)
    rounds = args.rounds or (2 if args.quick else 3)

    earlier, batch = snapshot(0, rows), snapshot(rows, rows)
    times: dict[str, list[float]] = {"append": [], "apply_changes": []}
    with tempfile.TemporaryDirectory(prefix="cdc-mirror-") as work:
        base = Path(work, "base")
        write_deltalake(str(base), earlier.select(COLUMNS), mode="append")
        print(f"{rows:,} rows per batch; the table holds {rows:,} rows of an earlier batch")
        for number in range(-1, rounds):  # round 0 warms up (delta-rs starts its engine)
            for kind in times:
                target = Path(work, f"{kind}-{number + 1}")
                shutil.copytree(base, target)
                began = time.perf_counter()
                if kind == "append":
                    write_deltalake(str(target), batch.select(COLUMNS), mode="append")
                else:
                    done = apply_changes(batch, 1, str(target), keys=["id"], app_id="bench")
                    assert done.inserted == rows, done
                seconds = time.perf_counter() - began
                shutil.rmtree(target)
                if number < 0:
                    continue
                times[kind].append(seconds)
                rate = rows / seconds
                print(f"round {number + 1}  {kind:<14} {seconds:7.2f} s  {rate:>12,.0f} rows/s")
    medians = {kind: rows / statistics.median(t) for kind, t in times.items()}
    ratio = medians["apply_changes"] / medians["append"]
    print(
        f"medians: append {medians['append']:,.0f} rows/s, "
        f"apply_changes {medians['apply_changes']:,.0f} rows/s"
    )
    if ratio < TARGET:
        print(f"MISS merge_vs_append={ratio:.3f} is below {TARGET}")
    print(f"RESULT merge_vs_append={ratio:.3f} target={TARGET}")


if __name__ == "__main__":
    main()
