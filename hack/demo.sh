#!/usr/bin/env bash
# The demo: a local cluster with simulated GPU nodes, the Helm chart installed, the operator
# (run locally with the chart's ServiceAccount token, since its image cannot run on KWOK's
# simulated nodes), a real Prometheus, an emulated GPU fleet serving HTTP behind the operator's
# router, a real load generator (aiperf, hack/loadgen.sh) sending a load that rises and falls
# through the router's endpoint, and the dashboard.
#
#   hack/demo.sh up      start everything (returns; services keep running in the background)
#   hack/demo.sh watch   follow the pool sizes (Ctrl-C to stop watching)
#   hack/demo.sh results the load generator's results (failed/truncated, TTFT/ITL percentiles)
#   hack/demo.sh down    stop the services and delete the cluster
#
# Ports (loopback): dashboard 8081, operator metrics 8080, Prometheus 9090, emulator 9400,
# the router's OpenAI-compatible endpoint 8090 (its metrics 8091); the emulated engines serve
# HTTP on their pod IPs (127.1.0.0/16).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "${HERE}")"
STATE="${DEMO_STATE_DIR:-${DISAGG_STATE_DIR:-${HOME}/.cache/disagg-operator/state}/demo}"
# kubectl's discovery cache stays with the demo's state (it defaults to ~/.kube/cache).
export KUBECACHEDIR="${STATE}/kube-cache"
NS="${DEMO_NAMESPACE:-disagg-demo}"
RELEASE=disagg
DASH_PORT="${DEMO_DASHBOARD_PORT:-8081}"
METRICS_PORT="${DEMO_METRICS_PORT:-8080}"
PROM_PORT="${DEMO_PROMETHEUS_PORT:-9090}"
EMU_PORT="${DEMO_EMULATOR_PORT:-9400}"
ROUTER_PORT="${DEMO_ROUTER_PORT:-8090}"
# Load through the endpoint: the rate (requests/s) changes at these seconds; the last rate holds
# until the load generator stops after DURATION seconds (it is bounded: 0 means one hour).
SCHEDULE="${DEMO_SCHEDULE:-0:1,60:4,150:8,270:3,390:1,480:6,600:2}"
DURATION="${DEMO_DURATION:-0}"
LOAD_SECONDS=$(( DURATION > 0 ? DURATION : 3600 ))
PROMPT_TOKENS="${DEMO_PROMPT_TOKENS:-3000}"
OUTPUT_TOKENS="${DEMO_OUTPUT_TOKENS:-200}"

BIN="$("${HERE}/tools.sh" --print)"
export PATH="${BIN}:${PATH}"
# `python3` and `disagg` below come from the Makefile's virtual environment when there is one.
if [[ -x "${ROOT}/.venv/bin/python3" ]]; then export PATH="${ROOT}/.venv/bin:${PATH}"; fi
log() { echo "[demo] $*" >&2; }

start_bg() { # start_bg <name> <command...>: a background service with a pid file and a log
  local name="$1"; shift
  stop_bg "${name}"
  nohup "$@" > "${STATE}/${name}.log" 2>&1 &
  echo $! > "${STATE}/${name}.pid"
  log "${name} started (pid $!, log ${STATE}/${name}.log)"
}

stop_bg() {
  local pidf="${STATE}/$1.pid"
  if [[ -f "${pidf}" ]]; then
    kill "$(cat "${pidf}")" 2>/dev/null || true
    rm -f "${pidf}"
  fi
}

