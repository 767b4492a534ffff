"""What to do with a CDC source's rows: keep a copy of each table (:func:`apply_changes`).

The CDC connectors themselves live in :mod:`splitflow.connectors.cdc` (the core) and the
database packages; this package is for the pipelines that consume their rows.
"""

from __future__ import annotations

from splitflow.cdc.mirror import Applied, apply_changes, latest_per_key

__all__ = ["Applied", "apply_changes", "latest_per_key"]
