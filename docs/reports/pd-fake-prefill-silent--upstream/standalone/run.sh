#!/usr/bin/env bash
# MooncakeConnector: decode waits abort_timeout + 60 s for a prefill node that stopped answering
# Usage: ./run.sh [PYTHON]   PYTHON (or $VLLM_PYTHON): the python of the venv that has vLLM (default: python3)
# Exit 1: the defect showed; 0: it did not; 2: the set-up failed. README.md says what it shows.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
setup "$@"

D=$(free_port); DB=$(free_port); FB=$(free_port); FS=$(free_port)
setsid timeout 900 "$PY" fake_prefill.py "$FB" "$FS" > out/fake_prefill.log 2>&1 < /dev/null &
PIDS+=("$!")
serve decode kv_consumer "$D" "$DB" 1
wait_ready decode "$D" 1

timeout 300 "$PY" repro.py --decode "http://127.0.0.1:$D" --bootstrap "http://127.0.0.1:$FB"
rc=$?
[ "$rc" -le 1 ] || rc=2
echo "vLLM log lines (out/*.log):"
log_lines 'fake prefill: pull' 'transfer failed|Resource temporarily unavailable'
exit "$rc"
