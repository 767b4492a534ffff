"""What keeping a batch's chunk reads in ``stateDir`` costs a PostgreSQL snapshot.

With ``stateDir``, every chunk a streaming batch reads is kept there (Arrow IPC, the first
read winning) until the batch completes, so that a replay after a driver crash returns what
the first evaluation read (``KeptChunks``; ``docs/postgres-cdc.md``). This measures the
split reader's chunk reads of one table (``id bigint`` primary key, an ``int``, a
20-character ``text``, a ``numeric(12,2)``, a ``timestamptz``) in a throw-away PostgreSQL
(``splitflow.testing.postgres``), each chunk read under one batch's exported snapshot as a
Spark task reads it, side by side in one process:

* **plain**: the chunks read, nothing kept (no ``stateDir``);
* **kept**: the same reads, each chunk also written to a local ``stateDir``
  (``splitflow.spark.cdc.StoreChunks``: encoded, then one atomic create per chunk);
* **replayed**: the reads of the kept run's batch again, answered from the kept files.

The three alternate over the rounds; each round's batch number is new, so ``kept`` always
writes. Every read must return the table's row count. The score is median(kept time) /
median(plain time): the cost of a first read (a replay's reads are printed, not scored).

    python bench/cdc_kept_chunks.py           # 1,000,000 rows in chunks of 8,096, 3 rounds
    python bench/cdc_kept_chunks.py --quick   # 200,000 rows, 3 rounds (well under a minute)

Last line: ``RESULT kept_vs_plain=<x> target=<=1.25``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from splitflow.connectors.cdc import cut_ahead
from splitflow.connectors.cdc.reader import KeptChunks
from splitflow.connectors.postgres import catalog
from splitflow.connectors.postgres.options import PostgresOptions
from splitflow.connectors.postgres.pinning import BatchSnapshot, SnapshotPinner
from splitflow.connectors.postgres.reader import CdcSplitReader, Pinned
from splitflow.connectors.postgres.source import PostgresCdcSource
from splitflow.spark.cdc import StoreChunks
from splitflow.spark.statedir import StateStore
from splitflow.testing.postgres import Postgres

TARGET = 1.25
TABLE = "bench_kept"


def read_all(
    source: PostgresCdcSource, kept: KeptChunks | None, pinner: SnapshotPinner, batch: int
) -> tuple[float, int]:
    """Every chunk of the table read as batch ``batch``'s tasks read them: seconds, rows."""
    with catalog.connect(source.options, autocommit=True) as conn:
        cut = catalog.cut(conn, source.tables[f"public.{TABLE}"], source.options.chunk_size)
        chunks, _ = cut_ahead([cut], None, partial(catalog.key_after, conn))
    pinned: Pinned[BatchSnapshot] = Pinned()
    pinned.event = pinner.pin(batch, chunks)
    source.kept_chunks = kept
    reader = CdcSplitReader(source, pinned)
    began = time.perf_counter()
    rows = 0
    try:
        for split in chunks:
            piece = reader._chunk(split)
            rows += sum(b.num_rows for b in piece.batches)
    finally:
        reader.close()
        source.kept_chunks = None
    return time.perf_counter() - began, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = args.rows or (200_000 if args.quick else 1_000_000)
    with (
        tempfile.TemporaryDirectory(prefix="kept-chunks-") as work,
        Postgres.start(Path(work) / "pg") as pg,
    ):
        pg.execute(
            f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, qty int, name text, "
            "price numeric(12,2), created timestamptz)"
        )
        pg.execute(
            f"INSERT INTO {TABLE} SELECT g, g %% 1000, lpad(g::text, 20, 'x'), g / 100.0, "
            "now() - g * interval '1 second' FROM generate_series(1, %s) g",
            (rows,),
        )
        pg.execute(f"VACUUM ANALYZE {TABLE}")
        options = PostgresOptions.parse({"conninfo": pg.conninfo(), "tables": TABLE})
        with catalog.connect(options, autocommit=True) as conn:
            table = catalog.describe_table(conn, f"public.{TABLE}", options)
        source = PostgresCdcSource(options, [table])
        store = StoreChunks(StateStore(str(Path(work) / "state")))
        pinner = SnapshotPinner(options)
        times: dict[str, list[float]] = {"plain": [], "kept": [], "replayed": []}
        print(f"{rows:,} rows in chunks of {options.chunk_size:,}; seconds per full read")
        try:
            for round_ in range(args.rounds):
                batch = 10 * (round_ + 1)
                for name, kept in (("plain", None), ("kept", store), ("replayed", store)):
                    seconds, read = read_all(source, kept, pinner, batch)
                    if read != rows:
                        print(f"FAIL {name} read {read} rows of {rows}")
                        return 1
                    times[name].append(seconds)
                    rate = rows / seconds
                    print(f"round {round_ + 1} {name:<9} {seconds:6.2f} s  {rate:>12,.0f} rows/s")
                pinner.release(batch)
        finally:
            pinner.close()
    medians = {name: statistics.median(t) for name, t in times.items()}
    print("medians: " + ", ".join(f"{n} {t:.2f} s" for n, t in medians.items()))
    ratio = medians["kept"] / medians["plain"]
    if ratio > TARGET:
        print(f"MISS kept_vs_plain={ratio:.3f} above {TARGET}")
    print(f"RESULT kept_vs_plain={ratio:.3f} target=<={TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
