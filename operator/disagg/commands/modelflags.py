"""The service-time model and SLO flags that `disagg plan`, `simulate` and `evaluate` share.

One table of the worked example's figures (docs/planner.md), so the three commands
cannot drift apart: flag dest -> (type, default, help). A command takes the flags it
needs with `add_flags`; `plan` and `evaluate` leave them unset (None) so a value
given on the command line can be told from a default, `simulate` takes the defaults
directly. Standard library only: `disagg --help` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

# dest -> (type, worked-example default, help)
MODEL_FLAGS: dict[str, tuple[type, Any, str]] = {
    "encoder_fixed_ms": (float, 15.0, "encoder: fixed ms per request"),
    "encoder_ms_per_item": (float, 25.0, "encoder: ms per media item"),
    "prefill_fixed_ms": (float, 20.0, "prefill: fixed ms per request"),
    "prefill_ms_per_token": (float, 0.035, "prefill: ms per prompt token"),
    "prefill_ms_per_token_sq": (float, 0.0, "prefill: quadratic term, ms per token squared"),
    "decode_step_ms": (float, 45.0, "fixed decode step time, ms"),
    "decode_ms_per_seq": (float, 0.0, "added decode step ms per running sequence"),
    "decode_slots": (int, 32, "batch slots per decode replica"),
    "kv_bytes_per_token": (float, 327680.0, "KV-cache bytes per token (320 KiB)"),
    "link_setup_ms": (float, 12.0, "KV transfer setup, ms"),
    "link_gibps": (float, 22.0, "KV link bandwidth, GiB/s"),
    "chunk_tokens": (int, 2000, "tokens per streamed KV chunk"),
}
SLO_FLAGS: dict[str, tuple[type, Any, str]] = {
    "ttft": (float, 0.6, "TTFT target in seconds"),
    "itl": (float, 0.15, "ITL target in seconds"),
    "percentile": (float, 0.9, "quantile of the targets, in (0,1)"),
}
FLAGS = {**MODEL_FLAGS, **SLO_FLAGS}


def defaults(names: list[str] | tuple[str, ...] | None = None) -> dict[str, Any]:
    """The worked example's value of each flag in `names` (default: every flag)."""
    return {k: FLAGS[k][1] for k in (names or FLAGS)}


def add_flags(
    group: argparse._ActionsContainer,
    names: list[str] | tuple[str, ...],
    *,
    unset: bool = True,
    overrides: dict[str, Any] | None = None,
    helps: dict[str, str] | None = None,
) -> None:
    """Add `--name` for each dest in `names`; `overrides` replaces a default, `helps` a help text.

    With ``unset`` the argparse default is None (the command resolves it from
    `defaults`); otherwise the default itself.
    """
    over = overrides or {}
    for name in names:
        typ, d, text = FLAGS[name]
        d = over.get(name, d)
        text = (helps or {}).get(name, text)
        flag = "--" + name.replace("_", "-")
        group.add_argument(flag, type=typ, default=None if unset else d, help=f"{text} (default {d:g})")


# The choices of disagg.model.ITL_STATISTICS (repeated here to keep `disagg --help` free of numpy;
# tests/unit/test_itl_tokens.py checks they agree).
ITL_STATISTIC_CHOICES = ("max", "p99", "mean")


def add_itl_statistic_flag(group: argparse._ActionsContainer, *, unset: bool = False) -> None:
    """`--itl-statistic`: how one request's inter-token gaps meet the ITL target (`unset`: default None)."""
    group.add_argument(
        "--itl-statistic",
        choices=ITL_STATISTIC_CHOICES,
        default=None if unset else ITL_STATISTIC_CHOICES[0],
        help="a request meets --itl when its max gap (default: one stall is a breach), "
        "99th percentile gap or mean gap does",
    )
