"""Workloads for the simulator and the emulator: request records, generators, trace readers.

A `Workload` is a column store (numpy arrays) of requests sorted by arrival time:
``arrival_s``, ``prompt_tokens``, ``output_tokens``, ``media_items`` and optional
``hash_ids`` (prefix-block hashes, 512 tokens per block, as in the Mooncake traces).
Iterating it yields `Request` records. Generators are seedable and vectorised with
numpy; trace readers parse the Azure LLM inference CSV and the Mooncake JSONL
format, report malformed lines with their line number and detect the format.

Token-count arguments (``prompt_tokens``/``output_tokens``) accept a `TokenSpec`:
an int (constant), a ``(lo, hi)`` tuple (uniform integers, inclusive), or a callable
``f(rng, n) -> array`` for anything else.

Pure module: numpy and the standard library only.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date

import numpy as np

TRACE_FORMATS = ("azure", "mooncake")
BLOCK_TOKENS = 512  # tokens per prefix hash block (Mooncake convention)
# Most requests one workload may hold: a million simulate in ~30 s and take ~100 MB with their
# per-request records, so this is minutes and a few GB; a rate typed 1000x too high fails fast.
MAX_REQUESTS = 20_000_000


def check_request_count(expected: float, what: str) -> None:
    """Refuse a workload of about `expected` requests when that is over `MAX_REQUESTS`."""
    if not expected <= MAX_REQUESTS:
        raise ValueError(
            f"{what} is about {expected:,.0f} requests; one workload holds at most {MAX_REQUESTS:,}"
        )


TokenSpec = int | tuple[int, int] | Callable[[np.random.Generator, int], np.ndarray]


@dataclass(slots=True)
class Request:
    """One request: when it arrives and how much work it carries."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    media_items: int = 0
    hash_ids: tuple[int, ...] | None = None


class Workload:
    """Requests as numpy columns, sorted by arrival time (seconds from the start)."""

    __slots__ = ("arrival_s", "hash_ids", "media_items", "name", "output_tokens", "prompt_tokens", "skipped")

    def __init__(
        self,
        arrival_s: Sequence[float] | np.ndarray,
        prompt_tokens: Sequence[int] | np.ndarray,
        output_tokens: Sequence[int] | np.ndarray,
        media_items: Sequence[int] | np.ndarray | None = None,
        hash_ids: list[tuple[int, ...] | None] | None = None,
        name: str = "",
        skipped: int = 0,
    ) -> None:
        arrival = np.asarray(arrival_s, dtype=np.float64)
        prompt = np.asarray(prompt_tokens, dtype=np.int64)
        output = np.asarray(output_tokens, dtype=np.int64)
        n = arrival.shape[0]
        media = (
            np.zeros(n, dtype=np.int64) if media_items is None else np.asarray(media_items, dtype=np.int64)
        )
        if not (prompt.shape[0] == output.shape[0] == media.shape[0] == n):
            raise ValueError("workload columns have different lengths")
        if hash_ids is not None and len(hash_ids) != n:
            raise ValueError("hash_ids has a different length than the workload")
        if n:
            if np.any(prompt < 1) or np.any(output < 1):
                raise ValueError("prompt and output tokens must be >= 1")
            if np.any(media < 0):
                raise ValueError("media_items must be >= 0")
            if not np.all(np.isfinite(arrival)) or np.any(arrival < 0):
                raise ValueError("arrival times must be finite and >= 0")
            if np.any(np.diff(arrival) < 0):
                order = np.argsort(arrival, kind="stable")
                arrival, prompt, output, media = arrival[order], prompt[order], output[order], media[order]
                if hash_ids is not None:
                    hash_ids = [hash_ids[i] for i in order.tolist()]
        self.arrival_s = arrival
        self.prompt_tokens = prompt
        self.output_tokens = output
        self.media_items = media
        self.hash_ids = hash_ids
        self.name = name
        self.skipped = skipped

    @classmethod
    def from_requests(cls, requests: Sequence[Request], name: str = "") -> Workload:
        hashes = [r.hash_ids for r in requests]
        return cls(
            [r.arrival_s for r in requests],
            [r.prompt_tokens for r in requests],
            [r.output_tokens for r in requests],
            [r.media_items for r in requests],
            hashes if any(h is not None for h in hashes) else None,
            name=name,
        )

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    def __getitem__(self, i: int) -> Request:
        return Request(
            float(self.arrival_s[i]),
            int(self.prompt_tokens[i]),
            int(self.output_tokens[i]),
            int(self.media_items[i]),
            None if self.hash_ids is None else self.hash_ids[i],
        )

    def __iter__(self) -> Iterator[Request]:
        hashes = self.hash_ids if self.hash_ids is not None else [None] * len(self)
        for a, p, o, m, h in zip(
            self.arrival_s.tolist(),
            self.prompt_tokens.tolist(),
            self.output_tokens.tolist(),
            self.media_items.tolist(),
            hashes,
            strict=True,
        ):
            yield Request(a, p, o, m, h)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    @property
    def mean_rate(self) -> float:
        d = self.duration_s
        return len(self) / d if d > 0 else 0.0

    def head(self, n: int) -> Workload:
        return Workload(
            self.arrival_s[:n],
            self.prompt_tokens[:n],
            self.output_tokens[:n],
            self.media_items[:n],
            None if self.hash_ids is None else self.hash_ids[:n],
            name=self.name,
            skipped=self.skipped,
        )

    def summary(self) -> dict:
        return {
            "name": self.name,
            "requests": len(self),
            "duration_s": self.duration_s,
            "mean_rate": self.mean_rate,
            "mean_prompt_tokens": float(self.prompt_tokens.mean()) if len(self) else 0.0,
            "mean_output_tokens": float(self.output_tokens.mean()) if len(self) else 0.0,
            "skipped_lines": self.skipped,
        }