up() {
  mkdir -p "${STATE}"
  KUBECONFIG="$("${HERE}/cluster.sh" up)"
  export KUBECONFIG
  kc() { kubectl --kubeconfig "${KUBECONFIG}" "$@"; }

  log "installing the Helm chart (CRDs, RBAC, operator Deployment) into ${NS}"
  kc create namespace "${NS}" --dry-run=client -o yaml | kc apply -f - >/dev/null
  helm --kubeconfig "${KUBECONFIG}" upgrade --install "${RELEASE}" "${ROOT}/charts/disagg-operator" \
    --namespace "${NS}" --set "watchNamespaces={${NS}}" \
    --set "prometheus.url=http://127.0.0.1:${PROM_PORT}" --wait=false >/dev/null
  # `kubectl wait` fails at once while a new CRD has no status conditions yet: retry it
  for _ in $(seq 30); do
    kc wait --for=condition=Established crd/disaggdeployments.disagg.dev --timeout=60s >/dev/null 2>&1 && break
    sleep 2
  done
  kc wait --for=condition=Established crd/disaggdeployments.disagg.dev --timeout=60s >/dev/null

  # The chart's operator pod lands on a simulated node, where nothing executes. Run the same
  # operator here with that pod's identity (its ServiceAccount token), so RBAC is the chart's.
  local sa
  sa="$(kc -n "${NS}" get deploy -l app.kubernetes.io/instance="${RELEASE}" \
        -o jsonpath='{.items[0].spec.template.spec.serviceAccountName}')"
  local token server ca
  token="$(kc -n "${NS}" create token "${sa}" --duration=24h)"
  server="$(kc config view --minify --raw -o jsonpath='{.clusters[0].cluster.server}')"
  ca="$(kc config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
  cat > "${STATE}/operator.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: demo, cluster: {server: "${server}", certificate-authority-data: "${ca}"}}]
users: [{name: ${sa}, user: {token: "${token}"}}]
contexts: [{name: demo, context: {cluster: demo, user: ${sa}, namespace: ${NS}}}]
current-context: demo
EOF

  start_bg prometheus python3 -m disagg.devtools.prometheus --port "${PROM_PORT}" --scrape-interval 2s \
    --workdir "${STATE}/prometheus" --target "emulator=127.0.0.1:${EMU_PORT}" \
    --target "operator=127.0.0.1:${METRICS_PORT}"

  log "applying the sample DisaggDeployment"
  python3 - "${ROOT}" "${PROM_PORT}" <<'PY' | kc -n "${NS}" apply --server-side -f - >/dev/null
import json, sys
root, port = sys.argv[1], sys.argv[2]
spec = {
  "apiVersion": "disagg.dev/v1alpha1", "kind": "DisaggDeployment", "metadata": {"name": "llama-demo"},
  "spec": {
    "engine": "vllm", "model": "llama-3.1-70b (emulated)", "placement": {"mode": "disaggregated"},
    "pools": {p: {"replicas": 1, "minReplicas": 1, "maxReplicas": m, "gpusPerReplica": 1,
                  "drain": {"timeoutSeconds": 120, "onTimeout": "readmit"},
                  "template": {"spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                                        "ports": [{"containerPort": 8000}]}]}}}
              for p, m in (("prefill", 8), ("decode", 20))},
    "slo": {"ttftSeconds": 0.6, "itlSeconds": 0.15, "percentile": 0.9},
    # aiperf's prompts share no prefix: round robin spreads them (docs/router.md, Benchmark).
    "router": {"extraArgs": ["--policy", "round_robin"]},
    "autoscaling": {"enabled": True, "intervalSeconds": 10, "scrapeIntervalSeconds": 2, "metricWindowSeconds": 30,
                    "scaleDownStabilizationSeconds": 60, "gpuBudget": 30,
                    "prometheus": {"url": f"http://127.0.0.1:{port}"}},
  },
}
print(json.dumps(spec))
PY

  start_bg operator disagg run --kubeconfig "${STATE}/operator.kubeconfig" --namespace "${NS}" \
    --metrics-port "${METRICS_PORT}" --dashboard-port "${DASH_PORT}" --liveness-port 8082 \
    --allow-prometheus-url "http://127.0.0.1:${PROM_PORT}"

  # The emulated engines serve HTTP on their pod IPs and generate no load of their own:
  # every request comes through the router.
  start_bg emulator disagg emulate --kubeconfig "${KUBECONFIG}" --namespace "${NS}" --serve --rate 0 \
    --metrics-port "${EMU_PORT}" --duration "$(( LOAD_SECONDS + 300 ))"

  start_router llama-demo
  start_load

  for _ in $(seq 1 60); do
    curl -fsS "http://127.0.0.1:${DASH_PORT}/healthz" >/dev/null 2>&1 && break
    sleep 0.5
  done
  cat <<EOF

  disagg-operator demo is running.

Endpoint: http://127.0.0.1:${ROUTER_PORT}/v1

    Try it:   curl -N http://127.0.0.1:${ROUTER_PORT}/v1/chat/completions -H 'content-type: application/json' \\
                -d '{"model": "llama-3.1-70b (emulated)", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": true}'

    Dashboard:    http://127.0.0.1:${DASH_PORT}/
    Prometheus:   http://127.0.0.1:${PROM_PORT}/
    Metrics:      http://127.0.0.1:${METRICS_PORT}/metrics   (operator)   http://127.0.0.1:${EMU_PORT}/metrics   (emulator)

    Load: aiperf sends streaming chat completions through the endpoint at "${SCHEDULE}"
    (seconds:requests/s) for ${LOAD_SECONDS} s; log ${STATE}/loadgen.log, results in ${STATE}/aiperf/
    (hack/demo.sh results prints the client's failed/truncated counts and TTFT/ITL percentiles).
    Watch the pools follow it:   hack/demo.sh watch
    or:   KUBECONFIG=${KUBECONFIG} kubectl get disaggdeployments -n ${NS} -w
    Stop everything:              make demo-down

EOF
}

start_router() { # the operator's router for DisaggDeployment $1, run here like the operator
  # (router pods land on simulated nodes too): the pinned binary, the flags of the Deployment the
  # operator built, the router's own ServiceAccount; only its listen addresses move to loopback.
  local dep="$1-router" dir
  dir="$("${HERE}/routers.sh")"
  for _ in $(seq 1 120); do
    kc -n "${NS}" get deploy "${dep}" >/dev/null 2>&1 && kc -n "${NS}" get sa "${dep}" >/dev/null 2>&1 && break
    sleep 0.5
  done
  local token server ca
  token="$(kc -n "${NS}" create token "${dep}" --duration=24h)"
  server="$(kc config view --minify --raw -o jsonpath='{.clusters[0].cluster.server}')"
  ca="$(kc config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
  cat > "${STATE}/router.kubeconfig" <<KUBECONFIG_END
apiVersion: v1
kind: Config
clusters: [{name: demo, cluster: {server: "${server}", certificate-authority-data: "${ca}"}}]
users: [{name: ${dep}, user: {token: "${token}"}}]
contexts: [{name: demo, context: {cluster: demo, user: ${dep}, namespace: ${NS}}}]
current-context: demo
KUBECONFIG_END
  local cmd
  mapfile -t cmd < <(kc -n "${NS}" get deploy "${dep}" -o json | PYTHONPATH="${ROOT}/operator" python3 -c '
import json, sys
from disagg import routers
c = json.load(sys.stdin)["spec"]["template"]["spec"]["containers"][0]
args = list(c["args"])
port = int(sys.argv[1])
for flag, value in (("--host", "127.0.0.1"), ("--port", port), ("--prometheus-host", "127.0.0.1"),
                    ("--prometheus-port", port + 1)):
    args[args.index(flag) + 1] = str(value)
p = next(p for p in routers.PRESETS.values() if c["command"][-1] == p.binary)
print("\n".join([f"{p.package}-{p.version}/bin/{p.binary}", *p.subcommand, *args]))
' "${ROUTER_PORT}")
  KUBECONFIG="${STATE}/router.kubeconfig" start_bg router "${dir}/${cmd[0]}" "${cmd[@]:1}"
}

start_load() { # aiperf through the router's endpoint, once the router lists its workers
  local endpoint="http://127.0.0.1:${ROUTER_PORT}/v1"
  for _ in $(seq 1 120); do
    curl -fsS "http://127.0.0.1:${ROUTER_PORT}/workers" 2>/dev/null | grep -q '"url"' && break
    sleep 0.5
  done
  local cmd
  rm -rf "${STATE}/aiperf"
  mapfile -t cmd < <(PYTHONPATH="${ROOT}/operator" python3 - "${endpoint}" "${STATE}/aiperf" "${SCHEDULE}" \
      "${LOAD_SECONDS}" "${PROMPT_TOKENS}" "${OUTPUT_TOKENS}" <<'PY'
import sys
from pathlib import Path
from disagg import loadgen
endpoint, art, schedule, seconds, prompt, output = sys.argv[1:]
load = loadgen.Load(endpoint, Path(art), model="llama-3.1-70b (emulated)", schedule=schedule,
                    duration_s=float(seconds), prompt_tokens=int(prompt), prompt_tokens_std=int(prompt) / 2,
                    output_tokens=int(output))
env = [f"{k}={v}" for k, v in load.env_overrides().items()]
print("\n".join(["env", *env, *load.prepare()]))
PY
)
  start_bg loadgen "${cmd[@]}"
}

results() { # the client's view of the demo's load so far (after it ends: the whole run)
  PYTHONPATH="${ROOT}/operator" python3 -c '
import sys
from disagg import loadgen
print(loadgen.format_results(loadgen.read_results(sys.argv[1], int(sys.argv[2]))))' \
    "${STATE}/aiperf" "${OUTPUT_TOKENS}"
}

watch_pools() {
  KUBECONFIG="$("${HERE}/cluster.sh" kubeconfig)"
  while true; do
    kubectl --kubeconfig "${KUBECONFIG}" -n "${NS}" get disaggdeployments --no-headers 2>/dev/null | \
      sed "s/^/$(date +%T) /"
    sleep 5
  done
}

down() {
  for s in loadgen router emulator operator prometheus; do stop_bg "${s}"; done
  "${HERE}/cluster.sh" down
  log "demo stopped"
}

case "${1:-up}" in
  up) up ;;
  watch) watch_pools ;;
  results) results ;;
  down) down ;;
  *) echo "usage: $0 up|watch|results|down" >&2; exit 2 ;;
esac
