"""The operator's vocabulary: labels, annotations, the readiness gate, condition types,
Event reasons and pool names, each defined once.

Pure (standard library only). Other modules import these names instead of spelling the
strings out, so a rename happens in one place and a typo is an import error.
"""

from __future__ import annotations

# --------------------------------------------------------------------------- pools

#: Every pool a DisaggDeployment can have, in pipeline order.
POOL_ENCODER = "encoder"
POOL_PREFILL = "prefill"
POOL_DECODE = "decode"
POOL_COLOCATED = "colocated"
POOL_NAMES = (POOL_ENCODER, POOL_PREFILL, POOL_DECODE, POOL_COLOCATED)

#: Requests the front door turned away, a counter per DisaggDeployment (labels `namespace` and
#: `deployment`): a front door that applies `status.lastDecision.outputs.admittedFraction` (the
#: emulator's does) exports it. No engine sees those requests, so the arrival rate the engines'
#: histograms give leaves them out and the decision adds them back.
METRIC_FRONT_DOOR_REJECTED = "disagg_front_door_rejected_requests_total"

# --------------------------------------------------------------------------- the autoscaling loop

#: DisaggDeployments whose autoscaling steps write to the API server at once by default
#: (`disagg run --decisions-at-once`), and the most it accepts.
DECISIONS_AT_ONCE = 16
DECISIONS_AT_ONCE_MAX = 1024

# --------------------------------------------------------------------------- placements

PLACEMENT_DISAGGREGATED = "disaggregated"
PLACEMENT_COLOCATED = "colocated"
PLACEMENT_CONDITIONAL = "conditional"
#: Every spec.placement.mode (the planner and the simulator take the same).
PLACEMENTS = (PLACEMENT_DISAGGREGATED, PLACEMENT_COLOCATED, PLACEMENT_CONDITIONAL)
#: Prompt tokens from which conditional placement prefills remotely when no threshold is given
#: (the simulator's default; the operator's is `spec.placement.splitThresholdTokens`).
SPLIT_THRESHOLD_DEFAULT_TOKENS = 2048

# --------------------------------------------------------------------------- labels and annotations

#: Label on every child (and pod) naming the DisaggDeployment it belongs to.
LABEL_DEPLOYMENT = "disagg.dev/deployment"
#: Label on every child (and pod) naming its pool.
LABEL_POOL = "disagg.dev/pool"
#: Annotation on a pool Deployment: hash of its pod template.
ANNOTATION_TEMPLATE_HASH = "disagg.dev/template-hash"
#: Annotation on every child: hash of what the operator last applied.
ANNOTATION_APPLIED = "disagg.dev/applied-hash"
#: Annotation on a pod being drained: its drain record (JSON).
ANNOTATION_DRAIN = "disagg.dev/drain"
#: Kubernetes' annotation that orders a ReplicaSet's choice of pods to delete.
ANNOTATION_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
#: Label of the router's objects and pods. Not `LABEL_DEPLOYMENT`: the router is not a pool
#: (the pool logic, the drain and the emulator select pods by that label).
LABEL_ROUTER = "disagg.dev/router"
#: Label by which a Secret's owner lets the operator use it as Prometheus credentials.
LABEL_PROMETHEUS_CREDENTIALS = "disagg.dev/prometheus-credentials"
#: Label the Deployment controller puts on a pod: which ReplicaSet (template revision) owns it.
LABEL_POD_TEMPLATE_HASH = "pod-template-hash"
#: Pod condition (readiness gate) the operator sets: False on a worker being drained.
READINESS_GATE = "disagg.dev/routable"
#: Field manager, Event source and `app.kubernetes.io/managed-by` value.
MANAGER = "disagg-operator"

# --------------------------------------------------------------------------- conditions

COND_READY = "Ready"
COND_PROGRESSING = "Progressing"
COND_DEGRADED = "Degraded"
COND_METRICS_AVAILABLE = "MetricsAvailable"
COND_DRAINING = "Draining"
COND_BUDGET_LIMITED = "BudgetLimited"
COND_INVALID_SPEC = "InvalidSpec"
COND_DRAIN_HELD = "DrainHeld"  # a timed-out drain waits: its pod's work is unknown
COND_RECONCILE_FAILED = "ReconcileFailed"  # a child write was refused (the API server's message)
COND_WARNING = "Warning"  # the spec has unusual values (each named with its field)
COND_SLO_REACHABLE = "SloReachable"  # False: no fleet meets a target on the observed requests
#: Every condition type written to status.conditions, in display order.
CONDITION_TYPES = (
    COND_READY,
    COND_PROGRESSING,
    COND_DEGRADED,
    COND_METRICS_AVAILABLE,
    COND_DRAINING,
    COND_BUDGET_LIMITED,
    COND_SLO_REACHABLE,
    COND_INVALID_SPEC,
    COND_DRAIN_HELD,
    COND_RECONCILE_FAILED,
    COND_WARNING,
)

# --------------------------------------------------------------------------- readiness-gate reasons

GATE_ADMITTED = "Admitted"  # a new pod became routable (its start-up ends here)
GATE_READMITTED = "Readmitted"  # a drain was cancelled
GATE_DRAINING = "Draining"

# --------------------------------------------------------------------------- Event reasons

EVENT_INVALID_SPEC = "InvalidSpec"
EVENT_POOL_CREATED = "PoolCreated"
EVENT_POOL_UPDATED = "PoolUpdated"
EVENT_POOL_DELETED = "PoolDeleted"
EVENT_PAUSED = "Paused"
EVENT_DRAIN_STARTED = "DrainStarted"
EVENT_DRAIN_COMPLETED = "DrainCompleted"
EVENT_DRAIN_CANCELLED = "DrainCancelled"
EVENT_DRAIN_TIMEOUT = "DrainTimeout"
EVENT_DRAIN_HELD = "DrainHeld"
EVENT_WRONG_VICTIM = "WrongVictim"
EVENT_PENDING_PODS_REMOVED = "PendingPodsRemoved"
#: Autoscaling decisions use the decision's own reason (policy.REASONS) as the Event reason.

# The policies `disagg evaluate` compares, each with its one-line description (the CLI help shows
# them; kept here, not in disagg.evaluate, so `disagg --help` stays fast). The %% is argparse's %.
EVAL_POLICY_HELP = {
    "disagg": "this project: joint queueing planner on the observed demand, forecast and burst headroom one "
    "decision lead ahead, + policy.decide (300 s stabilization, drains, budget rebalance)",
    "static": "fixed pools planned for the trace's peak 60 s arrival rate",
    "hpa": "per-pool HPA: ceil(ready x utilisation / 0.7), 10 % tolerance, 300 s scale-down stabilization",
    "throughput": "Dynamo's rule at a 30 s cadence: per pool ceil(rate / per-replica throughput) from the "
    "stage models, proportional squeeze under a budget",
    "dynamo": "Dynamo's SLA planner at its defaults: every 180 s on a 180 s window, prefill/decode sized by "
    "profiled throughput with TTFT/ITL correction factors, ARIMA load predictor, no drain",
    "keda": "KEDA-style per pool: ceil((in flight + waiting) / target per replica), HPA 300 s scale-down window",
    "oracle": "hindsight oracle: per interval the fewest workers per pool meeting the target attainment, "
    "by search through the simulator, applied instantly (GPU-hour reference)",
    "planner-foresight": "the planner's fewest GPUs for each interval's true load, applied instantly",
}
