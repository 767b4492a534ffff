"""A query's state directory (option ``stateDir``): a local folder or an object store, its
objects written whole or not at all, owned by one query (:class:`Owner`).

The reader events (:mod:`splitflow.spark.events`) and the enumerator's ledger
(:mod:`splitflow.spark.ledger`) both live there, through :class:`StateStore`, which asks of
the store only what every object store gives:

* :meth:`StateStore.put`: a whole object, seen whole or not at all. Every name is written
  either once, or again only with the same content (a retried or speculative task), so no
  writer needs an atomic rename or an append. Locally a file is written under a temporary
  name and renamed into place; on an object store a single PUT is already atomic.
* :meth:`StateStore.create`: a conditional create, for the owner token: of two writers of
  one new name, exactly one wins. Locally a hard link of a complete temporary file (fails
  if the name exists); S3 ``PutObject`` with ``If-None-Match: *`` (412 when it exists);
  Azure ``Put Blob`` with ``If-None-Match: *`` (409); GCS ``ifGenerationMatch=0`` (412). A
  store without one (HDFS, and any other fsspec filesystem) gets a documented fallback:
  write only if absent, wait :data:`SETTLE_SECONDS`, read back, and win only if the object
  still holds our token; two writers closer together than that may both think they won,
  and the loser finds out at its next batch, before it commits one (``Owner.check``).
* :meth:`StateStore.get`, :meth:`StateStore.get_many` (a batch's reader events, read
  concurrently), :meth:`StateStore.names` (one listing of one small folder),
  :meth:`StateStore.delete`.

A write that fails (a full or read-only disk, a missing bucket, refused credentials, an
unreachable store) raises :class:`~splitflow.errors.CheckpointStateError` naming the
object: the batch that wrote it is not committed, and a restart once the store is writable
again replays it. The storage options (``stateDir.<key>``) may hold credentials: they are
never part of a repr, an error message, an offset or a log line.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from splitflow.errors import CheckpointStateError, ConfigurationError

CONDITIONAL_CREATE = frozenset({"s3", "s3a", "abfs", "abfss", "az", "gs", "gcs"})
"""fsspec protocols whose filesystem creates an object only if it does not exist, as one
atomic request (``pipe_file(mode="create")``): s3fs (``If-None-Match: *``), adlfs
(``If-None-Match: *``), gcsfs (``ifGenerationMatch=0``)."""

SETTLE_SECONDS = 2.0
"""The fallback owner check of a store without conditional create waits this long between
writing its token and reading it back."""

_BACKENDS = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "abfs": "adlfs",
    "abfss": "adlfs",
    "az": "adlfs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
}


def storage_options(options: Mapping[str, str], prefix: str = "statedir.") -> dict[str, Any]:
    """The storage options among Spark ``options`` (keys lower-cased): ``<prefix><key>``
    -> ``key``; ``true``/``false`` become booleans and a JSON object a dict (``client_kwargs``).

    >>> storage_options({"statedir.anon": "true", "statedir.endpoint_url": "http://h:1"})
    {'anon': True, 'endpoint_url': 'http://h:1'}
    """
    found: dict[str, Any] = {}
    for key, value in sorted(options.items()):
        if not key.lower().startswith(prefix) or len(key) == len(prefix):
            continue
        text = str(value)
        parsed: Any = text
        if text.strip().lower() in ("true", "false"):
            parsed = text.strip().lower() == "true"
        elif text.strip().startswith("{"):
            with contextlib.suppress(ValueError):
                parsed = json.loads(text)
        found[key[len(prefix) :]] = parsed
    return found


def write_atomically(target: str, content: bytes) -> None:
    """Write ``content`` to local ``target`` (its folder made if missing), atomically."""
    temporary = f"{target}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(temporary, "wb") as f:
            f.write(content)
        os.replace(temporary, target)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise _cannot("write", target, error.strerror or str(error)) from error


def _cannot(what: str, where: str, why: str) -> CheckpointStateError:
    if what == "write":
        return CheckpointStateError(
            f"option stateDir: cannot write {where}: {why} (the state "
            "directory must be writable; the batch is not committed, and the query resumes "
            "from its last committed batch once it is)",
            path=where,
        )
    return CheckpointStateError(f"option stateDir: cannot {what} {where}: {why}", path=where)


class StateStore:
    """One query's state directory: ``url`` (a local path, ``file://``, or any fsspec URL:
    ``s3://``, ``abfs://`` / ``az://``, ``gs://``, ``hdfs://``) with its storage
    ``options`` (for fsspec; credentials allowed: they never leave this object except to
    the store's client). Pickles (the filesystem client is made again where it is used).

    Paths are ``/``-joined names under the root (``events/3/000001``); :meth:`where` gives
    the one an error names (the URL, with any user info stripped).
    """

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self._options = dict(options or {})
        parts = urlsplit(url)
        self.protocol = parts.scheme.lower() if len(parts.scheme) > 1 else ""
        self.local = self.protocol in ("", "file", "local")
        if self.local:  # file:///x, file:/x, local:/x: the path; a plain path as it is
            self.root = parts.netloc + parts.path if self.protocol else url
        else:
            netloc = parts.netloc.rpartition("@")[2]  # no user info in what is shown
            self.root = (netloc + parts.path).rstrip("/")
        self.display = self.root if self.local else f"{self.protocol}://{self.root}"
        self._fs: Any = None

    def __repr__(self) -> str:
        keys = ", ".join(sorted(self._options))
        return f"StateStore({self.display!r}{', options: ' + keys if keys else ''})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StateStore) and (self.url, self._options) == (
            other.url,
            other._options,
        )

    def __hash__(self) -> int:
        return hash(self.url)

    # -- names --------------------------------------------------------------------------------

    def path(self, *parts: str) -> str:
        """The store path of ``parts`` (local: an OS path)."""
        if self.local:
            return os.path.join(self.root, *parts)
        return posixpath.join(self.root, *parts)

    def where(self, path: str) -> str:
        """``path`` as an error names it."""
        return path if self.local else f"{self.protocol}://{path}"

    # -- the client ---------------------------------------------------------------------------

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (made on first use in each process)."""
        if self._fs is None:
            try:
                import fsspec  # type: ignore[import-untyped]

                cls = fsspec.get_filesystem_class(self.protocol)
            except (ImportError, ValueError) as error:
                backend = _BACKENDS.get(self.protocol)
                hint = (
                    f"install {backend} (pip install {backend}; the extra "
                    "splitflow[objectstore] brings s3fs and adlfs)"
                    if backend
                    else "no fsspec filesystem is registered for it"
                )
                raise ConfigurationError(
                    f"option stateDir: cannot open {self.display}: {hint} "
                    f"({type(error).__name__}: {self._redact(str(error))})",
                    option="stateDir",
                ) from None
            try:
                self._fs = cls(**self._options)
            except Exception as error:
                raise ConfigurationError(
                    f"option stateDir: cannot open {self.display} with the stateDir.* options "
                    f"({', '.join(sorted(self._options)) or 'none'}): {self._describe(error)}",
                    option="stateDir",
                ) from None
        return self._fs

    def _redact(self, text: str) -> str:
        """``text`` without any storage option's value (nor the account key inside a
        connection string)."""
        for value in self._options.values():
            for secret in _secret_parts(value):
                text = text.replace(secret, "***")
        return text

    def _describe(self, error: BaseException) -> str:
        return self._redact(f"{type(error).__name__}: {error}")

    def check(self) -> None:
        """At ``load()``: the store can be reached and its bucket or container exists.
        Raises ConfigurationError naming option stateDir (a local folder is made when the
        first batch is planned, as before)."""
        if self.local:
            return
        fs = self.fs
        bucket = self.root.split("/", 1)[0]
        try:
            fs.invalidate_cache(bucket)
            fs.ls(bucket, detail=False)  # one listing: the bucket exists and we may read it
        except FileNotFoundError:
            kind = "container" if self.protocol in ("abfs", "abfss", "az") else "bucket"
            raise ConfigurationError(
                f"option stateDir: {self.display}: the {kind} {bucket!r} does not exist, "
                "or these credentials may not see it (create it first; splitflow does not "
                f"create {kind}s)",
                option="stateDir",
            ) from None
        except Exception as error:
            raise ConfigurationError(
                f"option stateDir: cannot reach {self.display}: {self._describe(error)} "
                "(check the endpoint and the credentials: the stateDir.* options, or the "
                "store's own environment variables)",
                option="stateDir",
            ) from None

    # -- objects ------------------------------------------------------------------------------

    def put(self, path: str, content: bytes) -> None:
        """Write ``content`` to ``path`` whole (replacing what is there)."""
        if self.local:
            write_atomically(path, content)
            return
        try:
            self.fs.pipe_file(path, content)
        except Exception as error:
            raise _cannot("write", self.where(path), self._describe(error)) from None

    def create(self, path: str, content: bytes) -> bool:
        """Write ``content`` to ``path`` if nothing is there: True if this call created it,
        False if it existed. Of concurrent creates exactly one wins (see the module doc for
        the stores without a conditional create)."""
        if self.local:
            return self._create_local(path, content)
        if self.protocol not in CONDITIONAL_CREATE:
            return self._create_by_settling(path, content)
        for attempt in range(4):
            try:
                self.fs.pipe_file(path, content, mode="create")
                return True
            except FileExistsError:
                return False
            except Exception as error:
                # S3 answers 409 ConditionalRequestConflict to a create racing another one
                # in flight: retry, the next answer is 412 or success.
                if "ConditionalRequestConflict" in str(error) and attempt < 3:
                    time.sleep(0.1 * (attempt + 1))
                    continue
                raise _cannot("write", self.where(path), self._describe(error)) from None
        return False  # pragma: no cover - the loop returns or raises

    def _create_local(self, path: str, content: bytes) -> bool:
        temporary = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(temporary, "wb") as f:
                f.write(content)
            try:
                os.link(temporary, path)  # atomic, and fails if the name exists
            except FileExistsError:
                return False
            except OSError as error:
                if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                    raise
                try:  # a filesystem without hard links: exclusive create, then fill
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    return False
                with os.fdopen(fd, "wb") as f:
                    f.write(content)
            return True
        except OSError as error:
            raise _cannot("write", path, error.strerror or str(error)) from error
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temporary)

    def _create_by_settling(self, path: str, content: bytes) -> bool:
        """The fallback for a store without conditional create (module doc)."""
        if self.get(path) is not None:
            return False
        self.put(path, content)
        time.sleep(SETTLE_SECONDS)
        return self.get(path) == content

    def get(self, path: str) -> bytes | None:
        """The content of ``path``; None if there is no such object."""
        if self.local:
            try:
                with open(path, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return None
            except OSError as error:
                raise _cannot("read", path, error.strerror or str(error)) from error
        try:
            return bytes(self.fs.cat_file(path))
        except FileNotFoundError:
            return None
        except Exception as error:
            raise _cannot("read", self.where(path), self._describe(error)) from None

    def get_many(self, paths: list[str]) -> dict[str, bytes | None]:
        """The content of each of ``paths`` (None: no such object), read concurrently on an
        object store (one round trip's wait for all, not one per object)."""
        if self.local or len(paths) < 2:
            return {path: self.get(path) for path in paths}
        try:
            found = self.fs.cat(list(paths), on_error="return")
        except Exception as error:
            raise _cannot("read", self.where(paths[0]), self._describe(error)) from None
        result: dict[str, bytes | None] = {}
        for path in paths:
            value = found.get(path, found.get(self.fs._strip_protocol(path)))
            if isinstance(value, FileNotFoundError):
                result[path] = None
            elif isinstance(value, BaseException) or value is None:
                why = self._describe(value) if value is not None else "no answer"
                raise _cannot("read", self.where(path), why)
            else:
                result[path] = bytes(value)
        return result

    def names(self, folder: str) -> list[str]:
        """The names directly in ``folder`` (files and sub-folders), sorted; [] if none.
        One listing, never cached (another process may have written since)."""
        if self.local:
            try:
                return sorted(os.listdir(folder))
            except (FileNotFoundError, NotADirectoryError):
                return []
            except OSError as error:
                raise _cannot("list", folder, error.strerror or str(error)) from error
        fs = self.fs
        try:
            fs.invalidate_cache(folder)
            found = fs.ls(folder, detail=False)
        except FileNotFoundError:
            return []
        except Exception as error:
            raise _cannot("list", self.where(folder), self._describe(error)) from None
        return sorted({posixpath.basename(str(p).rstrip("/")) for p in found} - {""})

    def delete(self, path: str, *, folder: bool = False) -> None:
        """Remove ``path`` (with ``folder``: everything under it); missing is fine. A failure
        is logged by the caller's policy: here it raises CheckpointStateError."""
        try:
            if self.local:
                if folder:
                    import shutil

                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(path)
                return
            self.fs.rm(path, recursive=folder)
        except FileNotFoundError:
            return
        except Exception as error:
            raise _cannot("delete", self.where(path), self._describe(error)) from None


def _secret_parts(value: Any) -> list[str]:
    """The substrings of an option value never to show: the value, and each
    ``...Key=``/``...Signature=``/``sig=`` part of a connection string or SAS token."""
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _secret_parts(v)]
    text = str(value)
    if isinstance(value, bool) or len(text) < 4:
        return []
    parts = [text]
    parts += re.findall(r"(?i)(?:key|secret|signature|sig|token)=([^;&]{4,})", text)
    return parts


