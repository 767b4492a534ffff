"""A deterministic in-process source for tests, demos and benchmarks.

Its data lives in a :class:`SequenceCatalog`: named splits, each a growing sequence of
records ``(name, 0), (name, 1), ...``. Tests add splits, append records and remove splits
while a query runs, and know exactly which records must come out, once each.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from splitflow.api.assigner import AssignerState, AssignerStateCodec, AssigningSplitEnumerator
from splitflow.api.assignment import AssignmentStrategy
from splitflow.api.enumerator import SplitEnumerator, SplitEnumeratorContext, SplitExtent
from splitflow.api.reader import SourceReader, SourceReaderContext
from splitflow.api.source import Boundedness, Source, SupportsSplitReassignmentOnRecovery
from splitflow.api.split import Codec, DataclassCodec
from splitflow.errors import ConfigurationError
from splitflow.testing.sequence_reader import create_sequence_reader
from splitflow.testing.sequence_splits import SequenceRecord as SequenceRecord
from splitflow.testing.sequence_splits import SequenceSplit as SequenceSplit


class SequenceCatalog:
    """The data behind a :class:`SequenceSource`: split name -> number of records so far.

    Thread-safe. In memory by default: catalogs are registered by ``key`` in this process,
    so a source that refers to one stays small and picklable. With ``path``, the catalog
    lives in that JSON file instead, written atomically on every change and read on every
    look-up, so that other processes (a Spark runner, executors) see the same splits; one
    process at a time changes it (changes of two would overwrite each other).

    Every change (a split added, appended to, sealed or removed) gets the next version, so
    that :meth:`changes` tells what changed since a version (what a
    :meth:`~splitflow.api.enumerator.SplitEnumerator.changed_positions` needs), and
    :meth:`versions` tells the version of the last split added or removed. A catalog
    made with ``splits`` over an existing file goes on from the file's version, every
    split of both changed.
    """

    _registry: ClassVar[weakref.WeakValueDictionary[str, SequenceCatalog]] = (
        weakref.WeakValueDictionary()
    )
    _counter: ClassVar[int] = 0
    _class_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, splits: Mapping[str, int] | None = None, *, path: str | None = None) -> None:
        self._lock = threading.Lock()
        self._lengths: dict[str, int] = dict(splits or {})
        self._sealed: set[str] = set()
        self._version = 0
        self._versions: dict[str, int] = {}  # name -> version of its last change, in order
        self._members = 0  # the version of the last split added or removed
        self.path = path
        if path is not None:
            self.key = f"file:{os.path.abspath(path)}"
            if splits is not None and os.path.exists(path):
                self._load()  # what it replaces: every split of both changes
                names = [*self._versions, *self._lengths, *splits]
                self._lengths, self._sealed = dict(splits), set()
                self._version += 1
                self._versions = dict.fromkeys(names, self._version)
                self._members = self._version
            if splits is not None or not os.path.exists(path):
                self._save()
            return
        with SequenceCatalog._class_lock:
            SequenceCatalog._counter += 1
            self.key = f"catalog-{SequenceCatalog._counter}"
        SequenceCatalog._registry[self.key] = self

    @classmethod
    def named(cls, key: str) -> SequenceCatalog:
        if key.startswith("file:"):
            return cls(path=key.removeprefix("file:"))
        return cls._registry[key]

    def _load(self) -> None:
        if self.path is not None:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            self._lengths = {str(k): int(v) for k, v in data["lengths"].items()}
            self._sealed = set(data["sealed"])
            self._version = int(data.get("version", 0))
            self._versions = {str(k): int(v) for k, v in data.get("versions", {}).items()}
            self._members = int(data.get("members", self._version))

    def _save(self) -> None:
        if self.path is not None:
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(
                    {
                        "lengths": self._lengths,
                        "sealed": sorted(self._sealed),
                        "version": self._version,
                        "versions": self._versions,
                        "members": self._members,
                    },
                    f,
                )
            os.replace(tmp, self.path)

    def add(self, name: str, length: int = 0) -> None:
        with self._lock:
            self._load()
            if name in self._lengths:
                raise ValueError(f"split {name} already exists")
            self._lengths[name] = length
            self._changed(name, member=True)

    def append(self, name: str, count: int) -> None:
        with self._lock:
            self._load()
            self._lengths[name] += count
            self._changed(name)

    def remove(self, name: str) -> None:
        with self._lock:
            self._load()
            del self._lengths[name]
            self._sealed.discard(name)
            self._changed(name, member=True)

    def seal(self, name: str) -> None:
        """No record will be appended to ``name`` any more: it ends at its length."""
        with self._lock:
            self._load()
            if name not in self._lengths:
                raise KeyError(name)
            self._sealed.add(name)
            self._changed(name)

    def _changed(self, name: str, member: bool = False) -> None:
        """Split ``name`` changed (``member``: was added or removed): it moves to the end of
        the versions, with the next one."""
        self._version += 1
        self._versions.pop(name, None)
        self._versions[name] = self._version
        if member:
            self._members = self._version
        self._save()

    def is_sealed(self, name: str) -> bool:
        with self._lock:
            self._load()
            return name in self._sealed

    def extent(self, name: str) -> tuple[int, bool] | None:
        """``(length, sealed)`` of split ``name``, read atomically; None if it vanished."""
        with self._lock:
            self._load()
            if name not in self._lengths:
                return None
            return self._lengths[name], name in self._sealed

    def length(self, name: str) -> int | None:
        extent = self.extent(name)
        return None if extent is None else extent[0]

    def lengths(self) -> dict[str, int]:
        with self._lock:
            self._load()
            return dict(self._lengths)

    def extents(self) -> tuple[dict[str, int], frozenset[str]]:
        """Every split's length, and the sealed ones, read atomically in one look-up."""
        with self._lock:
            self._load()
            return dict(self._lengths), frozenset(self._sealed)

    def versions(self) -> tuple[int, int]:
        """The version now, and the version of the last split added or removed."""
        with self._lock:
            self._load()
            return self._version, self._members

    def changes(self, since: int | None) -> tuple[int, dict[str, tuple[int, bool] | None] | None]:
        """The version now, and ``(length, sealed)`` of each split that changed after
        version ``since`` (None: removed), read atomically; ``since`` None: none. None
        instead of the changes: ``since`` is newer than the catalog (the file was written
        by an older catalog since), which cannot tell what changed."""
        with self._lock:
            self._load()
            if since is not None and since > self._version:
                return self._version, None
            changed: dict[str, tuple[int, bool] | None] = {}
            if since is not None:
                for name, version in reversed(self._versions.items()):
                    if version <= since:
                        break
                    length = self._lengths.get(name)
                    changed[name] = None if length is None else (length, name in self._sealed)
            return self._version, changed

    def records(self) -> list[SequenceRecord]:
        """Every record that exists now, in a canonical order."""
        return [(name, i) for name, n in sorted(self.lengths().items()) for i in range(n)]


