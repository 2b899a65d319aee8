"""The trace flags that `disagg evaluate`, `simulate`, `replay` and `emulate` share.

`add_window_flags` adds ``--trace-start`` and ``--trace-duration`` (an hour of a week-long
trace, read without holding the week); `read_trace` loads a trace with them, turns an
unreadable file or a malformed line into a one-line `UsageError`, and says on stderr what
was left out (failed requests, skipped lines) and which window was read. Standard library
only at import: `disagg --help` stays fast.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from disagg.commands.errors import UsageError

FORMAT_CHOICES = ("auto", "azure", "burstgpt", "mooncake")
FORMAT_HELP = (
    "trace format: azure (Azure LLM inference CSV, 2023 or 2024), burstgpt (BurstGPT CSV), "
    "mooncake (JSON Lines) or auto (default: from the first line)"
)
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def seconds(text: str) -> float:
    """A duration: plain seconds ('5400') or a number with a unit s, m, h or d ('90m', '1.5h')."""
    t = text.strip().lower()
    scale = _UNIT_S.get(t[-1:]) if t else None
    number = t[:-1] if scale is not None else t
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (seconds, or e.g. 90m, 2h, 1d)") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"a duration must be finite and >= 0, got {text!r}")
    return value


def add_window_flags(group: Any) -> None:
    """``--trace-start`` and ``--trace-duration`` on an argparse parser or group."""
    group.add_argument(
        "--trace-start",
        type=seconds,
        default=0.0,
        metavar="DURATION",
        help="read the trace from this long after its first request (seconds, or 90m, 2h, 1d; default 0)",
    )
    group.add_argument(
        "--trace-duration",
        type=seconds,
        metavar="DURATION",
        help="read only this much of the trace from --trace-start (default: to its end)",
    )


def read_trace(args: argparse.Namespace, *, fmt: str = "auto", quiet: bool = False, **kw: Any) -> Any:
    """`disagg.workload.load_trace` of ``args.trace`` in the window of ``args``; UsageError on bad input."""
    from disagg.workload import load_trace

    start, duration = args.trace_start, args.trace_duration
    if duration is not None and duration <= 0:
        raise UsageError(f"--trace-duration must be > 0, got {duration:g}")
    try:
        w = load_trace(args.trace, fmt, start_s=start, duration_s=duration, **kw)
    except FileNotFoundError:
        raise UsageError(f"trace file not found: {args.trace}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {args.trace}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"cannot read trace: {exc}") from None
    if not quiet:
        notes = []
        if start or duration is not None:
            end = "its end" if duration is None else f"{start + duration:g} s"
            notes.append(f"read {len(w)} requests from {start:g} s to {end} after the first")
        if w.failed:
            notes.append(f"left out {w.failed} failed requests (no output tokens)")
        if w.skipped:
            notes.append(f"skipped {w.skipped} malformed lines")
        if notes:
            print(f"{args.trace}: " + "; ".join(notes), file=sys.stderr, flush=True)
    return w
