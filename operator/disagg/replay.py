"""Replay a trace through an OpenAI-compatible endpoint: each request at its own timestamp.

Reads a trace (Azure or BurstGPT CSV, Mooncake JSONL: `disagg.workload.load_trace`) and
sends each request as a streaming chat completion at ``t0 + arrival_s`` (open loop:
a slow endpoint does not slow the arrivals). A prompt of N tokens is N words, the
emulated engines' counting rule (docs/emulator.md); against a real engine the prompt
is about 1.3x longer in its tokenizer's tokens. ``max_tokens`` is the trace's output
length (optionally capped).

Every response is checked the way a client would: it must stream its tokens, end
with a ``finish_reason`` chunk and a usage chunk whose ``completion_tokens`` equals
``max_tokens``, then ``[DONE]``. Anything else is counted as failed (an HTTP error or
a refused connection) or truncated (a stream cut short).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field

DONE_LINE = b"data: [DONE]"


@dataclass
class Result:
    index: int
    scheduled_s: float  # when the request was due, from the start
    sent_s: float = math.nan  # when it was sent
    ttft_s: float = math.nan
    itl_s: float = math.nan  # mean gap between tokens
    e2e_s: float = math.nan
    status: str = "pending"  # ok | failed | truncated
    detail: str = ""


@dataclass
class Replay:
    endpoint: str  # base URL ending in /v1
    model: str = "emulated"
    max_output_tokens: int | None = None
    timeout_s: float = 600.0
    results: list[Result] = field(default_factory=list)

    async def one(self, session, r: Result, prompt_tokens: int, output_tokens: int, t0: float) -> None:
        import aiohttp

        out = output_tokens if self.max_output_tokens is None else min(output_tokens, self.max_output_tokens)
        out = max(1, out)
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": " ".join(["w"] * max(1, prompt_tokens))}],
            "max_tokens": out,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start = time.monotonic()
        r.sent_s = start - t0
        times: list[float] = []
        finish = usage = None
        done = False
        try:
            async with session.post(f"{self.endpoint}/chat/completions", json=body) as resp:
                if resp.status != 200:
                    r.status, r.detail = "failed", f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    return
                async for line in resp.content:
                    if line.startswith(DONE_LINE):
                        done = True
                        continue
                    if not line.startswith(b"data: "):
                        continue
                    ev = json.loads(line[6:])
                    if ev.get("usage"):
                        usage = ev["usage"]
                    for c in ev.get("choices") or []:
                        delta = c.get("delta") or {}
                        if delta.get("content"):
                            times.append(time.monotonic() - start)
                        if c.get("finish_reason"):
                            finish = c["finish_reason"]
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            r.status, r.detail = ("truncated" if times else "failed"), f"{type(exc).__name__}: {exc}"[:200]
            return
        r.e2e_s = time.monotonic() - start
        if not done or finish is None or not usage or usage.get("completion_tokens") != out or not times:
            r.status = "truncated"
            r.detail = f"done={done} finish={finish} usage={usage} tokens={len(times)}"
            return
        r.status = "ok"
        r.ttft_s = times[0]
        r.itl_s = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0

    async def run(self, arrival_s, prompt_tokens, output_tokens) -> list[Result]:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
            t0 = time.monotonic()
            tasks = []
            for i, (t, p, o) in enumerate(zip(arrival_s, prompt_tokens, output_tokens, strict=True)):
                delay = t0 + float(t) - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                r = Result(i, float(t))
                self.results.append(r)
                tasks.append(asyncio.create_task(self.one(session, r, int(p), int(o), t0)))
            await asyncio.gather(*tasks)
        return self.results


def summarize(results: list[Result]) -> dict:
    import numpy as np

    def pct(xs: list[float]) -> dict:
        if not xs:
            return {"p50": None, "p90": None, "p99": None}
        a = np.asarray(xs)
        return {f"p{q}": float(np.percentile(a, q)) for q in (50, 90, 99)}

    ok = [r for r in results if r.status == "ok"]
    lateness = [r.sent_s - r.scheduled_s for r in results if not math.isnan(r.sent_s)]
    return {
        "requests": len(results),
        "ok": len(ok),
        "failed": sum(r.status == "failed" for r in results),
        "truncated": sum(r.status == "truncated" for r in results),
        "ttft_s": pct([r.ttft_s for r in ok]),
        "itl_s": pct([r.itl_s for r in ok]),
        "e2e_s": pct([r.e2e_s for r in ok]),
        "send_lateness_s": {"max": max(lateness) if lateness else None},
        "errors": [f"#{r.index}: {r.detail}" for r in results if r.status != "ok"][:10],
    }


def format_summary(s: dict) -> str:
    def ms(d: dict) -> str:
        return "/".join("-" if d[k] is None else f"{d[k] * 1e3:.0f}ms" for k in ("p50", "p90", "p99"))

    late = s["send_lateness_s"]["max"]
    return (
        f"replay summary: requests={s['requests']} ok={s['ok']} failed={s['failed']} "
        f"truncated={s['truncated']} ttft p50/p90/p99={ms(s['ttft_s'])} itl p50/p90/p99={ms(s['itl_s'])} "
        f"max send lateness={'-' if late is None else f'{late * 1e3:.0f}ms'}"
        + (f"\nfirst errors: {'; '.join(s['errors'][:3])}" if s["errors"] else "")
    )
