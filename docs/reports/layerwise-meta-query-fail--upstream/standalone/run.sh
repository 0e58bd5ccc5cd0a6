#!/usr/bin/env bash
# MooncakeLayerwiseConnector: a failed metadata query on the prefill node is asked again on every layer and never reported to the decode node
# Usage: ./run.sh [PYTHON [VLLM_ASCEND_SRC]]
#   PYTHON (or $VLLM_PYTHON): the python of the venv with vllm-ascend, its vLLM and pytest (default: python3)
#   VLLM_ASCEND_SRC: a vllm-ascend source tree of the installed release (its tests/ut/conftest.py
#   holds the stand-ins vllm-ascend's unit tests use on a host without an NPU)
# Exit 1: the defect showed; 0: it did not; 2: the set-up failed. README.md says what it shows.
set -uo pipefail
cd "$(dirname "$0")"
PY=${1:-${VLLM_PYTHON:-python3}}
export VLLM_ASCEND_SRC=${2:-${VLLM_ASCEND_SRC:-}}
if [ ! -f "$VLLM_ASCEND_SRC/tests/ut/conftest.py" ]; then
  echo "error: give a vllm-ascend source tree (with tests/ut/conftest.py) as the second argument or VLLM_ASCEND_SRC" >&2
  exit 2
fi
mkdir -p out
export VLLM_RPC_BASE_PATH=$(mktemp -d)   # where vllm-ascend puts its ipc sockets
trap 'rm -rf "$VLLM_RPC_BASE_PATH"' EXIT
"$PY" -c "import importlib.metadata as m, platform, sys; v = {(x.metadata['Name'] or '').lower().replace('_', '-'): x.version for x in m.distributions()}; print('OS:', platform.platform()); print('Python:', sys.version.split()[0]); [print(d + ':', v.get(d, 'not installed')) for d in ('vllm-ascend', 'vllm', 'torch', 'pyzmq', 'msgpack', 'pytest')]" > out/versions.txt 2>&1 || { echo "error: $PY cannot run" >&2; exit 2; }
timeout 600 "$PY" repro.py > out/repro.log 2>&1
rc=$?
# a Python error also exits 1: only a RESULT line says what was seen
if [ "$rc" -gt 1 ] || ! grep -qE '^RESULT: defect (seen|not seen)' out/repro.log; then tail -n 30 out/repro.log; rc=2; fi
grep -E '^(repro|RESULT|[a-z_]+): ' out/repro.log | grep -vE '^(INFO|WARNING|ERROR|DEBUG)'
echo "log lines (out/repro.log):"
grep -E 'Query to port and kv base addr for request fail|MooncakeLayerwiseConnector transfer fail' out/repro.log | cut -c1-240 | head -n 20
exit "$rc"
