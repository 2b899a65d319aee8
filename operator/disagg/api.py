"""The DisaggDeployment API: pydantic models of spec and status.

This module is the single source of the CRD schema: `disagg.crdgen` turns the
JSON schema of `DisaggDeploymentSpec` / `DisaggDeploymentStatus` into the
structural OpenAPI schema of `crds/disagg.dev_disaggdeployments.yaml`.

Cross-field rules live twice, on purpose, with the same message text:

* as CEL `x-kubernetes-validations` (attached through `json_schema_extra`), so
  the API server refuses a bad object at admission;
* as pydantic validators, so the operator, `disagg plan` and the tests catch
  the same mistake offline (the operator reports it as an `InvalidSpec`
  condition and does not scale).

Pure module: no kopf, no kubernetes client, no HTTP.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic.alias_generators import to_camel

from disagg import names
from disagg import worked_example as we

GROUP = "disagg.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DisaggDeployment"
PLURAL = "disaggdeployments"
SINGULAR = "disaggdeployment"
SHORT_NAMES = ["dd", "disagg"]
CRD_NAME = f"{PLURAL}.{GROUP}"

#: Pool names in pipeline order (`colocated` replaces prefill+decode); defined in disagg.names.
POOL_NAMES = names.POOL_NAMES

#: Extended resource of one GPU (the device plugin's name).
GPU_RESOURCE = "nvidia.com/gpu"

# Upper bounds keep CEL cost estimates low and integer arithmetic far from overflow.
MAX_REPLICAS = 10_000
MAX_GPUS_PER_REPLICA = 64
MAX_KV_CACHE_TOKENS = 1_000_000_000  # per decode worker: far above any GPU memory today
MAX_GPU_BUDGET = MAX_REPLICAS * MAX_GPUS_PER_REPLICA
#: spec.autoscaling.metricWindowSeconds: the window rates and quantiles are read over.
METRIC_WINDOW_SECONDS_DEFAULT = 60
#: Issue-14 sizing inputs on by default (docs/planner.md, "Request sizes, burstiness and automatic headroom").
SIZING_REQUEST_SIZES_DEFAULT = False
SIZING_BURSTINESS_DEFAULT = True
SIZING_AUTO_HEADROOM_DEFAULT = True
SIZING_FRONT_LOAD_GAIN_DEFAULT = True
SIZING_ERROR_BUDGET_DEFAULT = True


# ---------------------------------------------------------------------------
# Validation messages (shared by CEL rules and pydantic validators).

MSG_MIN_LE_MAX = "minReplicas must be less than or equal to maxReplicas"
MSG_REPLICAS_IN_RANGE = "replicas must be between minReplicas and maxReplicas"
MSG_DRAIN_TIMEOUT = "drain.timeoutSeconds must be between 1 and 3600"
MSG_SPLIT_THRESHOLD = "splitThresholdTokens must be a positive integer or 'auto'"
MSG_COLOCATED_NEEDS_POOL = "placement.mode 'colocated' requires pools.colocated"
MSG_COLOCATED_FORBIDS_PD = "placement.mode 'colocated' does not allow pools.prefill or pools.decode"
MSG_DISAGG_NEEDS_PD = (
    "placement.mode 'disaggregated' or 'conditional' requires pools.prefill and pools.decode"
)
MSG_DISAGG_FORBIDS_COLOCATED = "pools.colocated is only allowed with placement.mode 'colocated'"
MSG_GPU_BUDGET = "autoscaling.gpuBudget must be at least the sum over pools of minReplicas * gpusPerReplica"
MSG_TEMPLATE_SPEC = "template.spec is required (a core/v1 PodTemplateSpec: metadata and spec)"
MSG_TEMPLATE_CONTAINERS = "template.spec.containers must list at least one container"
MSG_CONTAINER_IMAGE = "every container of template.spec.containers needs a name and a non-empty image"
MSG_GPUS_DISAGREE = (
    "gpusPerReplica must equal the nvidia.com/gpu that the template's containers request or limit "
    "(the planner and the GPU budget count gpusPerReplica): set both to the same number, or leave "
    "nvidia.com/gpu out of the template and the operator adds gpusPerReplica"
)
MSG_WINDOW_VS_SCRAPE = (
    "autoscaling.metricWindowSeconds must be at least twice scrapeIntervalSeconds: "
    "a rate needs two samples in its window"
)
MSG_PROMETHEUS_URL = "autoscaling.prometheus.url must be an http:// or https:// URL with a host, e.g. http://prometheus.monitoring:9090"

# Names. Every child is named <name>-<pool> (disagg.builders.child_name) and must be a valid
# Service name (RFC 1035 label: lowercase letters, digits and '-', starting with a letter,
# at most 63 characters); <name> is also a label value (at most 63). So the longest
# DisaggDeployment name leaves room for the longest "-<pool>" suffix.
DNS1035_LABEL_MAX = 63
DNS1035_LABEL_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
#: Longest "-<pool>" suffix the builders append to a DisaggDeployment's name.
LONGEST_CHILD_SUFFIX = max(len(f"-{pool}") for pool in POOL_NAMES)
MAX_NAME_LENGTH = DNS1035_LABEL_MAX - LONGEST_CHILD_SUFFIX
MSG_NAME = (
    f"metadata.name must be at most {MAX_NAME_LENGTH} characters of lowercase letters, digits and '-', "
    "starting with a letter and ending with a letter or digit (no dots): it names the pools' "
    f"Services <name>-<pool>, which must be DNS-1035 labels of at most {DNS1035_LABEL_MAX} characters"
)


def cel(rule: str, message: str, reason: str | None = None, field_path: str | None = None) -> dict[str, Any]:
    """One `x-kubernetes-validations` entry."""
    out: dict[str, Any] = {"rule": rule, "message": message}
    if reason:
        out["reason"] = reason
    if field_path:
        out["fieldPath"] = field_path
    return out


def _gpu_sum_expr() -> str:
    parts = [
        f"(has(self.pools.{p}) ? self.pools.{p}.minReplicas * self.pools.{p}.gpusPerReplica : 0)"
        for p in POOL_NAMES
    ]
    return " + ".join(parts)


_IS_COLOCATED = "(has(self.placement) && self.placement.mode == 'colocated')"

SPEC_RULES = [
    cel(f"!{_IS_COLOCATED} || has(self.pools.colocated)", MSG_COLOCATED_NEEDS_POOL, field_path=".pools"),
    cel(
        f"!{_IS_COLOCATED} || (!has(self.pools.prefill) && !has(self.pools.decode))",
        MSG_COLOCATED_FORBIDS_PD,
        field_path=".pools",
    ),
    cel(
        f"{_IS_COLOCATED} || (has(self.pools.prefill) && has(self.pools.decode))",
        MSG_DISAGG_NEEDS_PD,
        field_path=".pools",
    ),
    cel(f"{_IS_COLOCATED} || !has(self.pools.colocated)", MSG_DISAGG_FORBIDS_COLOCATED, field_path=".pools"),
    cel(
        "!has(self.autoscaling) || !has(self.autoscaling.gpuBudget) || "
        f"self.autoscaling.gpuBudget >= {_gpu_sum_expr()}",
        MSG_GPU_BUDGET,
        field_path=".autoscaling.gpuBudget",
    ),
]

POOL_RULES = [
    cel("self.minReplicas <= self.maxReplicas", MSG_MIN_LE_MAX, field_path=".minReplicas"),
    cel(
        "!has(self.replicas) || (self.replicas >= self.minReplicas && self.replicas <= self.maxReplicas)",
        MSG_REPLICAS_IN_RANGE,
        field_path=".replicas",
    ),
]


#: The GPU resource as a CEL field name (Kubernetes escapes '.' and '/' in property names).
_GPU_FIELD = GPU_RESOURCE.replace(".", "__dot__").replace("/", "__slash__")


def _gpu_quantity_ok(quantities: str) -> str:
    """CEL: `quantities` (a container's limits or requests) sets no GPUs or exactly gpusPerReplica.

    The quantity is an int or a string ("8"): equal to gpusPerReplica in either form.
    """
    q = f"{quantities}.{_GPU_FIELD}"
    return (
        f"!has({quantities}) || !has({q}) || {q} == self.gpusPerReplica || {q} == string(self.gpusPerReplica)"
    )


POOL_RULES.append(
    cel(
        "!has(self.template.spec) || !has(self.template.spec.containers) || "
        "self.template.spec.containers.all(c, !has(c.resources) || "
        f"(({_gpu_quantity_ok('c.resources.limits')}) && ({_gpu_quantity_ok('c.resources.requests')})))",
        MSG_GPUS_DISAGREE,
        field_path=".gpusPerReplica",
    )
)

TEMPLATE_RULES = [
    cel("has(self.spec)", MSG_TEMPLATE_SPEC),
]
TEMPLATE_SPEC_RULES = [
    cel("has(self.containers) && self.containers.size() > 0", MSG_TEMPLATE_CONTAINERS),
]
CONTAINER_RULES = [
    cel(
        "has(self.name) && self.name != '' && has(self.image) && self.image.trim() != ''", MSG_CONTAINER_IMAGE
    ),
]

AUTOSCALING_RULES = [
    cel(
        "!has(self.metricWindowSeconds) || !has(self.scrapeIntervalSeconds) || "
        "self.metricWindowSeconds >= 2 * self.scrapeIntervalSeconds",
        MSG_WINDOW_VS_SCRAPE,
        field_path=".metricWindowSeconds",
    )
]

#: scheme://host[:port][/path], no spaces, query or fragment.
PROMETHEUS_URL_PATTERN = "^https?://[-A-Za-z0-9.:]+(/[^ ?#]*)?$"
PROMETHEUS_RULES = [
    cel(f"self.url.matches('{PROMETHEUS_URL_PATTERN}')", MSG_PROMETHEUS_URL, field_path=".url"),
]

#: Applied to the whole object (crdgen puts them at the root of the schema).
NAME_RULES = [
    cel(
        f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && "
        f"self.metadata.name.matches('{DNS1035_LABEL_PATTERN}')",
        MSG_NAME,
    )
]


def name_error(name: str) -> str | None:
    """Why `name` cannot name a DisaggDeployment (the NAME_RULES check, offline), or None."""
    if len(name) > MAX_NAME_LENGTH or not re.fullmatch(DNS1035_LABEL_PATTERN, name):
        return MSG_NAME
    return None


DRAIN_RULES = [
    cel(
        # has(): the API server also checks the `default: {}` itself, before nested defaults apply.
        "!has(self.timeoutSeconds) || (self.timeoutSeconds >= 1 && self.timeoutSeconds <= 3600)",
        MSG_DRAIN_TIMEOUT,
        field_path=".timeoutSeconds",
    )
]

SPLIT_THRESHOLD_RULES = [
    cel("type(self) == int ? (self >= 1 && self <= 10000000) : self == 'auto'", MSG_SPLIT_THRESHOLD)
]

# ---------------------------------------------------------------------------
# Schema helpers.

#: Free-form object kept as-is by the API server (no pruning).
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]

#: Resource quantities (limits or requests): quantity strings or integers by resource name.
_QUANTITIES = {
    "type": "object",
    "description": "Quantities by resource name; nvidia.com/gpu, if set, must equal gpusPerReplica.",
    "x-kubernetes-preserve-unknown-fields": True,
    # Typed (and short) so the CEL rule's cost is bounded; other resources are kept as they are.
    "properties": {
        GPU_RESOURCE: {
            "x-kubernetes-int-or-string": True,
            "maxLength": 8,
            "description": "Whole GPUs per container.",
        }
    },
}

#: A full PodTemplateSpec, kept verbatim (validated by the Deployment it ends up in). Only the
#: parts the operator relies on are typed, so the API server can check them at admission:
#: a spec, at least one container, each with a name and an image, and its GPU quantities.
PodTemplate = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "x-kubernetes-validations": TEMPLATE_RULES,
            "description": (
                "Pod template of the pool's workers (a core/v1 PodTemplateSpec: metadata and spec). "
                "The operator adds its labels, a readiness gate of type disagg.dev/routable and, unless "
                "set, nvidia.com/gpu requests and limits of gpusPerReplica on the engine container."
            ),
            "properties": {
                "spec": {
                    "type": "object",
                    "description": "The workers' core/v1 PodSpec.",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "x-kubernetes-validations": TEMPLATE_SPEC_RULES,
                    "properties": {
                        "containers": {
                            "type": "array",
                            "description": "At least one container, each with a name and an image.",
                            "maxItems": 32,
                            "items": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                                "x-kubernetes-validations": CONTAINER_RULES,
                                "properties": {
                                    "name": {
                                        "type": "string",
                                        "maxLength": 253,
                                        "description": "Container name.",
                                    },
                                    "image": {
                                        "type": "string",
                                        "maxLength": 4096,
                                        "description": "Container image.",
                                    },
                                    "resources": {
                                        "type": "object",
                                        "description": "Compute resources of the container.",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                        "properties": {"limits": _QUANTITIES, "requests": _QUANTITIES},
                                    },
                                },
                            },
                        }
                    },
                }
            },
        }
    ),
]

SplitThreshold = Annotated[
    int | Literal["auto"],
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": SPLIT_THRESHOLD_RULES,
            "description": (
                "Prompt length (uncached tokens) from which a request is disaggregated, in conditional "
                "placement: shorter prompts are prefilled locally on the decode worker. 'auto' lets the "
                "planner derive it from the stage models (where the transfer pays for itself)."
            ),
        }
    ),
]


def _sub(model: type[BaseModel], description: str) -> Any:
    """A nested object field defaulted to `{}`, so the API server fills in its own defaults."""
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


class _Model(BaseModel):
    """Base: camelCase wire names, snake_case attributes, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    def to_dict(self) -> dict[str, Any]:
        """Wire form (camelCase), without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# ---------------------------------------------------------------------------
# Spec.


class Placement(_Model):
    """Where prefill runs relative to decode."""

    mode: Literal["disaggregated", "colocated", "conditional"] = Field(
        "disaggregated",
        description=(
            "disaggregated: every request is prefilled on the prefill pool and its KV cache sent to the "
            "decode pool. colocated: one pool does both (pools.colocated). conditional: prompts of at "
            "least splitThresholdTokens go through the prefill pool, shorter ones are prefilled locally "
            "on the decode pool."
        ),
    )
    split_threshold_tokens: SplitThreshold = "auto"

    @field_validator("split_threshold_tokens", mode="before")
    @classmethod
    def _check_threshold(cls, v: Any) -> Any:
        # Same rule as the CEL one: an int in range, or exactly the string "auto" (not "123").
        ok = v == "auto" if isinstance(v, str) else (type(v) is int and 1 <= v <= 10_000_000)
        if not ok:
            raise ValueError(MSG_SPLIT_THRESHOLD)
        return v


class EncoderServiceModel(_Model):
    """Encoder service time: fixedMs + msPerItem x items (images, video frames, audio clips)."""

    fixed_ms: float = Field(
        we.ENCODER_FIXED_MS, ge=0, description="Fixed cost of one encoder call, in milliseconds."
    )
    ms_per_item: float = Field(
        we.ENCODER_MS_PER_ITEM, gt=0, description="Cost per multimodal item, in milliseconds."
    )


class PrefillServiceModel(_Model):
    """Prefill service time: fixedMs + msPerToken x tokens + msPerTokenSquared x tokens^2, in chunks."""

    fixed_ms: float = Field(
        we.PREFILL_FIXED_MS, ge=0, description="Fixed cost of one prefill, in milliseconds."
    )
    ms_per_token: float = Field(
        we.PREFILL_MS_PER_TOKEN, gt=0, description="Cost per prompt token, in milliseconds."
    )
    ms_per_token_squared: float = Field(
        0.0, ge=0, description="Quadratic (attention) cost per token squared, in milliseconds."
    )
    chunk_tokens: int = Field(
        we.CHUNK_TOKENS, ge=1, le=1_000_000, description="Chunked-prefill size, in tokens."
    )


class DecodeServiceModel(_Model):
    """Decode step time: stepFixedMs + stepMsPerSequence x running sequences, with `slots` sequences per worker."""

    step_fixed_ms: float = Field(
        we.DECODE_STEP_MS, gt=0, description="Fixed cost of one decode step, in milliseconds."
    )
    step_ms_per_sequence: float = Field(
        0.0, ge=0, description="Added step cost per running sequence, in milliseconds."
    )
    slots: int = Field(
        we.DECODE_SLOTS, ge=1, le=100_000, description="Concurrent sequences (batch slots) per decode worker."
    )
    kv_cache_tokens: int = Field(
        we.DECODE_KV_CACHE_TOKENS,
        ge=1,
        le=MAX_KV_CACHE_TOKENS,
        description="KV-cache capacity of one decode worker, in tokens (vLLM: num_gpu_blocks x block_size, "
        "logged as 'GPU KV cache size'; SGLang: max_total_num_tokens). A sequence reserves prompt + output "
        "tokens of it while it decodes, so long contexts can fill it before the slots; the planner then "
        "sizes the pool by KV memory. Default: a 70B model (320 KiB/token) with FP8 weights on 2 x H100 80 GB.",
    )


class ColocatedServiceModel(PrefillServiceModel, DecodeServiceModel):
    """Colocated worker: the prefill and the decode parameters of the same engine."""


class DrainPolicy(_Model):
    """How a worker is retired when its pool shrinks or is rebalanced."""

    timeout_seconds: int = Field(
        300,
        description=(
            "Longest wait (1..3600 s) for a victim's in-flight requests and pending KV transfers to finish."
        ),
    )
    on_timeout: Literal["proceed", "readmit"] = Field(
        "proceed",
        description=(
            "At the deadline: proceed removes the pod anyway; readmit makes it routable again and "
            "cancels the scale-down step."
        ),
    )

    @model_validator(mode="after")
    def _check_timeout(self) -> DrainPolicy:
        if not (1 <= self.timeout_seconds <= 3600):
            raise ValueError(MSG_DRAIN_TIMEOUT)
        return self

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": DRAIN_RULES})


class Pool(_Model):
    """One worker pool: a Deployment sized by the autoscaler within [minReplicas, maxReplicas]."""

    replicas: int | None = Field(
        None,
        ge=0,
        le=MAX_REPLICAS,
        description="Initial replicas (defaults to minReplicas); afterwards the autoscaler owns the count.",
    )
    min_replicas: int = Field(
        1, ge=0, le=MAX_REPLICAS, description="Lowest replica count the autoscaler may set."
    )
    max_replicas: int = Field(
        ..., ge=1, le=MAX_REPLICAS, description="Highest replica count the autoscaler may set."
    )
    gpus_per_replica: int = Field(
        1,
        ge=1,
        le=MAX_GPUS_PER_REPLICA,
        description="GPUs of one worker (its tensor/pipeline-parallel size); counted against autoscaling.gpuBudget.",
    )
    template: PodTemplate
    drain: DrainPolicy = _sub(DrainPolicy, "Drain policy of this pool's workers.")

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": POOL_RULES})

    @field_validator("template")
    @classmethod
    def _check_template(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(v.get("spec"), dict):
            raise ValueError(MSG_TEMPLATE_SPEC)
        containers = v["spec"].get("containers")
        if not isinstance(containers, list) or not containers:
            raise ValueError(MSG_TEMPLATE_CONTAINERS)
        for c in containers:
            if not (
                isinstance(c, dict)
                and c.get("name")
                and isinstance(c.get("image"), str)
                and c["image"].strip()
            ):
                raise ValueError(MSG_CONTAINER_IMAGE)
        return v

    @model_validator(mode="after")
    def _check_replicas(self) -> Pool:
        if self.min_replicas > self.max_replicas:
            raise ValueError(MSG_MIN_LE_MAX)
        if self.replicas is not None and not (self.min_replicas <= self.replicas <= self.max_replicas):
            raise ValueError(MSG_REPLICAS_IN_RANGE)
        if any(q != str(self.gpus_per_replica) for q in template_gpus(self.template)):
            raise ValueError(MSG_GPUS_DISAGREE)
        return self

    @property
    def initial_replicas(self) -> int:
        return self.min_replicas if self.replicas is None else self.replicas


def template_gpus(template: dict[str, Any]) -> list[str]:
    """Every nvidia.com/gpu quantity the template's containers request or limit, as text."""
    out = []
    for c in (template.get("spec") or {}).get("containers") or []:
        resources = (c.get("resources") if isinstance(c, dict) else None) or {}
        for part in ("limits", "requests"):
            quantities = resources.get(part) or {}
            if GPU_RESOURCE in quantities:
                out.append(str(quantities[GPU_RESOURCE]))
    return out


class EncoderPool(Pool):
    """Encoder pool (multimodal E/P/D): turns images, video or audio into embeddings for prefill."""

    service_model: EncoderServiceModel = _sub(EncoderServiceModel, "Encoder service-time model.")


class PrefillPool(Pool):
    """Prefill pool: computes the prompt's KV cache and sends it to a decode worker."""

    service_model: PrefillServiceModel = _sub(PrefillServiceModel, "Prefill service-time model.")


class DecodePool(Pool):
    """Decode pool: receives KV caches and generates output tokens."""

    service_model: DecodeServiceModel = _sub(DecodeServiceModel, "Decode step-time model.")


class ColocatedPool(Pool):
    """Colocated pool: each worker prefills and decodes (placement.mode colocated)."""

    service_model: ColocatedServiceModel = _sub(
        ColocatedServiceModel, "Prefill and decode models of the worker."
    )


class Pools(_Model):
    """The worker pools. Disaggregated and conditional placement need prefill and decode; colocated needs colocated."""

    encoder: EncoderPool | None = Field(
        None,
        description="Optional encoder pool (multimodal E/P/D): turns images, video or audio into embeddings for prefill.",
    )
    prefill: PrefillPool | None = Field(
        None,
        description="Prefill pool: computes each prompt's KV cache and sends it to a decode worker. "
        "Required by disaggregated and conditional placement.",
    )
    decode: DecodePool | None = Field(
        None,
        description="Decode pool: receives KV caches and generates output tokens. "
        "Required by disaggregated and conditional placement.",
    )
    colocated: ColocatedPool | None = Field(
        None,
        description="Colocated pool: each worker prefills and decodes. Only (and required) with placement.mode colocated.",
    )


class KVTransfer(_Model):
    """KV-cache transfer between prefill and decode: setup + bytes / bandwidth, sent in chunks."""

    bytes_per_token: int = Field(
        we.KV_BYTES_PER_TOKEN, ge=1, description="KV-cache bytes per token (all layers, all heads)."
    )
    link_setup_ms: float = Field(
        we.LINK_SETUP_MS, ge=0, description="Fixed setup cost of one transfer, in milliseconds."
    )
    bandwidth_gi_bps: float = Field(
        we.LINK_GIBPS, gt=0, alias="bandwidthGiBps", description="Link bandwidth per transfer, in GiB/s."
    )
    chunk_tokens: int = Field(
        we.CHUNK_TOKENS,
        ge=1,
        le=1_000_000,
        description="Tokens per streamed chunk (overlaps transfer with prefill).",
    )
    stream_chunks: bool = Field(
        False,
        description="Send KV chunk by chunk while prefill runs (SGLang-style eager sends); false: the whole KV "
        "after prefill (vLLM NIXL). The planner and the emulator both follow it.",
    )
    max_concurrent_transfers: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Sends one KV link carries at once (each chunk of a streamed send counts as one); "
        "later ones wait in a FIFO queue. 0: no limit (the link shares its bandwidth among all sends).",
    )


