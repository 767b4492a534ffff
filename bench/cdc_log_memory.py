"""Memory of a task that reads a large slice of the CDC log: streamed piece by piece (now)
vs the whole slice held before it is emitted (before), side by side in one script.

A throw-away PostgreSQL 15 on loopback (``splitflow.testing.postgres``) holds a table of 2,000
rows (``id bigint`` primary key, ``version int``, a 1,792-character ``payload``), a
publication and a ``pgoutput`` slot made before any change. A connection then updates a
quarter of the rows per transaction (500 rows, ``version + 1`` and a new ``payload``) until
``--wal`` MiB of WAL lie between the slot and the insert position: the log's backlog after a
long snapshot on a busy database. That whole span is then read as ONE planned slice, as a
micro-batch planned with a large limit (or before the default limit existed) and replayed
reads it, in a fresh Python process per read, so each process's peaks are its read's alone:

* **streamed**: the CDC source's reader as a Spark task runs it (``source.create_reader``,
  ``add_splits`` with the slice's stop, ``poll_next`` until the end, each batch of rows
  counted and dropped as the task hands it to Spark): a server-side cursor, one piece of
  whole transactions (8,192 rows or 4 MiB of messages) per fetch;
* **whole**: the same decoder with every piece of the slice collected in a list before
  any is emitted, as ``LogDecoder.read`` did before.

Each read reports its rows and time and, measured in that process: the growth of its
resident set (peak ``VmHWM`` after the read, reset at the start through
``/proc/self/clear_refs``, minus ``VmRSS`` before), and, in a second read with
``tracemalloc`` on, the peak of Python's allocations plus the peak of Arrow's memory pool
(where the record batches live). Reads alternate between the two kinds over ``--rounds``.

    python bench/cdc_log_memory.py           # 200 MiB of WAL, 2 rounds
    python bench/cdc_log_memory.py --quick   # 40 MiB of WAL, 1 round (< 1 minute)

The score is the streamed read's resident-set growth (the median over rounds), which must
stay under 64 MiB however large the slice. Last line: ``RESULT peak_mib=<x> target=<=64``;
above the target, a ``MISS`` line comes before it (the exit code is still 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support

TARGET_MIB = 64.0
TABLE = "wide"
SLOT = "bench_log_memory"
ROWS = 2000
WIDTH = 1792
MIB = 1024 * 1024


# -- the backlog (parent process) --------------------------------------------------------------


def build_backlog(pg: Any, wal_mib: int) -> tuple[int, int, int]:
    """Table, publication, slot, then updates until ``wal_mib`` MiB of WAL follow the slot.
    Returns (slot's LSN, insert LSN after the updates, rows updated)."""
    pg.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, version int NOT NULL, payload text)")
    pg.execute(
        f"INSERT INTO {TABLE} SELECT g, 0, (SELECT string_agg(md5(g::text || h), '') "
        f"FROM generate_series(1, {WIDTH // 32}) h) FROM generate_series(1, {ROWS}) g"
    )
    pg.execute(f"CREATE PUBLICATION {SLOT} FOR TABLE {TABLE}")
    ((start,),) = pg.execute(
        "SELECT lsn - '0/0'::pg_lsn FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
        (SLOT,),
    )
    statements = 0
    with pg.connect() as conn:
        while True:
            conn.execute(
                f"UPDATE {TABLE} SET version = version + 1, "
                "payload = overlay(payload placing md5(random()::text) from 1) "
                "WHERE id %% 4 = %s",
                (statements % 4,),
            )
            statements += 1
            row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
            if int(row[0]) - int(start) >= wal_mib * MIB:
                return int(start), int(row[0]), statements * ROWS // 4


def measure(kind: str, conninfo: str, start: int, stop: int, trace: bool) -> dict[str, Any]:
    """One read in a fresh process (see :func:`child`)."""
    command = [sys.executable, __file__, "--child", kind, "--conninfo", conninfo]
    command += ["--start", str(start), "--stop", str(stop)] + (["--trace"] if trace else [])
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {kind} read failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- one read (child process) -----------------------------------------------------------------


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


class Counter:
    """A reader output that counts rows and drops them, as a task hands them to Spark."""

    rows = 0

    def collect(self, batch: Any) -> None:
        self.rows += batch.num_rows


