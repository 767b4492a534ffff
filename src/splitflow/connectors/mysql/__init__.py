"""Change data capture from MariaDB (the MySQL protocol): an incremental snapshot in parallel
key-range chunks, then the binlog (row-based, read through the replication protocol with
mysql-replication), on the CDC core (:mod:`splitflow.connectors.cdc`), with no row lost or
seen twice across the switch. Needs the ``mysql`` extra (PyMySQL, mysql-replication). On
Spark: ``format("splitflow-mysql-cdc")`` (:mod:`splitflow.spark.mysql`); see ``docs/cdc.md``.

What this package adds to the core: the options (:mod:`.options`, Flink CDC's names), the
type mapping (:mod:`.types`), GTIDs as positions (:mod:`.gtid`), the catalog
(:mod:`.catalog`), the binlog reader (:mod:`.binlog`), one pinned binlog position per batch
with chunks rewound to it (:mod:`.pinning`, :mod:`.reader`) and the enumerator's hooks
(:mod:`.source`).
"""