class SLO(_Model):
    """Latency targets, at `percentile`."""

    ttft_seconds: float = Field(we.TTFT_S, gt=0, description="Time-to-first-token target, in seconds.")
    itl_seconds: float = Field(we.ITL_S, gt=0, description="Inter-token latency target, in seconds.")
    percentile: float = Field(
        we.PERCENTILE, gt=0, lt=1, description="Quantile the targets apply to, in (0, 1), e.g. 0.9."
    )
    itl_statistic: Literal["max", "p99", "mean"] = Field(
        "max",
        description="How one request's inter-token gaps meet itlSeconds: max (every gap: one stall is a breach), "
        "p99 (the 99th percentile gap) or mean (the mean gap).",
    )
    ttft_seconds_per_thousand_tokens: float = Field(
        0.0,
        ge=0,
        le=60,
        description="Added to ttftSeconds per 1,000 prompt tokens: a TTFT target that grows with the "
        "prompt (0: flat). The planner gives each request-size class its own target.",
    )


#: Compute resources of the router container (a core/v1 ResourceRequirements), kept verbatim.
RouterResources = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "description": "Resources of the router container (a core/v1 ResourceRequirements: requests, "
            "limits).",
        }
    ),
]


class Router(_Model):
    """The engine's own P/D router in front of the pools: the deployment's one OpenAI-compatible endpoint.

    vLLM gets `vllm-router`, SGLang `sglang-router` (pinned versions, docs/router.md); the
    operator passes the pool selectors and gives it a namespaced Role to discover the pods.
    """

    enabled: bool = Field(
        True, description="Run the router (a Deployment and a Service named <name>-router)."
    )
    image: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        description="Router container image. Default: a pinned Python image that installs the pinned router "
        "wheel from PyPI at start; an image that already has the router binary runs it directly.",
    )
    replicas: int = Field(
        1,
        ge=0,
        le=64,
        description=(
            "Router replicas. With 2 or more the endpoint keeps serving while one router pod"
            " restarts (with 1, requests started then are refused)."
        ),
    )
    resources: RouterResources = Field(
        default_factory=dict, description="Resources of the router container (requests, limits)."
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Arguments appended to the router's command line (e.g. --prefill-policy round_robin); "
        "a flag given here overrides the operator's value for it (e.g. --worker-startup-check-interval, 1 s "
        "by default).",
    )


