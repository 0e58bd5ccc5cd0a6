"""The ``standalone/`` folder of the layerwise reports (``layerwise-*--upstream``): the defect with
vllm-ascend alone, on vllm-ascend's own unit-test stubs (stacks/ascend_cpu/standalone.py writes the
folder; this module holds the cases and ``standalone_files/``).

Written so far: layerwise-listener-garbage (vllm-ascend's own decode-node listener and a sender that
speaks its wire format). The other layerwise reports keep the README that says what theirs needs.
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
