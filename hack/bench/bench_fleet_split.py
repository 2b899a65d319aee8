#!/usr/bin/env python3
"""Benchmark: splitting one tick's fleet answers into each due object's own (issue 18).

    python hack/bench/bench_fleet_split.py [--objects 50 200 500] [--repeats 3]

A tick sends one query per metric for every due object (`metrics.fleet_queries`) and each
object then splits its own series out of the shared answers (`metrics.fleet_split`), in the
operator's event loop. This builds the answers a batch of N objects gets (the sample spec,
two pools of two pods each, every sizing input on: each fleet series once per pod, buckets
per `le`, the arrival-count subquery's points) and times splitting all N objects:

  indexed   the answers wrapped once in `metrics.FleetAnswers` (what `loop.FleetBatch` hands
            its objects): each object reads the series indexed under its own Deployments
  scan      the same answers without the index (`Unindexed`): every object's split tests
            every series of the batch against its pods' names, the baseline

Figures are CPU milliseconds (`time.process_time`) for the whole batch, median over the
repeats, and the ratio scan / indexed of the same run; the load average is printed because
the box is shared. No assertion: this prints numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import yaml
from benchlib import ROOT

from disagg import api, loop, metrics

NAMESPACE = "bench"
T = 1_800_000_000.0
PODS_PER_POOL = 2
LE_EDGES = ("1", "10", "100", "1000", "10000", "+Inf")


def sample_spec() -> api.DisaggDeploymentSpec:
    raw = yaml.safe_load(Path(ROOT, "config/samples/vllm-disaggregated-70b.yaml").read_text())["spec"]
    raw["autoscaling"] = {
        **(raw.get("autoscaling") or {}),
        "enabled": True,
        "sizing": {"requestSizes": True, "burstiness": True, "autoHeadroom": True},
    }
    return api.parse_spec(raw)


def pod_name(deployment: str, i: int) -> str:
    return f"{deployment}-7d9f8c6b5-p{i:04d}"[: metrics.GENERATE_NAME_BASE_MAX + 5]


def answers_for(spec: api.DisaggDeploymentSpec, names: list[str]) -> dict:
    """A plausible answer to each fleet query of a batch of `names`: one series per
    pod (per `le` for buckets, a few points for subqueries), one per object for its front door."""
    roles: set[str] = set()
    for name in names:
        roles |= metrics.fleet_roles(
            loop.object_queries(spec, NAMESPACE, name) + loop.sizing_query_list(spec, NAMESPACE, name),
            own=list(spec.autoscaling.queries or {}),
        )
    a = spec.autoscaling
    queries = metrics.fleet_queries(
        spec.engine, [NAMESPACE], a.metric_window_seconds, None, roles, sorted(names)
    )
    pods = [
        pod_name(f"{name}-{pool}", i)
        for name in names
        for pool in api.pools(spec)
        for i in range(PODS_PER_POOL)
    ]
    results: dict = {}
    for q in queries:
        series = []
        if "shed_counts" in q.name:  # the front doors' counters: one series per object
            results[q.name] = [
                {
                    "metric": {"namespace": NAMESPACE, "deployment": name},
                    "values": [[T - 15 * k, str(k % 3)] for k in range(8)],
                }
                for name in names
            ]
            continue
        for pod in pods:
            labels = {"namespace": NAMESPACE, "pod": pod}
            if "bucket" in q.name:
                series += [
                    {"metric": {**labels, "le": le}, "value": [T, str(float(i))]}
                    for i, le in enumerate(LE_EDGES)
                ]
            elif "arrival_counts" in q.name or "in_system" in q.name:  # subqueries: points per step
                series.append({"metric": labels, "values": [[T - 15 * k, str(k % 7)] for k in range(8)]})
            else:
                series.append({"metric": labels, "value": [T, "1.5"]})
        results[q.name] = series
    return results


class Unindexed(metrics.FleetAnswers):
    """The answers handing every object every series of a role: a scan per object."""

    def candidates(self, role: str, namespace: str, deployment: str):
        res = self.results.get(metrics.FLEET_PREFIX + role)
        return res if isinstance(res, Exception) else list(res or [])


def split_all(spec: api.DisaggDeploymentSpec, names: list[str], answers) -> None:
    for name in names:
        qs = loop.object_queries(spec, NAMESPACE, name) + loop.sizing_query_list(spec, NAMESPACE, name)
        metrics.fleet_split(answers, qs, NAMESPACE, name, spec.slo.percentile)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, nargs="+", default=[50, 200, 500])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    spec = sample_spec()
    print(f"load average {os.getloadavg()[0]:.1f}; CPU ms to split one tick's answers for N objects")
    print(f"{'N':>5} {'series':>8} {'indexed ms':>11} {'scan ms':>9} {'scan / indexed':>15}")
    for n in args.objects:
        names = [f"llm-{i:04d}" for i in range(n)]
        results = answers_for(spec, names)
        indexed, scanned = [], []
        for _ in range(args.repeats):  # alternated, so both see the same load
            t = time.process_time()
            split_all(spec, names, metrics.FleetAnswers(results))  # indexed once, as FleetBatch does
            indexed.append(time.process_time() - t)
            t = time.process_time()
            split_all(spec, names, Unindexed(results))
            scanned.append(time.process_time() - t)
        a, b = statistics.median(indexed) * 1e3, statistics.median(scanned) * 1e3
        total = sum(len(s) for s in results.values())
        print(f"{n:>5} {total:>8} {a:>11.1f} {b:>9.1f} {b / a:>14.1f}x")


if __name__ == "__main__":
    main()
