#!/usr/bin/env bash
# MooncakeConnector: a prompt whose first token is EOS fails on the decode instance
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

timeout 300 "$PY" repro.py --prefill "http://127.0.0.1:$P" --decode "http://127.0.0.1:$D" --bootstrap "http://127.0.0.1:$PB" --abort-timeout-s "$ABORT_TIMEOUT_S"
rc=$?
[ "$rc" -le 1 ] || rc=2
echo "vLLM log lines (out/*.log):"
log_lines 'P side ready' 'KV load failure|failed with an internal error'
exit "$rc"