#: spec.monitoring.podMonitor: create a Prometheus Operator PodMonitor for the deployment's pods.
POD_MONITOR_MODES = ("auto", "enabled", "disabled")


class Monitoring(_Model):
    """How the deployment's engines and router are scraped (docs/metrics.md "Scraping")."""

    pod_monitor: Literal["auto", "enabled", "disabled"] = Field(
        "auto",
        description="Create a monitoring.coreos.com/v1 PodMonitor (named like the deployment) that scrapes the engine "
        "pods and the router with the labels the autoscaler's queries use. auto: when the Prometheus "
        "Operator's PodMonitor CRD is served; enabled: always (a Warning event while the CRD is missing); "
        "disabled: never (an existing one is deleted).",
    )


class SecretKeyRef(_Model):
    """A key of a Secret in the DisaggDeployment's namespace."""

    name: str = Field(..., min_length=1, max_length=253, description="Secret name.")
    key: str = Field(..., min_length=1, max_length=253, description="Key in the Secret.")


class PrometheusTLS(_Model):
    """TLS settings for the Prometheus connection."""

    insecure_skip_verify: bool = Field(
        False, description="Skip server certificate verification (testing only)."
    )
    ca_secret_ref: SecretKeyRef | None = Field(None, description="CA bundle (PEM) to verify the server with.")


