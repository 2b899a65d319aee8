"""`disagg replay`: send a trace's requests through an OpenAI-compatible endpoint at their timestamps.

Each request becomes a streaming chat completion sent at its own time (open loop);
every response must end with its final chunk and usage. Prints one summary line
(client-side TTFT / inter-token gap percentiles, failed and truncated responses);
--summary-json also writes it as JSON. Exit code 1 if any response failed or was cut.

    disagg replay --endpoint http://127.0.0.1:8090/v1 --trace trace.jsonl --time-scale 0.5 --limit 200
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from disagg.commands import traceflags


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "replay",
        help="replay a trace through an OpenAI-compatible endpoint (streaming, at the trace's timestamps)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--endpoint", required=True, help="base URL ending in /v1, e.g. http://127.0.0.1:8090/v1")
    p.add_argument(
        "--trace", required=True, metavar="FILE", help="Azure or BurstGPT CSV, or Mooncake JSONL trace"
    )
    p.add_argument("--format", choices=traceflags.FORMAT_CHOICES, default="auto", help=traceflags.FORMAT_HELP)
    traceflags.add_window_flags(p)
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply arrival times (0.5: twice as fast)"
    )
    p.add_argument("--limit", type=int, default=None, help="only the first N requests")
    p.add_argument("--max-output-tokens", type=int, default=None, help="cap each request's max_tokens")
    p.add_argument("--model", default="emulated", help="model name sent in the requests")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    p.add_argument("--summary-json", metavar="FILE", help="also write the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from disagg.cli import UsageError
    from disagg.replay import Replay, format_summary, summarize

    if not args.endpoint.startswith(("http://", "https://")):
        raise UsageError(f"--endpoint must be an http(s) URL, got {args.endpoint!r}")
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be >= 1")
    w = traceflags.read_trace(args, fmt=args.format, time_scale=args.time_scale, limit=args.limit)
    rp = Replay(
        args.endpoint.rstrip("/"),
        model=args.model,
        max_output_tokens=args.max_output_tokens,
        timeout_s=args.timeout,
    )
    asyncio.run(rp.run(w.arrival_s.tolist(), w.prompt_tokens.tolist(), w.output_tokens.tolist()))
    s = summarize(rp.results)
    print(format_summary(s), flush=True)
    if args.summary_json:
        with open(args.summary_json, "w") as fh:
            json.dump(s, fh, indent=2, sort_keys=True)
            fh.write("\n")
    return 0 if s["failed"] == 0 and s["truncated"] == 0 else 1
