"""Keep a streaming query running across the errors a restart resolves: a CDC schema
change recorded in ``stateDir`` (:class:`~splitflow.errors.SchemaChangedError`).

::

    def build():
        return (spark.readStream.format("splitflow-postgres-cdc").options(**opts).load()
                .writeStream.foreachBatch(mirror)
                .option("checkpointLocation", "/chk/orders").start())

    run_restarting(build)

``build_query`` must call ``load()`` again each time: the restarted query's schema is
read then (from the record in ``stateDir``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from splitflow.errors import SchemaChangedError

log = logging.getLogger("splitflow.spark")


def run_restarting(
    build_query: Callable[[], Any],
    on: type[BaseException] | tuple[type[BaseException], ...] = SchemaChangedError,
    *,
    max_restarts: int | None = None,
    wait: Callable[[Any], None] | None = None,
    on_restart: Callable[[BaseException], None] | None = None,
) -> Any:
    """Start the query ``build_query()`` returns (a ``StreamingQuery``, started), wait for
    it to end, and when it failed with one of ``on`` start a new one; return the query
    that ended without error (stopped, or an ``availableNow`` run done).

    A :class:`SchemaChangedError` restarts only when its change was recorded (the
    ``schemaChanges=stop`` kind); one that no restart can follow is raised. Any other
    error, or more than ``max_restarts`` restarts, raises the query's
    ``StreamingQueryException``. ``wait``: waits for the query to end (default
    ``query.awaitTermination()``), e.g. a loop that also watches its progress and may
    ``stop()`` it. ``on_restart``: called with the error before each restart. Spark
    passes a Python error to the driver as text: it is matched by the class's name.
    """
    classes = on if isinstance(on, tuple) else (on,)
    restarts = 0
    while True:
        query = build_query()
        try:
            (wait or _await)(query)
        except KeyboardInterrupt:
            query.stop()
            raise
        except Exception:  # the query's own exception decides below
            pass
        error = query.exception()
        if error is None:
            return query
        if not _restartable(str(error), classes) or (
            max_restarts is not None and restarts >= max_restarts
        ):
            raise error
        restarts += 1
        if on_restart is not None:
            on_restart(error)
        log.warning(
            "splitflow: restarting the query (restart %d): %s", restarts, _first_line(error)
        )


def _await(query: Any) -> None:
    query.awaitTermination()


def _restartable(message: str, classes: tuple[type[BaseException], ...]) -> bool:
    for cls in classes:
        if f"{cls.__name__}: " in message:
            return not issubclass(cls, SchemaChangedError) or SchemaChangedError.RECORDED in message
    return False


def _first_line(error: Any) -> str:
    text = str(error)
    start = text.find(f"{SchemaChangedError.__name__}: ")
    return text[start if start >= 0 else 0 :].splitlines()[0][:500]
