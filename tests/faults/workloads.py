"""The sources a fault schedule runs against: their data, their faults, their recount.

A :class:`Workload` starts its data (which keeps arriving until :meth:`Workload.stop`),
gives the driver's arguments (source, schema, options), injects its own kinds of fault,
and recounts the sink against the data: every record exactly once, except those the docs
say are skipped (a split that vanished under ``failOnDataLoss=false``: its records not read
before it vanished), which may be missing, never repeated.

The sink is read as Spark's file sink defines it: the Parquet files its log lists
(:func:`splitflow.job.pipeline.committed_output_files`); part files of a batch that did not
commit do not count. A ``foreachBatch`` sink that reads every batch twice (CDC's fault
``evaluate-twice``) writes each batch to a folder of its own, which a replay of the batch
overwrites (``tests.support.cdc.batch_folders``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from splitflow.job.pipeline import committed_output_files


@dataclass(frozen=True)
class Count:
    """A recount: the records the source holds, those missing from the sink that should
    be there (``lost``), the extra copies in the sink (``duplicated``), and those missing
    that the docs say are skipped (``skipped``)."""

    records: int
    lost: int
    duplicated: int
    skipped: int = 0
    examples: tuple[str, ...] = ()
    """A few of the records lost or duplicated, described (for the report)."""


def recount(sink: Iterable[Any], expected: Iterable[Any], may_skip: Iterable[Any] = ()) -> Count:
    """Compare the sink's record keys with the expected ones; ``may_skip``: keys (of the
    expected) that may be missing. A key the source never held counts as duplicated."""
    seen = Counter(sink)
    wanted = set(expected)
    optional = set(may_skip)
    lost = sorted(key for key in wanted if key not in seen and key not in optional)
    skipped = sum(1 for key in optional if key in wanted and key not in seen)
    extra = sorted((key, n) for key, n in seen.items() if n > 1 or key not in wanted)
    duplicated = sum(n if key not in wanted else n - 1 for key, n in extra)
    examples = [f"lost {key}" for key in lost[:3]] + [f"{n}x {key}" for key, n in extra[:3]]
    return Count(len(wanted), len(lost), duplicated, skipped, tuple(examples))


def sink_keys(out: Path, columns: list[str]) -> list[tuple[Any, ...]]:
    """The values of ``columns`` of every row the sink at ``out`` committed."""
    files = committed_output_files(out)
    if not files:
        return []
    table = pa.concat_tables(pq.read_table(p, columns=columns) for p in files)
    return list(zip(*(table[c].to_pylist() for c in columns), strict=True))


class Workload(ABC):
    """A source, its data and its recount (see the module doc). Not thread-safe."""

    name: str
    kinds: tuple[str, ...] = ()
    """Its own fault kinds (see :meth:`inject`)."""
    final_runs = 1
    """``trigger(availableNow=True)`` runs it takes to read everything once the data stopped
    (a split that appears during such a run waits for the next one)."""
    sinks: tuple[str, ...] = ()
    """Sinks that read every batch twice (``tests.spark.jobs`` ``--sink`` modes) whose
    output :meth:`recount` reads besides Spark's file sink (fault ``evaluate-twice``)."""
    secret: str | None = None
    """A credential among its options, which must appear nowhere the query writes."""
    state_options: dict[str, str] = {}  # noqa: RUF012 - replaced, never mutated
    """The ``stateDir.<key>`` storage options when the state directory is on an object
    store (``--state-store``): set before :meth:`start`."""

    def state_args(self) -> list[str]:
        """The driver's ``stateDir`` arguments: the directory and its storage options."""
        state = getattr(self, "state", None)
        return [
            f"--option=stateDir={state}",
            *(f"--option=stateDir.{k}={v}" for k, v in self.state_options.items()),
        ]

    @abstractmethod
    def start(self, data: Path, state: Path | str) -> None:
        """Create the data under ``data`` and keep it arriving; ``state``: the query's
        ``stateDir`` (on the disk the schedule's faults hit, or an object store's URL)."""

    @abstractmethod
    def job_args(self) -> list[str]:
        """The driver's source arguments (``--source``, ``--schema``, ``--option``)."""

    def inject(self, kind: str, rnd: random.Random) -> str:
        """Apply fault ``kind`` now; says what it did."""
        raise ValueError(f"{self.name} has no fault {kind!r}")

    @abstractmethod
    def stop(self) -> None:
        """Stop the data arriving: from now on the source holds what it will hold."""

    @abstractmethod
    def recount(self, out: Path) -> Count:
        """The sink at ``out`` against the data."""

    def close(self) -> None:  # noqa: B027 (optional)
        """Release what :meth:`start` made (threads, servers)."""


