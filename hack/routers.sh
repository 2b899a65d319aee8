#!/usr/bin/env bash
# Install the pinned P/D routers from PyPI into virtualenvs (for the integration tests and
# `make demo`). The versions are the operator's pins (operator/disagg/routers.py).
#
#   hack/routers.sh            install what is missing, print the directory
#   hack/routers.sh --print    only print the directory
#
# ${DISAGG_ROUTERS_DIR:-~/.cache/disagg-operator/routers}/<package>-<version>/bin/<binary>
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${DISAGG_ROUTERS_DIR:-${HOME}/.cache/disagg-operator/routers}"
[[ "${1:-}" == "--print" ]] && { echo "${DIR}"; exit 0; }

pins="$(PYTHONPATH="${HERE}/../operator" python3 -c 'from disagg import routers; print(routers.pins_for_shell())')"
mkdir -p "${DIR}"
while read -r package version binary; do
  venv="${DIR}/${package}-${version}"
  if [[ -x "${venv}/bin/${binary}" ]]; then
    continue
  fi
  echo "[routers] installing ${package}==${version} into ${venv}" >&2
  rm -rf "${venv}"
  python3 -m venv "${venv}"
  "${venv}/bin/pip" install --quiet --disable-pip-version-check "${package}==${version}" >&2
  [[ -x "${venv}/bin/${binary}" ]] || { echo "hack/routers.sh: ERROR: ${package} has no ${binary}" >&2; exit 1; }
done <<< "${pins}"
echo "${DIR}"
