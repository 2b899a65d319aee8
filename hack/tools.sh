#!/usr/bin/env bash
# Build the local-cluster tools from their Go modules, pinned in hack/versions.env.
#
#   hack/tools.sh            build what is missing, print the bin directory
#   hack/tools.sh --print    only print the bin directory (no build)
#
# Binaries are cached outside the repository, keyed by version:
#   ${DISAGG_TOOLS_CACHE:-$HOME/.cache/disagg-operator/tools}/<tool>-<version>/
# and a directory of symlinks to the current versions is kept at
#   ${DISAGG_TOOLS_CACHE}/bin
# A tool whose cached binary exists is skipped.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${HERE}/versions.env"

CACHE="${DISAGG_TOOLS_CACHE:-${HOME}/.cache/disagg-operator/tools}"
BIN="${CACHE}/bin"

if [[ "${1:-}" == "--print" ]]; then
  echo "${BIN}"
  exit 0
fi

die() {
  echo "" >&2
  echo "hack/tools.sh: ERROR: $*" >&2
  exit 1
}
log() { echo "[tools] $*" >&2; }

command -v go >/dev/null 2>&1 || die "Go is not installed. Install Go 1.24 or newer (https://go.dev/doc/install, or 'apt-get install golang'), then run 'make tools' again."

export GOFLAGS="-mod=mod -buildvcs=false"
# Go's build and module caches stay in the project's cache too, not in the user's home.
export GOCACHE="${GOCACHE_OVERRIDE:-${CACHE}/go-build}"
export GOMODCACHE="${GOMODCACHE_OVERRIDE:-${CACHE}/go-mod}"
export CGO_ENABLED=0
mkdir -p "${BIN}"

check_proxy() {
  if ! go list -m -versions sigs.k8s.io/kwok >/dev/null 2>&1; then
    die "the Go module proxy ($(go env GOPROXY)) cannot be reached. Check your network or set GOPROXY to a reachable proxy, then run 'make tools' again."
  fi
}

link() { # link <dir> <names...>
  local dir="$1"; shift
  for n in "$@"; do ln -sfn "${dir}/${n}" "${BIN}/${n}"; done
}

have_all() { # have_all <dir> <names...>
  local dir="$1"; shift
  for n in "$@"; do [[ -x "${dir}/${n}" ]] || return 1; done
}

# Build main packages that live in a dependency module, from a throw-away wrapper module.
# wrapper_build <outdir> <ldflags> <go.mod extra lines> <packages...>
wrapper_build() {
  local out="$1" ldflags="$2" extra="$3"; shift 3
  local work
  work="$(mktemp -d)"
  mkdir -p "${out}.partial"
  local rc=0
  (
    cd "${work}"
    printf 'module disagg.dev/toolbuild\n\ngo 1.24\n\n%s\n' "${extra}" > go.mod
    # go build resolves missing requirements itself with -mod=mod.
    go build -trimpath -ldflags "${ldflags}" -o "${out}.partial/" "$@"
  ) || rc=1
  rm -rf "${work}"
  if [[ ${rc} != 0 ]]; then rm -rf "${out}.partial"; return 1; fi
  rm -rf "${out}"
  mv "${out}.partial" "${out}"
}

build_kube() {
  local names=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  local dir="${CACHE}/kubernetes-${KUBE_VERSION}"
  if have_all "${dir}" "${names[@]}"; then
    log "kubernetes ${KUBE_VERSION}: cached"
  else
    log "kubernetes ${KUBE_VERSION}: resolving staging modules"
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    [[ -f "${gomod}" ]] || die "could not download k8s.io/kubernetes@${KUBE_VERSION} from the Go module proxy."
    # k8s.io/kubernetes points its staging modules at ./staging; map each to its
    # published v0.x.y release instead.
    local staging="v0${KUBE_VERSION#v1}"
    local extra="require k8s.io/kubernetes ${KUBE_VERSION}"$'\n'
    while read -r mod; do
      extra+="replace ${mod} => ${mod} ${staging}"$'\n'
    done < <(grep -E '^\s*k8s.io/[a-z0-9-]+ => ./staging' "${gomod}" | awk '{print $1}')
    local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
    local ld="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld+=" -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
      ld+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
    done
    log "kubernetes ${KUBE_VERSION}: building ${names[*]} (10-25 min on 2 cores the first time)"
    local pkgs=()
    for n in "${names[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/${n}"); done
    wrapper_build "${dir}" "${ld}" "${extra}" "${pkgs[@]}" \
      || die "building Kubernetes ${KUBE_VERSION} failed (see the Go errors above). Check free disk space and 'go version' (>= 1.24), then run 'make tools' again."
  fi
  link "${dir}" "${names[@]}"
}

build_etcd() {
  local dir="${CACHE}/etcd-${ETCD_VERSION}"
  if have_all "${dir}" etcd; then
    log "etcd ${ETCD_VERSION}: cached"
  else
    log "etcd ${ETCD_VERSION}: building"
    local extra="require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}"
    wrapper_build "${dir}.tmp" "-s -w" "${extra}" go.etcd.io/etcd/server/v3 \
      || die "building etcd ${ETCD_VERSION} failed (see the Go errors above), then run 'make tools' again."
    mkdir -p "${dir}"
    mv "${dir}.tmp"/* "${dir}/etcd"
    rm -rf "${dir}.tmp"
  fi
  link "${dir}" etcd
}

build_kwok() {
  local dir="${CACHE}/kwok-${KWOK_VERSION}"
  if have_all "${dir}" kwok kwokctl; then
    log "kwok ${KWOK_VERSION}: cached"
  else
    log "kwok ${KWOK_VERSION}: building kwok and kwokctl"
    local extra="require sigs.k8s.io/kwok ${KWOK_VERSION}"
    local ld="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION}"
    wrapper_build "${dir}" "${ld}" "${extra}" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl \
      || die "building kwok ${KWOK_VERSION} failed (see the Go errors above), then run 'make tools' again."
  fi
  link "${dir}" kwok kwokctl
}

build_helm() {
  local dir="${CACHE}/helm-${HELM_VERSION}"
  if have_all "${dir}" helm; then
    log "helm ${HELM_VERSION}: cached"
  else
    log "helm ${HELM_VERSION}: building"
    local extra="require helm.sh/helm/v3 ${HELM_VERSION}"
    local ld="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
    wrapper_build "${dir}" "${ld}" "${extra}" helm.sh/helm/v3/cmd/helm \
      || die "building helm ${HELM_VERSION} failed (see the Go errors above), then run 'make tools' again."
  fi
  link "${dir}" helm
}

main() {
  local start=${SECONDS}
  local todo=("$@")
  [[ ${#todo[@]} -gt 0 ]] || todo=(etcd kwok helm kube)
  local need_proxy=0
  have_all "${CACHE}/kubernetes-${KUBE_VERSION}" kube-apiserver kube-controller-manager kube-scheduler kubectl || need_proxy=1
  have_all "${CACHE}/etcd-${ETCD_VERSION}" etcd || need_proxy=1
  have_all "${CACHE}/kwok-${KWOK_VERSION}" kwok kwokctl || need_proxy=1
  have_all "${CACHE}/helm-${HELM_VERSION}" helm || need_proxy=1
  [[ ${need_proxy} == 0 ]] || check_proxy
  for t in "${todo[@]}"; do "build_${t}"; done
  log "tools ready in ${BIN} ($((SECONDS - start)) s)"
  echo "${BIN}"
}

main "$@"
