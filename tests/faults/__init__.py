"""Random fault schedules over real streaming queries, with every record counted.

A *schedule* (:mod:`tests.faults.schedule`) is drawn from a seed: a few runs of a driver
(``python -m tests.spark.jobs``) streaming a splitflow source into a Parquet sink while the
source keeps receiving data, each run at its own ``parallelism`` and ended by a fault, with
faults during the runs (a Python worker killed mid-task, files or topics appearing and
vanishing, the broker or database stopped and started, a database's connections killed)
and, for CDC (PostgreSQL, MariaDB), maybe a sink that reads every batch twice
(``evaluate-twice``). A last run reads what is left with
``trigger(availableNow=True)``. :mod:`tests.faults.harness` runs a schedule against a
*workload* (:mod:`tests.faults.workloads`: the source, its data and how to recount it) and
counts every record of the sink against what the source holds: lost, duplicated, and
skipped where the docs say records are skipped (a split that vanished under
``failOnDataLoss=false``).

``tests/faults/test_faults.py`` runs a few seeds per connector in CI; ``bench/faults.py``
runs many (``--schedules 50``) and prints a failing seed so it can be replayed.
"""
