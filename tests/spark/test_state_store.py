"""The state store (option ``stateDir``) on real object-store servers: moto's S3 server and
Azurite, started on loopback by the fixtures in ``tests/spark/conftest.py``.

First what the stores themselves do with a conditional create, since the owner token relies
on it: of several concurrent creates of one object exactly one wins, and the others get
``FileExistsError`` (S3 ``If-None-Match: *`` -> 412; Azure ``If-None-Match: *`` -> 409).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def _race(store: Any, name: str, contenders: int) -> list[int]:
    """``contenders`` threads create ``name`` at once, each with its own client; the
    numbers of those that won."""
    won: list[int] = []
    barrier = threading.Barrier(contenders)

    def create(i: int) -> None:
        fs = store.server.filesystem()
        barrier.wait()
        try:
            fs.pipe_file(store.url(name), str(i).encode(), mode="create")
        except FileExistsError:
            return
        won.append(i)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return won


def test_of_concurrent_conditional_creates_exactly_one_wins(object_store: Any) -> None:
    for round_ in range(5):
        won = _race(object_store, f"owner-{round_}.json", 6)
        assert len(won) == 1, f"{object_store.kind}: winners {won}"
        assert object_store.fs.cat_file(object_store.url(f"owner-{round_}.json")) == (
            str(won[0]).encode()
        )


def test_a_conditional_create_of_an_existing_object_leaves_it_as_it_was(
    object_store: Any,
) -> None:
    fs, url = object_store.fs, object_store.url("token.json")
    fs.pipe_file(url, b"first", mode="create")
    with pytest.raises(FileExistsError):
        fs.pipe_file(url, b"second", mode="create")
    assert fs.cat_file(url) == b"first"


# -- the state store on each server ---------------------------------------------------------------


def _store(object_store: Any, name: str = "state") -> Any:
    from splitflow.spark.statedir import StateStore

    return StateStore(object_store.url(name), object_store.options)


def test_objects_are_written_whole_read_back_listed_and_deleted(object_store: Any) -> None:
    store = _store(object_store)
    assert store.get(store.path("events", "1", "000000")) is None
    assert store.names(store.path("events")) == []
    store.put(store.path("events", "1", "000001"), b"b")
    store.put(store.path("events", "1", "000000"), b"a")
    store.put(store.path("events", "1", "000000"), b"a")  # a retried task: harmless
    store.put(store.path("events", "2", "000000"), b"c")
    assert store.names(store.path("events")) == ["1", "2"]
    assert store.names(store.path("events", "1")) == ["000000", "000001"]
    assert store.get(store.path("events", "1", "000000")) == b"a"
    store.delete(store.path("events", "1"), folder=True)
    store.delete(store.path("events", "9"), folder=True)  # missing: fine
    assert store.names(store.path("events")) == ["2"]


def test_many_objects_are_read_at_once_and_a_missing_one_is_none(object_store: Any) -> None:
    """``get_many`` (a batch's reader events): one concurrent read, results in the order
    asked, None for an object deleted since the listing; a store that fails names the
    option and shows no secret."""
    store = _store(object_store, "many")
    paths = [store.path("events", "3", f"{i:06d}") for i in range(5)]
    for i, path in enumerate(paths[:4]):
        store.put(path, f"task {i}".encode())
    found = store.get_many(paths)
    assert list(found) == paths
    assert [found[p] for p in paths] == [b"task 0", b"task 1", b"task 2", b"task 3", None]
    assert store.get_many(paths[:1]) == {paths[0]: b"task 0"}
    assert store.get_many([]) == {}


def test_commits_delete_ledger_files_by_name_and_only_a_restore_lists(object_store: Any) -> None:
    from splitflow.spark.ledger import COMPACT_EVERY, LedgerStore

    store = _store(object_store, "ledger-lists")
    listings: list[str] = []
    original = store.names
    store.names = lambda folder: listings.append(folder) or original(folder)  # type: ignore[method-assign]
    ledger = LedgerStore(store)
    refs = [ledger.write(seq, frozenset(map(str, range(seq)))) for seq in range(1, 15)]
    for seq in range(1, 15):
        ledger.keep_from(seq)  # Spark keeps the last batch's offset only
    assert listings == []
    snapshot = f"snapshot-{COMPACT_EVERY + 2}.json"  # snapshot 1, then COMPACT_EVERY + 2
    assert original(ledger.root) == ["delta-13.json", "delta-14.json", snapshot]
    restored = LedgerStore(store)
    restored.resume_at(13)  # rolled back to batch 13
    assert listings == [ledger.root]
    assert original(ledger.root) == ["delta-13.json", snapshot]
    assert restored.load(refs[-2]) == frozenset(map(str, range(13)))


def test_the_state_store_creates_an_object_once_of_many_concurrent_creates(
    object_store: Any,
) -> None:
    from splitflow.spark.statedir import StateStore

    won: list[int] = []
    barrier = threading.Barrier(6)

    def create(i: int) -> None:
        store = StateStore(object_store.url("race"), object_store.options)
        store._fs = object_store.server.filesystem()  # a client of its own per contender
        barrier.wait()
        if store.create(store.path("owner.json"), str(i).encode()):
            won.append(i)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(won) == 1, won
    assert _store(object_store, "race").get(_store(object_store, "race").path("owner.json")) == (
        str(won[0]).encode()
    )


def test_two_queries_started_at_once_on_one_state_dir_one_takes_it(object_store: Any) -> None:
    from splitflow.errors import ConfigurationError
    from splitflow.spark.statedir import Owner

    first, second = Owner(_store(object_store, "q")), Owner(_store(object_store, "q"))
    first.begin(None)
    second.begin(None)
    first.check()
    first.confirm()
    with pytest.raises(ConfigurationError, match="is in use by another query, or was"):
        second.check()
    first.check()  # still its own


def test_the_event_and_ledger_stores_keep_their_guarantees_on_the_store(
    object_store: Any,
) -> None:
    from tests.spark.test_events import Ping

    from splitflow.spark.events import EventStore
    from splitflow.spark.ledger import COMPACT_EVERY, LedgerStore

    store = _store(object_store)
    events = EventStore(store)
    events.write(3, 1, slot=0, events=[Ping(1)])
    events.write(3, 1, slot=0, events=[Ping(1)])  # a retried attempt
    events.write(3, 0, slot=1, events=[Ping(7), Ping(8)])
    events.write(4, 0, slot=0, events=[Ping(2)])
    assert events.read(3)[1] == [(1, Ping(7)), (1, Ping(8)), (0, Ping(1))]
    events.write(5, 0, slot=0, events=[Ping(3)])
    events.keep_from(4)
    assert events.read(3)[1] == []
    assert events.read(4)[1] == [(0, Ping(2))]
    EventStore(store).resume_at(4)  # rolled back to batch 4: batch 5's events go
    assert store.names(events.root) == ["4"]

    ledger = LedgerStore(store)
    refs = [ledger.write(seq, frozenset(f"s{i}" for i in range(seq + 1))) for seq in range(14)]
    for seq, ref in enumerate(refs):
        assert LedgerStore(_store(object_store)).load(ref) == {f"s{i}" for i in range(seq + 1)}
    ledger.keep_from(13)  # the oldest offset Spark keeps: base COMPACT_EVERY + 1
    assert store.names(store.path("ledger")) == [
        "delta-12.json",
        "delta-13.json",
        f"snapshot-{COMPACT_EVERY + 1}.json",
    ]


def test_planning_a_batch_reads_a_bounded_number_of_objects_however_old_the_query(
    object_store: Any,
) -> None:
    """Requests per planned batch stay the same from batch 5 to batch 60: the owner token,
    one listing of the last batch's events and its task objects, one ledger object, one
    offset state object (the clean-up at commits lists nothing: it deletes one batch's
    events, and at most a snapshot and its deltas at a time of each log, by name)."""
    from tests.spark.test_ledger import finish_splits
    from tests.spark.test_planner import FakeClock, Query

    from splitflow.spark.ledger import COMPACT_EVERY
    from splitflow.spark.offsetstate import COMPACT_EVERY as STATE_EVERY
    from splitflow.spark.planner import Planner
    from splitflow.testing.sequence import SequenceCatalog, SequenceSource

    store = _store(object_store)
    calls: dict[str, int] = {}
    for method in ("get", "get_many", "names", "put", "create", "delete"):
        original = getattr(store, method)

        def counted(*args: Any, _m: str = method, _o: Any = original, **kw: Any) -> Any:
            if not (_m == "put" and "/events/" in str(args[0])):  # the tasks' writes
                calls[_m] = calls.get(_m, 0) + 1
            return _o(*args, **kw)

        setattr(store, method, counted)
    clock = FakeClock()
    catalog = SequenceCatalog({"live": 1})
    query = Query(
        Planner(SequenceSource(catalog, discovery_interval=0.1), 2, clock=clock, state_dir=store)
    )
    query.planner.retain_batches = 10  # commits delete from batch 11 on
    per_batch: list[float] = []
    for round_ in range(60):
        before, deleted = sum(calls.values()) - calls.get("delete", 0), calls.get("delete", 0)
        finish_splits(query, catalog, clock, [f"f{round_}"])
        planned = sum(calls.values()) - calls.get("delete", 0) - before
        per_batch.append(planned / max(1, len(query.batches)))
        # per commit: one batch's events; and a snapshot with its deltas now and then, of
        # the ledger and of the offset state
        most = COMPACT_EVERY + 1 + STATE_EVERY + 1 + len(query.batches)
        assert calls.get("delete", 0) - deleted <= most
        query.batches.clear()
    assert max(per_batch[40:]) <= max(per_batch[1:25]), per_batch
    assert max(per_batch) < 8, per_batch


def test_storage_options_never_show_in_reprs_errors_offsets_or_logs(
    object_store: Any, caplog: Any
) -> None:
    import logging

    from tests.spark.test_ledger import finish_splits
    from tests.spark.test_planner import FakeClock, Query

    from splitflow.errors import CheckpointStateError
    from splitflow.spark.options import RuntimeOptions
    from splitflow.spark.planner import Planner
    from splitflow.spark.statedir import StateStore
    from splitflow.testing.sequence import SequenceCatalog, SequenceSource

    caplog.set_level(logging.DEBUG, logger="splitflow")
    options = {
        "statedir": object_store.url("s"),
        **{k.lower(): v for k, v in object_store.spark_options().items()},
    }
    runtime = RuntimeOptions.parse(options)
    store = runtime.state_store
    assert store is not None
    shown = [repr(runtime), repr(store), str(runtime)]
    clock = FakeClock()
    catalog = SequenceCatalog({"live": 1})
    query = Query(
        Planner(SequenceSource(catalog, discovery_interval=0.1), 2, clock=clock, state_dir=store)
    )
    finish_splits(query, catalog, clock, ["a", "b"])
    shown += [json.dumps(o) for o in query.ends] + [caplog.text]
    if object_store.kind == "azure":  # Azurite checks the key's signature
        from tests.support.objectstores import AZURE_KEY

        wrong = AZURE_KEY[:-8] + "AAAAAAA="
        bad = StateStore(object_store.url("s"), object_store.server.storage_options(wrong))
        with pytest.raises(CheckpointStateError) as caught:
            bad.put(bad.path("x"), b"x")
        shown.append(str(caught.value))
        assert wrong not in str(caught.value)
    missing = StateStore(object_store.server.url("no-such-bucket", "s"), object_store.options)
    with pytest.raises(CheckpointStateError) as refused:
        missing.put(missing.path("x"), b"x")
    shown.append(str(refused.value))
    for secret in object_store.secrets():
        for text in shown:
            assert secret not in text


# -- options and bad input at load() --------------------------------------------------------------


def _load(**options: str) -> Any:
    """``load()`` of the generator source with ``options`` (Spark lower-cases the keys)."""
    from splitflow.spark.generator import GeneratorDataSource

    return GeneratorDataSource({k.lower(): v for k, v in options.items()})


def test_state_dir_storage_options_are_taken_and_need_a_state_dir(object_store: Any) -> None:
    from splitflow.errors import ConfigurationError

    source = _load(stateDir=object_store.url("q1"), **object_store.spark_options())
    store = source.runtime.state_store
    assert store.display == object_store.url("q1")
    assert store.display in repr(source.runtime.state_store)
    with pytest.raises(ConfigurationError, match=r"option stateDir\.\w+ is given without"):
        _load(**object_store.spark_options())


def test_a_bucket_or_container_that_does_not_exist_fails_at_load(object_store: Any) -> None:
    from splitflow.errors import ConfigurationError

    url = object_store.server.url("no-such-bucket", "q1")
    with pytest.raises(ConfigurationError) as caught:
        _load(stateDir=url, **object_store.spark_options())
    kind = "bucket" if object_store.kind == "s3" else "container"
    assert str(caught.value).startswith(
        f"option stateDir: {url}: the {kind} 'no-such-bucket' does not exist, or these "
        "credentials may not see it"
    )
    assert caught.value.option == "stateDir"


def test_an_unreachable_store_fails_at_load_naming_the_option(s3_server: Any) -> None:
    """(Azure's client retries an unreachable endpoint for about 90 s before it says so:
    the same error, too slow for this suite.)"""
    from tests.support.objectstores import StoreUnderTest, free_port

    from splitflow.errors import ConfigurationError

    object_store = StoreUnderTest("s3", s3_server)
    options = object_store.spark_options()
    options["stateDir.endpoint_url"] = f"http://127.0.0.1:{free_port()}"
    options["stateDir.config_kwargs"] = '{"retries": {"max_attempts": 1}, "connect_timeout": 2}'
    with pytest.raises(ConfigurationError, match="option stateDir: cannot reach") as caught:
        _load(stateDir=object_store.url("q1"), **options)
    for secret in object_store.secrets():
        assert secret not in str(caught.value)


def test_wrong_azure_credentials_fail_at_load_without_showing_the_key(azurite: Any) -> None:
    from tests.support.objectstores import AZURE_KEY

    from splitflow.errors import ConfigurationError

    container = azurite.create_container()
    wrong = AZURE_KEY[:-8] + "AAAAAAA="
    with pytest.raises(ConfigurationError, match="option stateDir: cannot reach") as caught:
        _load(
            stateDir=azurite.url(container, "q1"),
            **{"stateDir.connection_string": azurite.connection_string(wrong)},
        )
    assert wrong not in str(caught.value)
    assert AZURE_KEY not in str(caught.value)


def test_a_store_without_conditional_create_falls_back_to_write_and_read_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fsspec's ``memory://`` stands for a store without conditional create (as HDFS):
    write only when absent, wait, read back; the first writer keeps it."""
    from splitflow.spark import statedir

    monkeypatch.setattr(statedir, "SETTLE_SECONDS", 0.01)
    store = statedir.StateStore("memory://splitflow-fallback/q")
    assert store.protocol not in statedir.CONDITIONAL_CREATE
    path = store.path("owner.json")
    assert store.create(path, b"first")
    assert not store.create(path, b"second")
    assert store.get(path) == b"first"


def test_a_read_only_credential_fails_the_first_write_naming_the_object(azurite: Any) -> None:
    """A SAS token that may read and list passes ``load()`` and fails the first batch's
    owner token write: nothing is committed, so nothing committed is lost."""
    from splitflow.errors import CheckpointStateError
    from splitflow.spark.statedir import Owner

    container = azurite.create_container()
    sas = azurite.read_only_sas(container)
    options = {
        "stateDir.connection_string": (
            f"BlobEndpoint={azurite.blob_endpoint};SharedAccessSignature={sas}"
        )
    }
    source = _load(stateDir=azurite.url(container, "q1"), **options)
    owner = Owner(source.runtime.state_store)
    owner.begin(None)
    with pytest.raises(CheckpointStateError) as caught:
        owner.check()
    message = str(caught.value)
    assert message.startswith(
        f"option stateDir: cannot write abfs://{container}/q1/owner.json: "
    ), message
    assert "the batch is not committed" in message
    assert sas not in message
