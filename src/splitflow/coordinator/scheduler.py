"""Where a coordinator's work runs: one coordinator thread, a worker pool, timers.

:class:`ThreadedScheduler` uses real threads (the Spark runtime). :class:`ManualScheduler`
runs everything on the caller's thread when asked, with a virtual clock, so that tests and
the in-process harness are deterministic.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

Task = Callable[[], None]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """Runs a coordinator's tasks.

    Guarantees: tasks given to ``run_on_coordinator`` run one at a time, in submission
    order, on one thread. ``run_on_worker`` tasks may run concurrently with everything.
    """

    def run_on_coordinator(self, task: Task) -> None: ...

    def run_on_worker(self, task: Task) -> None: ...

    def schedule(self, delay: float, task: Task) -> Cancellable:
        """Run ``task`` (it must be quick: it only hands work on) after ``delay`` seconds."""
        ...

    def shutdown(self) -> None:
        """Stop accepting work; queued and running tasks are abandoned or finish."""
        ...


class ThreadedScheduler:
    """A real coordinator thread, a worker pool and timer threads."""

    def __init__(self, name: str = "splitflow", workers: int = 2) -> None:
        self._coordinator_ident: int | None = None
        self._coordinator = ThreadPoolExecutor(
            1, thread_name_prefix=f"{name}-coordinator", initializer=self._remember_thread
        )
        self._workers = ThreadPoolExecutor(workers, thread_name_prefix=f"{name}-worker")
        self._timers: set[threading.Timer] = set()
        self._lock = threading.Lock()
        self._closed = False

    def _remember_thread(self) -> None:
        self._coordinator_ident = threading.get_ident()

    def in_coordinator_thread(self) -> bool:
        return threading.get_ident() == self._coordinator_ident

    def run_on_coordinator(self, task: Task) -> None:
        if not self._closed:
            self._coordinator.submit(task)

    def run_on_worker(self, task: Task) -> None:
        if not self._closed:
            self._workers.submit(task)

    def schedule(self, delay: float, task: Task) -> Cancellable:
        timer = threading.Timer(delay, self._fire, args=(task,))
        timer.daemon = True
        with self._lock:
            if self._closed:
                return timer
            self._timers.add(timer)
        timer.start()
        return timer

    def _fire(self, task: Task) -> None:
        with self._lock:
            self._timers = {
                t for t in self._timers if t.is_alive() and t is not threading.current_thread()
            }
        if not self._closed:
            task()

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            timers, self._timers = self._timers, set()
        for timer in timers:
            timer.cancel()
        self._workers.shutdown(wait=False, cancel_futures=True)
        self._coordinator.shutdown(wait=False, cancel_futures=True)


class _Timer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualScheduler:
    """Runs tasks only when told to, on the calling thread, with a virtual clock.

    ``run_until_idle()`` runs queued coordinator and worker tasks until none is left;
    ``advance(seconds)`` moves the clock, firing due timers in time order.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self._coordinator: deque[Task] = deque()
        self._workers: deque[Task] = deque()
        self._timers: list[tuple[float, int, Task, _Timer]] = []
        self._seq = itertools.count()
        self._closed = False

    def run_on_coordinator(self, task: Task) -> None:
        if not self._closed:
            self._coordinator.append(task)

    def run_on_worker(self, task: Task) -> None:
        if not self._closed:
            self._workers.append(task)

    def schedule(self, delay: float, task: Task) -> Cancellable:
        handle = _Timer()
        if not self._closed:
            heapq.heappush(self._timers, (self.now + delay, next(self._seq), task, handle))
        return handle

    def run_until_idle(self) -> None:
        while self._coordinator or self._workers:
            while self._coordinator:
                self._coordinator.popleft()()
            if self._workers:
                self._workers.popleft()()

    def advance(self, seconds: float) -> None:
        until = self.now + seconds
        self.run_until_idle()
        while self._timers and self._timers[0][0] <= until:
            due, _, task, handle = heapq.heappop(self._timers)
            self.now = due
            if not handle.cancelled:
                task()
            self.run_until_idle()
        self.now = until

    @property
    def pending_timers(self) -> int:
        return sum(1 for *_, handle in self._timers if not handle.cancelled)

    def shutdown(self) -> None:
        self._closed = True
        self._coordinator.clear()
        self._workers.clear()
        self._timers.clear()
