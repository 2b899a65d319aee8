"""The load generator (aiperf, pinned; hack/loadgen.sh) through the real P/D routers to the emulated fleet.

No cluster: a standalone emulated fleet on 127.2.x.y and the router with fixed worker URLs
(router_util). aiperf sends streaming chat completions at a fixed rate, bounded by a request
count; its per-request records must show every response complete (no error, a usage chunk with
the requested output tokens), the prompt arrives with exactly the requested tokens (the word
tokenizer), and the client's TTFT and ITL follow what the emulated engines recorded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from router_util import StandaloneFleet, StaticRouter, router_binary

from disagg import loadgen
from prereqs import missing_prerequisite

pytestmark = pytest.mark.timeout(400)

FIRST_ADDRESS = {"vllm": "127.2.44.2", "sglang": "127.2.45.2"}
REQUESTS, RATE, PROMPT, OUTPUT = 24, 4, 500, 20


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_aiperf_through_the_router_gets_every_stream_complete(engine, tmp_path):
    if router_binary(engine) is None:
        missing_prerequisite(f"the {engine} router (hack/routers.sh installs the pinned one)")
    if not loadgen.installed():
        missing_prerequisite(f"the load generator {loadgen.PACKAGE} {loadgen.VERSION} (hack/loadgen.sh)")
    fleet = StandaloneFleet(tmp_path, FIRST_ADDRESS[engine], prefill=1, decode=2, engine=engine)
    router = None
    # The system temporary directory (TMPDIR) as aiperf sees it; short, because aiperf binds its
    # ZMQ sockets in it (a Unix socket path holds at most 107 characters).
    system_tmp = Path(tempfile.mkdtemp(prefix="disagg-"))
    try:
        router = StaticRouter(tmp_path, engine, fleet.prefill_urls, fleet.decode_urls)
        load = loadgen.Load(
            f"{router.url}/v1",
            tmp_path / "aiperf",
            rate=RATE,
            request_count=REQUESTS,
            prompt_tokens=PROMPT,
            output_tokens=OUTPUT,
        )
        log = tmp_path / "aiperf.log"
        env = load.environment({**os.environ, "TMPDIR": str(system_tmp)})
        with open(log, "w") as fh:
            rc = subprocess.run(
                load.prepare(), stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=300
            ).returncode
        assert rc == 0, log.read_text()[-3000:]
    finally:
        if router is not None:
            router.stop()
        summary = fleet.summary()
        left_in_tmp = sorted(
            str(p.relative_to(system_tmp))
            for p in system_tmp.rglob("*")
            if not p.is_dir() or p.name.startswith("aiperf_mmap_")
        )
        shutil.rmtree(system_tmp, ignore_errors=True)
    client = loadgen.read_results(tmp_path / "aiperf", OUTPUT)
    print(engine, loadgen.format_results(client), summary["ttft_s"], summary["itl_s"])
    assert client["requests"] == REQUESTS
    assert client["ok"] == REQUESTS and client["failed"] == 0 and client["truncated"] == 0, client
    assert summary["requests"]["completed"] == REQUESTS and summary["http"]["errors"] == 0
    # aiperf's dataset directory is in the run's artifact directory (aiperf empties it at the end
    # and leaves it), and nothing of it in the system temporary directory
    assert list((tmp_path / "aiperf" / loadgen.MMAP_DIR).glob("aiperf_mmap_*")), "no dataset directory"
    assert not left_in_tmp, left_in_tmp
    # every prompt reached the engines with exactly PROMPT tokens (one word per token)
    records = (tmp_path / "aiperf" / loadgen.RECORDS_FILE).read_text().splitlines()
    prompts = [json.loads(r)["metrics"]["usage_prompt_tokens"]["value"] for r in records]
    assert prompts == [PROMPT] * REQUESTS
    c, e = client["ttft_s"], summary["ttft_s"]
    assert e["p50"] - 0.02 <= c["p50"] <= e["p50"] + 0.3, (c, e)
    assert abs(client["itl_s"]["p50"] - summary["itl_s"]["p50"]) <= 0.015, (client["itl_s"], summary["itl_s"])
