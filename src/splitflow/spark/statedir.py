"""Files of a query's state directory (option ``stateDir``): written whole or not at all.

The reader events (:mod:`splitflow.spark.events`) and the enumerator's ledger
(:mod:`splitflow.spark.ledger`) both live there. A file is written under a temporary name and
renamed into place, so a reader never sees half of one and a retried writer leaves one
copy. A write that fails (a full or read-only disk, no permission) raises
:class:`~splitflow.errors.CheckpointStateError` naming the file: the batch that wrote it is
not committed, and a restart once the directory is writable again replays it.
"""

from __future__ import annotations

import contextlib
import os

from splitflow.errors import CheckpointStateError


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
