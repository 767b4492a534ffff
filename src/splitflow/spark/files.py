"""The files source on Spark: ``spark.readStream.format("splitflow-files")``.

Options (see ``docs/files.md``): ``path`` (required), ``format`` (``parquet``, ``json``,
``csv``; default: from the pattern's or the first file's extension), ``pattern`` (a glob
relative to ``path``, ``**`` for any depth), ``schema`` (DDL; or ``.schema(...)``; default:
inferred from the first file), ``discoveryInterval`` (default 1s), ``maxSplitBytes``
(default 128m), ``maxFilesPerBatch`` / ``maxFilesPerTrigger``, ``maxBytesPerTrigger`` (an
alias of the runtime's ``maxBytesPerBatch``: positions are file bytes), ``latestFirst``,
``maxFileAge``, ``cleanSource`` (``off``/``delete``/``archive``) with ``sourceArchiveDir``,
``badFiles``
(``fail``/``quarantine``; quarantine needs ``stateDir``), ``failOnDataLoss`` (default
true), ``header`` and ``delimiter`` (CSV), plus the runtime options of
:mod:`splitflow.spark.options`. The runtime's ``eventTimeColumn`` has no default here; for
Parquet it reaches the source, which aligns splits (``maxEventTimeDrift``) by the row-group
statistics of that column: exactly, to a row group. JSON lines and CSV are aligned by
pausing.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from splitflow.api.options import parse_bytes, parse_duration, parse_flag, parse_positive_int
from splitflow.connectors.files import CsvOptions, FilesSource, default_format
from splitflow.errors import ConfigurationError
from splitflow.spark.datasource import SplitflowDataSource
from splitflow.spark.statedir import storage_options

_RESOLVED_SCHEMA = "splitflow.files.schema"
"""Option key under which the query's schema (Spark JSON) travels to executors."""


def arrow_schema(struct: StructType) -> pa.Schema:
    """The Arrow form of a Spark schema that Spark expects a Python source's batches in."""
    return to_arrow_schema(struct, timezone="UTC")


class FilesDataSource(SplitflowDataSource):
    OPTIONS = (
        "path",
        "format",
        "pattern",
        "schema",
        "header",
        "delimiter",
        "badFiles",
        "discoveryInterval",
        "maxSplitBytes",
        "blockBytes",
        "maxFilesPerBatch",
        "maxFilesPerTrigger",
        "maxBytesPerTrigger",
        "latestFirst",
        "maxFileAge",
        "cleanSource",
        "sourceArchiveDir",
        "failOnDataLoss",
        _RESOLVED_SCHEMA,
    )
    OPTION_PREFIXES = ("path.",)
    """``path.<key>``: a storage option of the fsspec filesystem of ``path`` (s3fs, adlfs)."""

    @classmethod
    def name(cls) -> str:
        return "splitflow-files"

    def __init__(self, options: dict[str, str]) -> None:
        for alias, name in (("maxbytespertrigger", "maxbytesperbatch"),):
            if alias in options and name not in options:
                options[name] = options[alias]  # Spark's file source name for the option
        self._loaded = False
        super().__init__(options)
        self._loaded = True

    def schema(self) -> str | StructType:
        given = self.options.get("schema")
        if given:
            return str(given)
        inferred = self.create_source().infer_schema()
        return from_arrow_schema(
            pa.schema([f.with_nullable(True) for f in inferred]), prefer_timestamp_ntz=True
        )

    def _resolve(self, schema: Any) -> None:
        """Fix the query's schema and format in the options that travel to executors."""
        if isinstance(schema, StructType):
            self.options[_RESOLVED_SCHEMA] = schema.json()
        if not self.options.get("format"):
            self.options["format"] = self.create_source().format

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        self._resolve(schema)
        return super().streamReader(schema)

    def reader(self, schema: Any) -> DataSourceReader:
        self._resolve(schema)
        return super().reader(schema)

    # -- options ------------------------------------------------------------------------------

    def _text(self, *names: str) -> tuple[str, str] | None:
        for name in names:
            value = self.options.get(name.lower())
            if value is not None:
                return name, str(value)
        return None

    def _flag(self, option: str, default: bool) -> bool:
        return parse_flag(option, self.options.get(option.lower()), default)

    def _whole(self, *names: str) -> int | None:
        found = self._text(*names)
        return None if found is None else parse_positive_int(*found)

    def _size(self, *names: str) -> int | None:
        found = self._text(*names)
        return None if found is None else parse_bytes(*found)

    def _duration(self, name: str, *, above_zero: bool = False) -> float | None:
        found = self._text(name)
        if found is None:
            return None
        text = found[1].strip()
        if text.endswith("d") and text[:-1].strip().replace(".", "", 1).isdigit():
            return float(text[:-1]) * 86400.0
        return parse_duration(name, text, above_zero=above_zero)

    def create_source(self) -> FilesSource:
        path = self.options.get("path")
        if not path:
            raise ConfigurationError(
                "option path is required: the directory to read files from (load(path) or "
                ".option('path', ...))",
                option="path",
            )
        path = str(path)
        pattern = self.options.get("pattern") or None
        csv = CsvOptions(
            header=self._flag("header", True), delimiter=str(self.options.get("delimiter", ","))
        )
        if len(csv.delimiter) != 1:
            raise ConfigurationError(
                f"option delimiter: {csv.delimiter!r} is not one character", option="delimiter"
            )
        bad_files = str(self.options.get("badfiles", "fail")).lower()
        if bad_files == "quarantine" and self.runtime.state_dir is None:
            raise ConfigurationError(
                "option badFiles=quarantine needs option stateDir: readers report quarantined "
                "files to the enumerator through it",
                option="badFiles",
            )
        fmt = self.options.get("format")
        interval = self._duration("discoveryInterval", above_zero=True)
        resolved = self.options.get(_RESOLVED_SCHEMA)
        source = FilesSource(
            path,
            str(fmt).lower() if fmt else "json",
            arrow_schema(StructType.fromJson(json.loads(resolved))) if resolved else None,
            pattern=str(pattern) if pattern else None,
            discovery_interval=1.0 if interval is None else interval,
            split_bytes=self._size("maxSplitBytes") or 128 << 20,
            block_bytes=self._size("blockBytes") or 4 << 20,
            max_files_per_batch=self._whole("maxFilesPerBatch", "maxFilesPerTrigger"),
            latest_first=self._flag("latestFirst", False),
            max_file_age=self._duration("maxFileAge"),
            clean_source=str(self.options.get("cleansource", "off")).lower(),
            archive_dir=self.options.get("sourcearchivedir") or None,
            bad_files=bad_files,
            fail_on_data_loss=self._flag("failOnDataLoss", True),
            csv=csv,
            storage_options=storage_options(self.options, "path."),
            event_time_column=self.runtime.event_time_column,
        )
        if not self._loaded and not source.directory_exists():  # checked at load() only:
            # a directory that goes later is data loss, the enumerator's to report
            raise ConfigurationError(f"option path: no directory at {path!r}", option="path")
        if not fmt:
            source.format = default_format(path, source.pattern, source.list_files())
        return source


__all__ = ["FilesDataSource", "arrow_schema"]
