"""A streaming table fed by a splitflow source, and a materialized view over it.

``sequence_records`` reads the ``splitflow-sequence`` source (a catalog of named splits, each
a growing sequence of records ``(split, 0), (split, 1), ...``) incrementally: each run of the
pipeline reads what was appended since the last run, once (the flow's checkpoint is under
the pipeline's storage). ``records_per_split`` is recomputed from the table on every run.

Pipelines run streaming flows with ``trigger(availableNow=True)``: splitflow fixes the
target when the run starts and reads up to it in batches of at most ``maxRecordsPerBatch``.
"""

from pathlib import Path

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from splitflow.spark import register

spark = SparkSession.active()
register(spark)  # the splitflow sources, by name, for this pipeline's session

PROJECT = Path(__file__).resolve().parents[1]
CATALOG = PROJECT / spark.conf.get("spark.splitflow.example.catalog", "data/catalog.json")
PARALLELISM = spark.conf.get("spark.splitflow.example.parallelism", "2")


@dp.table(format="parquet", comment="every record of the sequence catalog, once")
def sequence_records() -> DataFrame:
    return (
        spark.readStream.format("splitflow-sequence")
        .option("catalog", str(CATALOG))
        .option("parallelism", PARALLELISM)
        .option("maxRecordsPerBatch", "1000")
        .load()
    )


@dp.materialized_view(format="parquet", comment="records, position sum and last position per split")
def records_per_split() -> DataFrame:
    return (
        spark.read.table("sequence_records")
        .groupBy("split")
        .agg(
            F.count("*").alias("records"),
            F.sum("position").alias("position_sum"),
            F.max("position").alias("last_position"),
        )
    )
