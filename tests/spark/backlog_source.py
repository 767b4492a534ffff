"""``splitflow-sequence-backlog``: ``splitflow-sequence-faulty`` whose enumerator logs every
:class:`~splitflow.api.events.BacklogFinishedEvent` it receives, one line per split, to the
file named by option ``backlogLog`` (the enumerator runs in the driver's streaming runner,
so the test reads the file directly). Executors import this module by name.
"""

from __future__ import annotations

from typing import Any

from tests.spark.sources import FaultySequenceDataSource

from splitflow.api.events import BacklogFinishedEvent, SourceEvent
from splitflow.testing.sequence import SequenceSource


class BacklogLoggingSource(SequenceSource):
    log_path = ""

    def _logging(self, enumerator: Any) -> Any:
        handle = enumerator.handle_source_event
        path = self.log_path

        def logging(reader_id: int, event: SourceEvent) -> None:
            if isinstance(event, BacklogFinishedEvent):
                with open(path, "a", encoding="utf-8") as f:
                    f.writelines(f"{sid}\n" for sid in event.split_ids)
            handle(reader_id, event)

        enumerator.handle_source_event = logging
        return enumerator

    def create_enumerator(self, context: Any) -> Any:
        return self._logging(super().create_enumerator(context))

    def restore_enumerator(self, context: Any, state: Any) -> Any:
        return self._logging(super().restore_enumerator(context, state))


class BacklogLoggingDataSource(FaultySequenceDataSource):
    OPTIONS = (*FaultySequenceDataSource.OPTIONS, "backlogLog")

    @classmethod
    def name(cls) -> str:
        return "splitflow-sequence-backlog"

    def create_source(self) -> SequenceSource:
        plain = super().create_source()
        source = BacklogLoggingSource.__new__(BacklogLoggingSource)
        source.__dict__.update(plain.__dict__)
        source.log_path = self.options.get("backloglog", "")
        return source
