"""The e2e tests' kill of a driver mid-batch (``kill_before_commit``), on a process that only
sleeps: it kills only while the batch found is not committed, and lets the job go on when
the batch was committed between the look and the stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.spark.support import _running, kill_before_commit, wait_until

SLEEPER = "import threading, time\n" + "threading.Thread(target=time.sleep, args=(60,)).start()\n"


class Sleeper:
    """A job in its own process group: two threads that sleep."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", SLEEPER], start_new_session=True)
        self.killed = False

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.killed = True


@pytest.fixture
def job() -> Iterator[Sleeper]:
    sleeper = Sleeper()
    yield sleeper
    if sleeper.process.poll() is None:
        sleeper.kill()


def commit(checkpoint: Path, batch: int) -> None:
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits" / str(batch)).write_text("v1\n{}\n")


def test_it_kills_the_job_while_the_batch_found_is_uncommitted(
    job: Sleeper, tmp_path: Path
) -> None:
    commit(tmp_path, 0)
    assert kill_before_commit(job, "batch 1", lambda: 1, tmp_path, 10) == 1
    assert job.killed
    assert job.process.returncode == -signal.SIGKILL


def test_a_batch_committed_before_the_stop_lets_the_job_go_on_until_another(
    job: Sleeper, tmp_path: Path
) -> None:
    """Between the look and the stop Spark committed batch 1: the job is continued, not
    killed, and killed while batch 2 is uncommitted."""
    looks = 0

    def find() -> int:
        nonlocal looks
        looks += 1
        if looks == 1:  # the first look finds batch 1, committed right after
            commit(tmp_path, 1)
            return 1
        wait_until("the job to go on", lambda: _running(job.process.pid), 5, 0.005)
        assert not job.killed
        return 2

    assert kill_before_commit(job, "a batch", find, tmp_path, 10, step=0.01) == 2
    assert looks == 2
    assert job.killed
