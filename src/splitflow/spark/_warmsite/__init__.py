"""The directory :mod:`splitflow.spark.warmstart` puts on the ``PYTHONPATH`` of the
splitflow data sources' Python processes (its ``sitecustomize`` module)."""
