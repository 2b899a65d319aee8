"""The worked example of the stage-disaggregation chapter: its figures, each defined once.

Every default that stands for the reference model reads its value here: the service-time
dataclasses (`disagg.model`), the offered load and SLO (`disagg.planner`), the
DisaggDeployment's field defaults (`disagg.api`) and the model and SLO flags that
`disagg plan`, `simulate` and `evaluate` share (`disagg.commands.modelflags`).

Pure, standard library only: `disagg --help` imports it without numpy.

* prefill_ms = 20 + 0.035 x tokens            (6,000 tokens -> 230 ms)
* KV state = 320 KiB per token                  (6,000 tokens -> 1.83 GiB)
* transfer_ms = 12 + bytes / 22 GiB/s           (6,000 tokens -> ~95.23 ms)
* decode step = 45 ms, 32 slots                 (400 tokens -> ~1.778 req/s)
* SLO: TTFT 0.6 s and ITL 0.15 s at p90
"""

from __future__ import annotations

# --------------------------------------------------------------------------- service times

ENCODER_FIXED_MS = 15.0  # ms per request with media
ENCODER_MS_PER_ITEM = 25.0  # ms per media item
PREFILL_FIXED_MS = 20.0  # ms per prefill
PREFILL_MS_PER_TOKEN = 0.035  # ms per prompt token
KV_BYTES_PER_TOKEN = 327_680  # 320 KiB of KV cache per token
LINK_SETUP_MS = 12.0  # ms per KV transfer
LINK_GIBPS = 22.0  # KV link bandwidth, GiB/s
CHUNK_TOKENS = 2000  # tokens per chunk (chunked prefill, streamed KV)
DECODE_STEP_MS = 45.0  # ms per decode step
DECODE_SLOTS = 32  # sequences per decode replica

# --------------------------------------------------------------------------- load and targets

ARRIVAL_RPS = 1.0
PROMPT_TOKENS = 6000.0
OUTPUT_TOKENS = 400.0
TTFT_S = 0.6
ITL_S = 0.15
PERCENTILE = 0.9
