#!/usr/bin/env bash
# Install the pinned checkov (the Kubernetes policy scanner run by
# tests/integration/test_chart_policy.py on the rendered chart) from PyPI into a cached
# virtual environment of its own: checkov pins many packages, which must not meet the
# project's. The versions are hack/checkov-constraints.txt (checkov's own line included).
#
#   hack/checkov.sh            install when missing, print the checkov executable
#   hack/checkov.sh --print    only print where the executable is (installed or not)
#
# ${DISAGG_CHECKOV_DIR:-~/.cache/disagg-operator/checkov}/checkov-<version>/bin/checkov, in a
# venv made by ${PYTHON:-python3}. hack/prereqs.sh test (so `make test` and CI) runs this.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONSTRAINTS="${HERE}/checkov-constraints.txt"
DIR="${DISAGG_CHECKOV_DIR:-${HOME}/.cache/disagg-operator/checkov}"
VERSION="$(sed -n 's/^checkov==//p' "${CONSTRAINTS}")"
[[ -n "${VERSION}" ]] || { echo "hack/checkov.sh: ERROR: no checkov== line in ${CONSTRAINTS}" >&2; exit 1; }
VENV="${DIR}/checkov-${VERSION}"
BIN="${VENV}/bin/checkov"
[[ "${1:-}" == "--print" ]] && { echo "${BIN}"; exit 0; }

# A complete install ends by writing the marker; a half-finished one is started over.
if [[ ! -x "${BIN}" || ! -f "${VENV}/.installed" ]]; then
  echo "[checkov] installing checkov==${VERSION} into ${VENV} (a few minutes, once)" >&2
  rm -rf "${VENV}"
  mkdir -p "${DIR}"
  "${PYTHON:-python3}" -m venv "${VENV}"
  "${VENV}/bin/pip" install --quiet --disable-pip-version-check -c "${CONSTRAINTS}" "checkov==${VERSION}" >&2
  "${BIN}" --version >/dev/null || { echo "hack/checkov.sh: ERROR: ${BIN} does not run" >&2; exit 1; }
  touch "${VENV}/.installed"
fi
echo "${BIN}"