class SequenceEnumerator(AssigningSplitEnumerator[SequenceSplit]):
    def __init__(
        self,
        source: SequenceSource,
        context: SplitEnumeratorContext[SequenceSplit],
        state: AssignerState[SequenceSplit] | None,
    ) -> None:
        super().__init__(
            context,
            strategy=source.make_strategy(),
            discovery_interval=source.discovery_interval,
            state=state,
        )
        self._source = source
        # The answers last given, reused while nothing changed: the runtime asks every batch.
        self._found: dict[str, SequenceSplit] = {}
        self._extents: dict[tuple[int, bool], SplitExtent] = {}
        self._last_listing: tuple[int, tuple[SequenceSplit, ...]] | None = None  # version, splits

    def discover_splits(self) -> Sequence[SequenceSplit]:
        """Every split of the catalog: the tuple returned last time while no split was
        added or removed since (bounded: nor changed at all), else listed anew (the assigner
        then skips its comparison when the tuple is the same)."""
        bounded = self._source.boundedness is Boundedness.BOUNDED
        found = self._found
        last = self._last_listing
        version, members = self._source.catalog.versions()
        if last is not None and (version if bounded else members) <= last[0] <= version:
            self._last_listing = version, last[1]
            return last[1]
        splits = []
        for name, n in self._source.catalog.lengths().items():
            split = found.get(name)
            if split is None or (bounded and split.end != n):
                split = found[name] = SequenceSplit(name, end=n if bounded else None)
            splits.append(split)
        if len(found) > len(splits):  # some vanished
            self._found = {s.name: s for s in splits}
        self._last_listing = version, tuple(splits)
        return self._last_listing[1]

    def latest_positions(self, splits: Sequence[SequenceSplit]) -> Mapping[str, SplitExtent]:
        lengths, sealed = self._source.catalog.extents()
        shared = self._extents
        result = {}
        for split in splits:
            if split.end is not None:
                key = (split.end, True)
            elif split.name in lengths:
                key = (lengths[split.name], split.name in sealed)
            else:
                continue  # vanished: nothing can be planned for it
            result[split.split_id] = shared.get(key) or self._extent(*key)
        return result

    def changed_positions(
        self, since: object | None
    ) -> tuple[object, Mapping[str, SplitExtent | None]] | None:
        """The catalog's changes since version ``since`` (None: the catalog cannot tell). A
        bounded source's extents are fixed when its splits are discovered: no change is
        reported. A subclass that answers :meth:`latest_positions` otherwise overrides
        this too (or returns None: changes not tracked)."""
        tracked = since if isinstance(since, int) and not self._source.bounded else None
        version, changed = self._source.catalog.changes(tracked)
        if changed is None:
            return None
        shared = self._extents
        return version, {
            name: None if extent is None else shared.get(extent) or self._extent(*extent)
            for name, extent in changed.items()
        }

    def _extent(self, latest: int, final: bool) -> SplitExtent:
        """One object per distinct extent (the planner compares extents by identity)."""
        if len(self._extents) > 100_000:
            self._extents = {}
        extent = self._extents.get((latest, final))
        if extent is None:
            extent = self._extents[latest, final] = SplitExtent(
                latest, final, self._source.record_bytes
            )
        return extent