class PrometheusConfig(_Model):
    """Where the autoscaler reads engine metrics."""

    url: str = Field(
        ...,
        min_length=1,
        max_length=2048,
        description="Base URL of the Prometheus HTTP API, e.g. http://prometheus-operated.monitoring:9090.",
    )
    bearer_token_secret_ref: SecretKeyRef | None = Field(None, description="Bearer token for the API.")
    tls: PrometheusTLS | None = Field(None, description="TLS settings.")

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": PROMETHEUS_RULES})

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        if not re.fullmatch(PROMETHEUS_URL_PATTERN, v):
            raise ValueError(MSG_PROMETHEUS_URL)
        return v


class Sizing(_Model):
    """Which measured inputs the autoscaling decision uses (docs/planner.md)."""

    request_sizes: bool = Field(
        SIZING_REQUEST_SIZES_DEFAULT,
        description="Size for the prompt/output length distribution (the engines' token histograms), "
        "not only the mean request.",
    )
    burstiness: bool = Field(
        SIZING_BURSTINESS_DEFAULT,
        description="Use the measured index of dispersion of arrival counts (per sub-window) in the "
        "queueing formulas and the forecast's counting noise, instead of Poisson; and in the queueing formulas "
        "the arrival variability the prefill queue's mean wait shows beyond it (requests that arrive together "
        "within a scrape), when two decisions in a row read it.",
    )
    auto_headroom: bool = Field(
        SIZING_AUTO_HEADROOM_DEFAULT,
        description="Standing spare capacity derived from the observed burst profile (how far load rose "
        "within one decision lead, start-up + interval + scrape, over the last hour); a burst still ramping "
        "into the metric window uses its share of it; at a rate more than 3x the hour's median only rises from "
        "comparable levels count (the top of an on/off source is not a foot for another jump); `headroom` is "
        "then a floor under it. Rises it cannot cover, from a silence or more than 3x their foot (on/off "
        "traffic many times its low level), stand as the rate they reached within the last hour, when "
        "their requests are more than the SLO percentile lets miss.",
    )
    front_load_gain: bool = Field(
        SIZING_FRONT_LOAD_GAIN_DEFAULT,
        description="Learn a gain on the load the prefill (and encoder) pools are sized for from lasting "
        "TTFT misses the model did not predict (the fleet at plan and steady, yet the observed TTFT percentile "
        "over the target), e.g. requests that arrive together within a scrape; it falls back to 1 while TTFT "
        "is comfortably within the target. Flat TTFT targets only.",
    )
    error_budget: bool = Field(
        SIZING_ERROR_BUDGET_DEFAULT,
        description="Spend the error budget: while the requests of about the last week (counts fading with a "
        "7-day time constant) met TTFT more "
        "often than the SLO percentile asks (the engines' TTFT histogram), plan at a lower percentile (at most "
        "twice the SLO's share of misses, the surplus spread over at least the next 30 minutes of requests); "
        "it may hold back growth, never shrink a pool the SLO percentile would keep. Flat TTFT targets only.",
    )

    @property
    def reads_any(self) -> bool:
        """Whether any switch needs the sizing readings (none are queried otherwise)."""
        return (
            self.request_sizes
            or self.burstiness
            or self.auto_headroom
            or self.front_load_gain
            or self.error_budget
        )

    @property
    def reads_histograms(self) -> bool:
        """Whether the token, TTFT and queue-time histograms are read: the sizes plan by them,
        the front load gain judges its misses by them, the error budget counts the TTFTs, and
        burstiness reads the spread of the prefill queue's waits."""
        return self.request_sizes or self.front_load_gain or self.error_budget or self.burstiness


