"""Command line: ``python -m splitflow demo``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="splitflow", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "demo", help="in-process demo: assignment, discovery, failover, rescale, exactly-once"
    )
    args = parser.parse_args(argv)
    if args.command == "demo":
        from splitflow.demo import run

        run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
