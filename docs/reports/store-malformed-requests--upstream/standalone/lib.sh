# Shared by run.sh: Mooncake masters and vLLM servers with vLLM's MooncakeStoreConnector on one host.
# Every step has a time limit; every process is stopped when run.sh ends, however it ends.

PIDS=()
START_TIMEOUT_S="${START_TIMEOUT_S:-600}"   # a server's start-up (20-30 s on a quiet CPU, minutes when loaded)
# kv_connector_extra_config: empty, every key at its default (the lookup socket's path included)
EXTRA='{}'

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
  [ -n "${RPC_DIR:-}" ] && rm -rf "$RPC_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# master NAME RPC_PORT ADMIN_PORT: a mooncake_master (the KV pool's metadata service) on loopback in
# its own process group, its log in out/NAME.log, and out/NAME.json, the mooncake config a vLLM
# server reads (MOONCAKE_CONFIG_PATH). Waits until its admin port says service_ready.
master() {
  local name="$1" rpc="$2" admin="$3" t=0
  echo "+ mooncake_master -rpc_address 127.0.0.1 -rpc_port $rpc -metrics_port $admin ..."
  setsid "$PY" -m mooncake.cli -rpc_address 127.0.0.1 -rpc_port "$rpc" -metrics_host 127.0.0.1 \
    -metrics_port "$admin" -enable_http_metadata_server=false -eviction_high_watermark_ratio 0.9 \
    -eviction_ratio 0.1 -default_kv_lease_ttl 11000 -client_ttl 120 > "out/$name.log" 2>&1 < /dev/null &
  PIDS+=("$!")
  cat > "out/$name.json" <<JSON
{"metadata_server": "P2PHANDSHAKE", "protocol": "tcp", "device_name": "",
 "master_server_address": "127.0.0.1:$rpc", "global_segment_size": "1GB",
 "preferred_segment": false, "prefer_alloc_in_same_node": true, "enable_ssd_offload": false}
JSON
  until curl -sf -m 2 "http://127.0.0.1:$admin/health" | grep -q '"service_ready": *true'; do
    if [ "$t" -ge 60 ]; then echo "error: $name (mooncake_master) not ready within 60 s (out/$name.log)"; exit 2; fi
    sleep 1; t=$((t + 1))
  done
}

# serve NAME PORT CORE MOONCAKE_JSON: one vLLM server with the store connector (kv_both: it saves
# prompts to the pool and looks them up there) in its own process group (a signal reaches its engine
# and worker processes too), its log in out/NAME.log. VLLM_RPC_BASE_PATH, where vLLM puts its ipc sockets
# (the store's admin channel among them), is a fresh temporary folder: a unix socket's path is at most
# 107 bytes, too short for a folder deep in a checkout.
serve() {
  local name="$1" port="$2" core="$3" mc="$4"
  local kv="{\"kv_connector\":\"MooncakeStoreConnector\",\"kv_role\":\"kv_both\",\"kv_connector_extra_config\":$EXTRA}"
  echo "+ MOONCAKE_CONFIG_PATH=$mc VLLM_RPC_BASE_PATH=$RPC_DIR vllm serve model --port $port --kv-transfer-config '$kv' ..."
  setsid env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_SERVER_DEV_MODE=1 \
    VLLM_HOST_IP=127.0.0.1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND="$core" \
    MOONCAKE_CONFIG_PATH="$HERE/$mc" VLLM_RPC_BASE_PATH="$RPC_DIR" \
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

# wait_socket NAME INDEX: a LookupKey admin-channel socket exists in RPC_DIR (the server's worker bound it)
wait_socket() {
  local name="$1" pgid="${PIDS[$2]}" t=0
  until compgen -G "$RPC_DIR/lookup_rpc_*" > /dev/null; do
    if ! kill -0 "$pgid" 2> /dev/null;  # the pid: its process group may not exist yet
    then echo "error: $name exited during start-up (out/$name.log):"; tail -5 "out/$name.log"; exit 2; fi
    if [ "$t" -ge $((START_TIMEOUT_S * 5)) ]; then echo "error: $name bound no lookup socket within $START_TIMEOUT_S s"; exit 2; fi
    sleep 0.2; t=$((t + 1))
  done
  echo "$name's worker bound the lookup socket"
}

setup() {
  HERE="$(cd "$(dirname "$0")" && pwd)"
  cd "$HERE"
  PY="${1:-${VLLM_PYTHON:-python3}}"
  command -v curl > /dev/null || { echo "error: curl is needed"; exit 2; }
  timeout 300 "$PY" -c 'import vllm, zmq, mooncake.store, mooncake.cli' 2> /dev/null \
    || { echo "error: $PY cannot import vllm, zmq and mooncake.store: pass the python of the venv that has vLLM and Mooncake"; exit 2; }
  rm -rf out; mkdir -p out
  RPC_DIR="$(mktemp -d -t vllm-rpc.XXXXXX)" || { echo "error: mktemp failed"; exit 2; }
  timeout 900 "$PY" make_model.py model || { echo "error: make_model.py failed"; exit 2; }
}

# show the vLLM log lines that show the defect (grep patterns, passed as arguments)
log_lines() {
  local pat
  for pat in "$@"; do grep -h -E "$pat" out/*.log | tail -3; done | cut -c1-400
}
