"""MariaDB GTIDs as the log's positions.

MariaDB writes a GTID ``domain-server-seq`` for every binlogged transaction; within a
domain, ``seq`` grows by one per transaction (``gtid_strict_mode`` makes anything else an
error). The source reads one domain, and a transaction's **position** is its ``seq``: the
log's slice ``[a, b)`` is the transactions whose ``seq`` is in it, and "the log after GTID
``0-1-41``" starts at position 42. A GTID position with several domains cannot be one
integer, and is refused.

Resuming needs the whole GTID of the transaction before the start, ``server`` included
(MariaDB's dump looks it up by domain and server). The position keeps only ``seq``, so the
server comes from ``@@gtid_binlog_state`` (the last GTID of every server of the domain):
the servers that wrote a ``seq`` at least that high are the candidates
(:func:`candidates`).
"""

from __future__ import annotations

from typing import NamedTuple

from splitflow.errors import ConnectorError


class Gtid(NamedTuple):
    domain: int
    server: int
    seq: int

    def __str__(self) -> str:
        return f"{self.domain}-{self.server}-{self.seq}"


def parse(text: str | None) -> list[Gtid]:
    """The GTIDs of a GTID position or state (``0-1-42,1-2-7``; empty: none).

    >>> parse("0-1-42, 1-2-7")
    [Gtid(domain=0, server=1, seq=42), Gtid(domain=1, server=2, seq=7)]
    """
    gtids = []
    for item in (text or "").split(","):
        item = item.strip()
        if item:
            domain, server, seq = (int(part) for part in item.split("-"))
            gtids.append(Gtid(domain, server, seq))
    return gtids


def single(text: str | None, where: str) -> Gtid | None:
    """The one GTID of a GTID position (None: no transaction yet); several domains are a
    ConnectorError naming ``where``.

    >>> single("0-1-42", "db"), single("", "db")
    (Gtid(domain=0, server=1, seq=42), None)
    """
    gtids = parse(text)
    if len({g.domain for g in gtids}) > 1:
        raise ConnectorError(
            f"the binlog of {where} has GTIDs of several domains ({text}): splitflow-mysql-cdc "
            "reads a server whose binlog has one GTID domain (its positions are that "
            "domain's sequence numbers)"
        )
    return max(gtids, key=lambda g: g.seq) if gtids else None


def position_after(text: str | None, where: str) -> int:
    """The position after a GTID position: its ``seq`` + 1 (1 when there is none).

    >>> position_after("0-1-42", "db")
    43
    """
    last = single(text, where)
    return 1 if last is None else last.seq + 1


def candidates(state: str | None, seq: int, where: str) -> list[Gtid]:
    """The GTIDs ``domain-server-seq`` the transaction ``seq`` may have, given the binlog's
    GTID state ``state``: one per server whose last GTID is at least ``seq``, the server
    whose last is lowest first (in a single-writer history, the one that wrote ``seq``).

    >>> candidates("0-1-100,0-2-250", 42, "db")
    [Gtid(domain=0, server=1, seq=42), Gtid(domain=0, server=2, seq=42)]
    >>> candidates("0-1-100,0-2-250", 180, "db")
    [Gtid(domain=0, server=2, seq=180)]
    """
    gtids = parse(state)
    if len({g.domain for g in gtids}) > 1:
        single(state, where)  # raises, naming the domains
    later = sorted((g for g in gtids if g.seq >= seq), key=lambda g: (g.seq, g.server))
    return [Gtid(g.domain, g.server, seq) for g in later]
