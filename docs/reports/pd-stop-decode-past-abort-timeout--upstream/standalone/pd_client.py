"""What a P/D proxy does for one request, for vLLM 0.32.0's MooncakeConnector (the same steps as
vLLM's examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py), as functions the
report's repro.py calls. Standard library only (plus pyzmq, which vLLM installs, for the side
channel).

One request through P and D:
  1. read P's engine id from P's bootstrap server: GET http://HOST:BOOTSTRAP/query -> {"0": {"engine_id": E, ...}}
  2. send P the request with max_tokens=1 and
     kv_transfer_params={"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": X}
  3. send D the same request with
     kv_transfer_params={"do_remote_decode": false, "do_remote_prefill": true,
                         "remote_bootstrap_addr": "http://HOST:BOOTSTRAP", "remote_engine_id": E, "transfer_id": X}
     (the example proxy sends 2 and 3 at the same time; here they can also be sent one after the other)
"""

import json
import threading
import time
import urllib.error
import urllib.request
import uuid

MODEL = "tiny-llama"  # --served-model-name of both servers


def post(url, body, timeout):
    """(HTTP status or None, parsed JSON or error text, seconds). status None: no answer in time."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null"), time.monotonic() - t0
    except urllib.error.HTTPError as e:
        return e.code, e.read()[:300].decode(errors="replace"), time.monotonic() - t0
    except (TimeoutError, OSError) as e:  # socket.timeout is a TimeoutError
        return None, type(e).__name__, time.monotonic() - t0


def engine_info(bootstrap, timeout=10):
    """(engine id, side-channel address of rank 0) from P's bootstrap server."""
    with urllib.request.urlopen(bootstrap + "/query", timeout=timeout) as r:
        entry = json.loads(r.read())["0"]
    return entry["engine_id"], entry["worker_addr"]["0"]["0"]


def completion(prompt, max_tokens, params=None):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if params is not None:
        body["kv_transfer_params"] = params
    return body


def prefill(p_url, prompt, transfer_id, timeout):
    params = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id}
    return post(p_url + "/v1/completions", completion(prompt, 1, params), timeout)


def decode(d_url, prompt, max_tokens, bootstrap, engine_id, transfer_id, timeout):
    params = {"do_remote_decode": False, "do_remote_prefill": True, "remote_bootstrap_addr": bootstrap,
              "remote_engine_id": engine_id, "transfer_id": transfer_id}
    return post(d_url + "/v1/completions", completion(prompt, max_tokens, params), timeout)


def pd_request(p_url, d_url, bootstrap, prompt, max_tokens, timeout, parallel=True):
    """One request through P and D; D's (status, body, seconds)."""
    engine_id, _ = engine_info(bootstrap)
    xid = str(uuid.uuid4())
    if not parallel:
        prefill(p_url, prompt, xid, timeout)
        return decode(d_url, prompt, max_tokens, bootstrap, engine_id, xid, timeout)
    t = threading.Thread(target=prefill, args=(p_url, prompt, xid, timeout), daemon=True)
    t.start()
    out = decode(d_url, prompt, max_tokens, bootstrap, engine_id, xid, timeout)
    t.join(timeout)
    return out


def text_of(body):
    try:
        return body["choices"][0]["text"]
    except (KeyError, IndexError, TypeError):
        return None


def result(seen, words):
    """The last line run.sh reports, and the exit code: 1 = the defect showed, 0 = it did not."""
    print(("RESULT: defect seen: " if seen else "RESULT: defect not seen: ") + words, flush=True)
    return 1 if seen else 0