class SequenceSource(
    Source[SequenceRecord, SequenceSplit, AssignerState[SequenceSplit]],
    SupportsSplitReassignmentOnRecovery,
):
    """Reads a :class:`SequenceCatalog`; reassigns splits on recovery (FLIP-537).

    ``bounded``: splits end at their length when discovered and input ends after them.
    ``discovery_interval``: seconds between discoveries (``None``: once).
    ``strategy``: name of the assignment strategy: ``balanced``, ``round_robin``, ``hash``.
    ``fail_on_data_loss``: a split that vanishes while a reader holds a planned slice of it
    fails the reader with :class:`~splitflow.errors.DataLossError` (default), or, when
    false, ends that split with a warning (its remaining planned records are gone).
    ``record_bytes``: a size estimate of one record, so that byte budgets can be planned.
    """

    def __init__(
        self,
        catalog: SequenceCatalog,
        *,
        bounded: bool = False,
        discovery_interval: float | None = None,
        strategy: str = "balanced",
        fetch_size: int = 100,
        fail_on_data_loss: bool = True,
        record_bytes: float | None = None,
    ) -> None:
        if fetch_size < 1:
            raise ConfigurationError(
                f"fetch_size must be at least 1, got {fetch_size}", option="fetch_size"
            )
        self.catalog_key = catalog.key
        self.bounded = bounded
        self.discovery_interval = discovery_interval
        self.strategy = strategy
        self.fetch_size = fetch_size
        self.fail_on_data_loss = fail_on_data_loss
        self.record_bytes = record_bytes
        self._catalog = catalog  # kept alive while the source lives

    @property
    def estimates_size(self) -> bool:
        return self.record_bytes is not None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_catalog"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._catalog = SequenceCatalog.named(self.catalog_key)

    @property
    def catalog(self) -> SequenceCatalog:
        return self._catalog

    @property
    def boundedness(self) -> Boundedness:
        return Boundedness.BOUNDED if self.bounded else Boundedness.CONTINUOUS_UNBOUNDED

    def make_strategy(self) -> AssignmentStrategy[SequenceSplit]:
        from splitflow.api.assignment import (
            BalancedAssignment,
            HashAssignment,
            RoundRobinAssignment,
        )

        strategies: dict[str, type[AssignmentStrategy[SequenceSplit]]] = {
            "balanced": BalancedAssignment,
            "round_robin": RoundRobinAssignment,
            "hash": HashAssignment,
        }
        return strategies[self.strategy]()

    def create_enumerator(
        self, context: SplitEnumeratorContext[SequenceSplit]
    ) -> SplitEnumerator[SequenceSplit, AssignerState[SequenceSplit]]:
        return SequenceEnumerator(self, context, None)

    def restore_enumerator(
        self, context: SplitEnumeratorContext[SequenceSplit], state: AssignerState[SequenceSplit]
    ) -> SplitEnumerator[SequenceSplit, AssignerState[SequenceSplit]]:
        return SequenceEnumerator(self, context, state)

    def create_reader(
        self, context: SourceReaderContext
    ) -> SourceReader[SequenceRecord, SequenceSplit]:
        return create_sequence_reader(self, context)

    @property
    def split_codec(self) -> Codec[SequenceSplit]:
        return DataclassCodec(SequenceSplit)

    @property
    def enumerator_state_codec(self) -> Codec[AssignerState[SequenceSplit]]:
        return AssignerStateCodec(self.split_codec)
