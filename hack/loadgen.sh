#!/usr/bin/env bash
# Install the pinned load generator (NVIDIA's aiperf, from PyPI) into its own virtualenv, with a
# word-level tokenizer built from aiperf's own prompt corpus (one token = one word, the emulated
# engines' rule; loaded from disk, so aiperf never fetches a tokenizer). Its dependencies conflict
# with constraints.txt, hence its own venv. The pin is operator/disagg/loadgen.py's.
#
#   hack/loadgen.sh            install what is missing, print the aiperf binary's path
#   hack/loadgen.sh --print    only print the path
#
# ${DISAGG_LOADGEN_DIR:-~/.cache/disagg-operator/loadgen}/aiperf-<version>/{bin/aiperf,word-tokenizer/}
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
read -r venv tokenizer package version < <(PYTHONPATH="${HERE}/../operator" python3 -c '
from disagg import loadgen as l
print(l.venv_dir(), l.tokenizer_dir(), l.PACKAGE, l.VERSION)')
[[ "${1:-}" == "--print" ]] && { echo "${venv}/bin/aiperf"; exit 0; }

if [[ ! -x "${venv}/bin/aiperf" ]]; then
  echo "[loadgen] installing ${package}==${version} into ${venv} (a few minutes)" >&2
  rm -rf "${venv}"
  mkdir -p "$(dirname "${venv}")"
  # aiperf 0.13.0 supports Python 3.11 to 3.13: the first such interpreter on PATH.
  py=""
  for c in python3 python3.13 python3.12 python3.11; do
    if command -v "${c}" >/dev/null 2>&1 && \
       "${c}" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; then
      py="${c}"; break
    fi
  done
  [[ -n "${py}" ]] || { echo "hack/loadgen.sh: ERROR: ${package} ${version} needs Python 3.11-3.13 on PATH" >&2; exit 1; }
  "${py}" -m venv "${venv}"
  "${venv}/bin/pip" install --quiet --disable-pip-version-check "${package}==${version}" >&2
  [[ -x "${venv}/bin/aiperf" ]] || { echo "hack/loadgen.sh: ERROR: ${package} has no aiperf" >&2; exit 1; }
fi
if [[ ! -f "${tokenizer}/tokenizer.json" ]]; then
  corpus="$("${venv}/bin/python" -c 'import aiperf, pathlib; print(pathlib.Path(aiperf.__file__).parent / "dataset/generator/assets/shakespeare.txt")')"
  "${venv}/bin/python" "${HERE}/loadgen_tokenizer.py" "${corpus}" "${tokenizer}" >&2
fi
echo "${venv}/bin/aiperf"
