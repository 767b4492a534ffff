"""Connectors built only on splitflow's public API (``splitflow.api`` and ``splitflow.reader``)."""
