#!/usr/bin/env bash
# Results matrix of `disagg evaluate` (docs/evaluation.md): every trace in $TRACES at rate
# scales 1 and 10 and the diurnal workload, at start-up times $STARTUPS, all five policies.
#
#   hack/evaluate_matrix.sh                      # full matrix into $OUT (default /tmp/evaluate-matrix)
#   STARTUPS="60" CASES="azure:trace:1" hack/evaluate_matrix.sh
#   STARTUPS="60" CASES="azure:diurnal:10:0.5" hack/evaluate_matrix.sh   # disagg with --headroom 0.5
#
# One JSON per case in $OUT (an existing file is reused: delete it to re-run), then
# $OUT/matrix.md (full table) and $OUT/summary.md (attainment / GPU-h vs oracle per policy).
# Cases run one at a time (one simulator process).
set -euo pipefail
# `disagg` and `python3` come from the Makefile's virtual environment when there is one.
VENV_BIN="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin"
if [[ -x "${VENV_BIN}/python3" ]]; then export PATH="${VENV_BIN}:${PATH}"; fi
TRACES=${TRACES:-/work/shared/traces}
OUT=${OUT:-/tmp/evaluate-matrix}
STARTUPS=${STARTUPS-"60 30 180"}  # empty: only rebuild the tables
# name:workload:scale[:headroom]; msyn (Mooncake synthetic, held out during development) last
CASES=${CASES-"azure:trace:1 azure:trace:10 azure:diurnal:1 azure:diurnal:10 mconv:trace:1 mconv:trace:10 mconv:diurnal:1 mconv:diurnal:10 msyn:trace:1 msyn:trace:10 msyn:diurnal:1 msyn:diurnal:10"}
declare -A FILE=(
  [azure]=azure_llm_2023/AzureLLMInferenceTrace_conv.csv
  [mconv]=mooncake_fast25/conversation_trace.0-40min.jsonl
  [msyn]=mooncake_fast25/synthetic_trace.jsonl
)
mkdir -p "$OUT"
for st in $STARTUPS; do
  for c in $CASES; do
    IFS=: read -r name wl k hr <<<"$c"
    hr=${hr:-0}
    f="$OUT/$name-$wl-x$k-s$st.json"
    [[ $hr == 0 ]] || f="$OUT/$name-$wl-x$k-s$st-h$hr.json"
    [[ -s $f ]] && continue
    echo "== $name $wl x$k start-up $st s headroom $hr" >&2
    disagg evaluate --trace "$TRACES/${FILE[$name]}" --workload "$wl" --rate-scale "$k" \
      --startup-seconds "$st" --headroom "$hr" --output json >"$f.tmp"
    mv "$f.tmp" "$f"
  done
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
order = {"azure": 0, "mconv": 1, "msyn": 2}
pols = ["disagg", "static", "hpa", "throughput", "oracle"]
rows = []
for f in glob.glob(os.path.join(out, "*.json")):
    name, wl, k, st, *h = os.path.basename(f)[:-5].split("-")
    hr = float(h[0][1:]) if h else 0.0
    rows.append(((order.get(name, 9), name, wl != "trace", int(k[1:]), float(st[1:]), hr), json.load(open(f))))
rows.sort(key=lambda r: r[0])
full = ["| trace | workload | scale | start-up s | headroom | policy | attainment | TTFT p90 s | TTFT p99 s | GPU-h | vs oracle | actions | drains | lost |",
        "|---|---|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
summ = ["| trace | scale | start-up s | headroom | " + " | ".join(pols[:-1]) + " | oracle |",
        "|---|---|--:|--:|" + "--:|" * len(pols)]
f3 = lambda x: "-" if x is None else f"{x:.3f}"
for (_, name, diur, k, st, hr), d in rows:
    wl = "diurnal" if diur else "trace"
    cells = []
    for p in pols:
        m = d["policies"][p]
        a = m["slo_attainment"]
        full.append(f"| {name} | {wl} | {k} | {st:g} | {hr:g} | {'**disagg**' if p == 'disagg' else p} | {100 * a:.2f}% | "
                    f"{f3(m['ttft_p90_s'])} | {f3(m['ttft_p99_s'])} | {m['gpu_hours']:.2f} | {m['gpu_hours_vs_oracle']:.3f} | "
                    f"{m['scaling_actions']} | {m['drains']} | {m['lost_requests']} |")
        cells.append(f"{100 * a:.1f}% / {m['gpu_hours_vs_oracle']:.2f}x" if p != "oracle" else f"{100 * a:.1f}% / {m['gpu_hours']:.1f} GPU-h")
    summ.append(f"| {name}{' diurnal' if diur else ''} | x{k} | {st:g} | {hr:g} | " + " | ".join(cells) + " |")
open(os.path.join(out, "matrix.md"), "w").write("\n".join(full) + "\n")
open(os.path.join(out, "summary.md"), "w").write("\n".join(summ) + "\n")
print(f"{len(rows)} cases -> {out}/matrix.md, {out}/summary.md")
PY
