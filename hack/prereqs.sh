#!/usr/bin/env bash
# Check (and, where it can, install) what `make demo`, `make test` and CI need outside Python:
#
#   hack/prereqs.sh venv     a Python >= 3.11 that can create a virtual environment
#   hack/prereqs.sh demo     venv + Go >= 1.24 + the `prometheus` server binary
#   hack/prereqs.sh test     demo + `chromium` (headless, for the dashboard browser test) + the
#                            pinned `checkov` policy scanner (hack/checkov.sh: PyPI, its own venv)
#   hack/prereqs.sh          same as `test`
#   hack/prereqs.sh --find-python   print the Python the Makefile builds .venv from
#
# The Python is $PYTHON when set, else the first of python3, python3.14 ... python3.11 on PATH
# that is >= 3.11. Missing Debian/Ubuntu packages are installed with apt-get when this runs as
# root or with sudo that needs no password; otherwise it stops at once and prints the exact
# command to run. Go is installed with apt only when the distribution's package is new enough.
# After installing `prometheus` (and always under CI=true), the system service that Debian's
# package starts on :9090 is stopped: the tests and the demo start their own servers.
# DISAGG_PREREQS_INSTALL=0 only checks: it installs nothing (no apt-get, no checkov).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

MIN_PY="3.11"
MIN_GO="1.24"
GO_DOWNLOAD_VERSION="1.24.0" # only used in the instructions printed when Go must be installed by hand
PY_CANDIDATES=(python3 python3.14 python3.13 python3.12 python3.11)

log() { echo "[prereqs] $*" >&2; }

stop() { # stop <message lines...>: print and exit 1
  echo "" >&2
  for line in "$@"; do echo "hack/prereqs.sh: $line" >&2; done
  exit 1
}

version_ge() { # version_ge A B: A >= B, for dotted versions
  [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]
}