class Autoscaling(_Model):
    """Autoscaler settings."""

    enabled: bool = Field(
        True, description="Size the pools from metrics. When false, replicas are left as set."
    )
    paused: bool = Field(False, description="Temporarily hold every pool at its current size.")
    interval_seconds: int = Field(30, ge=5, le=3600, description="Seconds between autoscaling decisions.")
    prometheus: PrometheusConfig | None = Field(
        None, description="Prometheus to read; defaults to the operator's --prometheus-url."
    )
    scrape_interval_seconds: int = Field(
        15,
        ge=1,
        le=300,
        description="Prometheus' scrape interval for the engine pods: a sample older than two of them is stale.",
    )
    metric_window_seconds: int = Field(
        METRIC_WINDOW_SECONDS_DEFAULT,
        ge=10,
        le=3600,
        description="Rate/quantile window of the queries, in seconds.",
    )
    scale_down_stabilization_seconds: int = Field(
        300,
        ge=0,
        le=86400,
        description="A pool shrinks only to the highest recommendation within this window.",
    )
    max_scale_up_step: int | None = Field(
        None,
        ge=1,
        le=MAX_REPLICAS,
        description="Most replicas added to a pool per decision. Unset: all the plan needs at once "
        "(a burst on a large pool can need tens of workers).",
    )
    max_scale_down_step: int | None = Field(
        None,
        ge=1,
        le=MAX_REPLICAS,
        description="Most replicas removed (drained) from a pool per decision. Unset: down to the "
        "stabilized recommendation at once; every victim is drained first.",
    )
    gpu_budget: int | None = Field(
        None,
        ge=1,
        le=MAX_GPU_BUDGET,
        description="Most GPUs all pools together may use; split across stages by SLO pressure.",
    )
    headroom: float = Field(
        0.0,
        ge=0,
        le=4,
        description="Spare capacity kept above the forecast demand, as a fraction (0.3 = 30 %): "
        "absorbs bursts that rise faster than a worker starts.",
    )
    sizing: Sizing = _sub(
        Sizing,
        "Measured inputs the autoscaler sizes with beyond the mean request and Poisson arrivals "
        "(docs/planner.md, 'Request sizes, burstiness and automatic headroom').",
    )
    queries: dict[str, Annotated[str, Field(max_length=4096)]] | None = Field(
        None,
        max_length=32,
        description="PromQL overrides by query name (see docs/metrics.md); the engine preset fills the rest.",
    )

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": AUTOSCALING_RULES})

    @model_validator(mode="after")
    def _check_window(self) -> Autoscaling:
        if self.metric_window_seconds < 2 * self.scrape_interval_seconds:
            raise ValueError(MSG_WINDOW_VS_SCRAPE)
        return self


