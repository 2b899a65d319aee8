"""Benchmark the serving path: the real P/D router in front of the HTTP emulated fleet, on loopback.

Streams chat completions at a fixed rate through `vllm-router` (or `sglang-router`) to a
standalone emulated fleet (`disagg emulate --standalone --serve`) and prints: CPU seconds per
wall second of the router, of the emulator and of this client; client-side TTFT and
inter-token gap percentiles; the TTFT the emulated engines recorded (from the prefill
request's arrival) and the difference, i.e. the latency the router and the HTTP hops add.

    hack/routers.sh
    python hack/bench/bench_router.py [--engine vllm] [--rate 50] [--duration 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))
from disagg.devtools.prometheus import free_port  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its reaped children), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(x) for x in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def wait_ok(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {url}")


def pct(xs: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


async def one(session, url: str | tuple[str, str], prompt: str, out: int, rec: dict) -> None:
    """One streamed chat completion through the router at `url`, or, given (prefill URL, decode
    URL), straight to the emulated engines with the client doing vLLM's P/D handshake itself."""
    t0 = time.monotonic()
    body = {
        "model": "emulated",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": out,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if isinstance(url, tuple):
        pre = dict(body, max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
        pre.pop("stream_options")
        async with session.post(f"{url[0]}/v1/chat/completions", json=pre) as r:
            if r.status != 200:
                rec["errors"] += 1
                return
            body["kv_transfer_params"] = (await r.json())["kv_transfer_params"]
        url = url[1]
    times, usage, finish = [], None, None
    async with session.post(f"{url}/v1/chat/completions", json=body) as r:
        if r.status != 200:
            rec["errors"] += 1
            return
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices", []):
                if c.get("delta", {}).get("content"):
                    times.append(time.monotonic() - t0)
                if c.get("finish_reason"):
                    finish = c["finish_reason"]
    if finish != "length" or not usage or usage["completion_tokens"] != out or not times:
        rec["truncated"] += 1
        return
    rec["ttft"].append(times[0])
    if len(times) > 1:
        rec["itl"].append((times[-1] - times[0]) / (len(times) - 1))
    rec["ok"] += 1


async def load(urls: list, rate: float, duration: float, prompt_tokens: int, out: int) -> dict:
    """Open-loop load at `rate`; request n goes to urls[n % len(urls)]."""
    import aiohttp

    rec = {"ok": 0, "errors": 0, "truncated": 0, "ttft": [], "itl": []}
    prompt = " ".join(["w"] * (prompt_tokens - 1))
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as s:
        for u in urls:
            await one(s, u, "warm up", 2, {"ok": 0, "errors": 0, "truncated": 0, "ttft": [], "itl": []})
        t0 = time.monotonic()
        tasks, n = [], 0
        while (due := n / rate) < duration:
            await asyncio.sleep(max(0.0, t0 + due - time.monotonic()))
            # a distinct first word per request: identical prompts would all go to one worker
            # under the routers' default cache-aware policy
            tasks.append(asyncio.create_task(one(s, urls[n % len(urls)], f"r{n} {prompt}", out, rec)))
            n += 1
        await asyncio.gather(*tasks)
    rec["sent"] = n
    return rec


def main(argv: list[str] | None = None) -> int:
    from disagg import routers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=sorted(routers.PRESETS), default="vllm")
    ap.add_argument("--rate", type=float, default=50.0, help="requests/s (default 50)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load (default 20)")
    ap.add_argument("--prefill", type=int, default=4)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--input-tokens", type=int, default=1000)
    ap.add_argument("--output-tokens", type=int, default=50)
    ap.add_argument("--first-address", default="127.2.80.2")
    ap.add_argument("--router-arg", action="append", default=[], help="extra router flag (repeatable)")
    ap.add_argument(
        "--direct",
        action="store_true",
        help="no router: the client does vLLM's P/D handshake itself, round robin over the pods "
        "(the baseline the router's added latency is measured against)",
    )
    a = ap.parse_args(argv)

    p = routers.preset(a.engine)
    binary = Path(os.environ.get("DISAGG_ROUTERS_DIR", Path.home() / ".cache/disagg-operator/routers"))
    binary = binary / f"{p.package}-{p.version}" / "bin" / p.binary
    if not binary.exists():
        raise SystemExit(f"{binary} missing: run hack/routers.sh")
    tmp = Path(tempfile.mkdtemp(prefix="bench-router-"))
    port = free_port(a.first_address)
    octets = a.first_address.split(".")
    addrs = [".".join([*octets[:3], str(int(octets[3]) + i)]) for i in range(a.prefill + a.decode)]
    emu_args = [
        sys.executable, "-m", "disagg.cli", "emulate", "--standalone", "--serve", "--rate", "0",
        "--prefill", str(a.prefill), "--decode", str(a.decode), "--engine", a.engine,
        "--serve-address", a.first_address, "--serve-port", str(port), "--metrics-port", "0",
        "--duration", str(a.duration + 120), "--summary-json", str(tmp / "summary.json"),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT / "operator"))
    emu_log = open(tmp / "emulator.log", "w")  # noqa: SIM115 - the child's log, closed at the end
    emu = subprocess.Popen(emu_args, stdout=emu_log, stderr=subprocess.STDOUT, env=env)
    router = None
    try:
        for addr in addrs:
            wait_ok(f"http://{addr}:{port}/health", 30)
        if a.direct:
            pre = [f"http://{x}:{port}" for x in addrs[: a.prefill]]
            dec = [f"http://{x}:{port}" for x in addrs[a.prefill :]]
            urls = [(pre[i % len(pre)], dec[i % len(dec)]) for i in range(len(pre) * len(dec))]
        else:
            rport = free_port()
            r_args = [str(binary), *p.subcommand, "--host", "127.0.0.1", "--port", str(rport), p.pd_flag]
            for addr in addrs[: a.prefill]:
                r_args += ["--prefill", f"http://{addr}:{port}"]
            for addr in addrs[a.prefill :]:
                r_args += ["--decode", f"http://{addr}:{port}"]
            r_args += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), *a.router_arg]
            router_log = open(tmp / "router.log", "w")  # noqa: SIM115 - the child's log
            router = subprocess.Popen(r_args, stdout=router_log, stderr=subprocess.STDOUT)
            urls = [f"http://127.0.0.1:{rport}"]
            wait_ok(f"{urls[0]}/workers", 60)
            time.sleep(2)  # the router's workers become healthy
        rpid = router.pid if router is not None else None
        c0 = (cpu_seconds(rpid) if rpid else 0.0, cpu_seconds(emu.pid), time.process_time())
        w0 = time.monotonic()
        rec = asyncio.run(load(urls, a.rate, a.duration, a.input_tokens, a.output_tokens))
        wall = time.monotonic() - w0
        c1 = (cpu_seconds(rpid) if rpid else 0.0, cpu_seconds(emu.pid), time.process_time())
    finally:
        if router is not None:
            router.terminate()
            router.wait(10)
        emu.terminate()
        emu.wait(30)
    summary = json.loads((tmp / "summary.json").read_text())
    engine_ttft = summary["ttft_s"]
    via = "no router (client-side vLLM handshake)" if a.direct else f"{a.engine} ({p.requirement})"
    print(f"router: {via}; fleet: {a.prefill} prefill + {a.decode} decode emulated pods")
    print(
        f"load: {rec['sent']} streams at {a.rate:g}/s for {a.duration:g} s "
        f"({a.input_tokens} prompt, {a.output_tokens} output tokens); wall {wall:.1f} s"
    )
    print(f"client: ok={rec['ok']} errors={rec['errors']} truncated={rec['truncated']}")
    print(
        "CPU s per wall s: router {:.3f}  emulator {:.3f}  client {:.3f}".format(
            *((c1[i] - c0[i]) / wall for i in range(3))
        )
    )
    t, g = rec["ttft"], rec["itl"]
    print(f"client TTFT p50/p90/p99: {pct(t, 50) * 1e3:.0f}/{pct(t, 90) * 1e3:.0f}/{pct(t, 99) * 1e3:.0f} ms")
    print(f"client ITL  p50/p90/p99: {pct(g, 50) * 1e3:.1f}/{pct(g, 90) * 1e3:.1f}/{pct(g, 99) * 1e3:.1f} ms")
    e50, e90 = engine_ttft["p50"], engine_ttft["p90"]
    if e50 is not None:
        print(
            f"engine TTFT p50/p90: {e50 * 1e3:.0f}/{e90 * 1e3:.0f} ms (emulated, from the prefill request's arrival)"
        )
        print(
            f"added by router + HTTP hops, TTFT p50: {(pct(t, 50) - e50) * 1e3:.0f} ms, "
            f"p90: {(pct(t, 90) - e90) * 1e3:.0f} ms"
        )
    return 0 if rec["errors"] == 0 and rec["truncated"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
