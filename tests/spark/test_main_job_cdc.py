"""The main job's CDC form end to end: ``python -m splitflow demo --cdc`` run twice on one
work directory.

Run 1 (a local PostgreSQL, pgbench's tables, a writer, an ``ALTER TABLE ... ADD COLUMN``
15 s in) stops after ``--duration``: the query must have stopped at the schema change and
gone on with the new schema, and at the end each Delta mirror must equal its table row for
row (the job compares them after the writer stopped and the query caught up; the test
compares them again itself, after run 2). Run 2 resumes on the same database and checkpoint: no
snapshot again, the mirrors equal again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.spark.cdc_jobs import delta_dicts, table_dicts
from tests.spark.support import REPO_ROOT, spark_env

from splitflow.testing.postgres import Postgres

pytestmark = pytest.mark.slow
pytest.importorskip("deltalake", reason="needs the delta extra (deltalake)")

TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")


def run(work: Path, *args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "splitflow", "demo", "--cdc", "--work-dir", str(work), "--plain",
         "--scale", "20000", "--chunk-size", "5000", "--tps", "40", *args],
        cwd=REPO_ROOT, env=spark_env(), capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return lines


def test_the_cdc_main_job_mirrors_four_tables_through_a_schema_change_and_a_resume(
    tmp_path: Path,
) -> None:
    if not Postgres.installed():
        pytest.skip("no PostgreSQL server installed (apt install postgresql-15)")
    work = tmp_path / "work"
    first = run(work, "--duration", "55", "--alter-after", "15")

    assert "fresh start" in first[0]
    assert any(line.startswith("schema change: schema changed at log position") for line in first)
    verdicts = [line for line in first if line.startswith("mirror ")]
    assert len(verdicts) == 4, first
    assert all(line.endswith("equal to the table") for line in verdicts), verdicts
    accounts = next(line for line in verdicts if line.startswith("mirror pgbench_accounts"))
    assert "note" in accounts  # the column the ALTER added

    second = run(work, "--duration", "25")
    assert "resuming" in second[0]
    assert not any(line.startswith("schema change") for line in second)
    batches = [line for line in second if line.startswith("phase: ")]
    assert batches, second
    assert all("snapshot rows: 0 " in line for line in batches), batches[-1]
    verdicts = [line for line in second if line.startswith("mirror ")]
    assert len(verdicts) == 4, second
    assert all(line.endswith("equal to the table") for line in verdicts), verdicts

    with Postgres.start(work, keep=True) as pg:  # the job's database, as the runs left it
        for table, key in zip(TABLES, ("aid", "bid", "tid", "hid"), strict=True):
            rows = table_dicts(pg, table)
            assert delta_dicts(work / "mirror" / table, key) == rows, table
            assert rows, table
