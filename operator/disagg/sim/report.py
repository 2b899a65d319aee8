"""Simulation reports: stage queues and waits, TTFT/ITL, goodput, failures, idle capacity, Little's law."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from disagg.sim.core import StageStats
from disagg.sim.workers import COLOCATED, DECODE, ServeWorker

_PCTS = (50, 90, 99)


def _arr(a) -> np.ndarray:
    return np.frombuffer(a, dtype=np.float64) if len(a) else np.zeros(0)


def _summary_ms(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    ms = values * 1000.0
    p = np.percentile(ms, _PCTS)
    return {"mean": float(ms.mean()), "p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2])}


class Series:
    """Stage queue lengths sampled every `dt` seconds of simulated time (for plots)."""

    MAX_GAP_SAMPLES = 10_000

    def __init__(self, dt: float, stages: list[str]) -> None:
        self.dt = dt
        self.t: list[float] = []
        self.queue: dict[str, list[int]] = {s: [] for s in stages}
        self.system: dict[str, list[int]] = {s: [] for s in stages}

    def sample(self, cluster, t: float, next_sample: float) -> float:
        """Record the state at every sample time <= t; returns the next sample time."""
        if (t - next_sample) / self.dt > self.MAX_GAP_SAMPLES:
            next_sample = t - self.MAX_GAP_SAMPLES * self.dt
        stages = cluster.stages
        while next_sample <= t:
            self.t.append(next_sample)
            for name, q in self.queue.items():
                st = stages[name]
                q.append(st.q)
                self.system[name].append(st.s)
            next_sample += self.dt
        return next_sample


def stage_summary(s: StageStats, horizon: float) -> dict[str, float]:
    waits = np.frombuffer(s.waits, dtype=np.float64) if len(s.waits) else np.zeros(0)
    L = s.s_area / horizon if horizon > 0 else 0.0
    lam = s.entered / horizon if horizon > 0 else 0.0
    W = s.sojourn_sum / s.exited if s.exited else 0.0
    return {
        "entered": s.entered,
        "queue_mean": s.q_area / horizon if horizon > 0 else 0.0,
        "queue_max": s.q_max,
        "wait_mean_ms": float(waits.mean() * 1000.0) if waits.size else 0.0,
        "wait_p90_ms": float(np.percentile(waits, 90) * 1000.0) if waits.size else 0.0,
        "in_stage_max": s.s_max,
        "L": L,
        "lambda": lam,
        "W_ms": W * 1000.0,
        "littles_law_error": abs(L - lam * W) / L if L > 0 else 0.0,
    }


@dataclass
class Report:
    placement: str
    workload: dict[str, Any]
    config: dict[str, Any]
    horizon_s: float
    wall_s: float
    requests: int
    completed: int
    failed: int
    lost: int
    rejected: int  # turned away at the front door (admission control): not misses, not served
    throughput_rps: float
    goodput_rps: float
    slo_attainment: float  # served within the SLO / every request (rejected ones count against it)
    admitted_slo_attainment: float  # served within the SLO / admitted requests
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]  # per request: the configured ITL statistic of its gaps
    itl_mean_ms: dict[str, float]  # per request: its mean gap
    gap_ms: dict[str, float]  # every inter-token gap of every completed request
    itl_statistic: str
    itl_breaches: int  # completed requests whose ITL statistic exceeds the target
    stages: dict[str, dict[str, float]]
    pools: dict[str, dict[str, float]]
    bytes_transferred: float
    failures: dict[str, int]
    prefix_cache: dict[str, float]
    kv_reserved_max: int
    series: Series | None = field(default=None, repr=False)
    samples: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, cl, workload, series: Series | None, wall_s: float, end: float) -> Report:
        horizon = max(end, 1e-9)
        ttft = np.frombuffer(cl.r_ttft, dtype=np.float64) if len(cl.r_ttft) else np.zeros(0)
        itl_all = _arr(cl.r_itl)
        itl_p99 = _arr(cl.r_itl_p99)
        itl_max = _arr(cl.r_itl_max)
        itl_stat = (itl_all, itl_p99, itl_max)[cl.itl_stat]
        arrival = _arr(cl.r_arrival)
        out_tokens = None
        # requests of one output token have no gap: left out of the ITL summaries
        has_gap = itl_max > 0
        pools: dict[str, dict[str, float]] = {}
        for w in cl.workers:
            added, removed = cl.life[w]
            life = (removed if removed is not None else end) - added
            p = pools.setdefault(
                w.role,
                {"workers": 0, "worker_s": 0.0, "busy_s": 0.0, "slot_s": 0.0, "kv_s": 0.0, "kv_peak": 0},
            )
            p["workers"] += 0 if removed is not None else 1
            p["worker_s"] += life
            p["busy_s"] += w.busy_s
            if isinstance(w, ServeWorker):
                p["slot_s"] += w.slot_area
                p["kv_s"] += w.kv_area
                p["kv_peak"] = max(p["kv_peak"], w.kv_peak)
        pool_out = {}
        for role, p in pools.items():
            ws = p["worker_s"]
            d = {"workers": p["workers"], "idle_fraction": 1.0 - p["busy_s"] / ws if ws > 0 else 1.0}
            if role in (DECODE, COLOCATED):
                d["slot_occupancy"] = p["slot_s"] / (ws * cl.slots) if ws > 0 else 0.0
                # KV-cache tokens reserved, time-averaged over the pool's workers and at the
                # fullest worker's peak, as shares of one worker's capacity
                d["kv_occupancy"] = p["kv_s"] / (ws * cl.kv_tokens) if ws > 0 else 0.0
                d["kv_peak"] = p["kv_peak"] / cl.kv_tokens
            pool_out[role] = d
        if cl.links:
            busy = sum(link.busy_s for link in cl.links)
            pool_out["link"] = {
                "links": len(cl.links),
                "idle_fraction": 1.0 - busy / (horizon * len(cl.links)),
            }
        caches = [w.cache for w in cl.workers if getattr(w, "cache", None) is not None]
        lookup = sum(c.lookup_tokens for c in caches)
        lookups = sum(c.lookups for c in caches)
        prefix = {
            "enabled": bool(caches),
            "token_hit_rate": (sum(c.hit_tokens for c in caches) / lookup) if lookup else 0.0,
            "request_hit_rate": (sum(c.hit_requests for c in caches) / lookups) if lookups else 0.0,
        }
        cfg = cl.cfg
        del out_tokens
        return cls(
            placement=cfg.placement,
            workload=workload.summary() if workload is not None else {},
            # colocated 0 means prefill + decode workers: the report says how many ran
            config={k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
            | {"colocated": cfg.colocated_workers()},
            horizon_s=horizon,
            wall_s=wall_s,
            requests=cl.submitted,
            completed=cl.completed,
            failed=cl.failed,
            lost=cl.lost,
            rejected=cl.rejected,
            throughput_rps=cl.completed / horizon,
            goodput_rps=cl.good / horizon,
            slo_attainment=cl.good / cl.submitted if cl.submitted else 0.0,
            admitted_slo_attainment=(
                cl.good / (cl.submitted - cl.rejected) if cl.submitted > cl.rejected else 0.0
            ),
            ttft_ms=_summary_ms(ttft),
            itl_ms=_summary_ms(itl_stat[has_gap]),
            itl_mean_ms=_summary_ms(itl_all[has_gap]),
            gap_ms=cl.gaps.summary_ms(),
            itl_statistic=cfg.itl_statistic,
            itl_breaches=int((itl_stat > cl.itl_s).sum()),
            stages={name: stage_summary(s, horizon) for name, s in cl.stages.items() if s.entered},
            pools=pool_out,
            bytes_transferred=float(sum(link.bytes_done for link in cl.links)),
            failures={
                "transfer_failures": cl.tx_failures,
                "retries": cl.retries,
                "reprefills": cl.reprefills,
                "failed_requests": cl.failed,
                "cleanups": cl.cleanups,
                "reservations_released": cl.released_on_failure,
                "pending_chunks_cleared": cl.chunks_cleared,
                "leaked_reservations": cl.leaked_reservations(),
            },
            prefix_cache=prefix,
            kv_reserved_max=cl.kv_reserved_max,
            series=series,
            samples={
                "id": np.frombuffer(cl.r_id, dtype=np.int64) if len(cl.r_id) else np.zeros(0, dtype=np.int64),
                "arrival_s": arrival,
                "ttft_s": ttft,
                "itl_s": itl_all,
                "itl_p99_s": itl_p99,
                "itl_max_s": itl_max,
                "itl_stat_s": itl_stat,
            },
        )

    def to_dict(self) -> dict[str, Any]:
        def clean(x):
            if isinstance(x, float) and not math.isfinite(x):
                return None
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            if isinstance(x, np.generic):
                return clean(x.item())
            return x

        return clean(
            {
                "placement": self.placement,
                "workload": self.workload,
                "config": self.config,
                "horizon_s": self.horizon_s,
                "wall_s": self.wall_s,
                "requests": self.requests,
                "completed": self.completed,
                "failed": self.failed,
                "lost": self.lost,
                "rejected_requests": self.rejected,
                "throughput_rps": self.throughput_rps,
                "goodput_rps": self.goodput_rps,
                "slo_attainment": self.slo_attainment,
                "admitted_slo_attainment": self.admitted_slo_attainment,
                "ttft_ms": self.ttft_ms,
                "itl_statistic": self.itl_statistic,
                "itl_ms": self.itl_ms,
                "itl_mean_ms": self.itl_mean_ms,
                "itl_breaches": self.itl_breaches,
                "gap_ms": self.gap_ms,
                "stages": self.stages,
                "pools": self.pools,
                "bytes_transferred": self.bytes_transferred,
                "failures": self.failures,
                "prefix_cache": self.prefix_cache,
                "kv_reserved_max": self.kv_reserved_max,
            }
        )


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        if abs(v) >= 1e9:
            return f"{v / 2**30:.1f} GiB"
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def format_table(reports: list[Report]) -> str:
    """Placements side by side, one metric per row."""
    rows: list[tuple[str, list[str]]] = []

    def add(label: str, getter) -> None:
        vals = []
        for r in reports:
            try:
                vals.append(_fmt(getter(r)))
            except (KeyError, TypeError):
                vals.append("")
        if any(vals):
            rows.append((label, vals))

    add("requests", lambda r: r.requests)
    add("completed", lambda r: r.completed)
    add("failed / lost", lambda r: f"{r.failed} / {r.lost}")
    if any(r.rejected for r in reports):
        add("rejected (admission)", lambda r: r.rejected)
        add("SLO attainment of admitted", lambda r: r.admitted_slo_attainment)
    add("throughput req/s", lambda r: r.throughput_rps)
    add("goodput req/s", lambda r: r.goodput_rps)
    add("SLO attainment", lambda r: r.slo_attainment)
    for k in ("mean", "p50", "p90", "p99"):
        add(f"TTFT {k} ms", lambda r, k=k: r.ttft_ms[k])
    for k in ("mean", "p50", "p90", "p99"):
        add(
            f"ITL ({'/'.join(sorted({r.itl_statistic for r in reports}))}) {k} ms", lambda r, k=k: r.itl_ms[k]
        )
    add("ITL breaches", lambda r: r.itl_breaches)
    for k in ("p50", "p90", "p99", "p99.9", "max"):
        add(f"token gap {k} ms", lambda r, k=k: r.gap_ms[k])
    stage_names: list[str] = []
    for r in reports:
        stage_names += [s for s in r.stages if s not in stage_names]
    for s in stage_names:
        add(
            f"{s} queue mean/max",
            lambda r, s=s: f"{r.stages[s]['queue_mean']:.2f}/{r.stages[s]['queue_max']}",
        )
        add(
            f"{s} wait mean/p90 ms",
            lambda r, s=s: f"{r.stages[s]['wait_mean_ms']:.1f}/{r.stages[s]['wait_p90_ms']:.1f}",
        )
        add(
            f"{s} L / lambda*W",
            lambda r, s=s: f"{r.stages[s]['L']:.2f}/{r.stages[s]['lambda'] * r.stages[s]['W_ms'] / 1000:.2f}",
        )
    pool_names: list[str] = []
    for r in reports:
        pool_names += [p for p in r.pools if p not in pool_names]
    for p in pool_names:
        add(f"{p} idle fraction", lambda r, p=p: r.pools[p]["idle_fraction"])
        if p in (DECODE, COLOCATED):
            add(f"{p} slot occupancy", lambda r, p=p: r.pools[p]["slot_occupancy"])
            add(
                f"{p} KV occupancy mean/peak",
                lambda r, p=p: f"{r.pools[p]['kv_occupancy']:.3f}/{r.pools[p]['kv_peak']:.3f}",
            )
    add("KV bytes transferred", lambda r: r.bytes_transferred)
    add("KV reservations max", lambda r: r.kv_reserved_max)
    add(
        "transfer failures/retries/re-prefills",
        lambda r: "{transfer_failures}/{retries}/{reprefills}".format(**r.failures),
    )
    add("failure cleanups", lambda r: r.failures["cleanups"])
    add("leaked reservations", lambda r: r.failures["leaked_reservations"])
    if any(r.prefix_cache["enabled"] for r in reports):
        add("prefix token hit rate", lambda r: r.prefix_cache["token_hit_rate"])
    add("wall s", lambda r: r.wall_s)
    width = max(len(label) for label, _ in rows)
    colw = [max(len(r.placement), *(len(v[i]) for _, v in rows)) for i, r in enumerate(reports)]
    lines = [" " * width + "  " + "  ".join(r.placement.rjust(w) for r, w in zip(reports, colw, strict=True))]
    for label, vals in rows:
        lines.append(
            label.ljust(width) + "  " + "  ".join(v.rjust(w) for v, w in zip(vals, colw, strict=True))
        )
    return "\n".join(lines)


def plot(reports: list[Report], path: str) -> None:
    """Stage queues and TTFT/ITL over time, one row per placement (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(reports), 2, figsize=(13, 3.6 * len(reports)), squeeze=False)
    for row, r in zip(axes, reports, strict=True):
        ax = row[0]
        if r.series is not None and r.series.t:
            for name, q in r.series.queue.items():
                if r.stages.get(name, {}).get("entered"):
                    ax.step(r.series.t, q, where="post", label=name, lw=1)
        ax.set_title(f"{r.placement}: queue length")
        ax.set_xlabel("time (s)")
        ax.legend(fontsize=7)
        ax = row[1]
        a, tt, il = r.samples.get("arrival_s"), r.samples.get("ttft_s"), r.samples.get("itl_stat_s")
        if a is not None and a.size:
            step = max(1, a.size // 5000)
            ax.scatter(a[::step], tt[::step] * 1000, s=2, label="TTFT ms")
            ax.scatter(a[::step], il[::step] * 1000, s=2, label=f"ITL ({r.itl_statistic}) ms")
            if r.config.get("ttft_ms"):
                ax.axhline(r.config["ttft_ms"], color="C0", ls="--", lw=0.8)
            if r.config.get("itl_ms"):
                ax.axhline(r.config["itl_ms"], color="C1", ls="--", lw=0.8)
            ax.set_yscale("log")
        ax.set_title(f"{r.placement}: latency by arrival time")
        ax.set_xlabel("arrival (s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
