"""Workloads for the simulator and the emulator: request records, generators, trace readers.

A `Workload` is a column store (numpy arrays) of requests sorted by arrival time:
``arrival_s``, ``prompt_tokens``, ``output_tokens``, ``media_items`` and optional
``hash_ids`` (prefix-block hashes, 512 tokens per block, as in the Mooncake traces).
Iterating it yields `Request` records. Generators are seedable and vectorised with
numpy; trace readers parse the Azure LLM inference CSV (2023 and 2024), the BurstGPT
CSV and the Mooncake JSONL format, detect the format from the first line, report
malformed lines with their line number, count failed requests and read a time window.

Token-count arguments (``prompt_tokens``/``output_tokens``) accept a `TokenSpec`:
an int (constant), a ``(lo, hi)`` tuple (uniform integers, inclusive), or a callable
``f(rng, n) -> array`` for anything else.

Pure module: numpy and the standard library only.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date

import numpy as np

TRACE_FORMATS = ("azure", "burstgpt", "mooncake")
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

    __slots__ = (
        "arrival_s",
        "failed",
        "hash_ids",
        "media_items",
        "name",
        "output_tokens",
        "prompt_tokens",
        "skipped",
    )

    def __init__(
        self,
        arrival_s: Sequence[float] | np.ndarray,
        prompt_tokens: Sequence[int] | np.ndarray,
        output_tokens: Sequence[int] | np.ndarray,
        media_items: Sequence[int] | np.ndarray | None = None,
        hash_ids: list[tuple[int, ...] | None] | None = None,
        name: str = "",
        skipped: int = 0,
        failed: int = 0,
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
        self.skipped = skipped  # malformed trace lines left out (on_error='skip')
        self.failed = failed  # trace rows of failed requests (no output tokens), left out

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

    def busiest_rate(self, window_s: float) -> float:
        """The highest arrival rate over any `window_s` seconds (requests per second): the most
        requests in a window starting at one of them, over `window_s`; 0 without requests."""
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        t = self.arrival_s
        if t.size == 0:
            return 0.0
        ends = np.searchsorted(t, t + window_s, side="left")
        return float((ends - np.arange(t.size)).max()) / window_s

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
            failed=self.failed,
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
            "failed_requests": self.failed,
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


def thinned(w: Workload, k: int, seed: int = 0) -> Workload:
    """`w` with each request kept with probability 1 / `k` (seeded): the same arrival pattern at
    a k-th of its rate, as a deployment with a k-th of the traffic sees it.

    Independent thinning keeps every burst where it was, k times smaller, and the mix of
    prompt and output lengths; a burst of batched requests stays a burst of smaller batches.
    ``k`` = 1 is `w` itself. Refuses (ValueError) a `k` below 1 or not whole, and a thinning
    that leaves fewer than two requests (nothing to replay).
    """
    if not (isinstance(k, int | np.integer) and k >= 1):
        raise ValueError(f"thinning keeps one request in k: k must be a whole number >= 1, got {k!r}")
    if k == 1:
        return w
    keep = np.flatnonzero(np.random.default_rng(seed).random(len(w)) < 1.0 / k)
    if keep.size < 2:
        raise ValueError(
            f"one request in {k} of {len(w):,} leaves {keep.size} (at least two are needed to replay)"
        )
    return Workload(
        w.arrival_s[keep],
        w.prompt_tokens[keep],
        w.output_tokens[keep],
        w.media_items[keep],
        None if w.hash_ids is None else [w.hash_ids[i] for i in keep.tolist()],
        name=f"{w.name} (one request in {k})",
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


def random_bursts(
    low_rate: float,
    high_rate: float,
    mean_low_s: float,
    mean_high_s: float,
    duration_s: float,
    *,
    prompt_tokens: TokenSpec = 1000,
    output_tokens: TokenSpec = 200,
    media_fraction: float = 0.0,
    media_items: int = 1,
    seed: int | None = 0,
) -> Workload:
    """On/off traffic at random times: a two-state Markov-modulated Poisson source.

    Poisson at `low_rate` for an exponential time of mean `mean_low_s`, then at
    `high_rate` for one of mean `mean_high_s`, and so on, starting low. Unlike
    `burst`'s square wave, no burst can be foreseen from the last one: the
    classic model of traffic that switches between levels (Heffes and Lucantoni).
    """
    if not (low_rate >= 0 and high_rate >= 0 and math.isfinite(low_rate) and math.isfinite(high_rate)):
        raise ValueError(f"rates must be finite and >= 0, got {low_rate!r} and {high_rate!r}")
    if not (mean_low_s > 0 and mean_high_s > 0 and duration_s > 0):
        raise ValueError("mean_low_s, mean_high_s and duration_s must be > 0")
    rng = np.random.default_rng(seed)
    levels = ((low_rate, mean_low_s), (high_rate, mean_high_s))  # stays alternate, low first
    segments: list[tuple[float, float]] = []
    t = 0.0
    while t < duration_s:
        rate, mean_s = levels[len(segments) % 2]
        length = min(float(rng.exponential(mean_s)), duration_s - t)
        segments.append((length, rate))
        t += length
    arrivals = piecewise_poisson(segments, rng)
    name = f"random_bursts({low_rate:g}/{high_rate:g}, {mean_low_s:g}s/{mean_high_s:g}s)"
    return _build(arrivals, rng, prompt_tokens, output_tokens, media_fraction, media_items, name)


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
    """Accumulates parsed rows: the on_error policy for bad lines, failed requests, the time window.

    ``start_s``/``end_s`` bound the rows kept by their time after the file's first row
    (trace seconds, before any time scaling); ``limit`` counts kept rows only.
    """

    __slots__ = (
        "arrival",
        "end_s",
        "failed",
        "first",
        "hashes",
        "limit",
        "on_error",
        "output",
        "path",
        "prompt",
        "skipped",
        "start_s",
    )

    def __init__(self, path: str, on_error: str, limit: int | None, start_s: float, end_s: float) -> None:
        if on_error not in ("skip", "stop"):
            raise ValueError(f"on_error must be 'skip' or 'stop', got {on_error!r}")
        self.path = path
        self.on_error = on_error
        self.limit = limit
        self.start_s = start_s
        self.end_s = end_s
        self.first: float | None = None
        self.arrival: list[float] = []
        self.prompt: list[int] = []
        self.output: list[int] = []
        self.hashes: list[tuple[int, ...] | None] = []
        self.skipped = 0
        self.failed = 0

    @property
    def full(self) -> bool:
        return self.limit is not None and len(self.arrival) >= self.limit

    def bad(self, lineno: int, why: str) -> None:
        if self.on_error == "stop":
            raise ValueError(f"{self.path}:{lineno}: {why}")
        self.skipped += 1

    def add(
        self, lineno: int, t: float, prompt: int, output: int, hashes: tuple[int, ...] | None = None
    ) -> None:
        """One parsed row: kept, counted as a failed request, left out by the window, or bad."""
        if not math.isfinite(t):
            self.bad(lineno, "timestamp is not finite")
            return
        if prompt < 1:
            self.bad(lineno, f"prompt tokens must be >= 1, got {prompt}")
            return
        if output < 0:
            self.bad(lineno, f"output tokens must be >= 0, got {output}")
            return
        if self.first is None:
            self.first = t
        if not self.start_s <= t - self.first < self.end_s:
            return
        if output == 0:
            # a request that produced nothing: the trace's sources mark failed requests so
            # (BurstGPT documents it); there is no decode to replay, so it is left out and counted
            self.failed += 1
            return
        self.arrival.append(t)
        self.prompt.append(prompt)
        self.output.append(output)
        self.hashes.append(hashes)


_DAY_CACHE: dict[str, float] = {}
_EPOCH_ORDINAL = date(2000, 1, 1).toordinal()


def _utc_offset_s(zone: str) -> int:
    """Seconds east of UTC of an ISO 8601 zone designator: 'Z', '+HH:MM', '-HHMM' or '+HH'."""
    if zone == "Z":
        return 0
    sign = {"+": 1, "-": -1}.get(zone[:1])
    digits = zone[1:].replace(":", "", 1) if len(zone) == 6 and zone[3] == ":" else zone[1:]
    if sign is None or len(digits) not in (2, 4) or not digits.isdigit():
        raise ValueError("bad time zone")
    hours, minutes = int(digits[:2]), int(digits[2:] or 0)
    if hours > 23 or minutes > 59:
        raise ValueError("bad time zone")
    return sign * (hours * 3600 + minutes * 60)


def _azure_seconds(ts: str) -> tuple[float, float]:
    """(day offset s since 2000-01-01, seconds in the day, UTC) of 'YYYY-MM-DD HH:MM:SS[.f...][zone]'.

    The fraction may have any number of digits (the 2023 traces have 7, the 2024
    traces 6); a zone ('+00:00' in the 2024 traces, 'Z', '-0500') is subtracted, so
    rows in different zones keep their true order. Parsed by hand (fast). The two parts
    stay separate so that, once the first row's day is subtracted, float64 keeps the
    7-digit fraction exactly.
    """
    day = _DAY_CACHE.get(ts[:10])
    if day is None:
        y, m, d = ts[:10].split("-")
        day = float((date(int(y), int(m), int(d)).toordinal() - _EPOCH_ORDINAL) * 86400)
        _DAY_CACHE[ts[:10]] = day
    if len(ts) < 19 or ts[10] not in " T" or ts[13] != ":" or ts[16] != ":":
        raise ValueError("bad time")
    secs = int(ts[11:13]) * 3600 + int(ts[14:16]) * 60 + int(ts[17:19])
    rest = ts[19:]
    if not rest:
        return day, float(secs)
    frac = ""
    if rest[0] == ".":
        end = 1
        while end < len(rest) and rest[end].isdigit():
            end += 1
        frac, rest = rest[1:end], rest[end:]
        if not frac:
            raise ValueError("bad fraction")
    if rest:
        secs -= _utc_offset_s(rest)
    return day, (secs + int(frac) / 10 ** len(frac)) if frac else float(secs)


# CSV traces by their header: the columns of arrival time, prompt tokens and output tokens.
# Azure's TIMESTAMP is a date and time; BurstGPT's Timestamp is seconds from its start.
CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}


def _csv_format(header: str) -> str | None:
    cols = {c.strip() for c in _split_csv(header.strip())}
    for fmt, wanted in CSV_COLUMNS.items():
        if cols.issuperset(wanted):
            return fmt
    return None


def _split_csv(line: str) -> list[str]:
    if '"' in line:  # a quoted field (a comma inside it): the csv module's reading
        return next(csv.reader([line]))
    return line.split(",")


def _read_csv(path: str, rows: _Rows, fmt: str) -> None:
    with open(path, encoding="utf-8") as fh:
        header = fh.readline()
        cols = [c.strip() for c in _split_csv(header.strip())]
        try:
            it, ip, io = (cols.index(c) for c in CSV_COLUMNS[fmt])
        except ValueError:
            raise ValueError(
                f"{path}:1: a {fmt} trace needs the columns {', '.join(CSV_COLUMNS[fmt])}; "
                f"got {header.strip()!r}"
            ) from None
        width = len(cols)
        dated = fmt == "azure"
        day0 = None
        for lineno, line in enumerate(fh, start=2):
            if rows.full:
                break
            line = line.strip()
            if not line:
                continue
            parts = _split_csv(line)
            if len(parts) != width:
                rows.bad(lineno, f"expected {width} fields, got {len(parts)}")
                continue
            try:
                if dated:
                    day, t = _azure_seconds(parts[it].strip())
                    if day0 is None:
                        day0 = day
                    t += day - day0
                else:
                    t = float(parts[it])
                p = int(parts[ip])
                o = int(parts[io])
            except (ValueError, IndexError):
                rows.bad(lineno, f"cannot parse {line!r}")
                continue
            rows.add(lineno, t, p, o)


def _read_mooncake(path: str, rows: _Rows) -> None:
    loads = json.loads
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if rows.full:
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
            rows.add(lineno, t, p, o, hashes)


def _known_formats() -> str:
    return (
        "known formats: azure (Azure LLM inference CSV: TIMESTAMP,ContextTokens,GeneratedTokens), "
        "burstgpt (BurstGPT CSV: Timestamp,...,Request tokens,Response tokens,...), "
        "mooncake (JSON Lines: timestamp in ms, input_length, output_length)"
    )


def detect_format(path: str) -> str:
    """'azure', 'burstgpt' or 'mooncake', from the first line (a CSV header or a JSON record).

    ValueError, naming the formats and their columns, otherwise.
    """
    with open(path, encoding="utf-8", errors="replace") as fh:
        first = fh.readline().strip()
    if first.startswith("{"):
        return "mooncake"
    fmt = _csv_format(first)
    if fmt is not None:
        return fmt
    if os.path.splitext(path)[1].lower() in (".jsonl", ".json", ".ndjson") and not first:
        return "mooncake"  # an empty JSON Lines file: read as one (no requests)
    raise ValueError(
        f"{path}: cannot detect the trace format from its first line {first[:80]!r}; {_known_formats()}"
    )


def load_trace(
    path: str,
    format: str = "auto",
    *,
    time_scale: float = 1.0,
    on_error: str = "stop",
    limit: int | None = None,
    start_s: float = 0.0,
    duration_s: float | None = None,
) -> Workload:
    """Read a trace; arrivals are seconds from the first request kept, multiplied by `time_scale`.

    ``time_scale=0.5`` replays twice as fast (double the rate), ``2`` half as fast.
    ``on_error='stop'`` raises ``ValueError("file:line: ...")`` on the first malformed
    line; ``'skip'`` drops such lines and counts them in ``Workload.skipped``. Rows with
    no output tokens (failed requests: BurstGPT keeps them with ``Response tokens`` 0)
    are left out and counted in ``Workload.failed``. ``start_s`` and ``duration_s``
    keep only the rows from ``start_s`` to ``start_s + duration_s`` seconds after the
    file's first row (trace time, before `time_scale`): an hour of a week-long trace is
    read without holding the week. ``limit`` keeps at most that many rows (of the window).
    """
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    if not (math.isfinite(start_s) and start_s >= 0):
        raise ValueError(f"start_s must be >= 0, got {start_s!r}")
    if duration_s is not None and not (duration_s > 0):
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in TRACE_FORMATS:
        raise ValueError(f"unknown trace format {format!r}; {_known_formats()}")
    end_s = math.inf if duration_s is None else start_s + duration_s
    rows = _Rows(path, on_error, limit, start_s, end_s)
    if fmt == "mooncake":
        _read_mooncake(path, rows)
    else:
        _read_csv(path, rows, fmt)
    arrival = np.asarray(rows.arrival, dtype=np.float64)
    if arrival.size:
        arrival = (arrival - arrival.min()) * time_scale
    hashes = rows.hashes if any(h is not None for h in rows.hashes) else None
    return Workload(
        arrival,
        rows.prompt,
        rows.output,
        None,
        hashes,
        name=f"{fmt}:{os.path.basename(path)}",
        skipped=rows.skipped,
        failed=rows.failed,
    )
