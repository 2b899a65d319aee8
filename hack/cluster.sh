#!/usr/bin/env bash
# A local Kubernetes cluster with simulated GPU nodes: the real kube-apiserver,
# etcd, kube-controller-manager and kube-scheduler (built by hack/tools.sh),
# run by kwokctl's binary runtime on loopback; KWOK simulates the nodes and the
# pod lifecycle (hack/kwok/stages.yaml).
#
#   hack/cluster.sh up      start (or reuse) the cluster, create the GPU nodes
#   hack/cluster.sh down    remove everything (also when nothing runs)
#   hack/cluster.sh status  print whether it runs and its kubeconfig
#   hack/cluster.sh env     print `export KUBECONFIG=...` for eval
#
# Settings (environment):
#   DISAGG_CLUSTER_NAME   cluster name                     (default: disagg)
#   DISAGG_GPU_NODES      number of fake GPU nodes         (default: 4)
#   DISAGG_GPUS_PER_NODE  nvidia.com/gpu per node          (default: 8)
#   DISAGG_NODE_CPU       cpu per node                     (default: 96)
#   DISAGG_NODE_MEMORY    memory per node                  (default: 1Ti)
#   DISAGG_POD_CIDR       pod IPs; must be inside 127.0.0.0/8 (default: 127.1.0.0/16)
#   DISAGG_SERVICE_CIDR   Service ClusterIP range (default: kwokctl's, a /24: ~250 Services,
#                         i.e. ~125 DisaggDeployments of two pools; e.g. 10.0.0.0/16 for benchmarks)
#   DISAGG_CLIENT_QPS     the controller-manager's API request rate (default: 200, burst twice
#                         that; Kubernetes' default is 20)
#   DISAGG_STATE_DIR      state (kwokctl workdir, kubeconfig)
#                         (default: ~/.cache/disagg-operator/state)
# The kubeconfig is written to ${DISAGG_STATE_DIR}/<name>.kubeconfig, and nowhere else:
# kwokctl's create and delete default to adding/removing the cluster's context in
# ~/.kube/config (or $KUBECONFIG) and making it current, so every kwokctl call that takes
# --kubeconfig gets the state-dir file. The user's own kubeconfig is never read or written
# (tests/integration/test_kubeconfig_isolation.py checks it stays byte-identical).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${HERE}/versions.env"

NAME="${DISAGG_CLUSTER_NAME:-disagg}"
NODES="${DISAGG_GPU_NODES:-4}"
GPUS="${DISAGG_GPUS_PER_NODE:-8}"
NODE_CPU="${DISAGG_NODE_CPU:-96}"
NODE_MEM="${DISAGG_NODE_MEMORY:-1Ti}"
POD_CIDR="${DISAGG_POD_CIDR:-127.1.0.0/16}"
SERVICE_CIDR="${DISAGG_SERVICE_CIDR:-}"
CLIENT_QPS="${DISAGG_CLIENT_QPS:-200}"
STATE="${DISAGG_STATE_DIR:-${HOME}/.cache/disagg-operator/state}"
KUBECONFIG_PATH="${STATE}/${NAME}.kubeconfig"
export KWOK_WORKDIR="${STATE}/kwok"
# Nothing below may fall back to the user's kubeconfig: kubectl gets --kubeconfig explicitly,
# and kwokctl's own default follows $KUBECONFIG, so point it at the state dir too.
export KUBECONFIG="${KUBECONFIG_PATH}"
# kubectl's discovery cache too (it defaults to ~/.kube/cache).
export KUBECACHEDIR="${STATE}/kube-cache"

log() { echo "[cluster] $*" >&2; }
die() { echo "hack/cluster.sh: ERROR: $*" >&2; exit 1; }

BIN="$("${HERE}/tools.sh" --print)"
export PATH="${BIN}:${PATH}"

