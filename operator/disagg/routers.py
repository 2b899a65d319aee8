"""The engines' own P/D routers: pinned packages and the command line the operator runs them with.

Facts (flags, discovery behaviour, handshakes) are in docs/router.md. One entry
per engine; `router_args` is the single place that turns a DisaggDeployment's
pools into router flags, used by the router Deployment builder and by the tests
that run the real binaries against the emulated fleet.

Pure: standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Port of the router's OpenAI-compatible endpoint (container and Service).
ROUTER_HTTP_PORT = 8000
# Port of the router's own Prometheus metrics.
ROUTER_METRICS_PORT = 29000
# Default container image: a pinned Python; the container installs the pinned router
# wheel from PyPI at start unless the image already has the router's binary.
DEFAULT_ROUTER_IMAGE = "python:3.12-slim"
#: The routers' readiness endpoint (vllm-router 0.1.17 and sglang-router 0.3.2): 200 once at
#: least one healthy prefill and one healthy decode worker are known (P/D mode), 503 before.
READINESS_PATH = "/readiness"
#: Seconds between readiness probes of the router pod (the kubelet's; a short period so that a
#: replaced router takes traffic soon after its discovery has found the workers).
READINESS_PERIOD_S = 2
#: Seconds between the router's health checks of a worker it is adding. Both routers add
#: discovered pods one at a time and poll each one's /health before the next (default 30 s in
#: vllm-router 0.1.17 and sglang-router 0.3.2), so a pod Ready a moment before its engine
#: answers would hold discovery (and every later pod event) that long (docs/router.md,
#: "Discovery adds one pod at a time"). 1 s keeps that stall short; the check is one GET.
WORKER_STARTUP_CHECK_INTERVAL_S = 1
#: The flag that sets it, the same in both routers (an argparse option: the last one given wins,
#: so spec.router.extraArgs, which come after it, can override it).
WORKER_STARTUP_CHECK_FLAG = "--worker-startup-check-interval"


@dataclass(frozen=True)
class RouterPreset:
    engine: str
    package: str  # on PyPI
    version: str  # pinned
    binary: str  # console script the wheel installs
    subcommand: tuple[str, ...]  # words between the binary and the flags
    pd_flag: str  # switches P/D mode on
    applies_split_threshold: bool  # can the router send short prompts straight to decode?

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


PRESETS: dict[str, RouterPreset] = {
    "vllm": RouterPreset(
        engine="vllm",
        package="vllm-router",
        version="0.1.17",
        binary="vllm-router",
        subcommand=(),
        pd_flag="--vllm-pd-disaggregation",
        applies_split_threshold=False,
    ),
    "sglang": RouterPreset(
        engine="sglang",
        package="sglang-router",
        version="0.3.2",
        binary="sglang-router",
        subcommand=("launch",),
        pd_flag="--pd-disaggregation",
        applies_split_threshold=False,
    ),
}


def preset(engine: str) -> RouterPreset:
    try:
        return PRESETS[engine]
    except KeyError:
        raise ValueError(
            f"no router for engine {engine!r}; choose from {', '.join(sorted(PRESETS))}"
        ) from None


def _selector_words(selector: dict[str, str]) -> list[str]:
    if not selector:
        raise ValueError("a router selector needs at least one label")
    return [f"{k}={v}" for k, v in selector.items()]


def router_args(
    engine: str,
    *,
    namespace: str,
    engine_port: int,
    prefill_selector: dict[str, str] | None = None,
    decode_selector: dict[str, str] | None = None,
    worker_selector: dict[str, str] | None = None,
    host: str = "0.0.0.0",
    port: int = ROUTER_HTTP_PORT,
    metrics_host: str = "0.0.0.0",
    metrics_port: int = ROUTER_METRICS_PORT,
    extra: Sequence[str] = (),
) -> list[str]:
    """The router's flags (after the binary and its subcommand) for one DisaggDeployment.

    P/D mode with `prefill_selector` and `decode_selector`; plain load balancing over the pods of
    `worker_selector` (colocated placement) otherwise. Discovery watches pods of `namespace` only
    (so a namespaced Role is enough) and reaches each engine on `engine_port`. The worker start-up
    check runs every WORKER_STARTUP_CHECK_INTERVAL_S. `extra` comes last, so it overrides any of
    these (the routers parse with argparse, where the last occurrence of an option wins).
    """
    p = preset(engine)
    if not 0 < engine_port < 65536:
        raise ValueError(f"engine port must be 1..65535, got {engine_port}")
    if worker_selector is not None:
        mode = ["--selector", *_selector_words(worker_selector)]
    elif prefill_selector is not None and decode_selector is not None:
        mode = [
            p.pd_flag,
            "--prefill-selector",
            *_selector_words(prefill_selector),
            "--decode-selector",
            *_selector_words(decode_selector),
        ]
    else:
        raise ValueError("give prefill_selector and decode_selector (P/D), or worker_selector")
    return [
        "--host",
        host,
        "--port",
        str(port),
        *mode,
        "--service-discovery",
        "--service-discovery-namespace",
        namespace,
        "--service-discovery-port",
        str(engine_port),
        "--prometheus-host",
        metrics_host,
        "--prometheus-port",
        str(metrics_port),
        WORKER_STARTUP_CHECK_FLAG,
        str(WORKER_STARTUP_CHECK_INTERVAL_S),
        *extra,
    ]


def container_command(engine: str) -> list[str]:
    """Shell entry of the router container: run the router binary, installing the pinned
    wheel first if the image does not have it. The router's flags follow as arguments."""
    p = preset(engine)
    run = " ".join([p.binary, *p.subcommand])
    script = (
        f"command -v {p.binary} >/dev/null 2>&1 || "
        f"pip install --no-cache-dir --disable-pip-version-check '{p.requirement}' || exit 1; "
        f'exec {run} "$@"'
    )
    return ["sh", "-c", script, p.binary]


def pins_for_shell() -> str:
    """`package version binary` per line, for hack/routers.sh."""
    return "\n".join(f"{p.package} {p.version} {p.binary}" for p in PRESETS.values())
