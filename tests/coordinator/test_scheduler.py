"""ManualScheduler (virtual clock, caller's thread) and ThreadedScheduler (real threads)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from splitflow.coordinator import ManualScheduler, ThreadedScheduler

WAIT = 5.0  # seconds; only reached when a test is about to fail


# -- ManualScheduler ----------------------------------------------------------------------


def test_manual_scheduler_runs_nothing_until_asked() -> None:
    scheduler = ManualScheduler()
    ran: list[str] = []
    scheduler.run_on_coordinator(lambda: ran.append("coordinator"))
    scheduler.run_on_worker(lambda: ran.append("worker"))

    assert ran == []
    scheduler.run_until_idle()
    assert ran == ["coordinator", "worker"]


def test_manual_scheduler_runs_coordinator_tasks_in_submission_order() -> None:
    scheduler = ManualScheduler()
    ran: list[int] = []
    for i in range(5):
        scheduler.run_on_coordinator(lambda i=i: ran.append(i))
    scheduler.run_until_idle()
    assert ran == [0, 1, 2, 3, 4]


def test_manual_scheduler_drains_coordinator_queue_before_each_worker_task() -> None:
    scheduler = ManualScheduler()
    ran: list[str] = []

    def worker(name: str) -> None:
        ran.append(name)
        scheduler.run_on_coordinator(lambda: ran.append(f"handler of {name}"))

    scheduler.run_on_worker(lambda: worker("w1"))
    scheduler.run_on_worker(lambda: worker("w2"))
    scheduler.run_on_coordinator(lambda: ran.append("c"))
    scheduler.run_until_idle()

    assert ran == ["c", "w1", "handler of w1", "w2", "handler of w2"]


def test_manual_scheduler_runs_tasks_queued_by_tasks_in_the_same_call() -> None:
    scheduler = ManualScheduler()
    ran: list[str] = []
    scheduler.run_on_coordinator(
        lambda: scheduler.run_on_worker(
            lambda: scheduler.run_on_coordinator(lambda: ran.append("deep"))
        )
    )
    scheduler.run_until_idle()
    assert ran == ["deep"]


def test_manual_scheduler_fires_timers_only_when_the_clock_reaches_them() -> None:
    scheduler = ManualScheduler()
    fired: list[float] = []
    scheduler.schedule(5.0, lambda: fired.append(scheduler.now))

    scheduler.advance(4.999)
    assert fired == []
    assert scheduler.now == pytest.approx(4.999)
    scheduler.advance(0.001)
    assert fired == [pytest.approx(5.0)]


def test_manual_scheduler_fires_timers_in_time_order_with_the_clock_at_their_due_time() -> None:
    scheduler = ManualScheduler()
    fired: list[tuple[str, float]] = []
    scheduler.schedule(3.0, lambda: fired.append(("b", scheduler.now)))
    scheduler.schedule(1.0, lambda: fired.append(("a", scheduler.now)))
    scheduler.schedule(3.0, lambda: fired.append(("c", scheduler.now)))  # same time: FIFO

    scheduler.advance(10.0)

    assert fired == [("a", 1.0), ("b", 3.0), ("c", 3.0)]
    assert scheduler.now == 10.0


def test_manual_scheduler_fires_a_timer_scheduled_by_a_timer_within_the_same_advance() -> None:
    scheduler = ManualScheduler()
    fired: list[float] = []

    def first() -> None:
        fired.append(scheduler.now)
        scheduler.schedule(2.0, lambda: fired.append(scheduler.now))

    scheduler.schedule(1.0, first)
    scheduler.advance(3.0)
    assert fired == [1.0, 3.0]


def test_manual_scheduler_runs_work_handed_on_by_a_timer_before_the_next_timer() -> None:
    scheduler = ManualScheduler()
    ran: list[str] = []
    scheduler.schedule(1.0, lambda: scheduler.run_on_worker(lambda: ran.append("work at 1")))
    scheduler.schedule(2.0, lambda: ran.append("timer at 2"))
    scheduler.advance(2.0)
    assert ran == ["work at 1", "timer at 2"]


def test_manual_scheduler_cancelled_timer_never_fires_and_is_not_pending() -> None:
    scheduler = ManualScheduler()
    fired: list[str] = []
    keep = scheduler.schedule(1.0, lambda: fired.append("kept"))
    drop = scheduler.schedule(1.0, lambda: fired.append("dropped"))
    assert scheduler.pending_timers == 2

    drop.cancel()
    drop.cancel()  # idempotent
    assert scheduler.pending_timers == 1
    scheduler.advance(2.0)

    assert fired == ["kept"]
    assert scheduler.pending_timers == 0
    keep.cancel()  # cancelling a fired timer is harmless


def test_manual_scheduler_after_shutdown_drops_queued_work_and_refuses_new_work() -> None:
    scheduler = ManualScheduler()
    ran: list[str] = []
    scheduler.run_on_coordinator(lambda: ran.append("queued"))
    scheduler.schedule(1.0, lambda: ran.append("timer"))

    scheduler.shutdown()
    scheduler.run_on_coordinator(lambda: ran.append("late coordinator"))
    scheduler.run_on_worker(lambda: ran.append("late worker"))
    scheduler.schedule(1.0, lambda: ran.append("late timer"))
    scheduler.advance(5.0)

    assert ran == []
    assert scheduler.pending_timers == 0


# -- ThreadedScheduler --------------------------------------------------------------------


@pytest.fixture
def threaded() -> Iterator[ThreadedScheduler]:
    scheduler = ThreadedScheduler(name="test", workers=2)
    yield scheduler
    scheduler.shutdown()


def test_threaded_scheduler_runs_coordinator_tasks_on_one_thread_in_order(
    threaded: ThreadedScheduler,
) -> None:
    ran: list[int] = []
    threads: set[int] = set()
    done = threading.Event()

    def task(i: int) -> None:
        ran.append(i)
        threads.add(threading.get_ident())
        if i == 49:
            done.set()

    for i in range(50):
        threaded.run_on_coordinator(lambda i=i: task(i))

    assert done.wait(WAIT)
    assert ran == list(range(50))
    assert len(threads) == 1
    assert threading.get_ident() not in threads


def test_threaded_scheduler_names_its_coordinator_thread(threaded: ThreadedScheduler) -> None:
    names: list[str] = []
    done = threading.Event()
    threaded.run_on_coordinator(lambda: (names.append(threading.current_thread().name), done.set()))
    assert done.wait(WAIT)
    assert names[0].startswith("test-coordinator")


def test_threaded_scheduler_runs_worker_tasks_concurrently_off_the_coordinator_thread(
    threaded: ThreadedScheduler,
) -> None:
    # Two workers that wait for each other can only both finish if they run at the same time.
    barrier = threading.Barrier(2, timeout=WAIT)
    worker_threads: set[int] = set()
    coordinator_thread: list[int] = []
    finished = threading.Semaphore(0)

    def worker() -> None:
        worker_threads.add(threading.get_ident())
        barrier.wait()
        finished.release()

    threaded.run_on_coordinator(lambda: coordinator_thread.append(threading.get_ident()))
    threaded.run_on_worker(worker)
    threaded.run_on_worker(worker)

    assert finished.acquire(timeout=WAIT)
    assert finished.acquire(timeout=WAIT)
    assert len(worker_threads) == 2
    assert coordinator_thread[0] not in worker_threads


def test_threaded_scheduler_fires_a_timer_after_its_delay(threaded: ThreadedScheduler) -> None:
    fired = threading.Event()
    handle = threaded.schedule(0.1, fired.set)
    assert not fired.wait(0.02)
    assert fired.wait(WAIT)
    handle.cancel()  # harmless after firing


def test_threaded_scheduler_cancelled_timer_never_fires(threaded: ThreadedScheduler) -> None:
    fired = threading.Event()
    handle = threaded.schedule(0.05, fired.set)
    handle.cancel()
    assert not fired.wait(0.2)


def test_threaded_scheduler_after_shutdown_runs_nothing_new() -> None:
    scheduler = ThreadedScheduler(name="test-shutdown")
    ran = threading.Event()
    pending = scheduler.schedule(0.05, ran.set)

    scheduler.shutdown()
    scheduler.run_on_coordinator(ran.set)
    scheduler.run_on_worker(ran.set)
    late = scheduler.schedule(0.0, ran.set)

    assert not ran.wait(0.2)
    pending.cancel()
    late.cancel()