def absolute(url: str) -> str:
    """``url`` with a relative local path made absolute against this process's working
    directory. The driver resolves it once: an executor resolving it against its own
    working directory would write reader events where the driver never looks.

    >>> absolute("s3://bucket/state"), absolute("/var/state"), absolute("file:/var/state")
    ('s3://bucket/state', '/var/state', 'file:/var/state')
    >>> absolute("state") == os.path.join(os.getcwd(), "state")
    True
    """
    store = StateStore(url)
    if not store.local or os.path.isabs(store.root):
        return url
    return os.path.abspath(store.root)


def open_store(state_dir: str | StateStore) -> StateStore:
    """``state_dir`` as a :class:`StateStore` (a plain string: no storage options)."""
    return state_dir if isinstance(state_dir, StateStore) else StateStore(state_dir)


class Owner:
    """Which query a state directory belongs to: ``<stateDir>/owner.json`` holds a token the
    query drew when it started afresh, and every offset carries it.

    The planner calls :meth:`begin` with the token of the offset it restores from (none on a
    fresh start) and :meth:`check` before planning each batch: the first check takes
    the directory, the later ones make sure it is still the query's. Taking it fails when the
    owner is another query that committed a batch, or, for a query restored from an offset
    with a token, any other query: two queries given one directory fail, the second at
    once, instead of reading each other's events and deleting each other's files. Taking a
    free directory is a conditional create (:meth:`StateStore.create`): of two queries
    started at once on one empty directory, exactly one gets it.

    Nothing is written before the first batch is planned (Spark asks for the initial
    offset again when it replays batch 0 after a crash), and an owner whose first batch
    Spark never recorded does not hold the directory (its first start died before Spark
    wrote an offset, or it is a query of a splitflow without tokens being restored). The
    planner calls :meth:`confirm` when Spark asks for the partitions of a batch it planned,
    which Spark does once it wrote the batch's offset, and when a batch commits: a second
    query started while the first runs its first batch is refused, not given the directory
    (with the confirmation at the commit only, Spark's commit of the next batch, one trigger
    later, was the first the planner heard of it).
    """

    def __init__(self, state_dir: str | StateStore) -> None:
        self.store = open_store(state_dir)
        self.state_dir = self.store.display
        self.path = self.store.path("owner.json")
        self.token = ""
        self._strict = False  # restored from an offset that carries the token
        self._taken = False
        self._committed = False

    def begin(self, token: str | None) -> str:
        """Start a run with the token of the offset restored from (None: a fresh start, or
        an offset without one): the token this run carries in its offsets."""
        self.token = token or uuid.uuid4().hex
        self._strict = token is not None
        self._taken = self._committed = False
        return self.token

    def expect(self, token: str | None) -> None:
        """Before reading an offset's state from the directory: a directory another query
        holds is refused (its files are not the offset's). Writes nothing."""
        found = self._read()
        if token is not None and found is not None and found.get("token") != token:
            raise self._refuse("belongs to another query than this checkpoint's")

    def check(self) -> None:
        """Before planning a batch: take the directory, or make sure it is still ours."""
        found = self._read()
        mine = found is not None and found.get("token") == self.token
        if self._taken:
            if not mine:
                raise self._refuse("was taken by another query while this one ran")
            return
        if found is None:
            if self.store.create(self.path, self._content()):
                self._taken = True
                return
            found = self._read()  # another query took it just now
            mine = found is not None and found.get("token") == self.token
        if found is not None and not mine:
            if self._strict:
                raise self._refuse("belongs to another query than this checkpoint's")
            if found.get("committed"):
                raise self._refuse("is in use by another query, or was")
        self._committed = bool(mine and found and found.get("committed"))
        self._write()
        self._taken = True

    def confirm(self) -> None:
        """Spark recorded an offset of the query: from now on the directory is its own for
        good."""
        if self._taken and not self._committed:
            self.check()
            self._committed = True
            self._write()

    def _read(self) -> dict[str, Any] | None:
        content = self.store.get(self.path)
        if content is None:
            return None
        try:
            found = json.loads(content)
        except ValueError as error:
            raise CheckpointStateError(
                f"option stateDir: cannot read {self.store.where(self.path)}: {error}",
                path=self.store.where(self.path),
            ) from error
        return found if isinstance(found, dict) else None

    def _refuse(self, why: str) -> ConfigurationError:
        return ConfigurationError(
            f"option stateDir: {self.state_dir} {why}: give each query a state directory of "
            "its own, as it has its own checkpointLocation (a fresh start of a query whose "
            "checkpoint was deleted needs a fresh stateDir too)",
            option="stateDir",
        )

    def _content(self) -> bytes:
        return json.dumps({"token": self.token, "committed": self._committed}).encode()

    def _write(self) -> None:
        self.store.put(self.path, self._content())
