#!/usr/bin/env bash
# MooncakeStoreConnector: one malformed message on the LookupKey admin channel kills LookupKeyServer's thread, and every later request hangs
# Usage: ./run.sh [PYTHON]   PYTHON (or $VLLM_PYTHON): the python of the venv that has vLLM and Mooncake (default: python3)
# Exit 1: the defect showed; 0: it did not; 2: the set-up failed. README.md says what it shows.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
setup "$@"

M=$(free_port); MA=$(free_port); S=$(free_port)
master master "$M" "$MA"
serve server "$S" 0 out/master.json
wait_ready server "$S" 1

timeout 300 "$PY" repro.py --server "http://127.0.0.1:$S" --rpc-dir "$RPC_DIR"
rc=$?
[ "$rc" -le 1 ] || rc=2
echo "log lines (out/*.log):"
log_lines 'Exception in thread' 'IndexError'
exit "$rc"
