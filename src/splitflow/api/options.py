"""Parsers for option values, shared by every connector: each error names the option.

Durations take ``ms``, ``s``, ``m`` or ``h`` (a bare number is seconds); sizes take ``k``,
``m``, ``g`` or ``t`` (powers of 1024); flags are ``true`` or ``false``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence

from splitflow.errors import ConfigurationError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(option: str, text: str, *, above_zero: bool = False) -> float:
    """Seconds in ``text``; a ConfigurationError naming ``option`` if it is not a duration
    (or, with ``above_zero``, if it is 0: an interval or a timeout).

    >>> parse_duration("discoveryInterval", "0s", above_zero=True)
    Traceback (most recent call last):
    ...
    splitflow.errors.ConfigurationError: option discoveryInterval: '0s' is not a duration \
above 0 (examples: 500ms, 30s, 15m, 1h)
    """
    match = _DURATION.match(text)
    seconds = float(match.group(1)) * _UNITS[match.group(2)] if match else None
    if seconds is None or (above_zero and seconds <= 0):
        above = " above 0" if above_zero else ""
        raise ConfigurationError(
            f"option {option}: {text!r} is not a duration{above} (examples: 500ms, 30s, 15m, 1h)",
            option=option,
        )
    return seconds


_BYTES = re.compile(r"^\s*(\d+)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_BYTE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_bytes(option: str, text: str) -> int:
    """Bytes in ``text`` (``"1048576"``, ``"64k"``, ``"64m"``, ``"1g"``: powers of 1024)."""
    match = _BYTES.match(text)
    value = int(match.group(1)) * _BYTE_UNITS[match.group(2).lower()] if match else 0
    if value < 1:
        raise ConfigurationError(
            f"option {option}: {text!r} is not a size of at least 1 byte (examples: 1048576, "
            "64k, 64m, 1g)",
            option=option,
        )
    return value


def parse_positive_int(option: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or str(value) != text.strip():
        raise ConfigurationError(
            f"option {option}: {text!r} is not a whole number of at least 1", option=option
        )
    return value


def parse_flag(option: str, text: str | None, default: bool) -> bool:
    """``true`` or ``false`` (any case); ``default`` when the option is not given."""
    if text is None:
        return default
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ConfigurationError(f"option {option}: {text!r} is not true or false", option=option)
    return value == "true"


def check_names(
    options: Iterable[str], known: Iterable[str], source: str, prefixes: Sequence[str] = ()
) -> None:
    """Refuse an option name ``source`` does not know (in any case), naming the nearest
    known one as spelled in ``known``; names starting with one of ``prefixes`` (a client's
    own settings, ``kafka.``) pass.

    >>> check_names(["maxrecordsperbatch"], ["maxRecordsPerBatch"], "splitflow-files")
    >>> check_names(["maxRecordPerBatch"], ["maxRecordsPerBatch"], "splitflow-files")
    Traceback (most recent call last):
    ...
    splitflow.errors.ConfigurationError: unknown option 'maxRecordPerBatch' for \
splitflow-files (did you mean 'maxRecordsPerBatch'?)
    """
    spelled = {name.lower(): name for name in known}
    lowered_prefixes = tuple(p.lower() for p in prefixes)
    for key in options:
        lowered = key.lower()
        if lowered in spelled or lowered.startswith(lowered_prefixes):
            continue
        close = difflib.get_close_matches(lowered, sorted(spelled), n=1, cutoff=0.6)
        hint = f" (did you mean {spelled[close[0]]!r}?)" if close else ""
        raise ConfigurationError(f"unknown option {key!r} for {source}{hint}", option=key)
