"""Bounded time series of DisaggDeployment pool state, for the web dashboard.

Pure: no Kopf, Kubernetes client or HTTP imports. Three producers feed a
`History`:

* the operator's runtime, which calls `History.record(...)` at every reconcile
  or autoscaling decision and `History.record_decision(...)` when it decides;
* `disagg dashboard --kubeconfig` (`disagg.dashboard.server.ClusterSource`),
  which polls the cluster and calls `History.record_object(body)`;
* `load_result(...)`, which turns a saved `disagg simulate/evaluate --output json`
  result into a History.

`History.to_json()` is the document served at /api/state:

    {"deployments": [{"namespace", "name", "conditions", "pools", "ratio",
                      "slo", "gpus", "gpu_budget", "summary",
                      "history": [snapshot, ...], "decisions": [decision, ...]}],
     "source": str, "time_axis": "unix" | "relative", "generated_at": unix s,
     "error": str | None}

A snapshot is {t, replicas, desired, ready, ratio, arrival_rps, planned_rps, stages,
predicted, observed, slo, draining, gpus, gpu_budget}; see `normalize_snapshot`. The
stages are the last plan's (at `planned_rps`, the rate it was sized for, and its replicas),
not the pools as they run.
A decision is {time, reason, targets, next_step, planned, message}, pool maps as
{pool: replicas}; see `normalize_decision`.
"""

from __future__ import annotations

import json
import math
import time as _time
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from disagg.names import POOL_DECODE, POOL_ENCODER, POOL_NAMES, POOL_PREFILL

POOL_ORDER = POOL_NAMES
STAGE_ORDER = (POOL_ENCODER, POOL_PREFILL, "transfer", POOL_DECODE)
DEFAULT_MAX_POINTS = 720  # 1 h at a 5 s poll
DEFAULT_MAX_DECISIONS = 50


