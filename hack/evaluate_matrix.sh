#!/usr/bin/env bash
# Results matrix of `disagg evaluate` (docs/evaluation.md): every trace in $TRACES at rate
# scales 1 and 10 and the diurnal workload, at start-up times $STARTUPS, every policy,
# measured against the hindsight oracle and the best fixed fleet.
#
#   hack/evaluate_matrix.sh                      # full matrix into $OUT (default /tmp/evaluate-matrix)
#   STARTUPS="60" CASES="azure:trace:1" hack/evaluate_matrix.sh
#   STARTUPS="60" CASES="azure:diurnal:10:0.5" hack/evaluate_matrix.sh   # disagg with --headroom 0.5
#   CURVES=0 hack/evaluate_matrix.sh             # default settings only (no knob sweep; faster)
#   DISAGG="python3 -m disagg.cli" hack/evaluate_matrix.sh   # e.g. with PYTHONPATH=$PWD/operator
#   JOBS=2 hack/evaluate_matrix.sh               # two cases at once (one simulator process each)
#   EVAL_ARGS="--ttft-per-1k 0.05" OUT=/tmp/matrix-growing hack/evaluate_matrix.sh   # more evaluate flags
#
# One JSON per case in $OUT (an existing file is reused: delete it to re-run), then
# $OUT/equal.md (the equal-attainment table: GPU-hours each policy needs for 99 % and
# 95 % attainment, x the hindsight oracle), $OUT/matrix.md (every policy at its default
# setting) and $OUT/summary.md (attainment / GPU-h vs oracle per policy).
# The hindsight references do not depend on start-up or the policies' knobs: a case whose
# trace, workload and scale already have a JSON at another start-up (or headroom) reuses
# its references (`disagg evaluate --references`, about three quarters of a case's time);
# REUSE_REFERENCES=0 searches them again. A file the CLI refuses is searched again too.
# Cases run $JOBS at a time (default 1; each case is one single-threaded simulator process).
# A line per case on stderr when it starts and when it ends, with its wall time and exit
# status; $OUT/times.txt collects the end lines. A failed case leaves no JSON (its stderr
# is in $OUT/<case>.log) and the script exits 1 after the tables are rebuilt.
set -euo pipefail
# `disagg` and `python3` come from the Makefile's virtual environment when there is one.
VENV_BIN="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin"
if [[ -x "${VENV_BIN}/python3" ]]; then export PATH="${VENV_BIN}:${PATH}"; fi
TRACES=${TRACES:-/work/shared/traces}
OUT=${OUT:-/tmp/evaluate-matrix}
STARTUPS=${STARTUPS-"60 30 180"}  # empty: only rebuild the tables
CURVES=${CURVES:-1}
DISAGG=${DISAGG:-disagg}
EVAL_ARGS=${EVAL_ARGS:-}  # extra `disagg evaluate` flags for every case (e.g. another SLO)
REUSE_REFERENCES=${REUSE_REFERENCES:-1}
# name:workload:scale[:headroom]; msyn (Mooncake synthetic, held out during development) last
CASES=${CASES-"azure:trace:1 azure:trace:10 azure:diurnal:1 azure:diurnal:10 mconv:trace:1 mconv:trace:10 mconv:diurnal:1 mconv:diurnal:10 msyn:trace:1 msyn:trace:10 msyn:diurnal:1 msyn:diurnal:10"}
declare -A FILE=(
  [azure]=azure_llm_2023/AzureLLMInferenceTrace_conv.csv
  [mconv]=mooncake_fast25/conversation_trace.0-40min.jsonl
  [msyn]=mooncake_fast25/synthetic_trace.jsonl
)
JOBS=${JOBS:-1}
curves=()
[[ $CURVES == 0 ]] || curves=(--curves)
mkdir -p "$OUT"

