#!/usr/bin/env bash
# MooncakeConnector: a decode request with unusable kv_transfer_params waits forever
# Usage: ./run.sh [PYTHON]   PYTHON (or $VLLM_PYTHON): the python of the venv that has vLLM (default: python3)
# Exit 1: the defect showed; 0: it did not; 2: the set-up failed. README.md says what it shows.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
setup "$@"

D=$(free_port); DB=$(free_port)
serve decode kv_consumer "$D" "$DB" 1
wait_ready decode "$D" 0

timeout 300 "$PY" repro.py --decode "http://127.0.0.1:$D"
rc=$?
[ "$rc" -le 1 ] || rc=2
echo "vLLM log lines (out/*.log):"
log_lines 'Got invalid KVTransferParams' 'Missing transfer_id'
exit "$rc"