def child(kind: str, conninfo: str, start: int, stop: int, trace: bool) -> None:
    import tracemalloc

    import pyarrow as pa

    from splitflow.api.reader import InputStatus
    from splitflow.connectors.postgres import catalog
    from splitflow.connectors.postgres.options import PostgresOptions
    from splitflow.connectors.postgres.reader import LogDecoder, OutputSchema
    from splitflow.connectors.postgres.source import PostgresCdcSource
    from splitflow.connectors.postgres.splits import LogSplit
    from splitflow.reader.output import RecordingReaderContext

    options = PostgresOptions.parse({"conninfo": conninfo, "tables": TABLE, "slotName": SLOT})
    with catalog.connect(options, autocommit=True) as conn:
        tables = [catalog.describe_table(conn, f"public.{TABLE}", options)]
    source = PostgresCdcSource(options, tables)
    # Once per process, not per slice: Arrow imports pandas for the first time-zone-aware
    # timestamps it converts (the commit times), some 40 MiB; a Spark worker has it already.
    pa.array([datetime.now(UTC)], pa.timestamp("us", tz="UTC"))
    out = Counter()
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    if trace:
        tracemalloc.start()
    began = time.perf_counter()
    if kind == "streamed":
        reader = source.create_reader(RecordingReaderContext(0))
        reader.start()
        split = LogSplit(SLOT, start)
        reader.add_splits([split], stop_at={split.split_id: stop})
        reader.notify_no_more_splits()
        while (status := reader.poll_next(out)) is not InputStatus.END_OF_INPUT:
            if status is InputStatus.NOTHING_AVAILABLE:
                reader.wait_available(60)
        reader.close()
    else:
        conn = catalog.connect(options, autocommit=True)
        decoder = LogDecoder(
            OutputSchema(source.columns()),
            [],
            lambda t: source.table(t, conn),
            lambda described, relation: catalog.describe_relation(
                conn,
                described,
                relation.oid,
                [(c.name, c.type_oid, c.type_modifier) for c in relation.columns],
            ),
            options.schema_changes == "stop",
        )
        pieces = list(decoder.read(conn, SLOT, SLOT, start, stop))  # the whole slice at once
        for piece in pieces:
            for batch in piece.batches:
                out.collect(batch)
        del pieces
        conn.close()
    seconds = time.perf_counter() - began
    python_peak = tracemalloc.get_traced_memory()[1] if trace else 0
    result = {
        "kind": kind,
        "rows": out.rows,
        "seconds": seconds,
        "rss_growth": (_status_kib("VmHWM") - before) * 1024,
        "python_peak": python_peak,
        "arrow_peak": pa.default_memory_pool().max_memory(),
    }
    print(json.dumps(result))


# -- the comparison ----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 MiB of WAL, 1 round")
    parser.add_argument("--wal", type=int, default=None, help="MiB of WAL (default 200)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 2)")
    parser.add_argument("--child", choices=["streamed", "whole"], help=argparse.SUPPRESS)
    parser.add_argument("--conninfo", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stop", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.conninfo, args.start, args.stop, args.trace)
        return
    wal = args.wal or (40 if args.quick else 200)
    rounds = args.rounds or (1 if args.quick else 2)

    from splitflow.testing.postgres import Postgres

    print(f"$ python bench/cdc_log_memory.py {' '.join(sys.argv[1:])}")
    pg = Postgres.start(Path(tempfile.mkdtemp(prefix="splitflow-bench-log-")))
    try:
        began = time.perf_counter()
        start, stop, updates = build_backlog(pg, wal)
        print(
            f"backlog: {(stop - start) / MIB:.1f} MiB of WAL, {updates:,} rows updated in "
            f"{updates * 4 // ROWS:,} transactions ({time.perf_counter() - began:.1f} s); "
            f"read as one slice; {os.cpu_count()} cpus, python {sys.version.split()[0]}"
        )
        results: dict[str, list[dict[str, Any]]] = {"streamed": [], "whole": []}
        for n in range(rounds):
            order = ["streamed", "whole"] if n % 2 == 0 else ["whole", "streamed"]
            for kind in order:
                result = measure(kind, pg.conninfo(), start, stop, trace=False)
                traced = measure(kind, pg.conninfo(), start, stop, trace=True)
                result.update(python_peak=traced["python_peak"], arrow_peak=traced["arrow_peak"])
                if result["rows"] != updates:
                    raise RuntimeError(f"the {kind} read got {result['rows']} of {updates} rows")
                results[kind].append(result)
                print(
                    f"  round {n} {kind:>8}: {result['rows']:,} rows in "
                    f"{result['seconds']:5.1f} s ({(stop - start) / MIB / result['seconds']:.1f} "
                    f"MiB of WAL/s), RSS +{result['rss_growth'] / MIB:6.1f} MiB, Python peak "
                    f"{result['python_peak'] / MIB:6.1f} MiB, Arrow peak "
                    f"{result['arrow_peak'] / MIB:6.1f} MiB"
                )
    finally:
        pg.stop()

    def median(kind: str, key: str) -> float:
        return float(statistics.median(r[key] for r in results[kind])) / MIB

    print(
        f"\n{'median over rounds, MiB':28}{'RSS growth':>12}{'Python peak':>13}{'Arrow peak':>12}"
    )
    for kind in ("streamed", "whole"):
        print(
            f"{kind:28}{median(kind, 'rss_growth'):12.1f}{median(kind, 'python_peak'):13.1f}"
            f"{median(kind, 'arrow_peak'):12.1f}"
        )
    peak = median("streamed", "rss_growth")
    print(
        f"WAL read: {(stop - start) / MIB:.1f} MiB; streamed holds "
        f"{peak / ((stop - start) / MIB):.2f} MiB per MiB of WAL, whole "
        f"{median('whole', 'rss_growth') / ((stop - start) / MIB):.2f}"
    )
    if peak > TARGET_MIB:
        print(f"MISS peak_mib={peak:.1f} is above the target of {TARGET_MIB:g}")
    print(f"RESULT peak_mib={peak:.1f} target=<={TARGET_MIB:g}")


if __name__ == "__main__":
    main()
