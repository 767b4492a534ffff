"""Command line: ``python -m splitflow demo`` (the main job) and ``python -m splitflow inspect``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="splitflow", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="the main job: event files -> splitflow files source -> windowed counts -> Parquet",
        description="Run the main job (see splitflow.demo); Ctrl-C stops it, a rerun resumes.",
    )
    from splitflow.demo import add_arguments

    add_arguments(demo)
    inspect = commands.add_parser(
        "inspect", help="show the split state of a Spark streaming checkpoint, offline"
    )
    inspect.add_argument("checkpoint", help="the query's checkpointLocation")
    inspect.add_argument("--batch", type=int, help="micro-batch id (default: the latest)")
    inspect.add_argument(
        "--state-dir", help="the query's stateDir, where it keeps its splits and finished splits"
    )
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from splitflow.demo import run

        return run(args)
    from splitflow.errors import SplitflowError
    from splitflow.inspect import format_table, read_checkpoint, to_json

    try:
        states = read_checkpoint(args.checkpoint, args.batch, args.state_dir)
    except SplitflowError as exc:
        print(f"splitflow inspect: {exc}", file=sys.stderr)
        return 2
    print(to_json(states) if args.json else format_table(states))
    return 0


if __name__ == "__main__":
    sys.exit(main())
