"""Node kind ``pd-workload``: completions through the P/D proxy, each recorded as an op
(``pdchaos node pd-workload --config JSON --journal PART``).

Config (JSON, written by the topology's ``workload_config()``):

=====================  ====================================================================
``proxy_url``          where the completions go (``http://127.0.0.1:PORT``; the P/D proxy)
``decode_url``         the decode server: the reference outputs are computed there, without
                       ``kv_transfer_params`` (D then prefills itself: the non-disaggregated
                       output), and prompts are measured with its ``/tokenize``
``duration_s``         how long requests are issued after the start signal
``concurrency``        worker threads (each paced to ``concurrency / rate`` s between requests)
``rate``               requests per second over all workers
``prompt_tokens``      prompt length in tokens (each prompt is cut at a word boundary to at most
                       this many tokens, measured with D's tokenizer)
``output_tokens``      ``max_tokens`` of every request, greedy (``temperature: 0``)
``request_timeout_s``  a request with no complete answer by then is given up: op ``info``,
                       outcome ``stalled``
``seed``               prompts are drawn from a ``random.Random`` seeded with it
``model``              the model name the servers serve (the model folder's path)
``prompts_path``       where the prompts and their references are written (JSON list of
                       ``{prompt, expected, prompt_tokens}``; secret: never in a log)
optional:
``go_timeout_s``       how long to wait for the start signal (default 60)
``grace_s``            how long workers may overrun ``duration_s`` (default request_timeout_s + 5)
``prepare_timeout_s``  bound on making prompts and references before READY (default 240)
``horizon_path``       where the runner holds the workers at the end of ``duration_s`` and
                       then writes a later end (nodekit/workload.py ``Horizon``: a fault
                       healed too late for the ops ``recovery`` must see); prompts are reused
                       past the prepared ones
=====================  ====================================================================

Optional too, a shared-prefix mix: ``shared_prefix_tokens`` (prompt i starts with prefix ``i %
prefix_groups``, whole words of at most this many tokens, then words of its own) and
``prefix_groups`` (default 1).

Before READY: ``ceil(duration_s * rate * 1.2) + concurrency`` unique prompts of words from the
tiny model's corpus vocabulary (stacks/vllm_cpu/build_tiny_model.py, so they tokenize densely),
and each prompt's reference: the greedy output of D alone for that prompt and ``max_tokens``,
asked one request at a time until two answers agree (tokens and text; at most 3). References are
cached in
``${XDG_CACHE_HOME:-~/.cache}/pdchaos/reference/<sha256>.json``, the hash over the model (its
path and its build stamp), the prompt and ``max_tokens``, so they are computed once per machine.

Then the lookup workload's protocol: baseline probe, ``READY``, wait for SIGUSR1 (blocked in the
main thread before any thread exists, taken with ``sigtimedwait``), paced workers for
``duration_s``, final probe (counters: ops by outcome, prompts reused, reference cache hits).
Every request is an op ``f: "complete"``: at invoke ``expected`` (the reference text),
``expected_ids`` (its tokens' digest, when D gave token ids) and ``prompt_index``; at completion
``phase``, ``value`` (the text, or None), ``value_ids`` (the output tokens' digest, when given),
``outcome``, ``code``, ``status`` (HTTP status or None), ``elapsed_ms``, ``completion_tokens``:

* HTTP 200 with a completion text: ``ok``, outcome ``ok``;
* another HTTP status (or a 200 without a text): ``fail``, outcome ``http_<status>``, code = the
  error type of the JSON body (``error.type`` / ``error.code`` / ``error`` / ``code``), else
  ``no_text`` / ``not_json``; ``error_phase`` = the proxy's ``error.phase`` when it names one,
  ``decode_ms`` = its ``error.decode_ms`` (how long D had the request) when it gives one;
* connection refused: ``fail``, outcome ``connect`` (the request never arrived);
* connection reset or closed after the request was sent: ``info``, outcome ``connect`` (it may
  have been served);
* no complete answer within ``request_timeout_s``: ``info``, outcome ``stalled``, code
  ``timeout`` (how long it hung is its ``elapsed_ms``).

Requests go with ``http.client`` (never through an HTTP proxy), one connection each, every socket
operation bounded by what is left of the request's deadline. Nothing here logs a prompt or an
output: counts, codes and times only. A worker still stuck when the grace ends is left behind:
the final probe is written and the process leaves with ``os._exit(3)``.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import logging
import math
import os
import random
import signal
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from nodekit.control import process_stats
from nodekit.journal import JournalWriter
from nodekit.nodeio import watch_parent
from nodekit.workload import Horizon, Tally, add_workload_arguments, finish, paced, run_workers, start_node

log = logging.getLogger(__name__)

REQUIRED = ("proxy_url", "decode_url", "duration_s", "concurrency", "rate", "prompt_tokens", "output_tokens",
            "request_timeout_s", "seed", "model", "prompts_path")
PROMPT_HEADROOM = 1.2


class PrepareError(Exception):
    """Prompts or references could not be made (one line, no prompt text)."""


# --------------------------------------------------------------------------- HTTP

class Deadline(TimeoutError):
    pass


def post_json(url: str, body: dict, timeout: float) -> tuple[int, Any]:
    """POST ``body`` as JSON; (status, decoded JSON body or None). The whole exchange must end
    within ``timeout``: :class:`Deadline` (a TimeoutError) otherwise. Raises OSError /
    http.client.HTTPException on connection trouble; ``ConnectionRefusedError`` means the
    request was never sent."""
    u = urlsplit(url)
    deadline = time.monotonic() + timeout

    def left() -> float:
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise Deadline("deadline")
        return rest

    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=left())
    try:
        conn.connect()
        sock = conn.sock  # kept: with "Connection: close" the response takes it over from conn
        payload = json.dumps(body).encode()
        sock.settimeout(left())
        conn.request("POST", (u.path or "/") + (f"?{u.query}" if u.query else ""), body=payload,
                     headers={"Content-Type": "application/json", "Connection": "close"})
        sock.settimeout(left())
        resp = conn.getresponse()
        chunks = []
        while True:
            sock.settimeout(left())
            chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
            if not chunk:
                break
            chunks.append(chunk)
        raw = b"".join(chunks)
    except socket.timeout as exc:  # an alias of TimeoutError since 3.10
        raise Deadline(str(exc)) from None
    finally:
        conn.close()
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        data = None
    return resp.status, data


def error_code(data: Any) -> str:
    """The error type named by a JSON error body (vLLM: ``{"error": {"type": ...}}``)."""
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            for k in ("type", "code"):
                if isinstance(err.get(k), (str, int)) and err.get(k) != "":
                    return str(err[k])
        if isinstance(err, str) and err:
            return err[:80]
        for k in ("code", "type"):
            if isinstance(data.get(k), (str, int)):
                return str(data[k])[:80]
        return "unknown"
    return "not_json"


def tokens_digest(data: Any) -> str | None:
    """A digest of the generated token ids (vLLM's ``return_token_ids``), None when the answer has
    none. The reference and every output are compared by it when both have one: the model's output
    is its tokens (vLLM's incremental detokenizer spells many byte-piece tokens as ''). Journals and
    prompts.json keep the digest, never the ids."""
    try:
        ids = data["choices"][0]["token_ids"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return None
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:24]


def completion_text(data: Any) -> str | None:
    try:
        text = data["choices"][0]["text"]
    except (KeyError, IndexError, TypeError):
        return None
    return text if isinstance(text, str) else None


# --------------------------------------------------------------------------- prompts and references

def vocabulary() -> list[str]:
    from stacks.vllm_cpu.build_tiny_model import WORDS

    return list(WORDS)


def tokenize(decode_url: str, model: str, text: str, timeout: float) -> list[str]:
    """The token strings of ``text`` from D's ``/tokenize``."""
    status, data = post_json(decode_url.rstrip("/") + "/tokenize",
                             {"model": model, "prompt": text, "return_token_strs": True}, timeout)
    strs = data.get("token_strs") if isinstance(data, dict) else None
    if status != 200 or not isinstance(strs, list):
        raise PrepareError(f"D's /tokenize answered HTTP {status} ({error_code(data)})")
    return strs


def cut_at_tokens(words: list[str], token_strs: list[str], limit: int) -> tuple[int, int]:
    """(number of words, number of tokens) of the longest word prefix of at most ``limit``
    tokens. A byte-level BPE token starting with 'Ġ' (a space) begins a new word."""
    starts = [i for i, t in enumerate(token_strs) if i == 0 or t.startswith("Ġ")]
    if len(starts) != len(words):  # not the word structure we expect: fall back to whole words
        raise PrepareError(f"/tokenize gave {len(starts)} word starts for {len(words)} words")
    n_words, n_tokens = 0, 0
    for w, start in enumerate(starts):
        end = starts[w + 1] if w + 1 < len(starts) else len(token_strs)
        if end > limit:
            break
        n_words, n_tokens = w + 1, end
    return n_words, n_tokens


def make_prefixes(cfg: dict, deadline: float) -> list[list[str]]:
    """The words of each shared prefix (``prefix_groups`` of them, each the longest word prefix
    of at most ``shared_prefix_tokens`` tokens); none without ``shared_prefix_tokens``."""
    n = int(cfg.get("shared_prefix_tokens") or 0)
    if n <= 0:
        return []
    rng = random.Random(f"pd-workload-prefixes:{cfg['seed']}")  # the prompts' own draw is left as it was
    vocab = vocabulary()
    out: list[list[str]] = []
    for _ in range(max(1, int(cfg.get("prefix_groups") or 1))):
        words = [rng.choice(vocab) for _ in range(n)]
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise PrepareError("shared prefixes not ready within the preparation time")
        n_words, _ = cut_at_tokens(words, tokenize(cfg["decode_url"], cfg["model"], " ".join(words),
                                                   min(rest, 30.0)), n)
        if n_words == 0:
            raise PrepareError(f"shared_prefix_tokens {n}: no whole word fits")
        out.append(words[:n_words])
    return out


def make_prompts(cfg: dict, count: int, deadline: float) -> list[tuple[str, int]]:
    """``count`` unique prompts of about ``prompt_tokens`` tokens: (text, tokens). With a
    shared-prefix mix, prompt i starts with prefix ``i % prefix_groups`` and goes on with words of
    its own (at least one)."""
    rng = random.Random(f"pd-workload-prompts:{cfg['seed']}")
    vocab = vocabulary()
    target = int(cfg["prompt_tokens"])
    prefixes = make_prefixes(cfg, deadline)
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    while len(out) < count:
        prefix = prefixes[len(out) % len(prefixes)] if prefixes else []
        words = prefix + [rng.choice(vocab) for _ in range(target + 8 - len(prefix))]  # a word is >= 1 token
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise PrepareError(f"prompts not ready within the preparation time ({len(out)} of {count})")
        strs = tokenize(cfg["decode_url"], cfg["model"], " ".join(words), min(rest, 30.0))
        n_words, n_tokens = cut_at_tokens(words, strs, target)
        text = " ".join(words[:n_words])
        if n_words <= len(prefix) or text in seen:
            continue
        seen.add(text)
        out.append((text, n_tokens))
    return out


def model_fingerprint(model: str) -> str:
    """The model's name and, when it is a folder built by pdchaos, its build stamp (a rebuilt
    model gets new references)."""
    stamp = Path(model) / "pdchaos-build.json"
    try:
        extra = hashlib.sha256(stamp.read_bytes()).hexdigest()
    except OSError:
        extra = ""
    return f"{model}\n{extra}"


def reference_dir() -> Path:
    from harness.nodeenv.venv import cache_root

    return cache_root() / "reference"


REFERENCE_VERSION = 3  # 2: with the output tokens' digest; 3: two computations agree


def reference_key(fingerprint: str, prompt: str, max_tokens: int) -> str:
    return hashlib.sha256(json.dumps([fingerprint, prompt, int(max_tokens), REFERENCE_VERSION]).encode()).hexdigest()


REFERENCE_TRIES = 3  # a reference is kept when two of at most this many computations agree


def _one_reference(cfg: dict, prompt: str, i: int, deadline: float) -> tuple[str, str | None]:
    rest = deadline - time.monotonic()
    if rest <= 0:
        raise PrepareError(f"references not ready within the preparation time (at reference {i})")
    try:
        status, data = post_json(cfg["decode_url"].rstrip("/") + "/v1/completions",
                                 {"model": cfg["model"], "prompt": prompt, "max_tokens": int(cfg["output_tokens"]),
                                  "temperature": 0, "return_token_ids": True},
                                 min(rest, float(cfg["request_timeout_s"])))
    except (OSError, http.client.HTTPException) as exc:
        raise PrepareError(f"reference {i}: D did not answer ({type(exc).__name__})") from None
    text = completion_text(data)
    if status != 200 or text is None:
        raise PrepareError(f"reference {i}: D answered HTTP {status} ({error_code(data)})")
    return text, tokens_digest(data)


def agreed_reference(compute: Callable[[], tuple[str, str | None]],
                     what: str = "one reference prompt") -> tuple[tuple[str, str | None], bool]:
    """(the output two computations agree on, whether any disagreed). A fresh D once answered a
    reference prompt with other tokens ('' for what it and every other serving answered
    otherwise; measured twice, on a busy machine too): kept, such a reference made every later run
    using that prompt deviate. Raises PrepareError when no two of REFERENCE_TRIES agree."""
    seen: list[tuple[str, str | None]] = []
    for _ in range(REFERENCE_TRIES):
        got = compute()
        if got in seen:
            return got, len(seen) > 1
        seen.append(got)
    raise PrepareError(f"{what}: D gave {REFERENCE_TRIES} different outputs")


def references(cfg: dict, prompts: list[str], deadline: float) -> tuple[list[tuple[str, str | None]], int, int, int]:
    """((the reference text, its tokens' digest) of each prompt, cache hits, computed, computed
    with a disagreement). Each is computed until two computations agree (:func:`agreed_reference`),
    then cached."""
    folder = reference_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fp = model_fingerprint(str(cfg["model"]))
    max_tokens = int(cfg["output_tokens"])
    out, hits, computed, disagreed = [], 0, 0, 0
    for i, prompt in enumerate(prompts):
        path = folder / f"{reference_key(fp, prompt, max_tokens)}.json"
        try:
            cached = json.loads(path.read_text())
            if isinstance(cached, dict) and isinstance(cached.get("expected"), str):
                ids = cached.get("expected_ids")
                out.append((cached["expected"], ids if isinstance(ids, str) else None))
                hits += 1
                continue
        except (OSError, ValueError):
            pass
        if deadline - time.monotonic() <= 0:
            raise PrepareError(f"references not ready within the preparation time ({i} of {len(prompts)})")
        (text, digest), differed = agreed_reference(lambda: _one_reference(cfg, prompt, i, deadline),
                                                    f"reference {i}")
        disagreed += differed
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"expected": text, "expected_ids": digest, "max_tokens": max_tokens}))
        os.replace(tmp, path)
        out.append((text, digest))
        computed += 1
    return out, hits, computed, disagreed


