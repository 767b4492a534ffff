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
    query's planner drew when it started afresh, and every offset carries it.

    A query that starts afresh finds the directory free (no owner, or an owner that never
    committed a batch: its first start died before Spark recorded any offset) or refuses it;
    a query restored from an offset finds its own token or refuses; and every planning call
    checks the token is still its own, so two queries given one directory fail, the second
    at once, instead of reading each other's events and deleting each other's files.
    """

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, "owner.json")
        self._committed = False

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

    def claim(self, token: str, *, restored: bool) -> None:
        """Take the directory for the query whose offsets carry ``token``."""
        found = self._read()
        if found is not None and found.get("token") != token:
            if restored:
                raise self._refuse("belongs to another query than this checkpoint's")
            if found.get("committed"):
                raise self._refuse("is in use by another query, or was")
        self._committed = bool(found and found.get("token") == token and found.get("committed"))
        self._write(token)

    def check(self, token: str) -> None:
        """Refuse to go on once another query took the directory."""
        found = self._read()
        if found is None or found.get("token") != token:
            raise self._refuse("was taken by another query while this one ran")

    def confirm(self, token: str) -> None:
        """A batch of the query committed: from now on the directory is its for good."""
        if not self._committed:
            self._committed = True
            self._write(token)

    def _write(self, token: str) -> None:
        content = {"token": token, "committed": self._committed}
        write_atomically(self.path, json.dumps(content).encode())