# -- the generator -------------------------------------------------------------------------------


class GeneratorWorkload(Workload):
    """``splitflow-generator``: 4 splits of ``rows`` rows each, arriving at ``rate`` rows per
    second per split (so its rows keep coming for ``rows / rate`` seconds)."""

    name = "generator"

    def __init__(self, rows: int = 1_500, rate: float = 100.0) -> None:
        self.rows, self.rate = rows, rate
        self.started = 0.0

    def start(self, data: Path, state: Path | str) -> None:
        data.mkdir(parents=True, exist_ok=True)
        self.state = state
        self.started = time.time()

    def job_args(self) -> list[str]:
        return [
            "--source=splitflow-generator",
            "--max-records-per-batch=200",
            "--option=splits=4",
            f"--option=rowsPerSplit={self.rows}",
            f"--option=rowsPerSecond={4 * self.rate:g}",
            f"--option=startTime={self.started:.3f}",
            *self.state_args(),
        ]

    def stop(self) -> None:  # the last rows exist once their event time has passed
        time.sleep(max(0.0, self.started + self.rows / self.rate + 0.5 - time.time()))

    def recount(self, out: Path) -> Count:
        expected = ((s, i) for s in range(4) for i in range(self.rows))
        return recount(sink_keys(out, ["split", "id"]), expected)


# -- files -----------------------------------------------------------------------------------------

FILE_SCHEMA = "file string, n bigint, pad string"


class FilesWorkload(Workload):
    """``splitflow-files`` on a landing directory in ``format`` (``parquet``, ``json`` or
    ``csv``): a producer writes a file of ``rows`` rows every ``every`` seconds, up to
    ``limit`` files. Faults: ``file-vanish`` (a file is deleted, read or not: with
    ``failOnDataLoss=false`` its unread rows are skipped), ``files-burst`` (ten files at
    once)."""

    name = "files"
    kinds = ("file-vanish", "files-burst")

    def __init__(self, format: str, rows: int = 25, every: float = 0.25, limit: int = 80) -> None:
        self.format, self.rows, self.every, self.limit = format, rows, every, limit
        self.written: list[str] = []
        self.vanished: set[str] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, data: Path, state: Path | str) -> None:
        self.landing, self.state = data / "landing", state
        self.landing.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._produce, daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        while not self._stopped.wait(self.every):
            if len(self.written) >= self.limit:
                return
            self._write()

    def _write(self) -> str:
        with self._lock:
            name = f"f{len(self.written):05d}.{self.format}"
            self.written.append(name)
        rows = self.rows_of(name)
        table = pa.table(
            {k: [r[k] for r in rows] for k in ("file", "n", "pad")},
            schema=pa.schema([("file", pa.string()), ("n", pa.int64()), ("pad", pa.string())]),
        )
        temporary = self.landing.parent / f".{name}.tmp"
        if self.format == "parquet":
            pq.write_table(table, temporary, row_group_size=10)
        elif self.format == "csv":
            pacsv.write_csv(table, temporary)
        else:
            temporary.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(temporary, self.landing / name)
        return name

    def rows_of(self, name: str) -> list[dict[str, Any]]:
        return [{"file": name, "n": i, "pad": "p" * (i * 7 % 40)} for i in range(self.rows)]

    def job_args(self) -> list[str]:
        return [
            "--source=splitflow-files",
            f"--schema={FILE_SCHEMA}",
            f"--option=path={self.landing}",
            f"--option=format={self.format}",
            f"--option=pattern=*.{self.format}",
            "--option=maxFilesPerBatch=4",
            "--option=discoveryInterval=200ms",
            "--option=failOnDataLoss=false",
            *self.state_args(),
        ]

    def inject(self, kind: str, rnd: random.Random) -> str:
        if kind == "files-burst":
            names = [self._write() for _ in range(10)]
            return f"files-burst: wrote {names[0]} .. {names[-1]}"
        if kind == "file-vanish":
            present = sorted(p.name for p in self.landing.iterdir())
            if not present:
                return "file-vanish: not applied: no file yet"
            name = rnd.choice(present)
            self.vanished.add(name)
            (self.landing / name).unlink()
            return f"file-vanish: deleted {name}"
        return super().inject(kind, rnd)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(30)

    def recount(self, out: Path) -> Count:
        expected = [(name, i) for name in self.written for i in range(self.rows)]
        vanished = [(f, n) for f, n in expected if f in self.vanished]
        return recount(sink_keys(out, ["file", "n"]), expected, vanished)

    def close(self) -> None:
        self.stop()