class DisaggDeploymentSpec(_Model):
    """Desired state of a disaggregated LLM serving deployment."""

    engine: Literal["vllm", "sglang"] = Field(
        ..., description="Serving engine; selects metric names and drain behaviour."
    )
    model: str = Field(
        ..., min_length=1, max_length=256, description="Model display name (e.g. the served model name)."
    )
    placement: Placement = _sub(Placement, "Where prefill runs relative to decode.")
    pools: Pools = Field(..., description="The worker pools.")
    kv_transfer: KVTransfer = _sub(KVTransfer, "KV-cache transfer model between prefill and decode.")
    slo: SLO = _sub(SLO, "Latency targets the pools are sized for.")
    autoscaling: Autoscaling = _sub(Autoscaling, "Autoscaler settings.")
    router: Router = _sub(Router, "The P/D router in front of the pools (the deployment's endpoint).")
    monitoring: Monitoring = _sub(Monitoring, "How the pools and the router are scraped.")

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": SPEC_RULES})

    @model_validator(mode="after")
    def _check_cross_fields(self) -> DisaggDeploymentSpec:
        p = self.pools
        if self.placement.mode == "colocated":
            if p.colocated is None:
                raise ValueError(MSG_COLOCATED_NEEDS_POOL)
            if p.prefill is not None or p.decode is not None:
                raise ValueError(MSG_COLOCATED_FORBIDS_PD)
        else:
            if p.prefill is None or p.decode is None:
                raise ValueError(MSG_DISAGG_NEEDS_PD)
            if p.colocated is not None:
                raise ValueError(MSG_DISAGG_FORBIDS_COLOCATED)
        budget = self.autoscaling.gpu_budget
        if budget is not None and budget < min_gpus(self):
            raise ValueError(MSG_GPU_BUDGET)
        return self


