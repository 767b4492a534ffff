"""Parsers for option values, shared by every connector: each error names the option.

Durations take ``ms``, ``s``, ``m`` or ``h`` (a bare number is seconds); sizes take ``k``,
``m``, ``g`` or ``t`` (powers of 1024); flags are ``true`` or ``false``.
"""

from __future__ import annotations

import re

from splitflow.errors import ConfigurationError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(option: str, text: str) -> float:
    """Seconds in ``text``; a ConfigurationError naming ``option`` if it is not a duration."""
    match = _DURATION.match(text)
    if not match:
        raise ConfigurationError(
            f"option {option}: {text!r} is not a duration (examples: 500ms, 30s, 15m, 1h)",
            option=option,
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


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