# -- Kafka ---------------------------------------------------------------------------------------


class KafkaWorkload(Workload):
    """``splitflow-kafka`` on a Tansu broker of its own, subscribed by pattern: a producer
    sends a few records to every partition of every live topic every ``every`` seconds.
    Faults: ``topic-create`` (a new topic of two partitions, which discovery finds),
    ``topic-delete`` (a topic goes, read or not: with ``failOnDataLoss=false`` its unread
    records are skipped), ``broker-pause`` (the broker stopped, SIGSTOP, for 2 to 4 s, then
    continued: Tansu keeps its data in memory only, so a restart would lose it all)."""

    name = "kafka"
    kinds = ("topic-create", "topic-delete", "broker-pause")
    secret = "kafka-s3cret-pw"  # kafka.sasl.password: a PLAINTEXT client ignores it

    def __init__(self, every: float = 0.2, records: int = 2, limit: int = 3_000) -> None:
        self.every, self.records, self.limit = every, records, limit
        self.live: dict[str, int] = {}  # topic -> partitions
        self.deleted: set[str] = set()
        self.produced: list[tuple[str, int, str]] = []  # (topic, partition, value)
        self._sequence: Counter[tuple[str, int]] = Counter()
        self._topics = 0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._broker: Any = None
        self._pause: threading.Timer | None = None  # continues a paused broker

    def start(self, data: Path, state: Path | str) -> None:
        from tests.support.tansu import Tansu

        data.mkdir(parents=True, exist_ok=True)
        self.state = state
        self._broker = Tansu.start(data / "tansu.log")
        for _ in range(2):
            self._create()
        self._thread = threading.Thread(target=self._produce, daemon=True)
        self._thread.start()

    def _create(self) -> str:
        topic = f"fx-{self._topics}"
        self._topics += 1
        self._broker.create_topic(topic, 2)
        with self._lock:
            self.live[topic] = 2
        return topic

    def _produce(self) -> None:
        while not self._stopped.wait(self.every) and len(self.produced) < self.limit:
            with self._lock:
                for topic, partitions in list(self.live.items()):
                    records = []
                    for partition in range(partitions):
                        for _ in range(self.records):
                            n = self._sequence[(topic, partition)]
                            self._sequence[(topic, partition)] += 1
                            value = f"{topic}/{partition}/{n}"
                            records.append((None, value.encode(), partition))
                            self.produced.append((topic, partition, value))
                    self._broker.produce(topic, records)

    def job_args(self) -> list[str]:
        return [
            "--source=splitflow-kafka",
            "--max-records-per-batch=60",
            f"--option=kafka.bootstrap.servers={self._broker.bootstrap}",
            "--option=subscribePattern=fx-.*",
            "--option=startingOffsets=earliest",
            "--option=discoveryInterval=500ms",
            "--option=failOnDataLoss=false",
            *self.state_args(),
            f"--option=kafka.sasl.password={self.secret}",
        ]

    def inject(self, kind: str, rnd: random.Random) -> str:
        if kind == "topic-create":
            return f"topic-create: {self._create()}"
        if kind == "topic-delete":
            with self._lock:
                if len(self.live) < 2:
                    return "topic-delete: not applied: one topic left"
                topic = rnd.choice(sorted(self.live))
                del self.live[topic]
                self.deleted.add(topic)
                self._broker.delete_topic(topic)
            return f"topic-delete: {topic}"
        if kind == "broker-pause":
            seconds = round(rnd.uniform(2, 4), 1)
            os.kill(self._broker.process.pid, signal.SIGSTOP)
            self._pause = threading.Timer(seconds, self._continue)
            self._pause.daemon = True
            self._pause.start()
            return f"broker-pause: {seconds}s"
        return super().inject(kind, rnd)

    def _continue(self) -> None:
        broker = self._broker
        if broker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(broker.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        self._stopped.set()
        if self._pause is not None:
            self._pause.cancel()
        self._continue()
        if self._thread is not None:
            self._thread.join(60)

    def recount(self, out: Path) -> Count:
        sink = [(t, p, v.decode()) for t, p, v in sink_keys(out, ["topic", "partition", "value"])]
        skipped = [r for r in self.produced if r[0] in self.deleted]
        return recount(sink, self.produced, skipped)

    def close(self) -> None:
        self.stop()
        if self._broker is not None:
            self._broker.stop()
            self._broker = None


# -- change data capture: PostgreSQL and MariaDB ---------------------------------------------------


class CdcDatabase(ABC):
    """One database under :class:`CdcWorkload`: its throw-away server, its SQL dialect (the
    table, the writer of changes, the table's final rows), its CDC source's options and
    its own faults. Everything else of the workload is the same for every database.

    Called by: the harness's thread; the writer it makes runs on a thread of its own.
    """

    name: str
    """The workload's name (``bench/faults.py --connectors``; it also seeds the schedules)."""
    source: str
    """The CDC source (``--source``)."""
    kinds: tuple[str, ...] = ("db-restart",)
    """Its faults: ``db-restart`` (the server stopped and started again, see
    :meth:`restart`) and those :meth:`inject` applies."""
    secret = "s3cret-pw"  # both test servers' password (splitflow.testing.postgres, .mariadb)
    server: Any = None
    """The running server (``splitflow.testing.postgres.Postgres``, ``.mariadb.MariaDB``)."""

    @abstractmethod
    def start(self, data: Path, table: str, rows: int) -> None:
        """Start a server under ``data``; create ``table`` ``(id, version, payload)``
        with ids 1 to ``rows`` at version 0, whose deletes carry the old row in the log
        (so the replay sees an update lost before a delete)."""

    @abstractmethod
    def writer(self, table: str, first_id: int) -> Any:
        """A thread that inserts (ids from ``first_id``), updates and deletes rows of
        ``table`` until its ``stop()``, counting the changes it committed (``changes``),
        and outlives a restart: :class:`tests.support.cdc.Writer` in this dialect."""

    @abstractmethod
    def options(self, table: str) -> list[str]:
        """The source's options that reach the server and read ``table`` (``KEY=VALUE``),
        :attr:`secret` among them."""

    @abstractmethod
    def rows(self, table: str) -> dict[int, tuple[int, str]]:
        """``table``'s rows now: id -> (version, payload)."""

    def restart(self) -> None:
        """Stop the server and start it again on the same port (fault ``db-restart``)."""
        self.server.restart()

    def inject(self, kind: str, rnd: random.Random) -> str:
        """Apply this database's own fault ``kind`` (not ``db-restart``); says what it did."""
        raise ValueError(f"{self.name} has no fault {kind!r}")

    def stop(self) -> None:
        """Throw the server away (it may not have started)."""
        if self.server is not None:
            self.server.stop()
            self.server = None


class PostgresCdc(CdcDatabase):
    """``splitflow-postgres-cdc`` on ``splitflow.testing.postgres``; ``db-restart`` stops it
    fast (``pg_ctl -m fast``)."""

    name = "cdc"  # the first CDC workload's name, kept: it seeds the recorded schedules
    source = "splitflow-postgres-cdc"

    def start(self, data: Path, table: str, rows: int) -> None:
        from splitflow.testing.postgres import Postgres

        self.server = Postgres.start(data)
        self.server.execute(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, version int NOT NULL, payload text)"
        )
        self.server.execute(
            f"INSERT INTO {table} SELECT g, 0, md5(g::text) FROM generate_series(1, {rows}) g"
        )
        self.server.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")

    def writer(self, table: str, first_id: int) -> Any:
        from tests.support.cdc import Writer

        return Writer(self.server, table, first_id)

    def options(self, table: str) -> list[str]:
        return [
            f"conninfo={self.server.conninfo()}",
            f"tables={table}",
            "slotName=s_faults",
        ]

    def rows(self, table: str) -> dict[int, tuple[int, str]]:
        from tests.support.cdc import table_rows

        return table_rows(self.server, table)