# --------------------------------------------------------------------------- generators


def _tokens(rng: np.random.Generator, n: int, spec: TokenSpec, what: str) -> np.ndarray:
    if callable(spec):
        out = np.asarray(spec(rng, n), dtype=np.int64)
        if out.shape != (n,):
            raise ValueError(f"{what}: token generator returned shape {out.shape}, expected ({n},)")
        return np.maximum(out, 1)
    if isinstance(spec, tuple):
        lo, hi = int(spec[0]), int(spec[1])
        if lo < 1 or hi < lo:
            raise ValueError(f"{what}: bad token range {spec}")
        return rng.integers(lo, hi + 1, size=n, dtype=np.int64)
    value = int(spec)
    if value < 1:
        raise ValueError(f"{what}: tokens must be >= 1, got {value}")
    return np.full(n, value, dtype=np.int64)


def _media(rng: np.random.Generator, n: int, media_fraction: float, media_items: int) -> np.ndarray:
    if not 0.0 <= media_fraction <= 1.0:
        raise ValueError(f"media_fraction must be in [0, 1], got {media_fraction}")
    if media_fraction == 0.0:
        return np.zeros(n, dtype=np.int64)
    return np.where(rng.random(n) < media_fraction, media_items, 0).astype(np.int64)


def with_media(w: Workload, media_fraction: float, media_items: int, seed: int | None = 0) -> Workload:
    """`w` with a seeded share `media_fraction` of its requests carrying `media_items` media items.

    For traces without media (Azure, Mooncake): a synthetic multimodal mix on real arrivals.
    Requests that already carry media keep theirs.
    """
    if media_fraction > 0 and media_items < 1:
        raise ValueError(f"media_items must be >= 1, got {media_items}")
    media = _media(np.random.default_rng(seed), len(w), media_fraction, media_items)
    return Workload(
        w.arrival_s,
        w.prompt_tokens,
        w.output_tokens,
        np.maximum(w.media_items, media),
        w.hash_ids,
        name=f"{w.name} +media({media_fraction:g}x{media_items})" if media_fraction > 0 else w.name,
    )


def with_coarse_timestamps(w: Workload, quantum_s: float) -> Workload:
    """`w` with every arrival floored to a multiple of `quantum_s` seconds: the requests of each
    quantum arrive together, as a trace with coarse timestamps replays them (the order is kept)."""
    if not (math.isfinite(quantum_s) and quantum_s > 0):
        raise ValueError(f"quantum_s must be > 0, got {quantum_s!r}")
    return Workload(
        np.floor(w.arrival_s / quantum_s) * quantum_s,
        w.prompt_tokens,
        w.output_tokens,
        w.media_items,
        w.hash_ids,
        name=f"{w.name} (timestamps floored to {quantum_s:g} s)",
    )


