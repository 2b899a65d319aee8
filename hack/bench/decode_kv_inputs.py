#!/usr/bin/env python3
"""Log the `disagg` decision's decode-KV inputs per interval on a trace (issue 14, decode side).

Usage: PYTHONPATH=operator python hack/bench/decode_kv_inputs.py --trace FILE [evaluate flags]

Replays the trace through `disagg evaluate`'s harness (the same `autoscaler.decide`
the operator runs) and prints, for every decision: the observed arrival rate and the
planned one, the back pool's running sequences now and averaged over the window, its
window-averaged KV usage (summed over the workers, in caches), the observed
footprint per sequence (usage x kvCacheTokens / running, `observed_kv_footprint`), the
planner's KV figures (footprint used, sequences per worker, what bounds the batch),
and the decode count planned and asked for. Ends with the policy's attainment,
GPU-hours and mean replicas. No assertion: this prints numbers.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from disagg import evaluate as ev
from disagg.commands import evaluate as cli
from disagg.workload import load_trace


def main() -> None:
    top = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.register(top.add_subparsers())
    args = top.parse_args(["evaluate", *sys.argv[1:]])
    s = cli._settings(args)
    w = load_trace(args.trace, args.format, limit=args.limit)
    if args.workload == "diurnal":
        w = ev.diurnal(w, args.rate_scale, seed=args.seed)
    else:
        w = ev.rate_scaled(w, args.rate_scale, seed=args.seed)
    cap = s.models.decode.kv_cache_tokens
    decide = ev.DisaggPolicy.decide

    def logged(self: ev.DisaggPolicy, o: ev.Obs) -> tuple[dict[str, int], str]:
        out = decide(self, o)
        last = self.last
        plan = last.plan if last is not None else None
        st = plan.stages if plan is not None else {}
        fp = o.kv_usage_sum * cap / o.kv_running if o.kv_usage_sum and o.kv_running else None

        def f(x: float | None, nd: int = 3) -> str:
            return "-" if x is None else f"{x:.{nd}g}"

        print(
            f"t={o.now:7.0f} rps={f(o.rate)} planned_rps={f(last.record.planned_rps if last else None)}"
            f" running={f(o.back_running)} running_avg={f(o.kv_running)} kv_usage_avg={f(o.kv_usage_sum)}"
            f" observed_fp={f(fp, 5)} plan_fp={f(st.get('decode.kv_footprint_tokens'), 5)}"
            f" kv_slots={f(st.get('decode.kv_slots'))} bound={plan.decode_bound if plan else '-'}"
            f" decode_planned={last.record.planned.get('decode') if last else '-'}"
            f" decode_asked={out[0].get('decode')}"
        )
        return out

    ev.DisaggPolicy.decide = logged  # type: ignore[method-assign]
    r = ev.run_policy("disagg", w, s)
    tl = r.timeline
    means = {p: float(np.mean([x["replicas"][p] for x in tl])) for p in tl[0]["replicas"]} if tl else {}
    print(
        f"attainment {r.metrics['slo_attainment']:.4f}  GPU-h {r.metrics['gpu_hours']:.3f}  mean replicas "
        + ", ".join(f"{p} {v:.2f}" for p, v in means.items())
    )


if __name__ == "__main__":
    main()
