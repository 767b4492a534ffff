"""Runs a source's split enumerator: threads, assignment tracking, checkpoints."""

from splitflow.coordinator.checkpoint import Checkpoint, redistribute_reader_states
from splitflow.coordinator.coordinator import (
    AddSplits,
    CoordinatorContext,
    NoMoreSplits,
    ReaderEvent,
    ReaderGateway,
    ReaderMessage,
    SourceCoordinator,
)
from splitflow.coordinator.metrics import SimpleMetricGroup
from splitflow.coordinator.scheduler import ManualScheduler, Scheduler, ThreadedScheduler
from splitflow.coordinator.tracker import SplitAssignmentTracker

__all__ = [
    "AddSplits",
    "Checkpoint",
    "CoordinatorContext",
    "ManualScheduler",
    "NoMoreSplits",
    "ReaderEvent",
    "ReaderGateway",
    "ReaderMessage",
    "Scheduler",
    "SimpleMetricGroup",
    "SourceCoordinator",
    "SplitAssignmentTracker",
    "ThreadedScheduler",
    "redistribute_reader_states",
]
