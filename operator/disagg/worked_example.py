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
* decode KV cache = 237,984 tokens per worker   (37 sequences of 6,000 + 400 tokens)
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

# KV-cache capacity of one decode worker, in tokens (what vLLM logs as "GPU KV cache size" and
# exposes as num_gpu_blocks x block_size in vllm:cache_config_info; SGLang's max_total_num_tokens).
# The default is derived for the reference model: a Llama-3.1-70B-class model (320 KiB of KV per
# token) with FP8 weights on a decode worker of 2 x H100 80 GB at vLLM's default memory share:
#   0.9 x 2 x 79.1 GiB - 65.75 GiB of weights - 4 GiB of activations and CUDA graphs
#   = 72.63 GiB of KV cache = 237,984 tokens (rounded down to 16-token blocks).
# With BF16 weights the same worker keeps ~8.6 GiB (~28,000 tokens): set the spec's
# kvCacheTokens from the engine's figure (docs/planner.md, "Decode KV capacity").
DECODE_GPU_MEMORY_GIB = 79.1  # memory of one H100 80 GB as CUDA reports it
DECODE_GPUS = 2  # tensor-parallel size of the decode worker
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization
DECODE_WEIGHT_BYTES = 70_600_000_000  # 70.6e9 parameters at 1 byte (FP8)
DECODE_RUNTIME_GIB = 4.0  # activations, CUDA graphs and communication buffers (both GPUs)
KV_BLOCK_TOKENS = 16  # tokens per KV-cache block (vLLM's default block size)
_KV_GIB = (
    GPU_MEMORY_UTILIZATION * DECODE_GPUS * DECODE_GPU_MEMORY_GIB
    - DECODE_WEIGHT_BYTES / 2**30
    - DECODE_RUNTIME_GIB
)
DECODE_KV_CACHE_TOKENS = int(_KV_GIB * 2**30 / KV_BYTES_PER_TOKEN) // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS

# --------------------------------------------------------------------------- load and targets

ARRIVAL_RPS = 1.0
PROMPT_TOKENS = 6000.0
OUTPUT_TOKENS = 400.0
TTFT_S = 0.6
ITL_S = 0.15
PERCENTILE = 0.9