def _build(
    arrivals: np.ndarray,
    rng: np.random.Generator,
    prompt_tokens: TokenSpec,
    output_tokens: TokenSpec,
    media_fraction: float,
    media_items: int,
    name: str,
) -> Workload:
    n = arrivals.shape[0]
    return Workload(
        arrivals,
        _tokens(rng, n, prompt_tokens, "prompt_tokens"),
        _tokens(rng, n, output_tokens, "output_tokens"),
        _media(rng, n, media_fraction, media_items),
        name=name,
    )


def poisson(
    rate: float,
    duration_s: float | None = None,
    *,
    n: int | None = None,
    prompt_tokens: TokenSpec = 1000,
    output_tokens: TokenSpec = 200,
    media_fraction: float = 0.0,
    media_items: int = 1,
    seed: int | None = 0,
) -> Workload:
    """Poisson arrivals at `rate` req/s, over `duration_s` seconds or for exactly `n` requests."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if (duration_s is None) == (n is None):
        raise ValueError("give exactly one of duration_s and n")
    rng = np.random.default_rng(seed)
    if n is not None:
        check_request_count(n, f"{n} requests")
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=int(n)))
    else:
        if not duration_s > 0:
            raise ValueError(f"duration must be > 0, got {duration_s}")
        check_request_count(rate * duration_s, f"{rate:g} req/s for {duration_s:g} s")
        count = rng.poisson(rate * duration_s)
        arrivals = np.sort(rng.uniform(0.0, duration_s, size=count))
    return _build(
        arrivals, rng, prompt_tokens, output_tokens, media_fraction, media_items, f"poisson({rate:g}/s)"
    )


def piecewise_poisson(
    segments: Sequence[tuple[float, float]],
    rng: np.random.Generator,
) -> np.ndarray:
    """Arrival times of a Poisson process whose rate is constant on each (length_s, rate) segment."""
    if any(rate < 0 or length < 0 for length, rate in segments):
        raise ValueError("segment rates and lengths must be >= 0")
    check_request_count(sum(rate * length for length, rate in segments), "that arrival process")
    out = []
    t0 = 0.0
    for length, rate in segments:
        k = rng.poisson(rate * length) if rate > 0 else 0
        if k:
            out.append(np.sort(rng.uniform(t0, t0 + length, size=k)))
        t0 += length
    return np.concatenate(out) if out else np.zeros(0)


def burst(
    low_rate: float,
    high_rate: float,
    period_s: float,
    duration_s: float,
    *,
    duty: float = 0.5,
    prompt_tokens: TokenSpec = 1000,
    output_tokens: TokenSpec = 200,
    media_fraction: float = 0.0,
    media_items: int = 1,
    seed: int | None = 0,
) -> Workload:
    """Square-wave Poisson: `high_rate` for `duty` of each period (first), `low_rate` for the rest."""
    if not period_s > 0 or not duration_s > 0:
        raise ValueError("period and duration must be > 0")
    if not 0.0 < duty < 1.0:
        raise ValueError(f"duty must be in (0, 1), got {duty}")
    rng = np.random.default_rng(seed)
    segments: list[tuple[float, float]] = []
    t = 0.0
    while t < duration_s:
        hi = min(period_s * duty, duration_s - t)
        segments.append((hi, high_rate))
        t += hi
        lo = min(period_s * (1 - duty), duration_s - t)
        if lo > 0:
            segments.append((lo, low_rate))
            t += lo
    arrivals = piecewise_poisson(segments, rng)
    name = f"burst({low_rate:g}/{high_rate:g} per {period_s:g}s)"
    return _build(arrivals, rng, prompt_tokens, output_tokens, media_fraction, media_items, name)


def spikes(
    base_rate: float,
    spike_rate: float,
    every_s: float,
    spike_s: float,
    duration_s: float,
    **kwargs,
) -> Workload:
    """Short spikes at `spike_rate` lasting `spike_s`, every `every_s` seconds, over `base_rate`."""
    if not 0 < spike_s < every_s:
        raise ValueError("need 0 < spike_s < every_s")
    return burst(base_rate, spike_rate, every_s, duration_s, duty=spike_s / every_s, **kwargs)


def mix(
    rate: float,
    duration_s: float | None = None,
    *,
    n: int | None = None,
    short_tokens: TokenSpec = 500,
    long_tokens: TokenSpec = 6000,
    long_fraction: float = 0.2,
    output_tokens: TokenSpec = 400,
    arrivals: np.ndarray | None = None,
    media_fraction: float = 0.0,
    media_items: int = 1,
    seed: int | None = 0,
) -> Workload:
    """Poisson (or given `arrivals`) mix of short and long prompts; `long_fraction` are long."""
    if not 0.0 <= long_fraction <= 1.0:
        raise ValueError(f"long_fraction must be in [0, 1], got {long_fraction}")
    rng = np.random.default_rng(seed)
    if arrivals is None:
        arrivals = poisson(rate, duration_s, n=n, seed=int(rng.integers(2**31))).arrival_s
    k = arrivals.shape[0]
    is_long = rng.random(k) < long_fraction
    prompt = np.where(
        is_long,
        _tokens(rng, k, long_tokens, "long_tokens"),
        _tokens(rng, k, short_tokens, "short_tokens"),
    )
    return Workload(
        arrivals,
        prompt,
        _tokens(rng, k, output_tokens, "output_tokens"),
        _media(rng, k, media_fraction, media_items),
        name=f"mix({long_fraction:.0%} long)",
    )


# --------------------------------------------------------------------------- traces


class _Rows:
    """Accumulates parsed rows; applies the on_error policy to bad lines."""

    __slots__ = ("arrival", "hashes", "on_error", "output", "path", "prompt", "skipped")

    def __init__(self, path: str, on_error: str) -> None:
        if on_error not in ("skip", "stop"):
            raise ValueError(f"on_error must be 'skip' or 'stop', got {on_error!r}")
        self.path = path
        self.on_error = on_error
        self.arrival: list[float] = []
        self.prompt: list[int] = []
        self.output: list[int] = []
        self.hashes: list[tuple[int, ...] | None] = []
        self.skipped = 0

    def bad(self, lineno: int, why: str) -> None:
        if self.on_error == "stop":
            raise ValueError(f"{self.path}:{lineno}: {why}")
        self.skipped += 1


def _check_tokens(prompt: int, output: int) -> str | None:
    if prompt < 1:
        return f"prompt tokens must be >= 1, got {prompt}"
    if output < 1:
        return f"output tokens must be >= 1, got {output}"
    return None


_DAY_CACHE: dict[str, float] = {}
_EPOCH_ORDINAL = date(2000, 1, 1).toordinal()


def _azure_seconds(ts: str) -> tuple[float, float]:
    """(day offset s since 2000-01-01, seconds in the day) of 'YYYY-MM-DD HH:MM:SS[.fffffff]'.

    Parsed by hand (fast). The two parts stay separate so that, once the first
    row's day is subtracted, float64 keeps the 7-digit fraction exactly.
    """
    day = _DAY_CACHE.get(ts[:10])
    if day is None:
        y, m, d = ts[:10].split("-")
        day = float((date(int(y), int(m), int(d)).toordinal() - _EPOCH_ORDINAL) * 86400)
        _DAY_CACHE[ts[:10]] = day
    if ts[10] not in " T" or ts[13] != ":" or ts[16] != ":":
        raise ValueError("bad time")
    secs = int(ts[11:13]) * 3600 + int(ts[14:16]) * 60 + int(ts[17:19])
    if len(ts) > 19:
        if ts[19] != ".":
            raise ValueError("bad fraction")
        frac = ts[20:]
        if not frac.isdigit():
            raise ValueError("bad fraction")
        return day, secs + int(frac) / 10 ** len(frac)
    if len(ts) != 19:
        raise ValueError("bad time")
    return day, float(secs)


def _read_azure(path: str, rows: _Rows, limit: int | None) -> None:
    with open(path, encoding="utf-8") as fh:
        header = fh.readline()
        cols = [c.strip() for c in header.strip().split(",")]
        try:
            it, ic, ig = cols.index("TIMESTAMP"), cols.index("ContextTokens"), cols.index("GeneratedTokens")
        except ValueError:
            raise ValueError(
                f"{path}:1: expected header TIMESTAMP,ContextTokens,GeneratedTokens, got {header.strip()!r}"
            ) from None
        width = len(cols)
        arrival, prompt, output = rows.arrival, rows.prompt, rows.output
        day0 = None
        for lineno, line in enumerate(fh, start=2):
            if limit is not None and len(arrival) >= limit:
                break
            line = line.strip()
            if not line:
                continue
            parts = line.split(",")
            if len(parts) != width:
                rows.bad(lineno, f"expected {width} fields, got {len(parts)}")
                continue
            try:
                day, t = _azure_seconds(parts[it].strip())
                p = int(parts[ic])
                o = int(parts[ig])
            except (ValueError, IndexError):
                rows.bad(lineno, f"cannot parse {line!r}")
                continue
            why = _check_tokens(p, o)
            if why:
                rows.bad(lineno, why)
                continue
            if day0 is None:
                day0 = day
            arrival.append((day - day0) + t)
            prompt.append(p)
            output.append(o)


def _read_mooncake(path: str, rows: _Rows, limit: int | None) -> None:
    loads = json.loads
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if limit is not None and len(rows.arrival) >= limit:
                break
            if not line.strip():
                continue
            try:
                rec = loads(line)
                t = float(rec["timestamp"]) / 1000.0
                p = int(rec["input_length"])
                o = int(rec["output_length"])
                h = rec.get("hash_ids")
                hashes = tuple(int(x) for x in h) if h is not None else None
            except (ValueError, KeyError, TypeError) as exc:
                rows.bad(lineno, f"cannot parse record ({type(exc).__name__}: {exc})")
                continue
            why = _check_tokens(p, o)
            if why or not np.isfinite(t):
                rows.bad(lineno, why or "timestamp is not finite")
                continue
            rows.arrival.append(t)
            rows.prompt.append(p)
            rows.output.append(o)
            rows.hashes.append(hashes)


def detect_format(path: str) -> str:
    """'azure' or 'mooncake', from the extension or the first line; ValueError otherwise."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".csv":
        return "azure"
    if ext in (".jsonl", ".json", ".ndjson"):
        return "mooncake"
    with open(path, encoding="utf-8", errors="replace") as fh:
        first = fh.readline().strip()
    if first.startswith("{") and "input_length" in first:
        return "mooncake"
    if "TIMESTAMP" in first and "ContextTokens" in first:
        return "azure"
    raise ValueError(f"{path}: cannot detect the trace format; known formats: {', '.join(TRACE_FORMATS)}")