class MariaDbCdc(CdcDatabase):
    """``splitflow-mysql-cdc`` on ``tests.support.mariadb`` (row binlog, full row images).
    Faults besides ``db-restart`` (a clean shutdown, SIGTERM): ``db-crash`` (the server
    SIGKILLed and started again: InnoDB's and the binlog's crash recovery; a new binlog
    file either way) and ``connections-kill`` (for 2 to 4 s, every 50 ms, ``KILL
    CONNECTION`` of every connection the source has open: binlog dump threads, chunk reads,
    the driver's queries). Purging binlog files is not a fault: it loses the changes in
    them by definition (the source fails with a ``DataLossError``, see
    ``tests/connectors/mysql``). The harness's own statements run as ``root`` through the
    socket, which no fault kills."""

    name = "mysql"
    source = "splitflow-mysql-cdc"
    kinds = ("db-restart", "db-crash", "connections-kill")

    def start(self, data: Path, table: str, rows: int) -> None:
        from tests.support.mariadb import MariaDB

        self.server = MariaDB.start(data)  # binlog_row_image=FULL: deletes carry the old row
        self.server.execute(
            f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, version INT NOT NULL, payload TEXT)",
            admin=True,
        )
        self.server.execute(
            f"INSERT INTO {table} SELECT seq, 0, MD5(seq) FROM seq_1_to_{rows}", admin=True
        )

    def writer(self, table: str, first_id: int) -> Any:
        from tests.support.cdc import MariaWriter

        return MariaWriter(self.server, table, first_id)

    def options(self, table: str) -> list[str]:
        from tests.support.mariadb import DATABASE, USER

        return [
            f"hostname={self.server.host}",
            f"port={self.server.port}",
            f"username={USER}",
            f"password={self.secret}",
            f"databaseName={DATABASE}",
            f"tableName={table}",
            "serverId=7100-7199",
        ]

    def rows(self, table: str) -> dict[int, tuple[int, str]]:
        found = self.server.execute(f"SELECT id, version, payload FROM {table}", admin=True)
        return {int(k): (int(v), str(p)) for k, v, p in found}

    def inject(self, kind: str, rnd: random.Random) -> str:
        if kind == "db-crash":
            began = time.monotonic()
            self.server.restart(crash=True)
            return f"db-crash: SIGKILLed, back after {time.monotonic() - began:.1f}s"
        if kind == "connections-kill":
            seconds = round(rnd.uniform(2, 4), 1)
            killed = self._kill_connections(seconds)
            if not killed:
                return f"connections-kill: not applied: the source opened none in {seconds}s"
            commands = ", ".join(f"{n} {command}" for command, n in killed.most_common())
            return f"connections-kill: {killed.total()} in {seconds}s ({commands})"
        return super().inject(kind, rnd)

    def _kill_connections(self, seconds: float) -> Counter[str]:
        """``KILL CONNECTION``, every 50 ms for ``seconds``, every connection of the CDC
        user but the writer's (the only one whose default database is ``splitflow``: the
        source names tables in full); the connections killed, by command."""
        import pymysql
        from tests.support.mariadb import DATABASE, USER

        killed: Counter[str] = Counter()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = self.server.execute(
                "SELECT id, command FROM information_schema.processlist "
                "WHERE user = %s AND COALESCE(db, '') <> %s",
                (USER, DATABASE),
                admin=True,
            )
            for connection, command in found:
                with contextlib.suppress(pymysql.err.OperationalError):  # 1094: gone meanwhile
                    self.server.execute(f"KILL CONNECTION {int(connection)}", admin=True)
                    killed[str(command)] += 1
            time.sleep(0.05)
        return killed


