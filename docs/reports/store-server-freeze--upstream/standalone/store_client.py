"""HTTP helpers the report's repro.py calls: one completion, a counter of vLLM's /metrics, the
master's key count, and the one RESULT line. Standard library only.

The tokens a server found in the KV pool (vLLM's MooncakeStoreConnector) are its counter
vllm:external_prefix_cache_hits_total (prompt tokens the connector said it could load); the server
runs with --no-enable-prefix-caching, so every prompt is looked up in the pool, never in the
server's own prefix cache.
"""

import json
import re
import time
import urllib.error
import urllib.request

MODEL = "tiny-llama"  # --served-model-name
# any text of about 200 tokens of the tiny model; each prompt its own (request i)
WORDS = ("the quick brown fox jumps over the lazy dog while the store keeps blocks for every "
         "engine and every request waits for its turn in the queue before it runs").split()
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, whatever HTTP_PROXY says


def prompt(i):
    return f"request {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(170))


def post(url, body, timeout):
    """(HTTP status or None, parsed JSON or error text, seconds). status None: no answer in time."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with _NO_PROXY.open(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null"), time.monotonic() - t0
    except urllib.error.HTTPError as e:
        return e.code, e.read()[:300].decode(errors="replace"), time.monotonic() - t0
    except (TimeoutError, OSError) as e:  # socket.timeout is a TimeoutError
        return None, type(e).__name__, time.monotonic() - t0


def complete(url, i, timeout, max_tokens=8):
    """Prompt i as a greedy completion: (status, answer, seconds)."""
    body = {"model": MODEL, "prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0}
    return post(url + "/v1/completions", body, timeout)


def counter(url, name, timeout=10):
    """The sum of a counter's samples on a server's /metrics (0 when it has none yet)."""
    with _NO_PROXY.open(url + "/metrics", timeout=timeout) as r:
        text = r.read().decode(errors="replace")
    pat = re.compile(r"^" + re.escape(name) + r"(\{[^}]*\})? ([0-9.e+-]+)$")
    return sum(float(m.group(2)) for line in text.splitlines() if (m := pat.match(line)))


def pool_hits(url):
    return counter(url, "vllm:external_prefix_cache_hits_total")


def master_keys(admin_url, timeout=5):
    """The master's key count (its admin port's master_key_count gauge), or None."""
    try:
        with _NO_PROXY.open(admin_url + "/metrics", timeout=timeout) as r:
            text = r.read().decode(errors="replace")
    except OSError:
        return None
    m = re.search(r"^master_key_count ([0-9.e+]+)$", text, re.M)
    return int(float(m.group(1))) if m else None


def result(seen, what):
    """Print the one RESULT line; exit status 1 when the defect showed, 0 when it did not."""
    print(f"RESULT: defect {'seen' if seen else 'not seen'}: {what}", flush=True)
    return 1 if seen else 0