# ---------------------------------------------------------------------------
# Status.


class _Status(_Model):
    model_config = ConfigDict(extra="ignore")


class Condition(_Status):
    """A Kubernetes-style condition."""

    type: str = Field(
        ..., min_length=1, max_length=316, description="One of " + ", ".join(names.CONDITION_TYPES) + "."
    )
    status: Literal["True", "False", "Unknown"] = Field(..., description="True, False or Unknown.")
    reason: str | None = Field(None, max_length=1024, description="CamelCase reason of the last transition.")
    message: str | None = Field(None, max_length=32768, description="Human-readable details.")
    last_transition_time: str | None = Field(
        None,
        description="When status last changed (RFC 3339).",
        json_schema_extra={"format": "date-time"},
    )
    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation the condition was computed for."
    )


class PoolStatus(_Status):
    """Observed state of one pool."""

    replicas: int | None = Field(None, description="Pods of the pool's Deployment.")
    ready_replicas: int | None = Field(None, description="Ready (and routable) pods.")
    desired_replicas: int | None = Field(None, description="Replicas the autoscaler wants.")
    draining_pods: list[Annotated[str, Field(max_length=253)]] | None = Field(
        None, max_length=256, description="Pods currently being drained."
    )


class Decision(_Status):
    """The last autoscaling decision and the figures behind it."""

    time: str | None = Field(
        None, description="When it was taken (RFC 3339).", json_schema_extra={"format": "date-time"}
    )
    reason: str | None = Field(None, max_length=1024, description="CamelCase reason.")
    inputs: FreeForm | None = Field(None, description="Metrics and model figures the decision used.")
    outputs: FreeForm | None = Field(None, description="Replica targets and predicted latencies.")


