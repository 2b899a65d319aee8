"""The service-time model and SLO flags that `disagg plan`, `simulate` and `evaluate` share.

One table of the worked example's figures (`disagg.worked_example`), so the three commands
cannot drift apart: flag dest -> (type, default, help). A command takes the flags it
needs with `add_flags`; `plan` and `evaluate` leave them unset (None) so a value
given on the command line can be told from a default, `simulate` takes the defaults
directly. Standard library only: `disagg --help` stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from disagg import worked_example as we

# dest -> (type, worked-example default, help)
MODEL_FLAGS: dict[str, tuple[type, Any, str]] = {
    "encoder_fixed_ms": (float, we.ENCODER_FIXED_MS, "encoder: fixed ms per request"),
    "encoder_ms_per_item": (float, we.ENCODER_MS_PER_ITEM, "encoder: ms per media item"),
    "prefill_fixed_ms": (float, we.PREFILL_FIXED_MS, "prefill: fixed ms per request"),
    "prefill_ms_per_token": (float, we.PREFILL_MS_PER_TOKEN, "prefill: ms per prompt token"),
    "prefill_ms_per_token_sq": (float, 0.0, "prefill: quadratic term, ms per token squared"),
    "decode_step_ms": (float, we.DECODE_STEP_MS, "fixed decode step time, ms"),
    "decode_ms_per_seq": (float, 0.0, "added decode step ms per running sequence"),
    "decode_slots": (int, we.DECODE_SLOTS, "batch slots per decode replica"),
    "decode_kv_cache_tokens": (
        int,
        we.DECODE_KV_CACHE_TOKENS,
        "KV-cache capacity per decode replica, tokens",
    ),
    "kv_bytes_per_token": (float, float(we.KV_BYTES_PER_TOKEN), "KV-cache bytes per token (320 KiB)"),
    "link_setup_ms": (float, we.LINK_SETUP_MS, "KV transfer setup, ms"),
    "link_gibps": (float, we.LINK_GIBPS, "KV link bandwidth, GiB/s"),
    "chunk_tokens": (int, we.CHUNK_TOKENS, "tokens per streamed KV chunk"),
}
SLO_FLAGS: dict[str, tuple[type, Any, str]] = {
    "ttft": (float, we.TTFT_S, "TTFT target in seconds"),
    "ttft_per_1k": (
        float,
        0.0,
        "seconds added to the TTFT target per 1,000 prompt tokens (spec.slo.ttftSecondsPerThousandTokens)",
    ),
    "itl": (float, we.ITL_S, "ITL target in seconds"),
    "percentile": (float, we.PERCENTILE, "quantile of the targets, in (0,1)"),
}
FLAGS = {**MODEL_FLAGS, **SLO_FLAGS}

# A model, demand or SLO field as its ValueError names it -> the flag that sets it
FIELD_FLAGS = {
    "encoder.fixed_ms": "encoder-fixed-ms",
    "encoder.ms_per_item": "encoder-ms-per-item",
    "prefill.fixed_ms": "prefill-fixed-ms",
    "prefill.ms_per_token_sq": "prefill-ms-per-token-sq",
    "prefill.ms_per_token": "prefill-ms-per-token",
    "transfer.kv_bytes_per_token": "kv-bytes-per-token",
    "transfer.setup_ms": "link-setup-ms",
    "transfer.bandwidth_gibps": "link-gibps",
    "transfer.chunk_tokens": "chunk-tokens",
    "decode.step_fixed_ms": "decode-step-ms",
    "decode.step_ms_per_seq": "decode-ms-per-seq",
    "decode.slots": "decode-slots",
    "decode.kv_cache_tokens": "decode-kv-cache-tokens",
    "arrival_rps": "arrival-rate",
    "prompt_tokens_mean": "input-tokens",
    "prompt_tokens_std": "input-tokens-std",
    "output_tokens_mean": "output-tokens",
    "output_tokens_std": "output-tokens-std",
    "items_per_request": "items-per-request",
    "media_fraction": "media-fraction",
    "prefix_hit_rate": "prefix-hit-rate",
    "ttft_s": "ttft",
    "ttft_s_per_1k_tokens": "ttft-per-1k",
    "itl_s": "itl",
    "percentile": "percentile",
}
# A DisaggDeployment spec field (`disagg.evaluate.spec_for` names it in its error) -> the
# `disagg evaluate` flag that sets it
SPEC_FLAGS = {
    "autoscaling.intervalSeconds": "interval",
    "autoscaling.headroom": "headroom",
    "autoscaling.gpuBudget": "gpu-budget",
    "slo.ttftSeconds": "ttft",
    "slo.ttftSecondsPerThousandTokens": "ttft-per-1k",
    "slo.itlSeconds": "itl",
    "slo.percentile": "percentile",
    "placement.splitThresholdTokens": "split-threshold",
    "pools.encoder.gpusPerReplica": "encoder-gpus-per-replica",
    "pools.prefill.gpusPerReplica": "prefill-gpus-per-replica",
    "pools.decode.gpusPerReplica": "decode-gpus-per-replica",
}


def with_flag(msg: str) -> str | None:
    """`msg` (a ValueError's text) led by the flag of the field it names; None when it names none."""
    for field, flag in FIELD_FLAGS.items():
        if msg.startswith((f"{field} ", f"{field}:")):  # whole names: ttft_s is not ttft_s_per_1k_tokens
            return f"--{flag}: {msg}"
    for path, flag in SPEC_FLAGS.items():
        if f"spec.{path}:" in msg:
            return f"--{flag}: {msg}"
    return None


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
