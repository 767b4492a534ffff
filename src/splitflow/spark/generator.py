"""The generator source on Spark: ``spark.read(Stream).format("splitflow-generator")``.

Options: ``splits`` (default 4), ``rowsPerSplit`` (default 1,000,000), ``batchRows`` (rows
per Arrow batch, default 65,536), ``skew`` (default 0), plus the runtime options.
"""

from __future__ import annotations

from splitflow.connectors.generator import SPARK_SCHEMA, GeneratorSource
from splitflow.errors import ConfigurationError
from splitflow.spark.datasource import SplitflowDataSource
from splitflow.spark.options import parse_positive_int


class GeneratorDataSource(SplitflowDataSource):
    @classmethod
    def name(cls) -> str:
        return "splitflow-generator"

    def schema(self) -> str:
        return SPARK_SCHEMA

    def create_source(self) -> GeneratorSource:
        def whole(name: str, default: int) -> int:
            text = self.options.get(name.lower())
            return default if text is None else parse_positive_int(name, text)

        skew_text = self.options.get("skew", "0")
        try:
            skew = float(skew_text)
        except ValueError:
            raise ConfigurationError(
                f"option skew: {skew_text!r} is not a number", option="skew"
            ) from None
        return GeneratorSource(
            whole("splits", 4),
            whole("rowsPerSplit", 1_000_000),
            batch_rows=whole("batchRows", 65_536),
            skew=skew,
        )
