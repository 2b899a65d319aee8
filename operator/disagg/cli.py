"""The `disagg` command line.

Each subcommand lives in its own module under `disagg.commands` and exposes
`register(subparsers)`, which adds its parser and sets `func` (called with the
parsed arguments, returning an exit code). Heavy imports happen inside `func`,
so `disagg --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from disagg import __version__

# Order here is the order in `disagg --help`.
COMMANDS = [
    "plan",
    "simulate",
    "evaluate",
    "emulate",
    "replay",
    "run",
    "crds",
    "dashboard",
]


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="disagg",
        description=(
            "disagg-operator: plan, simulate, emulate and operate disaggregated "
            "(encoder / prefill / decode) LLM serving pools."
        ),
    )
    parser.add_argument("--version", action="version", version=f"disagg {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"disagg.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"disagg.commands.{name}":
                continue  # command not shipped in this build
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"disagg {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        # Validation errors of the pure core name the offending input.
        print(f"disagg {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
