"""What planning a batch of ``splitflow-files`` costs on the driver over a directory of many
files, against the directory listing every batch needs anyway.

A directory of ``N`` small JSON files (20,000; ``--quick``: 5,000), read with
``maxFilesPerTrigger`` ``N / 20`` (``--per-trigger``): every file is discovered and held,
and each batch admits the next ones. The real :class:`~splitflow.spark.planner.Planner` is
driven as Spark's streaming runner drives it (no Spark, no pyspark import): a discovery
every batch (``discoveryInterval`` 1 s, a clock that moves one second per batch), then
``latestOffset``, ``partitions``'s task planning and ``commit``. The batches read nothing
from the files: the planner moves each slot to the end of the batch it planned, as it does
in a query.

Side by side, alternating with each batch: the listing alone (``pyarrow.fs``'s
``get_file_info`` of the directory, recursive: what any file source stats each batch, as
Spark's own does). The score is the median batch over the median listing: what the
planning costs in listings. The first batch (every file new) is printed apart.

    python bench/files_planning.py            # 20,000 files, 8 batches
    python bench/files_planning.py --quick    # 5,000 files (well under a minute)

Last line: ``RESULT files_batch_vs_listing_<n>=<x> files_batch_ms_<n>=<ms> target=<=3``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa
import pyarrow.fs as pafs

from splitflow.connectors.files import FilesSource
from splitflow.spark.limits import ReadAll
from splitflow.spark.offset import encode_tasks
from splitflow.spark.planner import Planner, collect_garbage_less_often

TARGET = 3.0
SCHEMA = pa.schema([("file", pa.string()), ("n", pa.int64())])


def make_files(directory: Path, count: int) -> None:
    for i in range(count):
        (directory / f"f{i:07d}.json").write_text('{"file": "f", "n": 1}\n')


def listing(directory: Path) -> float:
    start = time.perf_counter()
    pafs.LocalFileSystem().get_file_info(pafs.FileSelector(str(directory), recursive=True))
    return time.perf_counter() - start


def run(directory: Path, per_trigger: int, batches: int) -> tuple[float, list[float], list[float]]:
    """The first batch's time, then each later batch's and a listing's beside it."""
    source = FilesSource(
        str(directory), "json", SCHEMA, max_files_per_batch=per_trigger, discovery_interval=1.0
    )
    now = [0.0]
    planner: Planner[Any, Any] = Planner(source, 2, clock=lambda: now[0])
    offset = planner.initial_offset()
    first, times, listings = 0.0, [], []
    try:
        for batch in range(batches + 1):
            now[0] += 1.0
            start = time.perf_counter()
            end = planner.latest_offset(offset, ReadAll())
            encode_tasks(planner.planned(end), source.split_codec, None)
            planner.commit(offset)
            elapsed = time.perf_counter() - start
            if end.get("seq") == offset.get("seq"):
                raise SystemExit(f"batch {batch}: nothing planned; too few files")
            offset = end
            if batch == 0:
                first = elapsed
            else:
                times.append(elapsed)
                listings.append(listing(directory))
    finally:
        planner.close()
    return first, times, listings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5,000 files")
    parser.add_argument("--files", type=int, help="files in the directory")
    parser.add_argument("--per-trigger", type=int, help="maxFilesPerTrigger (files / 20)")
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args(argv)
    count = args.files or (5_000 if args.quick else 20_000)
    per_trigger = args.per_trigger or count // 20
    logging.disable(logging.WARNING)
    collect_garbage_less_often()  # as in Spark's streaming runner
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        make_files(directory, count)
        first, times, listings = run(directory, per_trigger, args.batches)
    batch, listed = statistics.median(times), statistics.median(listings)
    label = f"{count // 1000}k"
    print(
        f"files_planning: {count:,} files, maxFilesPerTrigger {per_trigger}, "
        f"{args.batches} batches: first batch {first * 1e3:.0f} ms, then median "
        f"{batch * 1e3:.1f} ms a batch ({', '.join(f'{t * 1e3:.0f}' for t in times)}); "
        f"the listing alone, median {listed * 1e3:.1f} ms"
    )
    ratio = batch / listed
    if ratio > TARGET:
        print(f"MISS files_batch_vs_listing_{label}={ratio:.2f} is above the target {TARGET:g}")
    print(
        f"RESULT files_batch_vs_listing_{label}={ratio:.2f} files_batch_ms_{label}="
        f"{batch * 1e3:.0f} target=<={TARGET:g}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
