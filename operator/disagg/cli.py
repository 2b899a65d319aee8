"""The `disagg` command line.

Each subcommand lives in its own module under `disagg.commands` and exposes
`register(subparsers)`, which adds its parser and sets `func` (called with the
parsed arguments, returning an exit code). Heavy imports happen inside `func`,
so `disagg --help` stays fast.

Errors are one line on stderr, `disagg <command>: error: ...`: exit 2 for bad input (argparse's
own errors, `UsageError`, and the checks of `disagg.commands.checks`, which run before the
command starts any long work), exit 1 for a run that could not do its job (`CommandFailed`).
A reader that closes the pipe early (`disagg plan ... | head`) is not an error: exit 0.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from disagg import __version__
from disagg.commands.errors import CommandFailed, UsageError

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


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise KeyError(command)


def _quiet_closed_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush does not complain."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (captured in tests)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):  # no command: usage to stderr, exit 2 as argparse does
        parser.print_help(sys.stderr)
        return 2
    try:
        from disagg.commands import checks

        rest = argv[argv.index(args.command) + 1 :] if args.command in argv else argv
        given = checks.given_options(_subparser(parser, args.command), rest)
        checks.check(args.command, args, given)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        _quiet_closed_stdout()
        return 0
    except UsageError as exc:
        print(f"disagg {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except CommandFailed as exc:
        print(f"disagg {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        # Validation errors of the pure core name the offending input.
        print(f"disagg {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