run_case() {  # run_case NAME WORKLOAD SCALE STARTUP HEADROOM FILE
  local name=$1 wl=$2 k=$3 st=$4 hr=$5 f=$6 t0 rc=0 line cpu="?" timer=() refs=() ref="" other
  # CPU seconds beside wall time: on the shared machine wall time mostly measures the load
  [[ -x /usr/bin/time ]] && timer=(/usr/bin/time -f "%U %S" -o "${f%.json}.cpu")
  if [[ $REUSE_REFERENCES != 0 ]]; then
    for other in "$OUT/$name-$wl-x$k-s"*.json; do
      [[ -s $other && $other != "$f" ]] && grep -q '"reference_key"' "$other" && { ref=$other; break; }
    done
  fi
  [[ -n $ref ]] && refs=(--references "$ref")
  evaluate() {  # evaluate [FLAG...]: this case into $f.tmp, its stderr into the case's log
    # shellcheck disable=SC2086  # DISAGG may be a command with arguments, EVAL_ARGS several flags
    "${timer[@]}" $DISAGG evaluate --trace "$TRACES/${FILE[$name]}" --workload "$wl" --rate-scale "$k" \
      --startup-seconds "$st" --headroom "$hr" "${curves[@]}" "$@" $EVAL_ARGS --output json >"$f.tmp" 2>"${f%.json}.log"
  }
  t0=$(date +%s)
  echo "[start $(date -u +%H:%M:%S)] $name $wl x$k start-up ${st}s headroom $hr${ref:+ (references of ${ref##*/})}" >&2
  evaluate "${refs[@]}" || rc=$?
  if ((rc == 2)) && [[ -n $ref ]]; then  # references refused (other settings): search them
    echo "[note  $(date -u +%H:%M:%S)] $(tail -n 1 "${f%.json}.log"); searching them" >&2
    rc=0 ref=""
    evaluate || rc=$?
  fi
  if ((rc == 0)); then mv "$f.tmp" "$f"; else rm -f "$f.tmp"; fi
  [[ -s ${f%.json}.cpu ]] && cpu=$(tail -n 1 "${f%.json}.cpu" | awk '{printf "%.0f", $1 + $2}')
  line="$name $wl x$k start-up ${st}s headroom $hr: $(($(date +%s) - t0)) s wall, $cpu s CPU, exit $rc${ref:+, references reused}, load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "[done  $(date -u +%H:%M:%S)] $line" >&2
  echo "$line" >>"$OUT/times.txt"
  return "$rc"
}

failed=0
running=0
for st in $STARTUPS; do
  for c in $CASES; do
    IFS=: read -r name wl k hr <<<"$c"
    hr=${hr:-0}
    f="$OUT/$name-$wl-x$k-s$st.json"
    [[ $hr == 0 ]] || f="$OUT/$name-$wl-x$k-s$st-h$hr.json"
    [[ -s $f ]] && continue
    if ((JOBS <= 1)); then
      run_case "$name" "$wl" "$k" "$st" "$hr" "$f" || failed=1
      continue
    fi
    if ((running >= JOBS)); then  # wait for one case to end before starting another
      wait -n || failed=1
      running=$((running - 1))
    fi
    run_case "$name" "$wl" "$k" "$st" "$hr" "$f" &
    running=$((running + 1))
  done
done
while ((running > 0)); do
  wait -n || failed=1
  running=$((running - 1))
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
order = {"azure": 0, "mconv": 1, "msyn": 2}
pols = ["disagg", "static", "hpa", "throughput", "dynamo", "keda", "planner-foresight"]
rows = []
for f in glob.glob(os.path.join(out, "*.json")):
    name, wl, k, st, *h = os.path.basename(f)[:-5].split("-")
    hr = float(h[0][1:]) if h else 0.0
    rows.append(((order.get(name, 9), name, wl != "trace", int(k[1:]), float(st[1:]), hr), json.load(open(f))))
rows.sort(key=lambda r: r[0])
f3 = lambda x: "-" if x is None else f"{x:.3f}"
pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"


def at(m, key, ref):
    h = (m.get("gpu_hours_at") or {}).get(key)
    if h is None:
        return "not reached"
    return f"{h / ref:.2f}x" if ref else f"{h:.1f}"