def prepare(cfg: dict) -> tuple[list[dict], dict]:
    """Prompts and references (see the module docstring) -> (items, counts for the log)."""
    t0 = time.monotonic()
    deadline = t0 + float(cfg.get("prepare_timeout_s", 240.0))
    count = math.ceil(float(cfg["duration_s"]) * float(cfg["rate"]) * PROMPT_HEADROOM) + int(cfg["concurrency"])
    try:
        prompts = make_prompts(cfg, count, deadline)
        t1 = time.monotonic()
        expected, hits, computed, disagreed = references(cfg, [p for p, _ in prompts], deadline)
    except Deadline:
        raise PrepareError("D did not answer within the preparation time") from None
    except (OSError, http.client.HTTPException) as exc:
        raise PrepareError(f"D at {cfg['decode_url']} cannot be reached ({type(exc).__name__})") from None
    items = [{"prompt": p, "expected": e, "expected_ids": d, "prompt_tokens": n}
             for (p, n), (e, d) in zip(prompts, expected)]
    path = Path(cfg["prompts_path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(items))
    os.replace(tmp, path)
    toks = [n for _, n in prompts]
    return items, {"prompts": len(items), "tokens_min": min(toks), "tokens_median": statistics.median(toks),
                   "tokens_max": max(toks), "prompts_s": round(t1 - t0, 2), "reference_hits": hits,
                   "reference_computed": computed, "reference_disagreed": disagreed, "references_s": round(time.monotonic() - t1, 2)}


# --------------------------------------------------------------------------- the workload

class Workload:
    def __init__(self, cfg: dict, journal: JournalWriter, items: list[dict]):
        self.cfg = cfg
        self.journal = journal
        self.items = items
        self.url = cfg["proxy_url"].rstrip("/") + "/v1/completions"
        self.timeout = float(cfg["request_timeout_s"])
        self._ids = iter(range(1, 1 << 62))
        self._next_prompt = 0
        lead = [i for i in cfg.get("lead_prompts") or () if 0 <= i < len(items)]
        # the prompts sent first (lead_prompts), then the rest in order: a permutation of the indices
        self._order = lead + [i for i in range(len(items)) if i not in set(lead)]
        self._lock = threading.Lock()
        self.tally = Tally("complete")
        self.reused = 0
        self.orphaned = threading.Event()
        self.pauses: list[tuple[float, float]] = []  # set at the start signal (monotonic seconds)
        watch_parent(self.orphaned)

    def _take(self) -> tuple[int, int]:
        """(op id, prompt index); prompts are reused (and counted) only if the run outlasts them."""
        with self._lock:
            op_id = next(self._ids)
            idx = self._order[self._next_prompt % len(self.items)]
            if self._next_prompt >= len(self.items):
                self.reused += 1
            self._next_prompt += 1
            return op_id, idx

    def call(self, worker: int) -> None:
        op_id, idx = self._take()
        item = self.items[idx]
        body = {"model": self.cfg["model"], "prompt": item["prompt"], "max_tokens": int(self.cfg["output_tokens"]),
                "temperature": 0, "return_token_ids": True}
        t_inv = time.monotonic()
        inv = {"type": "op", "id": op_id, "process": worker, "f": "complete", "phase": "invoke",
               "t": t_inv, "prompt_index": idx, "expected": item["expected"]}
        if item.get("expected_ids"):
            inv["expected_ids"] = item["expected_ids"]
        self.journal.write(inv)
        done: dict[str, Any] = {"type": "op", "id": op_id, "process": worker, "f": "complete", "value": None,
                                "status": None, "completion_tokens": None}
        start = time.monotonic()
        try:
            status, data = post_json(self.url, body, self.timeout)
        except Deadline:
            done.update(phase="info", outcome="stalled", code="timeout")
        except ConnectionRefusedError as exc:
            done.update(phase="fail", outcome="connect", code=type(exc).__name__)
        except (OSError, http.client.HTTPException) as exc:
            done.update(phase="info", outcome="connect", code=type(exc).__name__)
        else:
            text = completion_text(data) if status == 200 else None
            done["status"] = status
            if text is not None:
                usage = data.get("usage") if isinstance(data, dict) else None
                done.update(phase="ok", outcome="ok", code="", value=text,
                            completion_tokens=(usage or {}).get("completion_tokens"))
                digest = tokens_digest(data)
                if digest is not None:
                    done["value_ids"] = digest
            else:
                done.update(phase="fail", outcome=f"http_{status}",
                            code=error_code(data) if status != 200 else ("no_text" if data is not None else "not_json"))
                err = data.get("error") if isinstance(data, dict) else None
                if isinstance(err, dict) and isinstance(err.get("phase"), str):
                    done["error_phase"] = err["phase"][:40]  # the P/D proxy names where it failed
                d_ms = err.get("decode_ms") if isinstance(err, dict) else None
                if isinstance(d_ms, (int, float)) and not isinstance(d_ms, bool) and 0 <= d_ms < 1e8:
                    done["decode_ms"] = float(d_ms)  # how long D had it (the P/D proxy says)
        t = time.monotonic()
        done.update(t=t, elapsed_ms=round((t - start) * 1000.0, 3))
        self.journal.write(done)
        self.tally.count(done)

    def reset(self, at: float, url: str) -> None:
        """One ``reset`` op at monotonic time ``at``: the server's prefix cache and its external KV
        pool (``POST /reset_prefix_cache?reset_external=true``, vLLM's dev API, as an RL loop calls
        it after a weight update). ``ok`` only on 200 with ``{"success": true}``; 200 with false is
        ``reset_refused``; no answer within request_timeout is ``stalled``."""
        while not self.orphaned.is_set() and time.monotonic() < at:
            self.orphaned.wait(min(0.05, max(0.0, at - time.monotonic())))
        if self.orphaned.is_set():
            return
        op_id = self._take()[0]
        node = "decode" if url.rstrip("/") == self.cfg["decode_url"].rstrip("/") else "server"
        self.journal.write({"type": "op", "id": op_id, "process": -1, "f": "reset", "phase": "invoke",
                            "t": time.monotonic(), "node": node})
        done: dict[str, Any] = {"type": "op", "id": op_id, "process": -1, "f": "reset", "value": None,
                                "status": None, "node": node}
        start = time.monotonic()
        try:
            status, data = post_json(url.rstrip("/") + "/reset_prefix_cache?reset_external=true", {}, self.timeout)
        except Deadline:
            done.update(phase="info", outcome="stalled", code="timeout")
        except (OSError, http.client.HTTPException) as exc:
            done.update(phase="fail", outcome="connect", code=type(exc).__name__)
        else:
            done["status"] = status
            success = data.get("success") if isinstance(data, dict) else None
            if status == 200 and success is True:
                done.update(phase="ok", outcome="ok", code="", value=True)
            elif status == 200 and success is False:
                done.update(phase="fail", outcome="reset_refused", code="success_false", value=False)
            else:
                done.update(phase="fail", outcome=f"http_{status}", code="not_json" if data is None else "bad_answer")
        t = time.monotonic()
        done.update(t=t, elapsed_ms=round((t - start) * 1000.0, 3))
        self.journal.write(done)

    def worker(self, idx: int, t_start: float, t_end: Horizon, interval: float) -> None:
        for _ in paced(t_start, t_end, interval, self.orphaned, self.pauses):
            self.call(idx)

    def run(self, go_timeout: float) -> int:
        cfg = self.cfg
        self.journal.write({"type": "probe", "node": "client", "kind": "pd-workload", "when": "baseline",
                            "t": time.monotonic(), **process_stats(), "counters": {}, "alive": True})
        print("READY", flush=True)
        # The runner sends SIGUSR1 to start (blocked in run_node() before any thread existed).
        if signal.sigtimedwait({signal.SIGUSR1}, go_timeout) is None:
            log.info("pd-workload: no start signal within %.0f s; leaving", go_timeout)
            self.journal.close()
            return 0
        n = int(cfg["concurrency"])
        t_start = time.monotonic()
        self.pauses = [(t_start + float(a), t_start + float(a) + float(f)) for a, f in cfg.get("pauses") or ()]
        t_end = Horizon(t_start + float(cfg["duration_s"]), cfg.get("horizon_path"))
        interval = n / float(cfg["rate"])
        resetters = [threading.Thread(target=self.reset, args=(t_start + float(at), url), name="pd-reset",
                                      daemon=True) for at, url in cfg.get("resets") or ()]
        for th in resetters:
            th.start()
        stuck, crashed = run_workers(self.journal, "pd-workload", n,
                                     lambda i, first_at: self.worker(i, first_at, t_end, interval),
                                     t_start=t_start, t_end=t_end, interval=interval,
                                     grace=float(cfg.get("grace_s", self.timeout + 5.0)))
        for th in resetters:  # each is bounded by request_timeout: a reset still out then is journalled open
            th.join(max(0.0, t_end.end() + self.timeout + 1.0 - time.monotonic()))
        with self._lock:
            counters = {**self.tally.counters(), "prompts_reused": self.reused}
        log.info("pd-workload: %d requests in %.1f s: %s; %d prompts reused; %d workers stuck",
                 counters["ops"], time.monotonic() - t_start,
                 ", ".join(f"{k[4:]} {v}" for k, v in sorted(counters.items()) if k.startswith("ops_")) or "none",
                 self.reused, len(stuck))
        return finish(self.journal, stuck, crashed, kind="pd-workload", counters=counters)


def check_config(cfg: Any) -> str | None:
    if not isinstance(cfg, dict):
        return "expected a JSON object"
    missing = [k for k in REQUIRED if k not in cfg]
    if missing:
        return f"missing keys: {', '.join(missing)}"
    try:
        checks = [(float(cfg["duration_s"]) > 0, "duration_s must be > 0"),
                  (int(cfg["concurrency"]) >= 1, "concurrency must be >= 1"),
                  (float(cfg["rate"]) > 0, "rate must be > 0"),
                  (8 <= int(cfg["prompt_tokens"]) <= 500, "prompt_tokens must be 8..500"),
                  (1 <= int(cfg["output_tokens"]) <= 256, "output_tokens must be 1..256"),
                  (float(cfg["request_timeout_s"]) > 0, "request_timeout_s must be > 0")]
    except (TypeError, ValueError) as exc:
        return f"bad value: {exc}"
    for ok, why in checks:
        if not ok:
            return why
    pauses = cfg.get("pauses", [])
    if not isinstance(pauses, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                        for x in p) and p[0] >= 0 and p[1] > 0 for p in pauses):
        return "pauses: expected a list of [at_s >= 0, for_s > 0]"
    lead = cfg.get("lead_prompts", [])
    if not isinstance(lead, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in lead):
        return "lead_prompts: expected a list of prompt indices >= 0"
    resets = cfg.get("resets", [])
    if not isinstance(resets, list) or not all(
            isinstance(r, list) and len(r) == 2 and isinstance(r[0], (int, float)) and not isinstance(r[0], bool)
            and r[0] >= 0 and isinstance(r[1], str) for r in resets):
        return "resets: expected a list of [at_s >= 0, server_url]"
    for _, url in resets:
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname or not u.port:
            return "resets: a server_url is not http://HOST:PORT"
    for k in ("proxy_url", "decode_url"):
        u = urlsplit(str(cfg[k]))
        if u.scheme != "http" or not u.hostname or not u.port:
            return f"{k}: expected http://HOST:PORT"
    return None


def add_node_arguments(p: argparse.ArgumentParser, kind: str) -> None:  # noqa: ARG001
    add_workload_arguments(p)


def run_node(args: argparse.Namespace) -> int:
    cfg = start_node(args, check_config)
    try:
        items, counts = prepare(cfg)
    except PrepareError as exc:
        print(f"error: pd-workload: {exc}", file=sys.stderr, flush=True)
        return 2
    log.info("pd-workload: %s", ", ".join(f"{k} {v}" for k, v in counts.items()))
    journal = JournalWriter(args.journal)
    return Workload(cfg, journal, items).run(float(cfg.get("go_timeout_s", 60.0)))
