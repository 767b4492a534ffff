"""The README's main job (for now the in-process demo) runs and proves what it prints."""

from __future__ import annotations

import subprocess
import sys

from splitflow.demo import run


def test_demo_reads_every_record_exactly_once_and_shows_the_balance() -> None:
    lines: list[str] = []
    count = run(lines.append)
    text = "\n".join(lines)
    assert count == 1210  # 12 splits of 50..125 records plus 4 late ones of 40
    assert f"all {count} records committed exactly once" in text
    assert "others untouched: yes" in text
    assert "4 of 16 splits moved" in text
    balanced = next(line for line in lines if line.strip().startswith("balanced"))
    hashed = next(line for line in lines if line.strip().startswith("hash"))
    assert balanced.endswith("spread 1")
    assert not hashed.endswith("spread 1")


def test_demo_command_line_exits_zero() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "splitflow", "demo"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "exactly once" in done.stdout
