"""Files of a query's state directory (option ``stateDir``): written whole or not at all,
and owned by one query (:class:`Owner`).

The reader events (:mod:`splitflow.spark.events`) and the enumerator's ledger
(:mod:`splitflow.spark.ledger`) both live there. A file is written under a temporary name and
renamed into place, so a reader never sees half of one and a retried writer leaves one
copy. A write that fails (a full or read-only disk, no permission) raises
:class:`~splitflow.errors.CheckpointStateError` naming the file: the batch that wrote it is
not committed, and a restart once the directory is writable again replays it.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from typing import Any

from splitflow.errors import CheckpointStateError, ConfigurationError


def write_atomically(target: str, content: bytes) -> None:
    """Write ``content`` to ``target`` (its folder made if missing), atomically."""
    temporary = f"{target}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(temporary, "wb") as f:
            f.write(content)
        os.replace(temporary, target)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise CheckpointStateError(
            f"option stateDir: cannot write {target}: {error.strerror or error} (the state "
            "directory must be writable; the batch is not committed, and the query resumes "
            "from its last committed batch once it is)",
            path=target,
        ) from error


class Owner:
    """Which query a state directory belongs to: ``<stateDir>/owner.json`` holds a token the
    query drew when it started afresh, and every offset carries it.

    The planner calls :meth:`begin` with the token of the offset it restores from (none on a
    fresh start) and :meth:`check` before planning each batch: the first check takes
    the directory, the later ones make sure it is still the query's. Taking it fails when the
    owner is another query that committed a batch, or, for a query restored from an offset
    with a token, any other query: two queries given one directory fail, the second at
    once, instead of reading each other's events and deleting each other's files.

    Nothing is written before the first batch is planned (Spark asks for the initial
    offset again when it replays batch 0 after a crash), and an owner that never
    committed a batch does not hold the directory (its first start died before Spark
    recorded an offset, or it is a query of a splitflow without tokens being restored).
    """

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, "owner.json")
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

    def check(self) -> None:
        """Before planning a batch: take the directory, or make sure it is still ours."""
        found = self._read()
        mine = found is not None and found.get("token") == self.token
        if self._taken:
            if not mine:
                raise self._refuse("was taken by another query while this one ran")
            return
        if found is not None and not mine:
            if self._strict:
                raise self._refuse("belongs to another query than this checkpoint's")
            if found.get("committed"):
                raise self._refuse("is in use by another query, or was")
        self._committed = bool(mine and found and found.get("committed"))
        self._write()
        self._taken = True

    def confirm(self) -> None:
        """A batch of the query committed: from now on the directory is its own for good."""
        if self._taken and not self._committed:
            self.check()
            self._committed = True
            self._write()

    def _read(self) -> dict[str, Any] | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                found = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            raise CheckpointStateError(
                f"option stateDir: cannot read {self.path}: {error}", path=self.path
            ) from error
        return found if isinstance(found, dict) else None

    def _refuse(self, why: str) -> ConfigurationError:
        return ConfigurationError(
            f"option stateDir: {self.state_dir} {why}: give each query a state directory of "
            "its own, as it has its own checkpointLocation (a fresh start of a query whose "
            "checkpoint was deleted needs a fresh stateDir too)",
            option="stateDir",
        )

    def _write(self) -> None:
        content = {"token": self.token, "committed": self._committed}
        write_atomically(self.path, json.dumps(content).encode())