def load_trace(
    path: str,
    format: str = "auto",
    *,
    time_scale: float = 1.0,
    on_error: str = "stop",
    limit: int | None = None,
) -> Workload:
    """Read a trace; arrivals are seconds from the first request, multiplied by `time_scale`.

    ``time_scale=0.5`` replays twice as fast (double the rate), ``2`` half as fast.
    ``on_error='stop'`` raises ``ValueError("file:line: ...")`` on the first malformed
    line; ``'skip'`` drops such lines and counts them in ``Workload.skipped``.
    """
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in TRACE_FORMATS:
        raise ValueError(f"unknown trace format {format!r}; known formats: auto, {', '.join(TRACE_FORMATS)}")
    rows = _Rows(path, on_error)
    if fmt == "azure":
        _read_azure(path, rows, limit)
    else:
        _read_mooncake(path, rows, limit)
    arrival = np.asarray(rows.arrival, dtype=np.float64)
    if arrival.size:
        arrival = (arrival - arrival.min()) * time_scale
    hashes = rows.hashes if fmt == "mooncake" and any(h is not None for h in rows.hashes) else None
    return Workload(
        arrival,
        rows.prompt,
        rows.output,
        None,
        hashes,
        name=f"{fmt}:{os.path.basename(path)}",
        skipped=rows.skipped,
    )
