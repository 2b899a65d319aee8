"""Benchmark the EMULATOR's wall-clock driver: CPU seconds per wall second.

Target: 50 requests/s across 40 emulated pods on less than one core. Runs the
real driver (asyncio, time.monotonic) with the metrics server on, a standalone
fleet of 10 prefill + 30 decode pods, and scrapes /metrics once a second like
Prometheus would; prints CPU seconds per wall second from time.process_time().

    python hack/bench/bench_emulator.py [--rate 50] [--prefill 10] [--decode 30] [--duration 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    from disagg.emulator.driver import emulate
    from disagg.emulator.fleet import DeploymentEmulator, Fleet
    from disagg.emulator.load import LoadGenerator, TokenDraw
    from disagg.model import StageModels

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--prefill", type=int, default=10)
    ap.add_argument("--decode", type=int, default=30)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--input-tokens", type=int, default=1000)
    ap.add_argument("--output-tokens", type=int, default=200)
    ap.add_argument("--no-scrape", action="store_true", help="do not scrape /metrics")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    fleet = Fleet()
    dep = DeploymentEmulator("bench", "bench", StageModels())
    fleet.add_deployment(dep, 0.0)
    for pool, n in (("prefill", a.prefill), ("decode", a.decode)):
        for i in range(n):
            fleet.add_pod(dep, pool, f"bench-{pool}-{i}", f"u-{pool}-{i}", 0.0)
    rng = np.random.default_rng(0)
    load = LoadGenerator(
        [(0.0, a.rate)],
        TokenDraw(a.input_tokens, a.input_tokens / 4, rng),
        TokenDraw(a.output_tokens, a.output_tokens / 4, rng),
        duration_s=a.duration,
        rng=rng,
    )
    scrapes = []

    async def run() -> dict:
        port_box: list[int] = []

        async def scraper() -> None:
            while not port_box:
                await asyncio.sleep(0.05)
            loop = asyncio.get_running_loop()
            url = f"http://127.0.0.1:{port_box[0]}/metrics"
            while True:
                await asyncio.sleep(1.0)
                t = time.perf_counter()
                # the scrape itself runs in a thread (it is Prometheus' cost, not ours); the
                # emulator's work to answer it is on the loop and is counted
                body = await loop.run_in_executor(None, lambda: urllib.request.urlopen(url, timeout=5).read())
                scrapes.append((time.perf_counter() - t, len(body)))

        task = None if a.no_scrape else asyncio.create_task(scraper())
        try:
            return await emulate(fleet, load, duration_s=a.duration, metrics_port=0, on_ready=port_box.append)
        finally:
            if task is not None:
                task.cancel()

    wall0 = time.monotonic()
    summary = asyncio.run(run())
    wall = time.monotonic() - wall0
    out = {
        "rate": a.rate,
        "pods": a.prefill + a.decode,
        "duration_s": a.duration,
        "generated": summary["requests"]["generated"],
        "completed": summary["requests"]["completed"],
        "cpu_s": round(summary["cpu_s"], 3),
        "wall_s": round(wall, 3),
        "cpu_per_wall_s": round(summary["cpu_per_wall_s"], 4),
        "scrapes": len(scrapes),
        "scrape_ms_mean": round(1000 * sum(s for s, _ in scrapes) / len(scrapes), 2) if scrapes else None,
        "scrape_bytes": scrapes[-1][1] if scrapes else None,
        "ttft_p50_s": summary["ttft_s"]["p50"],
    }
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"emulator bench: {out['rate']:g} req/s over {out['pods']} emulated pods for {a.duration:g} s: "
            f"{out['generated']} generated, {out['completed']} completed; "
            f"CPU {out['cpu_s']} s / wall {out['wall_s']} s = {out['cpu_per_wall_s']} CPU s per wall s "
            f"(target < 1.0); {out['scrapes']} scrapes, mean {out['scrape_ms_mean']} ms, "
            f"{out['scrape_bytes']} bytes"
        )
    return 0 if out["cpu_per_wall_s"] < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
