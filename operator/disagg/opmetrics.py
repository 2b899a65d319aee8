"""The operator's own Prometheus metrics (served by `disagg run` on --metrics-port).

Every name here is part of the public interface: the Grafana dashboard and the
alert examples use them. Labels: namespace, deployment (the DisaggDeployment's
name), and pool or stage where it applies.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

_DL = ("namespace", "deployment")
_PL = (*_DL, "pool")
_SL = (*_DL, "stage")

POOL_REPLICAS_DESIRED = Gauge(
    "disagg_pool_replicas_desired", "Replicas the autoscaler wants for the pool.", _PL, registry=REGISTRY
)
POOL_REPLICAS = Gauge("disagg_pool_replicas", "Pods present in the pool.", _PL, registry=REGISTRY)
POOL_REPLICAS_READY = Gauge(
    "disagg_pool_replicas_ready", "Ready (routable) pods in the pool.", _PL, registry=REGISTRY
)
POOL_RATIO = Gauge(
    "disagg_pool_ratio",
    "Desired replicas of the pool per prefill replica (the P:D(:E) ratio).",
    _PL,
    registry=REGISTRY,
)
POOL_DRAINING = Gauge("disagg_pool_draining_pods", "Pods of the pool being drained.", _PL, registry=REGISTRY)
GPUS = Gauge("disagg_gpus", "GPUs requested by all pools of the deployment.", _DL, registry=REGISTRY)
GPU_BUDGET = Gauge(
    "disagg_gpu_budget", "The deployment's GPU budget (absent when unlimited).", _DL, registry=REGISTRY
)

STAGE_ARRIVAL_RATE = Gauge(
    "disagg_stage_arrival_rate", "Arrival rate lambda into the stage (requests/s).", _SL, registry=REGISTRY
)
STAGE_WAIT = Gauge(
    "disagg_stage_time_in_system_seconds",
    "Time W a request spends in the stage (queue + service).",
    _SL,
    registry=REGISTRY,
)
STAGE_IN_SYSTEM = Gauge(
    "disagg_stage_in_system", "Requests L in the stage (Little's law L = lambda x W).", _SL, registry=REGISTRY
)
STAGE_UTILIZATION = Gauge(
    "disagg_stage_utilization", "Planned utilisation of the stage's pool (0..1).", _SL, registry=REGISTRY
)

PREDICTED_TTFT = Gauge(
    "disagg_predicted_ttft_seconds",
    "TTFT at the SLO percentile the planner predicts for the chosen sizes.",
    _DL,
    registry=REGISTRY,
)
PREDICTED_ITL = Gauge(
    "disagg_predicted_itl_seconds",
    "Inter-token latency the planner predicts for the chosen sizes.",
    _DL,
    registry=REGISTRY,
)
OBSERVED_TTFT = Gauge(
    "disagg_observed_ttft_seconds",
    "TTFT at the SLO percentile observed in Prometheus.",
    _DL,
    registry=REGISTRY,
)
OBSERVED_ITL = Gauge(
    "disagg_observed_itl_seconds", "Inter-token latency observed in Prometheus.", _DL, registry=REGISTRY
)
SLO_TTFT = Gauge("disagg_slo_ttft_seconds", "The TTFT target.", _DL, registry=REGISTRY)
SLO_ITL = Gauge("disagg_slo_itl_seconds", "The ITL target.", _DL, registry=REGISTRY)

DECISIONS = Counter(
    "disagg_decisions", "Autoscaling decisions by reason.", (*_DL, "reason"), registry=REGISTRY
)
METRIC_ERRORS = Counter(
    "disagg_metric_errors",
    "Metrics that were missing, stale or invalid, by kind.",
    (*_DL, "kind"),
    registry=REGISTRY,
)
DRAINS = Counter(
    "disagg_drains",
    "Finished drains by outcome (completed, timeout_proceed, timeout_readmit, cancelled).",
    (*_PL, "outcome"),
    registry=REGISTRY,
)
METRICS_AVAILABLE = Gauge(
    "disagg_metrics_available",
    "1 when the last snapshot was complete and fresh, else 0.",
    _DL,
    registry=REGISTRY,
)

# Names as exported (counters get a _total suffix), for the dashboard test.
EXPORTED_NAMES = sorted(
    {f"{m._name}_total" if isinstance(m, Counter) else m._name for m in REGISTRY._collector_to_names}
)

# Operator internals, one series each for the whole process (no per-object labels): how the
# operator itself keeps up (hack/bench/bench_scale.py reads them; docs/scale.md). Not on the
# per-deployment dashboard, so not in EXPORTED_NAMES.
_SECONDS_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    1.25,
    1.5,
    2,
    3,
    5,
    7.5,
    10,
    12.5,
    15,
    20,
    30,
    60,
    120,
    300,
)
LOOP_TICK = Histogram(
    "disagg_operator_loop_tick_seconds",
    "Time between the starts of two passes of the autoscaling loop (the target is its tick, 1 s).",
    buckets=_SECONDS_BUCKETS,
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "disagg_operator_reconcile_seconds",
    "Duration of one event-triggered reconcile of a DisaggDeployment (the count is the number of reconciles).",
    buckets=_SECONDS_BUCKETS,
    registry=REGISTRY,
)
DECISION_GAP = Histogram(
    "disagg_operator_decision_gap_seconds",
    "Time between two autoscaling decisions of one DisaggDeployment (the target is its intervalSeconds).",
    buckets=_SECONDS_BUCKETS,
    registry=REGISTRY,
)
DECISION_WAIT = Histogram(
    "disagg_operator_decision_wait_seconds",
    "Time a started step of the autoscaling loop waited before it ran, by what it waited for: "
    "wait=metrics (the tick's shared Prometheus queries), wait=slot (one of --decisions-at-once, "
    "asked for at a step's first write), "
    "wait=lock (the object's lock, held by a reconcile of the same object).",
    ["wait"],
    buckets=_SECONDS_BUCKETS,
    registry=REGISTRY,
)
DECISION_SECONDS = Histogram(
    "disagg_operator_decision_seconds",
    "Duration of one autoscaling decision, from holding its lock to its status written, less its wait "
    "for a write slot; "
    "outcome=changed for a decision that wrote new replicas, unchanged otherwise.",
    ["outcome"],
    buckets=_SECONDS_BUCKETS,
    registry=REGISTRY,
)
SHARD_OVERLAPS = Gauge(
    "disagg_operator_shard_overlaps",
    "Overlap of this shard with another shard (disagg.leader.ShardOverlapCheck): kind=selectors is 1 when "
    "both selectors can match one object in a shared namespace; kind=objects counts existing "
    "DisaggDeployments both own.",
    ["other_shard", "kind"],
    registry=REGISTRY,
)
