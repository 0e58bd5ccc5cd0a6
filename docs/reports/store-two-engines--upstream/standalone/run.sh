#!/usr/bin/env bash
# MooncakeStoreConnector: two engines on one host share the LookupKey socket; one engine's lookups are answered by the other's worker
# Usage: ./run.sh [PYTHON]   PYTHON (or $VLLM_PYTHON): the python of the venv that has vLLM and Mooncake (default: python3)
# Exit 1: the defect showed; 0: it did not; 2: the set-up failed. README.md says what it shows.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
setup "$@"

MA_RPC=$(free_port); MA_ADMIN=$(free_port); MB_RPC=$(free_port); MB_ADMIN=$(free_port)
A=$(free_port); B=$(free_port)
master master-a "$MA_RPC" "$MA_ADMIN"
master master-b "$MB_RPC" "$MB_ADMIN"
# A is held (SIGSTOP) from the moment its worker has bound the admin channel's socket until B is up:
# then A's scheduler connects after both workers bound, every run (started together, it is a race)
serve a "$A" 0 out/master-a.json
wait_socket a 2
kill -STOP -- "-${PIDS[2]}"
serve b "$B" 1 out/master-b.json
wait_ready b "$B" 3
kill -CONT -- "-${PIDS[2]}"
wait_ready a "$A" 2

timeout 300 "$PY" repro.py --a "http://127.0.0.1:$A" --a-admin "http://127.0.0.1:$MA_ADMIN" --b "http://127.0.0.1:$B" --b-admin "http://127.0.0.1:$MB_ADMIN" --rpc-dir "$RPC_DIR"
rc=$?
[ "$rc" -le 1 ] || rc=2
echo "log lines (out/*.log):"
log_lines 'KV load failure|[Ff]ailed to (load|get)'
exit "$rc"