present = [p for p in pols if any(p in d["policies"] for _, d in rows)]
eq = ["| trace | scale | start-up s | headroom | oracle GPU-h @99 % | fluid bound GPU-h | best fixed fleet | "
      + " | ".join(present) + " |",
      "|---|---|--:|--:|--:|--:|---|" + "--:|" * len(present)]
full = ["| trace | workload | scale | start-up s | headroom | policy | attainment | TTFT p90 s | TTFT p99 s | GPU-h | vs oracle | GPU-h @95 % | GPU-h @99 % | actions | drains | lost | rejected |",
        "|---|---|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
summ = ["| trace | scale | start-up s | headroom | " + " | ".join(present) + " | oracle |",
        "|---|---|--:|--:|" + "--:|" * (len(present) + 1)]
for (_, name, diur, k, st, hr), d in rows:
    wl = "diurnal" if diur else "trace"
    refs = d.get("references", {})
    o = refs.get("oracle", {})
    oat = o.get("gpu_hours_at", {})
    b = refs.get("best_static")
    bcell = "-"
    if b:
        bcell = (f"{b['replicas']['prefill']}P+{b['replicas']['decode']}D, {pct(b['slo_attainment'])}, "
                 f"{b['gpu_hours'] / o['gpu_hours']:.2f}x")
    cells = []
    for p in present:
        m = d["policies"].get(p)
        cells.append("-" if m is None else f"{at(m, '0.99', oat.get('0.99'))} / {at(m, '0.95', oat.get('0.95'))}")
    oc = f"{oat.get('0.99') or o.get('gpu_hours', 0):.1f} ({pct(o.get('slo_attainment'))})"
    fb = refs.get("fluid_bound", {}).get("gpu_hours")
    fcell = "-" if fb is None else f"{fb:.1f}"
    eq.append(f"| {name}{' diurnal' if diur else ''} | x{k} | {st:g} | {hr:g} | {oc} | {fcell} | {bcell} | " + " | ".join(cells) + " |")
    scells = []
    for p in present:
        m = d["policies"].get(p)
        if m is None:
            scells.append("-")
            continue
        scells.append(f"{pct(m['slo_attainment'])} / {m['gpu_hours_vs_oracle']:.2f}x")
        full.append(f"| {name} | {wl} | {k} | {st:g} | {hr:g} | {'**disagg**' if p == 'disagg' else p} | {pct(m['slo_attainment'])} | "
                    f"{f3(m['ttft_p90_s'])} | {f3(m['ttft_p99_s'])} | {m['gpu_hours']:.2f} | {m['gpu_hours_vs_oracle']:.3f} | "
                    f"{at(m, '0.95', None)} | {at(m, '0.99', None)} | "
                    f"{m['scaling_actions']} | {m['drains']} | {m['lost_requests']} | {m.get('rejected_requests', 0)} |")
    summ.append(f"| {name}{' diurnal' if diur else ''} | x{k} | {st:g} | {hr:g} | " + " | ".join(scells)
                + f" | {pct(o.get('slo_attainment'))} / {o.get('gpu_hours', 0):.1f} GPU-h |")
predictors = sorted({d["settings"].get("dynamo_predictor", "constant") for _, d in rows})
note = ("GPU-hours each policy needs for 99 % / 95 % attainment, x the hindsight oracle's for the same "
        "attainment (interpolated on the policy's knob curve; 'not reached' where no setting gets there). "
        f"`dynamo` load predictor: {', '.join(predictors) or '-'}. The fluid bound is a true lower bound "
        "on any schedule's GPU-hours at 99 % (docs/evaluation.md).\n\n")
open(os.path.join(out, "equal.md"), "w").write(note + "\n".join(eq) + "\n")
open(os.path.join(out, "matrix.md"), "w").write("\n".join(full) + "\n")
open(os.path.join(out, "summary.md"), "w").write("\n".join(summ) + "\n")
print(f"{len(rows)} cases -> {out}/equal.md, {out}/matrix.md, {out}/summary.md")
PY
exit "$failed"