class DisaggDeploymentStatus(_Status):
    """Observed state, written by the operator."""

    observed_generation: int | None = Field(None, description="metadata.generation last reconciled.")
    conditions: list[Condition] | None = Field(
        None,
        max_length=16,
        description=", ".join(names.CONDITION_TYPES) + ".",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    pools: dict[str, PoolStatus] | None = Field(
        None, max_length=8, description="Observed state per pool name."
    )
    ratio: str | None = Field(
        None, max_length=64, description='Replica ratio P:D(:E), e.g. "1:2.5" or "1:3:1".'
    )
    last_decision: Decision | None = Field(None, description="The last autoscaling decision.")
    endpoint: str | None = Field(
        None,
        max_length=512,
        description="OpenAI-compatible base URL of the router inside the cluster "
        "(http://NAME-router.NAMESPACE:8000/v1); absent when spec.router.enabled is false.",
    )
    calibration: FreeForm | None = Field(None, description="Stage-model parameters fitted from live metrics.")
    scaler_state: FreeForm | None = Field(
        None,
        description="The autoscaler's memory (stabilization window, rate samples, calibration samples, "
        "token shape, start-up times, front load gain, the arrival pool's uncounted requests, the error "
        "budget's counts), bounded in size: a restarted operator resumes from it.",
    )


# ---------------------------------------------------------------------------
# Helpers.


def parse_spec(spec: dict[str, Any]) -> DisaggDeploymentSpec:
    """Validate a spec dict (camelCase, as stored by the API server)."""
    return DisaggDeploymentSpec.model_validate(spec)


def spec_warnings(spec: DisaggDeploymentSpec) -> list[tuple[str, str]]:
    """Values that are allowed but probably mistakes, as (field path, why) pairs.

    What can never work is refused by the rules above; these can work, so the operator
    accepts them and reports a Warning condition and Event naming the field.
    """
    out: list[tuple[str, str]] = []
    a = spec.autoscaling
    if a.metric_window_seconds < 4 * a.scrape_interval_seconds:
        out.append(
            (
                "spec.autoscaling.metricWindowSeconds",
                f"{a.metric_window_seconds} s holds fewer than 4 scrapes of {a.scrape_interval_seconds} s: "
                "one missed scrape leaves a rate with no samples and the autoscaler holds",
            )
        )
    if a.interval_seconds < a.scrape_interval_seconds:
        out.append(
            (
                "spec.autoscaling.intervalSeconds",
                f"{a.interval_seconds} s is shorter than the scrape interval ({a.scrape_interval_seconds} s): "
                "decisions repeat on the same samples",
            )
        )
    if a.enabled and 0 < a.scale_down_stabilization_seconds < a.interval_seconds:
        out.append(
            (
                "spec.autoscaling.scaleDownStabilizationSeconds",
                f"{a.scale_down_stabilization_seconds} s is shorter than one decision interval "
                f"({a.interval_seconds} s): it stabilizes nothing",
            )
        )
    if spec.slo.ttft_seconds > 60:
        out.append(
            (
                "spec.slo.ttftSeconds",
                f"{spec.slo.ttft_seconds:g} seconds to the first token; is it milliseconds?",
            )
        )
    if spec.slo.itl_seconds > 5:
        out.append(
            ("spec.slo.itlSeconds", f"{spec.slo.itl_seconds:g} seconds between tokens; is it milliseconds?")
        )
    if spec.placement.mode != "conditional" and spec.placement.split_threshold_tokens != "auto":
        out.append(
            (
                "spec.placement.splitThresholdTokens",
                f"only used by placement.mode 'conditional', not {spec.placement.mode!r}",
            )
        )
    prom = a.prometheus
    if prom is not None and prom.url.startswith("http://"):
        if prom.bearer_token_secret_ref is not None:
            out.append(
                ("spec.autoscaling.prometheus.url", "a bearer token would be sent in clear text over http://")
            )
        if prom.tls is not None:
            out.append(("spec.autoscaling.prometheus.tls", "TLS settings are unused with an http:// URL"))
    for name, pool in pools(spec).items():
        if a.enabled and pool.min_replicas == pool.max_replicas:
            out.append(
                (
                    f"spec.pools.{name}.maxReplicas",
                    f"equals minReplicas ({pool.min_replicas}): the autoscaler cannot resize this pool",
                )
            )
    return out


def pool_names(spec: DisaggDeploymentSpec) -> list[str]:
    """Names of the pools present in `spec`, in pipeline order."""
    return [name for name in POOL_NAMES if getattr(spec.pools, name) is not None]


def pools(spec: DisaggDeploymentSpec) -> dict[str, Pool]:
    """Present pools by name, in pipeline order."""
    return {name: getattr(spec.pools, name) for name in pool_names(spec)}


def min_gpus(spec: DisaggDeploymentSpec) -> int:
    """GPUs needed with every pool at minReplicas."""
    return sum(p.min_replicas * p.gpus_per_replica for p in pools(spec).values())


def format_ratio(replicas: dict[str, float]) -> str:
    """Pool ratio P:D(:E) normalised to prefill = 1, e.g. {"prefill": 2, "decode": 5} -> "1:2.5".

    Colocated deployments report their single pool count; a zero prefill pool reports raw counts.
    """

    def fmt(x: float) -> str:
        return f"{x:.2f}".rstrip("0").rstrip(".")

    if names.POOL_COLOCATED in replicas:
        return fmt(replicas[names.POOL_COLOCATED])
    order = [n for n in (names.POOL_PREFILL, names.POOL_DECODE, names.POOL_ENCODER) if n in replicas]
    base = replicas.get(names.POOL_PREFILL) or 0
    if base <= 0:
        return ":".join(fmt(replicas[n]) for n in order)
    return ":".join(fmt(replicas[n] / base) for n in order)


def stage_models(spec: DisaggDeploymentSpec) -> dict[str, Any]:
    """Service-time models of each present stage, as `disagg.model` dataclasses.

    Keys: encoder, prefill, transfer, decode (the colocated pool yields prefill
    and decode; transfer is present only when prefill runs remotely).
    """
    from disagg import model as m  # lazy: owned by another module, may evolve independently

    out: dict[str, Any] = {}
    p = spec.pools
    if p.encoder is not None:
        e = p.encoder.service_model
        out[names.POOL_ENCODER] = m.EncoderModel(fixed_ms=e.fixed_ms, ms_per_item=e.ms_per_item)
    prefill = (
        p.prefill.service_model
        if p.prefill is not None
        else (p.colocated.service_model if p.colocated else None)
    )
    decode = (
        p.decode.service_model
        if p.decode is not None
        else (p.colocated.service_model if p.colocated else None)
    )
    if prefill is not None:
        out[names.POOL_PREFILL] = m.PrefillModel(
            fixed_ms=prefill.fixed_ms,
            ms_per_token=prefill.ms_per_token,
            ms_per_token_sq=prefill.ms_per_token_squared,
            chunk_tokens=prefill.chunk_tokens,
        )
    if p.prefill is not None:
        kv = spec.kv_transfer
        out["transfer"] = m.TransferModel(
            kv_bytes_per_token=kv.bytes_per_token,
            setup_ms=kv.link_setup_ms,
            bandwidth_gibps=kv.bandwidth_gi_bps,
            chunk_tokens=kv.chunk_tokens,
        )
    if decode is not None:
        out[names.POOL_DECODE] = m.DecodeModel(
            step_fixed_ms=decode.step_fixed_ms,
            step_ms_per_seq=decode.step_ms_per_sequence,
            slots=decode.slots,
            kv_cache_tokens=decode.kv_cache_tokens,
        )
    return out


def stage_bundle(spec: DisaggDeploymentSpec) -> Any:
    """All stage models as one `disagg.model.StageModels`; absent stages keep the model defaults."""
    from disagg import model as m

    return m.StageModels(**stage_models(spec))


@dataclass(frozen=True)
class PlannerInputs:
    """Everything `planner.plan` needs from a spec except the demand: the one translation used by
    the autoscaler, the emulator and `disagg plan --from`."""

    models: Any  # disagg.model.StageModels
    slo: Any  # disagg.planner.SLO
    bounds: dict[str, Any]  # pool -> disagg.planner.PoolBounds, for the spec's pools only
    budget: int | None
    placement: str
    chunked: bool
    split_threshold: int | Literal["auto"]

    def plan(self, demand: Any, models: Any = None) -> Any:
        """`planner.plan` for `demand`; `models` replaces the spec's (calibrated models)."""
        from disagg import planner

        return planner.plan(
            demand,
            models or self.models,
            self.slo,
            self.bounds,
            self.budget,
            self.placement,
            chunked=self.chunked,
            split_threshold=None if self.split_threshold == "auto" else float(self.split_threshold),
        )

    def split_threshold_tokens(self) -> int:
        """Prompt length from which conditional placement prefills remotely ("auto": the planner's)."""
        if self.split_threshold != "auto":
            return int(self.split_threshold)
        from disagg import planner

        return int(planner.split_threshold_tokens(self.models, self.slo))


def planner_inputs(spec: DisaggDeploymentSpec) -> PlannerInputs:
    """The planner's inputs for `spec`: stage models, SLO, per-pool bounds, budget, placement."""
    from disagg import planner

    return PlannerInputs(
        models=stage_bundle(spec),
        slo=planner.SLO(
            spec.slo.ttft_seconds,
            spec.slo.itl_seconds,
            spec.slo.percentile,
            spec.slo.itl_statistic,
            ttft_s_per_1k_tokens=spec.slo.ttft_seconds_per_thousand_tokens,
        ),
        bounds={
            k: planner.PoolBounds(p.min_replicas, p.max_replicas, p.gpus_per_replica)
            for k, p in pools(spec).items()
        },
        budget=spec.autoscaling.gpu_budget,
        placement=spec.placement.mode,
        chunked=spec.kv_transfer.stream_chunks,
        split_threshold=spec.placement.split_threshold_tokens,
    )