class CdcWorkload(Workload):
    """A CDC source on a database of its own (``database``: :class:`PostgresCdc`,
    :class:`MariaDbCdc`): a table of 400 rows read by a chunked snapshot, then its log,
    while a writer inserts, updates and deletes. Faults: ``db-restart`` (the server stopped
    and started again) and the database's own. The recount replays the sink key by key
    against the table (:func:`tests.support.cdc.replay`): a gap in a key's versions or a
    final row that differs is lost, a change seen twice is duplicated. The sink may be a
    ``foreachBatch`` that writes and counts every batch (in either order): each read of a
    batch must see the rows that the chunk's watermark says it saw."""

    sinks = ("write-count", "count-write")
    final_runs = 2  # a run that starts during the snapshot reads the log in the next one
    table = "fx_orders"

    def __init__(self, database: CdcDatabase, rows: int = 400) -> None:
        self.database, self.rows = database, rows
        self.name, self.kinds, self.secret = database.name, database.kinds, database.secret
        self._writer: Any = None

    def start(self, data: Path, state: Path | str) -> None:
        data.mkdir(parents=True, exist_ok=True)
        self.state = state
        self.database.start(data, self.table, self.rows)
        self._writer = self.database.writer(self.table, self.rows + 1)
        self._writer.start()

    def job_args(self) -> list[str]:
        return [
            f"--source={self.database.source}",
            *(f"--option={option}" for option in self.database.options(self.table)),
            "--option=chunkSize=50",
            "--option=maxChunksPerBatch=2",
            "--option=discoveryInterval=1s",
            *self.state_args(),
        ]

    def inject(self, kind: str, rnd: random.Random) -> str:
        if kind == "db-restart":
            began = time.monotonic()
            self.database.restart()
            return f"db-restart: back after {time.monotonic() - began:.1f}s"
        return self.database.inject(kind, rnd)

    def stop(self) -> None:
        if self._writer is not None:
            self._writer.stop()

    def recount(self, out: Path) -> Count:
        from tests.support.cdc import replay, sink_in_batch_order

        rows, table = sink_in_batch_order(out), self.database.rows(self.table)
        found = replay(rows, table)
        examples = (*found.lost[:3], *found.duplicated[:3])
        changes = self.rows + self._writer.changes
        return Count(changes, len(found.lost), len(found.duplicated), 0, examples)

    def close(self) -> None:
        self.stop()
        self.database.stop()


def workload(name: str, seed: int) -> Workload:
    """The workload ``name`` for schedule ``seed`` (the files' format follows the seed)."""
    if name == "generator":
        return GeneratorWorkload()
    if name == "files":
        return FilesWorkload(("parquet", "json", "csv")[seed % 3])
    if name == "kafka":
        return KafkaWorkload()
    if name == "cdc":
        return CdcWorkload(PostgresCdc())
    if name == "mysql":
        return CdcWorkload(MariaDbCdc())
    raise ValueError(f"no workload {name!r}")


WORKLOADS = ("generator", "files", "kafka", "cdc", "mysql")