py_version() { # py_version <python>: "3.11", or nothing when it does not run
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

find_python() { # print the interpreter to build .venv from, or fail
  if [[ -n "${PYTHON:-}" ]]; then
    local p
    p="$(command -v "${PYTHON}" 2>/dev/null || true)"
    [[ -n "$p" ]] || stop "PYTHON=${PYTHON} was not found."
    local v
    v="$(py_version "$p")"
    [[ -n "$v" ]] && version_ge "$v" "${MIN_PY}" || stop "PYTHON=${PYTHON} is Python ${v:-?}; ${MIN_PY} or newer is needed."
    echo "$p"
    return 0
  fi
  local c p v
  for c in "${PY_CANDIDATES[@]}"; do
    p="$(command -v "$c" 2>/dev/null || true)"
    [[ -n "$p" ]] || continue
    v="$(py_version "$p")"
    if [[ -n "$v" ]] && version_ge "$v" "${MIN_PY}"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# --- installing with apt -----------------------------------------------------------------------

SUDO=()
can_install() { # root, or sudo without a password prompt, and apt-get present
  [[ "${DISAGG_PREREQS_INSTALL:-1}" != 0 ]] || return 1
  command -v apt-get >/dev/null 2>&1 || return 1
  if [[ "$(id -u)" == 0 ]]; then
    SUDO=()
    return 0
  fi
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
    return 0
  fi
  return 1
}

APT_UPDATED=0
apt_update() {
  [[ "${APT_UPDATED}" == 1 ]] && return 0
  log "apt-get update"
  "${SUDO[@]}" apt-get update -qq </dev/null >/dev/null
  APT_UPDATED=1
}

apt_install() { # apt_install <packages...>
  apt_update
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "$@" \
    </dev/null >/dev/null
}

apt_candidate_version() { # apt_candidate_version <package>: upstream version apt would install, or ""
  local v
  v="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')"
  [[ -z "$v" || "$v" == "(none)" ]] && return 0
  v="${v#*:}"                 # epoch
  v="${v%%[-~+]*}"            # Debian revision / suffix
  echo "$v"
}

stop_system_prometheus() {
  # Debian's package enables and starts a service on :9090, which the demo uses.
  if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
    "${SUDO[@]}" systemctl stop prometheus >/dev/null 2>&1 || true
  elif command -v service >/dev/null 2>&1; then
    "${SUDO[@]}" service prometheus stop >/dev/null 2>&1 || true
  fi
}

# --- the checks --------------------------------------------------------------------------------

check_python() { # sets PY
  if [[ -n "${PYTHON:-}" ]]; then
    PY="$(find_python)" || exit 1 # an explicit choice that does not work: find_python said why
  elif ! PY="$(find_python)"; then
    if can_install; then
      apt_install python3 python3-venv
      PY="$(find_python)" || stop "no Python >= ${MIN_PY} found after installing python3."
    else
      stop "no Python >= ${MIN_PY} found (tried ${PY_CANDIDATES[*]}). Install one, e.g.:" \
        "    sudo apt-get install -y python3 python3-venv" \
        "or choose one with: make PYTHON=/path/to/python3.11 ..."
    fi
  fi
  # `python3 -m venv` needs ensurepip, which Debian and Ubuntu ship separately (python3-venv).
  if "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    return 0
  fi
  local real pkg
  real="$(readlink -f "$PY")"
  if [[ "$real" == /usr/bin/* ]]; then
    if [[ "$real" == "$(readlink -f /usr/bin/python3 2>/dev/null)" ]]; then
      pkg=python3-venv
    else
      pkg="python$(py_version "$PY")-venv"
    fi
    if can_install; then
      apt_install "$pkg"
      "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1 || stop "$PY still cannot create a virtual environment after installing $pkg."
      return 0
    fi
    stop "$PY cannot create a virtual environment (no ensurepip). Install it with:" \
      "    sudo apt-get install -y $pkg"
  fi
  stop "$PY cannot create a virtual environment (its venv/ensurepip modules are missing)." \
    "Reinstall that Python with them, or choose another: make PYTHON=/usr/bin/python3 ..."
}

go_version() { # "1.26" or ""
  command -v go >/dev/null 2>&1 || return 0
  go env GOVERSION 2>/dev/null | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/' || true
}

check_go() {
  local have
  have="$(go_version)"
  if [[ -n "$have" ]] && version_ge "$have" "${MIN_GO}"; then
    return 0
  fi
  local what="Go ${MIN_GO} or newer is needed to build the local-cluster tools (found: ${have:+go$have}${have:-none})."
  if [[ -z "$have" && -x /usr/local/go/bin/go ]]; then
    stop "${what}" "Go is installed in /usr/local/go but not on PATH:" \
      "    export PATH=/usr/local/go/bin:\$PATH"
  fi
  if can_install; then
    apt_update
    local cand
    cand="$(apt_candidate_version golang-go)"
    if [[ -n "$cand" ]] && version_ge "$cand" "${MIN_GO}"; then
      apt_install golang-go
      have="$(go_version)"
      [[ -n "$have" ]] && version_ge "$have" "${MIN_GO}" && return 0
    fi
  fi
  local arch
  arch="$(uname -m)"
  case "$arch" in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; esac
  stop "${what}" \
    "Your distribution's golang-go is too old or cannot be installed here. Install Go from go.dev:" \
    "    curl -fsSL https://go.dev/dl/go${GO_DOWNLOAD_VERSION}.linux-${arch}.tar.gz | sudo tar -C /usr/local -xz" \
    "    export PATH=/usr/local/go/bin:\$PATH"
}

find_chromium() {
  command -v chromium || command -v chromium-browser || command -v google-chrome || true
}

check_binaries() { # check_binaries <with_chromium 0|1>
  local need=() why=()
  if [[ -z "${DISAGG_PROMETHEUS_BIN:-}" ]] && ! command -v prometheus >/dev/null 2>&1; then
    need+=(prometheus)
    why+=("prometheus (the Prometheus server, for the demo and the Prometheus tests)")
  fi
  if [[ "$1" == 1 && -z "$(find_chromium)" ]]; then
    need+=(chromium)
    why+=("chromium (headless browser, for the dashboard test)")
  fi
  if [[ ${#need[@]} -eq 0 ]]; then
    [[ "${CI:-}" == true ]] && can_install && stop_system_prometheus
    return 0
  fi
  if ! can_install; then
    local joined
    joined="$(printf '%s; ' "${why[@]}")"
    stop "missing: ${joined%; }. Install with:" \
      "    sudo apt-get install -y --no-install-recommends ${need[*]}"
  fi
  apt_install "${need[@]}"
  stop_system_prometheus
  [[ -n "${DISAGG_PROMETHEUS_BIN:-}" ]] || command -v prometheus >/dev/null 2>&1 \
    || stop "apt installed prometheus but no prometheus binary is on PATH."
  [[ "$1" == 0 || -n "$(find_chromium)" ]] || stop "apt installed chromium but no chromium binary is on PATH."
}

check_checkov() { # the chart's policy scanner, in a cached venv of its own (no root needed)
  local bin
  bin="$("${HERE}/checkov.sh" --print)"
  [[ -x "${bin}" && -f "$(dirname "$(dirname "${bin}")")/.installed" ]] && return 0
  [[ "${DISAGG_PREREQS_INSTALL:-1}" != 0 ]] || stop "missing: checkov (the chart's policy scanner). Install with:" \
    "    hack/checkov.sh"
  PYTHON="$PY" "${HERE}/checkov.sh" >/dev/null
}

main() {
  local target="${1:-test}"
  case "$target" in
    --find-python)
      find_python || stop "no Python >= ${MIN_PY} found (tried ${PY_CANDIDATES[*]}); run hack/prereqs.sh venv."
      return 0
      ;;
    venv) check_python ;;
    demo) check_python; check_go; check_binaries 0 ;;
    test | all) check_python; check_go; check_binaries 1; check_checkov ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; return 0 ;;
    *) stop "unknown target '$target' (venv, demo, test)" ;;
  esac
  local summary="python $PY ($(py_version "$PY"))"
  [[ "$target" == venv ]] || summary+=", go$(go_version), prometheus"
  [[ "$target" == demo || "$target" == venv ]] || summary+=", chromium, checkov"
  log "ok: ${summary}"
}

main "$@"
