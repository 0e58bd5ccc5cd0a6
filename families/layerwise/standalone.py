"""The ``standalone/`` folder of the layerwise reports (``layerwise-*--upstream``): the defect with
vllm-ascend alone, on vllm-ascend's own unit-test stubs (stacks/ascend_cpu/standalone.py writes the
folder; this module holds the cases and ``standalone_files/``).

Written: layerwise-listener-garbage (vllm-ascend's own decode-node listener and a sender that speaks
its wire format) and the five whose defect needs both nodes (completion-lost, meta-query-fail,
metaserver-fail, slow-write, transfer-error): ``layerwise_pair.py`` builds D (vLLM's v1 Scheduler with
the connector) and P (the connector's worker side) in one process, with a stand-in transfer engine,
metaserver and TCP relay around them.
``python -m families.layerwise.standalone docs/reports`` writes the folders;
tests/families/lookup/test_ascend_standalone.py checks them and runs each for real.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

from stacks.ascend_cpu.standalone import Case, env_text, write_folder

FILES = Path(__file__).with_name("standalone_files")
OBSERVED = FILES / "observed.json"  # scenario -> {"upstream"|"patched": RESULT line, "log_lines": [...]}

PAIR_FILES = ("layerwise_pair.py",)


def fix_of(diffs: str) -> str:
    return (f"The fix is {diffs} of connector_patch/upstream/vllm-ascend/0.23.0.post1/ in the project that found "
            "this; the patched run above is vllm-ascend 0.23.0.post1 with that series applied.")
  # D and P in one process, with the stand-ins around the connector
# what each run showed, in words (the RESULT lines themselves are in observed.json)
ACTUAL = {
    "layerwise-completion-lost": "P wrote both layers and sent DONE into the broken link; its sender gave up after "
                                 "its retries and nothing told D. The request is still waiting for its KV when "
                                 "the script stops watching, 8 s after its admission, its blocks held (What we "
                                 "saw, below).",
    "layerwise-meta-query-fail": "P's forward pass spent its time in the metadata queries (one per layer, each "
                                 "about 3.3 s: 6.4 s for the two layers), no layer was written, and D was never "
                                 "told: the request is still waiting when the script stops watching, 10 s after "
                                 "its admission (What we saw, below).",
    "layerwise-metaserver-fail": "The held POST waited the whole 5 s and was then sent again; the request answered "
                                 "500 counted as posted. Neither request reached P, and both are still waiting "
                                 "when the script stops watching, 10 s after their admission (What we saw, below).",
    "layerwise-slow-write": "D waited for the late layers: the request ended only once P's slow writes were done, "
                            "well past the 2 s it was given (What we saw, below).",
    "layerwise-transfer-error": "The request whose write raised is still waiting when the script stops watching "
                                "(D never told); the one whose write returned -1 ended with an error, but its "
                                "blocks never came back to D's pool (What we saw, below).",
}

CASES: dict[str, Case] = {
    "layerwise-listener-garbage": Case(
        title="[Bug]: MooncakeLayerwiseConnector: the decode node's listener never answers a malformed or "
              "unexpected message; its sender waits out every try",
        bug="The decode node's side-channel listener (`KVCacheRecvingLayerThread.run`, started by "
            "`register_kv_caches`) serves the prefill node's GET_META, DONE and FAILED messages on a ZMQ "
            "ROUTER socket. A message it cannot use (bytes that are not msgpack, a payload that is not an "
            "array, an unknown message name, a DONE without its fields; `garbage_sender.py` sends one of "
            "each in the connector's own wire format) is logged at ERROR, raw frames included, and nothing is "
            "sent back.",
        expected="Every message gets an answer: the metadata, an ACK, or an error code for a message the "
                 "listener cannot use, so the sender knows at once.",
        actual="None of the 4 bad messages is answered: each sender waits its whole receive timeout (1 s here; "
               "vllm-ascend's own sender tries 3 times of 1 s, about 3.3 s a message). The listener survives "
               "them (a well-formed GET_META afterwards is answered).",
        fix="The fix is diff 30 of connector_patch/upstream/vllm-ascend/0.23.0.post1/ in the project that found "
            "this (the listener answers NACK_MALFORMED, NACK_UNKNOWN_MSG or NACK_BAD_FIELDS); the patched run "
            "above is vllm-ascend 0.23.0.post1 with that series applied.",
        log_patterns=(r"Invalid message format|Invalid payload count|Unexpected message type|Failed to decode",),
        files=("garbage_sender.py",)),
    "layerwise-completion-lost": Case(
        title="[Bug]: MooncakeLayerwiseConnector: the decode node waits forever for a DONE that was lost",
        bug="On the decode node (D), a request whose KV the prefill node (P) pushes waits in "
            "WAITING_FOR_REMOTE_KVS until D's listener gets P's DONE or FAILED for it. There is no deadline: when "
            "that message never arrives (the link from P to D's listener drops it longer than P's sender keeps "
            "trying, about 3.3 s; P died; the proxy never forwarded the request) the request waits for good and "
            "holds its blocks. `repro.py` drives D (vLLM's v1 Scheduler with the layerwise connector) and P (the "
            "connector's worker side and sending thread) in one process, with a stand-in metaserver and a TCP "
            "relay between P and D's listener; `layerwise_pair.py` holds those parts.",
        expected="D fails a request whose DONE/FAILED has not come within a bound (the fix: "
                 "`layerwise_recv_timeout_s`), reports its blocks as failed loads and gives them back once P can no "
                 "longer write them.",
        actual=ACTUAL["layerwise-completion-lost"],
        fix=fix_of("diffs 32 (DONE/FAILED sent off the sending thread, bounded) and 34 (D's deadline)"),
        log_patterns=(r"Failed to send done sending signal|Sending signal fail",),
        files=PAIR_FILES),
    "layerwise-meta-query-fail": Case(
        title="[Bug]: MooncakeLayerwiseConnector: a failed metadata query on the prefill node is asked again on "
              "every layer and never reported to the decode node",
        bug="Before P pushes a request's layer it asks D's listener for D's metadata (`update_decoder_info`: "
            "GET_META, 3 tries of 1 s plus sleeps, about 3.3 s, on the forward pass). When the answers are lost, "
            "the error is re-raised, `save_kv_layer` skips the request for that layer only and asks again on the "
            "next layer; D is never told. `repro.py` drives D and P in one process (`layerwise_pair.py`) with a "
            "TCP relay between P and D's listener that drops D's bytes for the first 5 s.",
        expected="P asks once, within a bound, skips the request's other layers and tells D FAILED; D fails the "
                 "request.",
        actual=ACTUAL["layerwise-meta-query-fail"],
        fix=fix_of("diff 33 (one bounded query per request, `layerwise_meta_timeout_s`; FAILED to D) with 32 and 34"),
        log_patterns=(r"Query to port and kv base addr for request fail|MooncakeLayerwiseConnector transfer fail",),
        files=PAIR_FILES),
    "layerwise-metaserver-fail": Case(
        title="[Bug]: MooncakeLayerwiseConnector: the scheduler's POST to the metaserver has no timeout, ignores "
              "the status and is retried after the request may have been sent",
        bug="D's scheduler side POSTs each remote-prefill request's transfer params to the proxy's metaserver "
            "(`_access_metaserver`, on a thread pool) with an httpx client built with `timeout=None`, ignores the "
            "answer's status and posts again after any exception, up to 3 times. A metaserver that holds the "
            "connection holds the POST; a 500 counts as success; in either case the request is never forwarded "
            "to P and D waits for it for good. `repro.py` drives D (vLLM's v1 Scheduler with the layerwise "
            "connector) and a stand-in metaserver (`layerwise_pair.py`) that holds the first POST 5 s and "
            "answers every later one 500.",
        expected="The POST is bounded, tried again only when it never connected (it is not idempotent), and a "
                 "non-2xx answer fails the request at once.",
        actual=ACTUAL["layerwise-metaserver-fail"],
        fix=fix_of("diff 36 (`metaserver_timeout_s`, the status checked, a second try only after a connect "
                   "error) with 34 (D's deadline)"),
        log_patterns=(r"Failed to connect to metaserver|Access metaserver fail",),
        files=PAIR_FILES),
    "layerwise-slow-write": Case(
        title="[Bug]: MooncakeLayerwiseConnector: the decode node has no deadline and waits out a slow transfer",
        bug="When P's transfer engine is slow (each write succeeds, late), D waits for the late layers however "
            "long they take: it has no deadline for a request waiting in WAITING_FOR_REMOTE_KVS. `repro.py` "
            "drives D and P in one process (`layerwise_pair.py`) with a stand-in transfer engine, in the place "
            "of Mooncake's NPU engine a CPU host has not, whose writes take 2.5 s longer.",
        expected="D fails the request at its deadline, but gives its blocks back only once P can no longer write "
                 "into them; P starts no write past the time D can wait.",
        actual=ACTUAL["layerwise-slow-write"],
        fix=fix_of("diffs 34 (D's deadline) and 35 (D's write-by time: P writes nothing past it, D holds the "
                   "blocks until P's last word or that time plus a grace)"),
        log_patterns=(r"Sending signal fail|Got FAILED_SENDING_MSG",),
        files=PAIR_FILES),
    "layerwise-transfer-error": Case(
        title="[Bug]: MooncakeLayerwiseConnector: a transfer engine that raises leaves the request waiting "
              "forever; one that returns -1 leaks its blocks on the decode node",
        bug="P's sending thread (`KVCacheSendingLayerThread._transfer_kv_cache`) writes each layer with the "
            "transfer engine's `batch_transfer_sync_write`. When the write raises, `_handle_request` logs it and "
            "goes on, and D is never told: the request waits for good. When it returns -1, D is told FAILED and "
            "its scheduler finishes the request with an error, but D's connector never reports the load finished "
            "(`get_finished` returns done requests only), so the request's blocks are never freed. `repro.py` "
            "drives D and P in one process (`layerwise_pair.py`) with a stand-in transfer engine, in the place of "
            "Mooncake's NPU engine a CPU host has not, told to raise, then to return -1, then to succeed, one "
            "request each.",
        expected="Either failure tells D FAILED for the requests of that write; D fails them and gives their "
                 "blocks back.",
        actual=ACTUAL["layerwise-transfer-error"],
        fix=fix_of("diffs 31 (a transfer error fails the requests of its own write, D told FAILED) and 34 "
                   "(a failed request leaves through finished_recving)"),
        log_patterns=(r"Failed to transfer KV cache|Mooncake transfer failed|Got FAILED_SENDING_MSG",),
        files=PAIR_FILES),
}


def observed() -> dict:
    try:
        return json.loads(OBSERVED.read_text())
    except (OSError, ValueError):
        return {}


def steps_of(name: str) -> str:
    doc = ast.get_docstring(ast.parse((FILES / "scenarios" / f"{name}.py").read_text())) or ""
    return " ".join(doc.split("\n\n")[-1].split())


def write_standalone(report_dir: Path, scenario: str, env: str) -> Path | None:
    """``report_dir/standalone/`` for a layerwise case written here (None for any other scenario)."""
    case = CASES.get(scenario)
    if case is None:
        return None
    return write_folder(Path(report_dir) / "standalone", case, FILES, FILES / "scenarios" / f"{scenario}.py",
                        steps_of(scenario), env, observed().get(scenario, {}))


def node_python() -> tuple[Path, Path]:
    from .upstream import vllm_ascend_project

    p = vllm_ascend_project()
    return p.python(), p.test_tools()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m families.layerwise.standalone",
                                 description="write the standalone/ folder of every layerwise report it has a case for")
    ap.add_argument("reports", type=Path, help="the reports folder (docs/reports)")
    a = ap.parse_args(argv)
    dirs = sorted(d for d in a.reports.glob("*--upstream") if d.is_dir() and d.name.split("--")[0] in CASES)
    if not dirs:
        print(f"error: no layerwise report folder with a case (<scenario>--upstream) under {a.reports}", file=sys.stderr)
        return 2
    env = env_text(*node_python())
    for d in dirs:
        write_standalone(d, d.name.split("--")[0], env)
        print(f"{d.name}: standalone reproduction")
    return 0


if __name__ == "__main__":
    sys.exit(main())
