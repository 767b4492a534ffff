"""Change data capture from PostgreSQL: an incremental snapshot in parallel key-range
chunks, then the logical replication log (pgoutput), with no row lost or seen twice across
the switch. Needs the ``postgres`` extra (psycopg 3). On Spark:
``format("splitflow-postgres-cdc")`` (:mod:`splitflow.spark.postgres`); see
``docs/postgres-cdc.md``.
"""
