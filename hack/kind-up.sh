#!/usr/bin/env bash
# A kind cluster whose nodes advertise fake nvidia.com/gpu capacity.
#
# For users with Docker. NOT exercised by CI (CI machines have no Docker engine);
# the tested path is hack/cluster.sh (kwokctl binary runtime).
#
#   hack/kind-up.sh            create (or reuse) the cluster "disagg-kind" with 2 workers
#   hack/kind-up.sh down       delete it
# Settings: KIND_CLUSTER_NAME (disagg-kind), KIND_WORKERS (2), GPUS_PER_NODE (8).
#
# The GPUs are only a number in each node's status: pools schedule, but their containers
# really run, so give your engine template a small image (or use `disagg emulate` for load).
set -euo pipefail
NAME="${KIND_CLUSTER_NAME:-disagg-kind}"
WORKERS="${KIND_WORKERS:-2}"
GPUS="${GPUS_PER_NODE:-8}"

command -v kind >/dev/null || { echo "kind not found: https://kind.sigs.k8s.io/docs/user/quick-start/" >&2; exit 1; }
command -v docker >/dev/null && docker info >/dev/null 2>&1 \
  || { echo "kind needs a running Docker engine; use hack/cluster.sh (no Docker) instead" >&2; exit 1; }

if [[ "${1:-}" == "down" ]]; then
  kind delete cluster --name "${NAME}"
  exit 0
fi

if ! kind get clusters | grep -qx "${NAME}"; then
  cfg="$(mktemp)"
  { echo "kind: Cluster"; echo "apiVersion: kind.x-k8s.io/v1alpha4"; echo "nodes:"; echo "- role: control-plane"
    for _ in $(seq 1 "${WORKERS}"); do echo "- role: worker"; done; } > "${cfg}"
  kind create cluster --name "${NAME}" --config "${cfg}" --wait 120s
  rm -f "${cfg}"
fi
kubectl config use-context "kind-${NAME}" >/dev/null

# Advertise fake GPUs through the status subresource (the kubelet keeps extended resources it
# does not manage). JSON-pointer escapes '/' as '~1'.
kubectl proxy --port=0 >/tmp/disagg-kind-proxy.log 2>&1 &
PROXY=$!
trap 'kill ${PROXY} 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  PORT="$(sed -n 's/.*127.0.0.1:\([0-9]*\).*/\1/p' /tmp/disagg-kind-proxy.log | head -1)"
  [[ -n "${PORT}" ]] && break; sleep 0.1
done
for node in $(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' -o name); do
  n="${node#node/}"
  curl -fsS -H 'Content-Type: application/json-patch+json' -X PATCH \
    "http://127.0.0.1:${PORT}/api/v1/nodes/${n}/status" \
    -d "[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"${GPUS}\"}]" >/dev/null
  kubectl label node "${n}" nvidia.com/gpu.present=true --overwrite >/dev/null
  echo "node ${n}: ${GPUS} fake nvidia.com/gpu"
done
kubectl get nodes -o custom-columns='NAME:.metadata.name,GPU:.status.allocatable.nvidia\.com/gpu'