need_tools() {
  for t in kwokctl kwok kube-apiserver kube-controller-manager kube-scheduler kubectl etcd; do
    [[ -x "${BIN}/${t}" ]] || { log "tool ${t} missing: building tools"; "${HERE}/tools.sh" >&2; return; }
  done
}

kc() { "${BIN}/kubectl" --kubeconfig "${KUBECONFIG_PATH}" "$@"; }

is_running() {
  [[ -f "${KUBECONFIG_PATH}" ]] && kc get --raw /readyz >/dev/null 2>&1
}

write_config() {
  local cfg="${STATE}/${NAME}.kwokctl.yaml"
  [[ "${POD_CIDR}" == 127.* ]] || die "DISAGG_POD_CIDR=${POD_CIDR} is outside 127.0.0.0/8; emulated pods must stay on loopback"
  mkdir -p "${STATE}"
  cat > "${cfg}" <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  runtime: binary
  kubeVersion: ${KUBE_VERSION}
  etcdVersion: ${ETCD_VERSION#v}
  kwokVersion: ${KWOK_VERSION}
  bindAddress: 127.0.0.1
  kubeAuthorization: true
  kubeApiserverBinary: ${BIN}/kube-apiserver
  kubeControllerManagerBinary: ${BIN}/kube-controller-manager
  kubeSchedulerBinary: ${BIN}/kube-scheduler
  kubectlBinary: ${BIN}/kubectl
  etcdBinary: ${BIN}/etcd
  kwokControllerBinary: ${BIN}/kwok
  nodeLeaseDurationSeconds: 40
  cacheDir: ${STATE}/kwok-cache
# One instance of each: no leader election, so an API-server restart cannot make them exit
# (kwokctl's binary runtime does not restart a component that exits).
# The Endpoints and EndpointSlice controllers are off: the pods' loopback IPs are addresses the
# API server refuses in both (and no kube-proxy would read them), so those controllers would
# only retry rejected writes, which spend the controller-manager's client rate limit that the
# Deployment, ReplicaSet and disruption controllers need when many objects are applied at once.
# The controller-manager's client rate limit: at its default (20 requests/s) the ~12 writes per
# DisaggDeployment of the cluster's own controllers (ReplicaSets, pods, Deployment and PDB
# status) take ten minutes at N=1,000 (hack/bench/bench_scale.py); large clusters raise it too.
componentsPatches:
- name: kube-controller-manager
  extraArgs:
  - key: leader-elect
    value: "false"
  - key: controllers
    value: "*,-endpoints-controller,-endpointslice-controller,-endpointslice-mirroring-controller"
  - key: kube-api-qps
    value: "${CLIENT_QPS}"
  - key: kube-api-burst
    value: "$((2 * CLIENT_QPS))"
- name: kube-scheduler
  extraArgs:
  - key: leader-elect
    value: "false"
# Pod IPs inside loopback: each emulated engine (disagg emulate --serve) binds its own pod IP,
# and a router or client that follows a pod IP never leaves the machine.
- name: kwok-controller
  extraArgs:
  - key: cidr
    value: ${POD_CIDR}
EOF
  if [[ -n "${SERVICE_CIDR}" ]]; then
    # ClusterIPs are only allocated, never routed (no kube-proxy): any private range works.
    cat >> "${cfg}" <<EOF
- name: kube-apiserver
  extraArgs:
  - key: service-cluster-ip-range
    value: ${SERVICE_CIDR}
- name: kube-controller-manager
  extraArgs:
  - key: service-cluster-ip-range
    value: ${SERVICE_CIDR}
EOF
  fi
  cat "${HERE}/kwok/stages.yaml" >> "${cfg}"
  echo "${cfg}"
}

gpu_nodes() {
  for i in $(seq 0 $((NODES - 1))); do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-node-${i}
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: gpu-node-${i}
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    kubernetes.io/role: agent
    type: kwok
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.count: "${GPUS}"
    nvidia.com/gpu.product: KWOK-Simulated-GPU
    disagg.dev/simulated: "true"
spec: {}
status:
  allocatable:
    cpu: "${NODE_CPU}"
    memory: ${NODE_MEM}
    pods: "110"
    nvidia.com/gpu: "${GPUS}"
  capacity:
    cpu: "${NODE_CPU}"
    memory: ${NODE_MEM}
    pods: "110"
    nvidia.com/gpu: "${GPUS}"
EOF
  done
}

kill_leftovers() {
  # Processes of this cluster that outlived it (their binaries live in its workdir).
  local dir="${KWOK_WORKDIR}/clusters/${NAME}/bin"
  pkill -9 -f "^${dir}/" 2>/dev/null || true
}

up() {
  local start=${SECONDS}
  need_tools
  if is_running; then
    log "cluster '${NAME}' already running; reusing it"
  else
    if kwokctl get clusters 2>/dev/null | grep -qx "${NAME}"; then
      # Left over from a machine restart or killed processes: recreating is faster and
      # safer than restarting half-dead components.
      log "cluster '${NAME}' exists but is not serving: recreating it"
      kill_leftovers
      kwokctl delete cluster --name "${NAME}" --kubeconfig "${KUBECONFIG_PATH}" >&2 || true
    fi
    if ! is_running; then
      local cfg
      cfg="$(write_config)"
      log "creating cluster '${NAME}' (Kubernetes ${KUBE_VERSION}, kwok ${KWOK_VERSION}, binary runtime, 127.0.0.1)"
      mkdir -p "${STATE}"
      kwokctl create cluster --name "${NAME}" --config "${cfg}" --kubeconfig "${KUBECONFIG_PATH}" --wait 90s >&2 \
        || die "kwokctl could not create the cluster; see the messages above and the logs in ${KWOK_WORKDIR}/clusters/${NAME}/logs. 'make cluster-down' and retry."
    fi
    kwokctl get kubeconfig --name "${NAME}" > "${KUBECONFIG_PATH}.tmp"
    mv "${KUBECONFIG_PATH}.tmp" "${KUBECONFIG_PATH}"
  fi
  log "creating ${NODES} simulated GPU nodes with ${GPUS} nvidia.com/gpu each"
  gpu_nodes | kc apply --server-side --force-conflicts -f - >/dev/null
  # The default service account must exist before pods can be created in a namespace.
  for _ in $(seq 1 120); do
    if [[ "$(kc get nodes -l disagg.dev/simulated=true -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)" -ge "${NODES}" ]] \
      && kc get serviceaccount default -n default >/dev/null 2>&1; then
      log "cluster '${NAME}' ready in $((SECONDS - start)) s; KUBECONFIG=${KUBECONFIG_PATH}"
      echo "${KUBECONFIG_PATH}"
      return 0
    fi
    sleep 0.5
  done
  die "the nodes did not become Ready within 60 s; see ${KWOK_WORKDIR}/clusters/${NAME}/logs"
}

down() {
  kill_leftovers
  if [[ -x "${BIN}/kwokctl" ]] && kwokctl get clusters 2>/dev/null | grep -qx "${NAME}"; then
    log "deleting cluster '${NAME}'"
    kwokctl delete cluster --name "${NAME}" --kubeconfig "${KUBECONFIG_PATH}" >&2 || true
  else
    log "no cluster '${NAME}' to delete"
  fi
  rm -f "${KUBECONFIG_PATH}" "${STATE}/${NAME}.kwokctl.yaml"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status)
    if is_running; then echo "running: KUBECONFIG=${KUBECONFIG_PATH}"; else echo "not running"; exit 1; fi ;;
  env) echo "export KUBECONFIG=${KUBECONFIG_PATH}" ;;
  kubeconfig) echo "${KUBECONFIG_PATH}" ;;
  *) echo "usage: $0 up|down|status|env|kubeconfig" >&2; exit 2 ;;
esac