# -- coercion helpers ---------------------------------------------------------
def _num(v: Any) -> float | None:
    """A finite float, or None for anything else (strings of numbers are accepted)."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _int(v: Any) -> int | None:
    f = _num(v)
    return None if f is None else round(f)


def _first(m: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if k in m and m[k] is not None:
            return m[k]
    return None


def pool_sort_key(name: str) -> tuple[int, str]:
    return (POOL_ORDER.index(name) if name in POOL_ORDER else len(POOL_ORDER), name)


def _counts(v: Any) -> dict[str, int]:
    """{pool: n} from {pool: n} or {pool: {"replicas": n}}; other entries are dropped."""
    out: dict[str, int] = {}
    if not isinstance(v, Mapping):
        return out
    for k, x in v.items():
        if isinstance(x, Mapping):
            x = _first(x, "replicas", "workers", "n", "count")
        n = _int(x)
        if n is not None:
            out[str(k)] = n
    return dict(sorted(out.items(), key=lambda kv: pool_sort_key(kv[0])))


def format_ratio(replicas: Mapping[str, float]) -> str:
    """P:D(:E) normalised to prefill = 1 (empty for no pools); see `disagg.api.format_ratio`."""
    from disagg.api import format_ratio as api_format_ratio  # pure, but pydantic: imported on use

    return api_format_ratio(replicas) if replicas else ""


def _latency(v: Any) -> dict[str, float | None]:
    """{ttft_s, itl_s} from a mapping using any of the usual spellings."""
    if not isinstance(v, Mapping):
        return {"ttft_s": None, "itl_s": None}
    return {
        "ttft_s": _num(_first(v, "ttft_s", "ttft", "ttftSeconds", "ttft_p95_s", "ttft_p95")),
        "itl_s": _num(_first(v, "itl_s", "itl", "itlSeconds", "itl_p95_s", "itl_p95", "tpot_s")),
    }


def _stages(v: Any) -> dict[str, dict[str, float | None]]:
    """{stage: {lambda, W, L, utilization}}; L = lambda x W (Little's law) when not given."""
    out: dict[str, dict[str, float | None]] = {}
    if not isinstance(v, Mapping):
        return out
    for name, s in v.items():
        if not isinstance(s, Mapping):
            continue
        lam = _num(_first(s, "lambda", "lam", "arrival_rps", "rate", "throughput"))
        w = _num(_first(s, "W", "w", "sojourn_s", "W_s", "latency_s"))
        if w is None and _num(s.get("W_ms")) is not None:
            w = _num(s["W_ms"]) / 1000.0  # type: ignore[operator]
        length = _num(_first(s, "L", "l", "in_system", "concurrency"))
        if length is None and lam is not None and w is not None:
            length = lam * w
        util = _num(_first(s, "utilization", "util", "rho"))
        out[str(name)] = {"lambda": lam, "W": w, "L": length, "utilization": util}
    return dict(
        sorted(
            out.items(),
            key=lambda kv: (STAGE_ORDER.index(kv[0]) if kv[0] in STAGE_ORDER else 9, kv[0]),
        )
    )


def _draining(v: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if isinstance(v, Mapping):
        for k, pods in v.items():
            if isinstance(pods, list | tuple) and pods:
                out[str(k)] = [str(p) for p in pods]
            elif isinstance(pods, int | float) and not isinstance(pods, bool) and pods > 0:
                out[str(k)] = [f"{int(pods)} pod(s)"]
    return out


def normalize_snapshot(snapshot: Mapping[str, Any], t: float | None = None) -> dict[str, Any]:
    """The canonical snapshot dict; missing or malformed fields become empty/None, never errors.

    Accepted input keys (first match wins): t|time|time_s|t_s; replicas|pools|actual;
    desired|desired_replicas|target; ready|ready_replicas; ratio; arrival_rps|arrival_rate|rps|lambda;
    planned_rps|plannedRps; stages; predicted; observed; slo; draining|drains; gpus; gpu_budget|gpuBudget.
    """
    s = snapshot
    ts = _num(_first(s, "t", "time", "time_s", "t_s"))
    if ts is None:
        ts = _time.time() if t is None else t
    replicas = _counts(_first(s, "replicas", "pools", "actual"))
    desired = _counts(_first(s, "desired", "desired_replicas", "target"))
    ready = _counts(_first(s, "ready", "ready_replicas"))
    ratio = _first(s, "ratio")
    if not isinstance(ratio, str):
        ratio = format_ratio(desired or replicas)
    return {
        "t": ts,
        "replicas": replicas,
        "desired": desired,
        "ready": ready,
        "ratio": ratio,
        "arrival_rps": _num(_first(s, "arrival_rps", "arrival_rate", "rps", "lambda")),
        "planned_rps": _num(_first(s, "planned_rps", "plannedRps")),
        "stages": _stages(s.get("stages")),
        "predicted": _latency(s.get("predicted")),
        "observed": _latency(s.get("observed")),
        "slo": _latency(s.get("slo")),
        "draining": _draining(_first(s, "draining", "drains")),
        "gpus": _num(s.get("gpus")),
        "gpu_budget": _num(_first(s, "gpu_budget", "gpuBudget")),
    }


def _pool_map(m: Any) -> dict[str, int]:
    """{pool: replicas} with the integer counts of `m` (anything else left out)."""
    if not isinstance(m, Mapping):
        return {}
    return {str(k): n for k, v in m.items() if (n := _int(v)) is not None}


def normalize_decision(d: Mapping[str, Any]) -> dict[str, Any]:
    """{time, reason, targets, next_step, planned, message} of one decision.

    `outputs` is either the operator's record (`status.lastDecision.outputs`:
    targets, nextStep, planned, notes) or, from a saved result, a {pool: replicas} map of targets.
    """
    outputs = d.get("outputs") if isinstance(d.get("outputs"), Mapping) else {}
    record = isinstance(outputs.get("targets"), Mapping)
    notes = outputs.get("notes") if record and isinstance(outputs.get("notes"), list) else []
    message = d.get("message")
    if not isinstance(message, str) or not message:
        message = "; ".join(str(n) for n in notes)
    when = _first(d, "time", "t")
    return {
        "time": when if isinstance(when, str | int | float) and not isinstance(when, bool) else None,
        "reason": str(d.get("reason") or ""),
        "targets": _pool_map(outputs["targets"] if record else outputs),
        "next_step": _pool_map(outputs.get("nextStep")) if record else {},
        "planned": _pool_map(outputs.get("planned")) if record else {},
        "message": message,
    }


class _Deployment:
    __slots__ = ("conditions", "decisions", "extra", "history", "name", "namespace", "summary")

    def __init__(self, namespace: str, name: str, max_points: int, max_decisions: int) -> None:
        self.namespace = namespace
        self.name = name
        self.history: deque[dict[str, Any]] = deque(maxlen=max_points)
        self.decisions: deque[dict[str, Any]] = deque(maxlen=max_decisions)
        self.conditions: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}


class History:
    """Per DisaggDeployment, a ring of the last `max_points` snapshots and `max_decisions` decisions."""

    def __init__(
        self,
        max_points: int = DEFAULT_MAX_POINTS,
        max_decisions: int = DEFAULT_MAX_DECISIONS,
        source: str = "operator",
        time_axis: str = "unix",
    ) -> None:
        if max_points < 1 or max_decisions < 1:
            raise ValueError("max_points and max_decisions must be at least 1")
        self.max_points = max_points
        self.max_decisions = max_decisions
        self.source = source
        self.time_axis = time_axis  # "unix": t is wall-clock; "relative": simulated seconds from 0
        self.error: str | None = None
        self._deps: dict[tuple[str, str], _Deployment] = {}

    def _dep(self, namespace: str, name: str) -> _Deployment:
        key = (namespace, name)
        d = self._deps.get(key)
        if d is None:
            d = self._deps[key] = _Deployment(namespace, name, self.max_points, self.max_decisions)
        return d

    def keys(self) -> list[tuple[str, str]]:
        return sorted(self._deps)

    # -- producers -----------------------------------------------------------
    def record(
        self,
        namespace: str,
        name: str,
        snapshot: Mapping[str, Any],
        conditions: Iterable[Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Append one snapshot (see `normalize_snapshot` for the keys); returns the stored dict.

        `conditions` (the DisaggDeployment's status.conditions) replace the shown conditions when given.
        """
        snap = normalize_snapshot(snapshot)
        d = self._dep(namespace, name)
        d.history.append(snap)
        if conditions is not None:
            d.conditions = [dict(c) for c in conditions if isinstance(c, Mapping)]
        return snap

    def record_decision(
        self,
        namespace: str,
        name: str,
        time: str | float | None = None,
        reason: str = "",
        outputs: Mapping[str, Any] | None = None,
        message: str = "",
    ) -> bool:
        """Append an autoscaling decision; a repeat of the latest (same time and reason) is ignored.

        `time` is an RFC 3339 string or unix seconds (default: now); `outputs` the operator's
        `lastDecision.outputs` or a {pool: replicas} map of targets. Returns whether it was stored.
        """
        dec = normalize_decision(
            {
                "time": _time.time() if time is None else time,
                "reason": reason,
                "outputs": dict(outputs or {}),
                "message": message,
            }
        )
        d = self._dep(namespace, name)
        if d.decisions and (d.decisions[-1]["time"], d.decisions[-1]["reason"]) == (
            dec["time"],
            dec["reason"],
        ):
            return False
        d.decisions.append(dec)
        return True

    def set_conditions(self, namespace: str, name: str, conditions: Iterable[Mapping[str, Any]]) -> None:
        self._dep(namespace, name).conditions = [dict(c) for c in conditions if isinstance(c, Mapping)]

    def set_summary(self, namespace: str, name: str, summary: Mapping[str, Any]) -> None:
        self._dep(namespace, name).summary = dict(summary)

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted DisaggDeployment."""
        self._deps.pop((namespace, name), None)

    def retain(self, keys: Iterable[tuple[str, str]]) -> None:
        """Drop every DisaggDeployment not in `keys` (after a full list of the cluster)."""
        keep = set(keys)
        for k in list(self._deps):
            if k not in keep:
                del self._deps[k]

    def record_object(
        self, body: Mapping[str, Any], t: float | None = None, extra: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Record a DisaggDeployment object (spec + status) as one snapshot, plus its lastDecision.

        `extra` overrides snapshot keys (e.g. predicted/observed latencies known to the caller).
        """
        meta = body.get("metadata") or {}
        snap, conditions, decision = snapshot_from_object(body, t=t)
        if extra:
            snap.update(extra)
        stored = self.record(meta.get("namespace", ""), meta.get("name", ""), snap, conditions)
        if decision:
            self.record_decision(meta.get("namespace", ""), meta.get("name", ""), **decision)
        return stored

    # -- consumer ------------------------------------------------------------
    def deployment_json(self, namespace: str, name: str) -> dict[str, Any]:
        d = self._dep(namespace, name)
        last = d.history[-1] if d.history else normalize_snapshot({}, t=0.0)
        names = sorted(
            set(last["replicas"]) | set(last["desired"]) | set(last["ready"]) | set(last["draining"]),
            key=pool_sort_key,
        )
        pools = {
            p: {
                "replicas": last["replicas"].get(p),
                "desired": last["desired"].get(p),
                "ready": last["ready"].get(p),
                "draining": list(last["draining"].get(p, [])),
            }
            for p in names
        }
        return {
            "namespace": d.namespace,
            "name": d.name,
            "conditions": list(d.conditions),
            "pools": pools,
            "ratio": last["ratio"],
            "slo": last["slo"],
            "gpus": last["gpus"],
            "gpu_budget": last["gpu_budget"],
            "summary": dict(d.summary),
            "history": list(d.history),
            "decisions": list(d.decisions),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "deployments": [self.deployment_json(ns, n) for ns, n in self.keys()],
            "source": self.source,
            "time_axis": self.time_axis,
            "generated_at": _time.time(),
            "error": self.error,
        }


# -- DisaggDeployment objects -------------------------------------------------
def _rfc3339_to_unix(s: Any) -> float | None:
    if not isinstance(s, str):
        return _num(s)
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def snapshot_from_object(
    body: Mapping[str, Any], t: float | None = None, children: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None]:
    """(snapshot, conditions, lastDecision) from a DisaggDeployment dict.

    Reads spec.pools.<pool>.{replicas, minReplicas, gpusPerReplica}, spec.slo.{ttftSeconds, itlSeconds},
    spec.autoscaling.gpuBudget, status.pools.<pool>.{replicas, readyReplicas, desiredReplicas,
    drainingPods}, status.ratio, status.conditions and status.lastDecision.{time, reason, inputs,
    outputs, message}. From lastDecision.inputs, when present: arrivalRps|arrival_rps, plannedRps,
    stages, predicted, observed. `children` ({pool: Deployment dict}) fills pools missing from status.
    """
    spec = body.get("spec") or {}
    st = body.get("status") or {}
    spec_pools = spec.get("pools") or {}
    st_pools = st.get("pools") or {}
    replicas: dict[str, int] = {}
    desired: dict[str, int] = {}
    ready: dict[str, int] = {}
    draining: dict[str, list[str]] = {}
    gpus = 0.0
    for pool in sorted(set(spec_pools) | set(st_pools), key=pool_sort_key):
        ps = st_pools.get(pool)
        sp = spec_pools.get(pool) or {}
        if isinstance(ps, Mapping):
            replicas[pool] = _int(ps.get("replicas")) or 0
            ready[pool] = _int(ps.get("readyReplicas")) or 0
            want = _int(ps.get("desiredReplicas"))
            desired[pool] = replicas[pool] if want is None else want
            if ps.get("drainingPods"):
                draining[pool] = [str(p) for p in ps["drainingPods"]]
        else:
            child = (children or {}).get(pool) or {}
            cst = child.get("status") or {}
            replicas[pool] = _int(cst.get("replicas")) or 0
            ready[pool] = _int(cst.get("readyReplicas")) or 0
            want = _int((child.get("spec") or {}).get("replicas"))
            if want is None:
                want = _int(_first(sp, "replicas", "minReplicas"))
            desired[pool] = want or 0
        gpus += replicas[pool] * (_num(sp.get("gpusPerReplica")) or 1)
    slo = spec.get("slo") or {}
    decision = st.get("lastDecision") if isinstance(st.get("lastDecision"), Mapping) else None
    inputs = (decision or {}).get("inputs") if isinstance((decision or {}).get("inputs"), Mapping) else {}
    snap: dict[str, Any] = {
        "replicas": replicas,
        "desired": desired,
        "ready": ready,
        "ratio": st.get("ratio") if isinstance(st.get("ratio"), str) else format_ratio(desired),
        "arrival_rps": _first(inputs, "arrivalRps", "arrival_rps", "arrivalRate"),
        "planned_rps": _first(inputs, "plannedRps", "planned_rps"),
        "stages": inputs.get("stages"),
        "predicted": inputs.get("predicted"),
        "observed": inputs.get("observed"),
        "slo": {"ttft_s": slo.get("ttftSeconds"), "itl_s": slo.get("itlSeconds")},
        "draining": draining,
        "gpus": gpus,
        "gpu_budget": (spec.get("autoscaling") or {}).get("gpuBudget"),
    }
    if t is not None:
        snap["t"] = t
    conditions = [dict(c) for c in st.get("conditions") or [] if isinstance(c, Mapping)]
    dec = None
    if decision and (decision.get("time") or decision.get("reason")):
        dec = {
            "time": decision.get("time"),
            "reason": str(decision.get("reason") or ""),
            "outputs": decision.get("outputs") if isinstance(decision.get("outputs"), Mapping) else {},
            "message": str(decision.get("message") or ""),
        }
    return snap, conditions, dec


# -- saved results ------------------------------------------------------------
SERIES_KEYS = ("timeline", "series", "history", "snapshots", "samples", "steps", "trace", "points")
NAME_KEYS = ("name", "policy", "placement", "label", "scenario", "id")
RESULT_LIST_KEYS = ("results", "runs", "reports")
DECISION_KEYS = ("decisions", "events", "scaling_events")


def _is_series(v: Any) -> bool:
    """A non-empty list of dicts with a time and pool counts."""
    if not isinstance(v, list) or not v or not all(isinstance(x, Mapping) for x in v[:50]):
        return False
    head = v[0]
    has_t = any(k in head for k in ("t", "time", "time_s", "t_s"))
    has_pools = any(k in head for k in ("replicas", "pools", "actual", "desired"))
    return has_t and has_pools


def _scalars(m: Mapping[str, Any], prefix: str = "", depth: int = 2) -> dict[str, Any]:
    """Flatten the numbers, strings and booleans of a mapping (nested up to `depth`) for a summary table."""
    out: dict[str, Any] = {}
    for k, v in m.items():
        key = f"{prefix}{k}"
        if isinstance(v, bool) or (isinstance(v, str) and len(v) <= 200):
            out[key] = v
        elif isinstance(v, int | float):
            if _num(v) is not None:
                out[key] = v
        elif isinstance(v, Mapping) and depth > 0:
            out.update(_scalars(v, key + ".", depth - 1))
    return out


def _find_runs(obj: Any, path: str, depth: int, out: list[tuple[str, Mapping[str, Any], list]]) -> None:
    """Collect (label, container, series) for every series found within `depth` levels."""
    if depth < 0:
        return
    if isinstance(obj, Mapping):
        found = False
        for k in SERIES_KEYS:
            if _is_series(obj.get(k)):
                out.append((path, obj, obj[k]))
                found = True
                break
        if found:
            return
        for k, v in obj.items():
            if isinstance(v, Mapping | list):
                _find_runs(v, f"{path}/{k}" if path else str(k), depth - 1, out)
    elif isinstance(obj, list):
        if _is_series(obj):
            out.append((path, {}, obj))
            return
        for i, v in enumerate(obj[:100]):
            if isinstance(v, Mapping | list):
                _find_runs(v, f"{path}[{i}]", depth - 1, out)


def _thin(series: list, n: int) -> list:
    if len(series) <= n:
        return series
    if n < 2:
        return series[-1:]
    step = (len(series) - 1) / (n - 1)
    return [series[round(i * step)] for i in range(n)]


def _run_name(path: str, container: Mapping[str, Any], index: int) -> str:
    for k in NAME_KEYS:
        v = container.get(k)
        if isinstance(v, str) and v:
            return v
    last = path.rsplit("/", 1)[-1]  # {"policies": {"disagg": {...}}} -> "disagg"
    return last or f"run-{index}"


def _defaults(data: Any) -> dict[str, Any]:
    """Document-wide SLO and GPU budget (top level or under "settings"), for series items lacking them."""
    out: dict[str, Any] = {}
    if not isinstance(data, Mapping):
        return out
    for src in (data.get("settings"), data):
        if not isinstance(src, Mapping):
            continue
        if "slo" not in out and isinstance(src.get("slo"), Mapping):
            out["slo"] = src["slo"]
        budget = _first(src, "gpu_budget", "gpuBudget")
        if "gpu_budget" not in out and _num(budget) is not None:
            out["gpu_budget"] = budget
    return out


def history_from_result(data: Any, label: str = "result", max_points: int = 2000) -> History:
    """A History from a parsed `disagg simulate|evaluate --output json` document.

    Series: the first list under one of SERIES_KEYS (timeline, series, history, snapshots,
    samples, steps, trace, points) whose items have a time (t|time|time_s|t_s) and pool counts
    (replicas|pools|actual|desired), searched in the top level and up to three levels down
    (so {"runs": [{"name": ..., "timeline": [...]}]} gives one card per run). Items are read with
    `normalize_snapshot`; a series longer than `max_points` is thinned evenly (first and last kept).
    Decisions: a list under decisions|events|scaling_events next to the
    series. The run's scalar fields (nested two levels) become the card's summary table. With no
    series at all, see `_static_results` (one card per result, summary plus one snapshot).
    Card names: the container's name|policy|label|scenario|id, else the last key of its JSON path
    (`disagg evaluate`: {"policies": {"disagg": {..., "timeline": [...]}}} -> "disagg"); namespace =
    `label`. A document-wide `slo` and `gpu_budget` (top level or under "settings") fill items lacking them.
    """
    h = History(max_points=max_points, source=f"file: {label}", time_axis="relative")
    if not isinstance(data, Mapping | list):
        raise ValueError(f"{label}: expected a JSON object or array, got {type(data).__name__}")
    runs: list[tuple[str, Mapping[str, Any], list]] = []
    _find_runs(data, "", 3, runs)
    defaults = _defaults(data)
    if not runs:
        _static_results(h, data, label, defaults)
        return h
    seen: dict[str, int] = {}
    for i, (path, container, series) in enumerate(runs):
        name = _run_name(path, container, i)
        if name in seen:
            seen[name] += 1
            name = f"{name}-{seen[name]}"
        else:
            seen[name] = 0
        summary_src = container if container else (data if isinstance(data, Mapping) else {})
        h.set_summary(label, name, _scalars(summary_src))
        for item in _thin(series, max_points):
            if isinstance(item, Mapping):
                h.record(label, name, {**defaults, **item})
        for k in DECISION_KEYS:
            decs = container.get(k)
            if isinstance(decs, list):
                for dd in decs:
                    if isinstance(dd, Mapping):
                        nd = normalize_decision(dd)
                        h.record_decision(
                            label, name, nd["time"], nd["reason"], dd.get("outputs"), nd["message"]
                        )
                break
    return h


def _static_results(h: History, data: Any, label: str, defaults: Mapping[str, Any]) -> None:
    """No time series: one card per result (a list under results|runs|reports, else the document).

    Each card gets the result's scalars as its summary and, when it has pool counts
    (replicas|pools, counts or {replicas|workers: n}), one snapshot at t = horizon_s (else 0) with
    its pools and stages (`disagg simulate --output json`).
    """
    results: list[Any] = []
    if isinstance(data, Mapping):
        for k in RESULT_LIST_KEYS:
            v = data.get(k)
            if isinstance(v, list) and v and all(isinstance(x, Mapping) for x in v):
                results = v
                break
        else:
            results = [data]
    else:
        results = [x for x in data if isinstance(x, Mapping)]
    seen: dict[str, int] = {}
    for i, r in enumerate(results):
        name = _run_name("", r, i) if len(results) > 1 or any(k in r for k in NAME_KEYS) else "result"
        if name in seen:
            seen[name] += 1
            name = f"{name}-{seen[name]}"
        else:
            seen[name] = 0
        h.set_summary(label, name, _scalars(r))
        if _counts(_first(r, "replicas", "pools")):
            t = _num(_first(r, "t", "time", "horizon_s")) or 0.0
            h.record(label, name, {**defaults, **r, "t": t})


def load_result(path: str | Path) -> History:
    """Read a saved result file (JSON) with `history_from_result`; the file name labels the cards."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not JSON ({exc})") from None
    return history_from_result(data, label=p.stem)
