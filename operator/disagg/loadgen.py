"""The load generator users already run against vLLM: NVIDIA's `aiperf`, pinned, driven through an endpoint.

`hack/loadgen.sh` installs the pinned aiperf into its own virtualenv (its dependencies
conflict with constraints.txt: kubernetes-asyncio<33, prometheus-client~=0.23, rich~=14.1,
pillow~=12.3; docs/router.md) under ``~/.cache/disagg-operator/loadgen/aiperf-<version>/``,
with a word-level tokenizer beside it (``word-tokenizer/``). That tokenizer makes one token
one whitespace-separated word, the emulated engines' counting rule (docs/emulator.md), so a
synthetic prompt of N tokens reaches the emulator as N prompt tokens; and it loads from a
local directory, so aiperf never asks a hub for one (its ``builtin`` tokenizer downloads
tiktoken's encoding file on first use).

This module builds aiperf's command line (streaming chat completions at a fixed rate, or a
rate schedule, bounded by a duration or a request count) and reads its machine-readable
results (``profile_export.jsonl``: one record per request) into the checks a client makes:
every request answered, none failed, none truncated (each stream ended with a usage chunk
reporting exactly the requested output tokens), and TTFT / inter-token latency percentiles.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "aiperf"
VERSION = "0.13.0"
#: Where hack/loadgen.sh installs it (override with DISAGG_LOADGEN_DIR).
DEFAULT_DIR = Path.home() / ".cache" / "disagg-operator" / "loadgen"
#: aiperf's per-request records and its summary, inside the artifact directory.
RECORDS_FILE = "profile_export.jsonl"
SUMMARY_FILE = "profile_export_aiperf.json"
#: Where, inside a run's artifact directory, aiperf keeps its dataset's memory-mapped files.
MMAP_DIR = "mmap"
#: A rate step in a schedule becomes two control points this far apart (aiperf's rate series
#: is piecewise linear; its points must be strictly increasing in time).
STEP_S = 0.1
PERCENTILES = (50, 90, 99)


def tool_dir() -> Path:
    return Path(os.environ.get("DISAGG_LOADGEN_DIR", DEFAULT_DIR))


def venv_dir() -> Path:
    return tool_dir() / f"{PACKAGE}-{VERSION}"


def binary() -> Path:
    return venv_dir() / "bin" / "aiperf"


def tokenizer_dir() -> Path:
    return venv_dir() / "word-tokenizer"


def installed() -> bool:
    return binary().exists() and (tokenizer_dir() / "tokenizer.json").exists()


def parse_schedule(schedule: str) -> list[tuple[float, float]]:
    """'0:2,25:8,85:2' (seconds:requests per second, the emulator's --schedule) -> [(0, 2), (25, 8), (85, 2)]."""
    points: list[tuple[float, float]] = []
    for part in schedule.split(","):
        try:
            t_text, r_text = part.split(":")
            t, r = float(t_text), float(r_text)
        except ValueError:
            raise ValueError(f"schedule entry {part!r} is not SECONDS:RATE") from None
        if not (math.isfinite(t) and math.isfinite(r)) or t < 0 or r <= 0:
            raise ValueError(f"schedule entry {part!r}: seconds must be >= 0 and the rate > 0")
        if points and t <= points[-1][0]:
            raise ValueError(f"schedule times must increase: {part!r} after {points[-1][0]:g} s")
        points.append((t, r))
    if not points or points[0][0] != 0:
        raise ValueError(f"a schedule starts at 0 s, got {schedule!r}")
    return points


def rate_series(schedule: str, duration_s: float) -> dict:
    """aiperf's --request-rate-series document for a step schedule lasting `duration_s`.

    Each rate holds until the next step, which takes STEP_S (piecewise-linear points).
    """
    steps = [(t, r) for t, r in parse_schedule(schedule) if t < duration_s]
    out: list[dict] = []
    for i, (t, r) in enumerate(steps):
        end = steps[i + 1][0] - STEP_S if i + 1 < len(steps) else duration_s
        for when in (t, end):
            if not out or when > out[-1]["time_s"]:
                out.append({"time_s": when, "qps": r})
    if len(out) < 2:  # aiperf wants two points at least
        out.append({"time_s": out[0]["time_s"] + STEP_S, "qps": out[0]["qps"]})
    return {"points": out}


@dataclass
class Load:
    """One aiperf run: streaming chat completions through `endpoint` (a base URL ending in /v1)."""

    endpoint: str
    artifact_dir: Path
    model: str = "emulated"
    rate: float | None = None  # requests per second, constant arrivals
    schedule: str | None = None  # or a step schedule '0:2,25:8' (with duration_s)
    duration_s: float | None = None
    request_count: int | None = None
    prompt_tokens: int = 200
    prompt_tokens_std: float = 0.0
    output_tokens: int = 20
    seed: int = 1
    request_timeout_s: float = 600.0
    grace_s: float = 120.0  # after the duration, in-flight responses still count
    extra: Sequence[str] = field(default_factory=tuple)

    def base_url(self) -> str:
        url = self.endpoint.rstrip("/")
        if not url.endswith("/v1"):
            raise ValueError(f"the endpoint is a base URL ending in /v1, got {self.endpoint!r}")
        return url[: -len("/v1")]

    def command(self) -> list[str]:
        if (self.rate is None) == (self.schedule is None):
            raise ValueError("give a rate or a schedule")
        if self.duration_s is None and self.request_count is None:
            raise ValueError("bound the load: give a duration or a request count")
        if self.schedule is not None and self.duration_s is None:
            raise ValueError("a schedule needs a duration")
        args = [
            str(binary()),
            "profile",
            "--model",
            self.model,
            "--url",
            self.base_url(),
            "--endpoint-type",
            "chat",
            "--streaming",
            "--tokenizer",
            str(tokenizer_dir()),
            "--arrival-pattern",
            "constant",
            "--isl",
            str(self.prompt_tokens),
            "--isl-stddev",
            f"{self.prompt_tokens_std:g}",
            "--osl",
            str(self.output_tokens),
            # Output tokens as the server counted them, from each stream's usage chunk.
            "--use-server-token-count",
            "--request-timeout-seconds",
            f"{self.request_timeout_s:g}",
            "--random-seed",
            str(self.seed),
            "--artifact-dir",
            str(self.artifact_dir),
            # No GPU telemetry (it polls DCGM on localhost:9400, the emulator's default metrics
            # port) and no scrape of the endpoint's /metrics; no UI on a terminal.
            "--no-gpu-telemetry",
            "--no-server-metrics",
            "--ui-type",
            "none",
        ]
        # A rate, or a schedule (aiperf takes one or the other).
        if self.schedule is not None:
            args += ["--request-rate-series", str(self.artifact_dir / "rate-series.json")]
        else:
            args += ["--request-rate", f"{self.rate:g}"]
        if self.duration_s is not None:
            args += [
                "--benchmark-duration",
                f"{self.duration_s:g}",
                "--benchmark-grace-period",
                f"{self.grace_s:g}",
            ]
        if self.request_count is not None:
            args += ["--request-count", str(self.request_count)]
        return [*args, *self.extra]

    def prepare(self) -> list[str]:
        """Create the artifact directory (and the rate series file); returns the command, to run
        with environment()."""
        (self.artifact_dir / MMAP_DIR).mkdir(parents=True, exist_ok=True)
        if self.schedule is not None:
            assert self.duration_s is not None
            (self.artifact_dir / "rate-series.json").write_text(
                json.dumps(rate_series(self.schedule, self.duration_s))
            )
        return self.command()

    def env_overrides(self) -> dict[str, str]:
        """What this run's environment sets: no hub telemetry, and no file outside the run's
        artifact directory and the project's cache directory. By default aiperf writes its
        dataset's memory-mapped files in a directory of the system temporary directory, and
        leaves that directory behind; here it goes to `artifact_dir`/mmap, and aiperf's dataset
        cache to the tool directory instead of ~/.cache/aiperf."""
        return {
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HOME": str(tool_dir() / "hf-home"),
            "AIPERF_DATASET_MMAP_BASE_PATH": str(self.artifact_dir / MMAP_DIR),
            "AIPERF_DATASET_MMAP_CACHE_DIR": str(tool_dir() / "mmap-cache"),
        }

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """This run's environment: `base` (default: this process's) with env_overrides()."""
        return {**(os.environ if base is None else base), **self.env_overrides()}


def _pct(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"p{q}": None for q in PERCENTILES}
    xs = sorted(values)
    out: dict[str, float | None] = {}
    for q in PERCENTILES:  # linear interpolation, numpy's default
        pos = (len(xs) - 1) * q / 100
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        out[f"p{q}"] = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return out


def _value(metrics: dict, name: str) -> float | None:
    m = metrics.get(name)
    if not isinstance(m, dict) or m.get("value") is None:
        return None
    return float(m["value"])


def read_results(artifact_dir: Path, expected_output_tokens: int | None = None) -> dict:
    """The client's view of an aiperf run, from its per-request records.

    A request is `failed` when aiperf recorded an error for it (an HTTP error, a refused or
    reset connection, a timeout), `truncated` when it has no error but its stream did not
    report, in a usage chunk, the output tokens asked for (or no TTFT: no token came), and
    `ok` otherwise. TTFT and ITL (mean gap between tokens of one response) are in seconds,
    over the ok requests.
    """
    path = Path(artifact_dir) / RECORDS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no aiperf records at {path} (did the run start?)")
    ok = failed = truncated = 0
    ttft: list[float] = []
    itl: list[float] = []
    details: list[str] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        meta = rec.get("metadata") or {}
        if meta.get("benchmark_phase", "profiling") != "profiling":
            continue
        metrics = rec.get("metrics") or {}
        err = rec.get("error")
        if err:
            failed += 1
            details.append(f"failed: {json.dumps(err)[:200]}")
            continue
        out = _value(metrics, "usage_completion_tokens")
        first = _value(metrics, "time_to_first_token")
        want = expected_output_tokens
        if out is None or first is None or (want is not None and out != want):
            truncated += 1
            details.append(f"truncated: usage completion tokens {out} (want {want}), ttft {first}")
            continue
        ok += 1
        ttft.append(first / 1000)
        gap = _value(metrics, "inter_token_latency")
        if gap is not None:
            itl.append(gap / 1000)
    summary_path = Path(artifact_dir) / SUMMARY_FILE
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return {
        "requests": ok + failed + truncated,
        "ok": ok,
        "failed": failed,
        "truncated": truncated,
        "ttft_s": _pct(ttft),
        "itl_s": _pct(itl),
        "error_summary": summary.get("error_summary") or [],
        "cancelled": bool(summary.get("was_cancelled")),
        "details": details[:20],
    }


def format_results(r: dict) -> str:
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1000:.0f}ms"

    t, i = r["ttft_s"], r["itl_s"]
    return (
        f"aiperf: requests={r['requests']} ok={r['ok']} failed={r['failed']} truncated={r['truncated']} "
        f"ttft p50/p90/p99={ms(t['p50'])}/{ms(t['p90'])}/{ms(t['p99'])} "
        f"itl p50/p90/p99={ms(i['p50'])}/{ms(i['p90'])}/{ms(i['p99'])}"
    )
