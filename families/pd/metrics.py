"""vLLM's ``/metrics`` (Prometheus text format), read and flattened into the counters a ``vllm``
node reports on its control channel.

Parsing: prometheus_client's own parser (``prometheus_client.parser``) when it can be imported.
It is only in the harness's ``dev`` and ``metrics`` extras, not in its runtime dependencies, so a
node must still work without it: then :func:`parse_text` falls back to a small parser written
here, which reads the subset of the text format vLLM writes (``# TYPE`` lines, then
``name{label="value",...} value [timestamp]`` lines; label values with the format's escapes
``\\\\``, ``\\"``, ``\\n``). Both give the same samples (tests/families/pd/test_pd_nodes.py compares them on a
live server's scrape).

Flattening (:func:`flatten`): the samples of ``vllm:`` metrics, keyed by the name without the
``vllm:`` prefix and with the labels that tell samples apart (all but ``engine`` and
``model_name``), like ``prompt_tokens_by_source_total{source=external_kv_transfer}``:

* every counter (``..._total``) and gauge, except ``..._created`` timestamps, ``..._info``
  metrics (configuration as labels) and metrics that say nothing on CPU with a text model
  (``estimated_*`` FLOP/byte estimates, ``mm_cache_*`` multimodal cache);
* of the histograms only ``_sum`` and ``_count``, and only of those in :data:`HISTOGRAMS`.

What vLLM 0.32.0 (CPU build, MooncakeConnector) exports, scraped from a live server: gauges
``num_requests_running``, ``num_requests_waiting``, ``num_requests_waiting_by_reason{reason=
capacity|deferred}``, ``num_requests_kv_fetch_by_stage{stage=waiting_to_start|in_progress|
completed_waiting}`` (kv consumers only), ``kv_cache_usage_perc``, ``engine_sleep_state{sleep_state=
...}``; counters ``prompt_tokens_total``, ``prompt_tokens_by_source_total{source=local_compute|
local_cache_hit|external_kv_transfer}``, ``prompt_tokens_cached_total``,
``prompt_tokens_cached_by_source_total{source=device|host|p2p|disk|external_unspecified}``,
``generation_tokens_total``, ``request_success_total{finished_reason=stop|length|abort|error|
repetition}`` (``error`` is what a KV load failure under policy ``fail`` ends as),
``prefix_cache_queries_total``, ``prefix_cache_hits_total``, ``external_prefix_cache_queries_total``,
``external_prefix_cache_hits_total``, ``num_preemptions_total``, ``admission_rejections_total{reason=
...}``; and histograms (request latencies, token counts). The Mooncake connector's own transfer
statistics (``KV Transfer metrics: ...``) are only logged, not exported; the patched target exports
them (connector_patch/upstream/vllm/0.32.0/ diff 17: ``mooncake_num_failed_recvs_total{cause=...}``,
``mooncake_num_failed_transfers_total``, ``mooncake_num_kv_expired_reqs_total``), the hardened one
``pdchaos_kv_failures_total{code=...}``.
"""

from __future__ import annotations

import math

import http.client
import re
from typing import Iterable, NamedTuple
from urllib.parse import urlsplit

PREFIX = "vllm:"
DROP_LABELS = frozenset({"engine", "model_name"})
DROP_PREFIXES = ("estimated_", "mm_cache_")
HISTOGRAMS = frozenset({"e2e_request_latency_seconds", "time_to_first_token_seconds",
                        "request_queue_time_seconds", "request_prefill_kv_computed_tokens"})


class Sample(NamedTuple):
    name: str          # the sample's own name (``..._total``, ``..._sum``, ...)
    labels: dict
    value: float
    type: str          # its family's type: counter, gauge, histogram, summary, info, untyped


class MetricsError(Exception):
    """The scrape failed (one line)."""


# --------------------------------------------------------------------------- parsing

