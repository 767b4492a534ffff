"""A small disk of its own for a query's checkpoint and state directory: a tmpfs that a
fault fills up or turns read-only for a few seconds.

Mounting needs the ``CAP_SYS_ADMIN`` capability (root in this sandbox); where the mount is
refused, :func:`available` says so and the schedules draw no disk faults.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import subprocess
import tempfile
import time
from pathlib import Path


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@functools.cache
def available() -> bool:
    """Whether this process may mount a tmpfs (tried once, on a scratch folder)."""
    with tempfile.TemporaryDirectory(prefix="splitflow-disk-probe-") as folder:
        if _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", folder).returncode != 0:
            return False
        subprocess.run(["umount", folder], capture_output=True, timeout=30)
        return True


class Disk:
    """A tmpfs of ``size`` at ``path`` (created), until :meth:`close`."""

    def __init__(self, path: Path, size: str = "64m") -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        done = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
        if done.returncode != 0:
            raise OSError(f"cannot mount a tmpfs at {path}: {done.stderr.strip()}")

    def full_for(self, seconds: float) -> str:
        """Fill the disk, keep it full ``seconds``, free it again."""
        filler = self.path / ".filler"
        written = 0
        with open(filler, "wb") as f:
            chunk = b"\0" * (1 << 20)
            try:
                while True:
                    written += f.write(chunk)
                    f.flush()
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
        time.sleep(seconds)
        filler.unlink()
        return f"disk-full: {written >> 20} MiB written until full, for {seconds}s"

    def read_only_for(self, seconds: float) -> str:
        """Remount the disk read-only for ``seconds``, then read-write again."""
        for _ in range(40):  # busy while a file there is open for writing: try again
            done = _mount("-o", "remount,ro", str(self.path))
            if done.returncode == 0:
                break
            time.sleep(0.05)
        else:
            return f"disk-read-only: not applied: {done.stderr.strip().splitlines()[0]}"
        time.sleep(seconds)
        _mount("-o", "remount,rw", str(self.path))
        return f"disk-read-only: for {seconds}s"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            (self.path / ".filler").unlink()
        _mount("-o", "remount,rw", str(self.path))
        for _ in range(50):  # a process of a killed driver may still hold a file there
            if subprocess.run(["umount", str(self.path)], capture_output=True).returncode == 0:
                return
            time.sleep(0.2)
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)

    def __enter__(self) -> Disk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
