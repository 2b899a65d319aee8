"""The two ways a `disagg` command stops with an error (printed by `disagg.cli.main` as one line).

They live here, not in `disagg.cli`, so that `python -m disagg.cli` (where the CLI module runs as
`__main__`) and the commands, which import them, share one class each.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class CommandFailed(Exception):
    """The command ran but could not do its job (e.g. no plan meets the SLO): one line, exit code 1."""
