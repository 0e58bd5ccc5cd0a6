# Shared by run.sh: start and stop vLLM servers with the Mooncake connector on one host.
# Every step has a time limit; every server is stopped when run.sh ends, however it ends.

PIDS=()
ABORT_TIMEOUT_S="${ABORT_TIMEOUT_S:-10}"   # VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (vLLM's default: 480)
START_TIMEOUT_S="${START_TIMEOUT_S:-600}"   # a server's start-up (20-30 s on a quiet CPU, minutes when loaded)
# kv_connector_extra_config: the protocol; kv_load_timeout_ms is read only by the fixed connector (vLLM 0.32.0 ignores it)
EXTRA='{"mooncake_protocol":"tcp","kv_load_timeout_ms":2000}'

cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -CONT -- "-$p" 2>/dev/null; kill -TERM -- "-$p" 2>/dev/null; done
  for _ in $(seq 1 30); do
    local alive=0
    for p in "${PIDS[@]}"; do kill -0 -- "-$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 1
  done
  for p in "${PIDS[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# serve NAME ROLE PORT BOOTSTRAP_PORT CORE [EXTRA_CONFIG_JSON]: one vLLM server in its own process group
# (so a signal reaches its engine and worker processes too), its log in out/NAME.log.
serve() {
  local name="$1" role="$2" port="$3" bport="$4" core="$5"
  local extra="${6:-$EXTRA}"
  local kv="{\"kv_connector\":\"MooncakeConnector\",\"kv_role\":\"$role\",\"kv_load_failure_policy\":\"fail\",\"kv_connector_extra_config\":$extra}"
  echo "+ VLLM_MOONCAKE_BOOTSTRAP_PORT=$bport VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT=$ABORT_TIMEOUT_S vllm serve model --port $port --kv-transfer-config '$kv' ..."
  setsid env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
    VLLM_HOST_IP=127.0.0.1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND="$core" \
    VLLM_MOONCAKE_BOOTSTRAP_PORT="$bport" VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT="$ABORT_TIMEOUT_S" \
    PYTHONPATH="$HERE/cpu_shim" NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost \
    "$PY" -m vllm.entrypoints.cli.main serve model --served-model-name tiny-llama \
      --host 127.0.0.1 --port "$port" --dtype bfloat16 --max-model-len 512 --max-num-seqs 8 \
      --enforce-eager --no-enable-prefix-caching --kv-transfer-config "$kv" \
      > "out/$name.log" 2>&1 < /dev/null &
  PIDS+=("$!")
}

# wait_ready NAME PORT INDEX: /health answers 200 within START_TIMEOUT_S (the server, PIDS[INDEX], must
# stay alive meanwhile), then one warm-up completion
wait_ready() {
  local name="$1" port="$2" pgid="${PIDS[$3]}" t=0
  until curl -sf -m 2 "http://127.0.0.1:$port/health" > /dev/null; do
    if ! kill -0 -- "-$pgid" 2> /dev/null; then echo "error: $name exited during start-up (out/$name.log):"; tail -5 "out/$name.log"; exit 2; fi
    if [ "$t" -ge "$START_TIMEOUT_S" ]; then echo "error: $name did not start within $START_TIMEOUT_S s (out/$name.log)"; exit 2; fi
    sleep 2; t=$((t + 2))
  done
  curl -sf -m 120 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"tiny-llama","prompt":"the quick brown fox jumps over the lazy dog","max_tokens":2}' > /dev/null \
    || { echo "error: $name's warm-up completion failed (out/$name.log)"; exit 2; }
  echo "$name ready after about ${t} s"
}

setup() {
  HERE="$(cd "$(dirname "$0")" && pwd)"
  cd "$HERE"
  PY="${1:-${VLLM_PYTHON:-python3}}"
  command -v curl > /dev/null || { echo "error: curl is needed"; exit 2; }
  timeout 300 "$PY" -c 'import vllm, zmq, msgpack' 2> /dev/null \
    || { echo "error: $PY cannot import vllm, zmq and msgpack: pass the python of the venv that has vLLM"; exit 2; }
  mkdir -p out
  timeout 900 "$PY" make_model.py model || { echo "error: make_model.py failed"; exit 2; }
}

# show the vLLM log lines that show the defect (grep patterns: repro.py's LOG_PATTERNS, passed as arguments)
log_lines() {
  local pat
  for pat in "$@"; do grep -h -E "$pat" out/*.log | tail -3; done | cut -c1-400
}