def parse_text(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition, with its family's type."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:  # not a runtime dependency of the harness: see the module docstring
        return parse_text_fallback(text)
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.append(Sample(s.name, dict(s.labels), float(s.value), fam.type))
    return out


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count", "_gcount", "_gsum", "_info")


def parse_text_fallback(text: str) -> list[Sample]:
    """The hand-written parser (see the module docstring); raises ValueError on a line it
    cannot read."""
    types: dict[str, str] = {}
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) == 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"line {n}: not a sample")
        name, body, value = m.group(1), m.group(2), m.group(3)
        labels: dict[str, str] = {}
        if body:
            pos = 0
            while pos < len(body):
                lm = _LABEL.match(body, pos)
                if lm is None or lm.end() == pos:
                    if body[pos:].strip():
                        raise ValueError(f"line {n}: bad labels")
                    break
                labels[lm.group(1)] = re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group(0)], lm.group(2))
                pos = lm.end()
        out.append(Sample(name, labels, float(value), _type_of(name, types)))
    return out


def _type_of(name: str, types: dict[str, str]) -> str:
    if name in types:
        return types[name]
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in types:
            t = types[name[: -len(suffix)]]
            # prometheus_client reads a ``_created`` sample of a counter as a gauge of its own
            return "gauge" if suffix == "_created" and t == "counter" else t
    return "untyped"


# --------------------------------------------------------------------------- flattening

def _key(name: str, labels: dict) -> str:
    kept = sorted((k, v) for k, v in labels.items() if k not in DROP_LABELS)
    return name + ("{" + ",".join(f"{k}={v}" for k, v in kept) + "}" if kept else "")


def _num(v: float) -> float | int:
    return int(v) if v.is_integer() and abs(v) < 2 ** 53 else v


def flatten(samples: Iterable[Sample], prefix: str = PREFIX) -> dict[str, float | int]:
    """The counters of a scrape (see the module docstring). Samples with the same key (several
    engines) are summed."""
    out: dict[str, float | int] = {}
    for s in samples:
        if not s.name.startswith(prefix):
            continue
        name = s.name[len(prefix):]
        if name.startswith(DROP_PREFIXES) or name.endswith(("_created", "_info")):
            continue
        if s.type == "histogram":
            base, _, part = name.rpartition("_")
            if part not in ("sum", "count") or base not in HISTOGRAMS:
                continue
        elif s.type not in ("counter", "gauge"):
            continue
        k = _key(name, s.labels)
        out[k] = _num(out.get(k, 0) + s.value)
    return out


def counters(text: str) -> dict[str, float | int]:
    return flatten(parse_text(text))


# --------------------------------------------------------------------------- scraping

def http_get(url: str, timeout: float) -> tuple[int, bytes]:
    """One GET to a loopback server, never through a proxy; every socket operation bounded by
    ``timeout``. Raises OSError (connection refused, timeout) or http.client.HTTPException."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)
    try:
        conn.request("GET", (u.path or "/") + (f"?{u.query}" if u.query else ""),
                     headers={"Connection": "close"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def scrape(base_url: str, timeout: float = 1.0) -> dict[str, float | int]:
    """GET ``base_url/metrics`` and flatten it; MetricsError (one line) when it cannot."""
    try:
        status, body = http_get(base_url.rstrip("/") + "/metrics", timeout)
    except (OSError, http.client.HTTPException) as exc:
        raise MetricsError(f"GET /metrics: {type(exc).__name__}: {exc}") from None
    if status != 200:
        raise MetricsError(f"GET /metrics: HTTP {status}")
    try:
        return counters(body.decode("utf-8", "replace"))
    except ValueError as exc:
        raise MetricsError(f"GET /metrics: unreadable: {exc}") from None


def gauge(counters: dict, name: str) -> float | None:
    """A vLLM gauge from a node's scraped counters, whatever its prefix or labels (summed)."""
    def bare(key: str) -> str:  # without a "vllm:" prefix; labels kept when ``name`` has them
        key = key.split(":", 1)[-1] if ":" in key.split("{")[0] else key
        return key if "{" in name else key.split("{")[0]

    vals = [float(v) for k, v in (counters or {}).items()
            if isinstance(v, (int, float)) and math.isfinite(v) and bare(k) == name]
    return sum(vals) if vals else None
