#!/usr/bin/env bash
# MooncakeConnector: decode waits abort_timeout + 60 s for a prefill node that was killed
# Usage: ./run.sh [PYTHON]   PYTHON (or $VLLM_PYTHON): the python of the venv that has vLLM (default: python3)
# Exit 1: the defect showed; 0: it did not; 2: the set-up failed. README.md says what it shows.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
setup "$@"

P=$(free_port); PB=$(free_port); D=$(free_port); DB=$(free_port)
serve prefill kv_producer "$P" "$PB" 0
serve decode kv_consumer "$D" "$DB" 1
wait_ready prefill "$P" 0
wait_ready decode "$D" 1

timeout 300 "$PY" repro.py --prefill "http://127.0.0.1:$P" --decode "http://127.0.0.1:$D" --bootstrap "http://127.0.0.1:$PB" --prefill-pgid "${PIDS[0]}"
rc=$?
[ "$rc" -le 1 ] || rc=2
echo "vLLM log lines (out/*.log):"
log_lines 'transfer failed|Resource temporarily unavailable' 'KV load failure'
exit "$rc"
