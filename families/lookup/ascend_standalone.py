"""The ``standalone/`` folder of the AscendStore lookup reports (``lookup-*--upstream``): the defect
with vllm-ascend alone, on vllm-ascend's own unit-test stubs (stacks/ascend_cpu/standalone.py writes
the folder; this module holds the cases and ``standalone_files/``).

Each reproduction runs vllm-ascend 0.23.0.post1's real ``LookupKeyServer`` (worker rank 0) and
``LookupKeyClient`` (the scheduler) over their real ipc socket, with a stand-in for the pool worker
behind the server (vllm-ascend's ``KVPoolWorker`` needs an NPU and a Mooncake store; the server calls
one method of it). ``python -m families.lookup.ascend_standalone docs/reports`` writes the folders of
the existing reports; tests/families/lookup/test_ascend_standalone.py checks them and runs each for
real on upstream (defect seen) and on the patched vllm-ascend (not seen).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

from stacks.ascend_cpu.standalone import Case, env_text, write_folder

FILES = Path(__file__).with_name("standalone_files")
OBSERVED = FILES / "observed.json"  # scenario -> {"upstream"|"patched": RESULT line, "log_lines": [...]}, from
# real runs of the folders (tests/families/lookup/test_ascend_standalone.py, recorded by hand)
COMMON = ("lookup_parts.py",)
FIX = ("The fix is in connector_patch/upstream/vllm-ascend/0.23.0.post1/ of the project that found this "
       "(diffs {diffs}); the patched run above is vllm-ascend 0.23.0.post1 with them applied. The new keys "
       "it reads from `kv_connector_extra_config`, set in `lookup_parts.py` and ignored by the release: "
       "`lookup_rpc_timeout_ms` (300 here) and `lookup_backend_timeout_ms` (150 here).")

CASES: dict[str, Case] = {
    "lookup-server-freeze": Case(
        title="[Bug]: AscendStore: the scheduler's KV pool lookup waits without limit for a stalled worker rank 0",
        bug="With `AscendStoreConnector`, the scheduler asks worker rank 0 how many of a prompt's tokens the KV "
            "pool holds (`LookupKeyClient.lookup`, on the engine's scheduling step). The client sends the "
            "request on a ZMQ REQ socket and then blocks in `recv()` with no timeout. When worker rank 0 stops "
            "answering for a while (a stalled process: here SIGSTOP for 3 s; in production swap, a debugger, a "
            "long pause of the store), the scheduler waits with it.",
        expected="The lookup returns within a bounded time (a miss when it has no answer by then: the request "
                 "is computed locally), and the next lookups work once the worker answers again.",
        actual="The lookup takes as long as the worker is stopped (3.00 s of 3 s here), and the whole engine's "
               "scheduling waits with it; a worker that never answers again blocks the scheduler for ever.",
        fix=FIX.format(diffs="10, 11: a deadline per lookup, fail-open, a fresh socket after a failure"),
        log_patterns=(r"lookup rpc",),  # the release logs nothing while it waits; the fix logs its miss
        files=COMMON + ("lookup_server.py",)),
    "lookup-backend-hang": Case(
        title="[Bug]: AscendStore: a hung pool store blocks the scheduler's KV pool lookup for as long as it hangs",
        bug="Worker rank 0's `LookupKeyServer` answers the scheduler's lookups on one thread and calls the store "
            "(`KVPoolWorker.lookup_scheduler`) inline, with no bound; the scheduler's `LookupKeyClient` waits "
            "in `recv()` with no timeout. A store that hangs (a Mooncake master or metadata server that does "
            "not answer: here 3 s a call) hangs the scheduler's lookup, on the engine's scheduling step.",
        expected="The server gives up the store call after a bound and answers (or the client gives up at its "
                 "deadline): the lookup is a miss and the request is computed locally.",
        actual="The lookup returns only when the store does: 3.00 s here for a 3 s hang, during which the engine "
               "schedules nothing.",
        fix=FIX.format(diffs="10, 11, 12: the v1 reply, the client's deadline, the server's bound on the store "
                             "call (BACKEND_TIMEOUT)"),
        log_patterns=(r"lookup rpc",),
        files=COMMON),
    "lookup-malformed-requests": Case(
        title="[Bug]: AscendStore: one malformed lookup request kills the lookup server thread; every later "
              "lookup of the scheduler hangs",
        bug="Worker rank 0's `LookupKeyServer` decodes each request's frames (`int.from_bytes`, msgpack) on its "
            "one serving thread with no check and no exception handler. A request with a missing frame or "
            "bytes that are not msgpack (a client of another version, a stray or buggy client on the same "
            "host; `bad_requests.py` sends three in the client's own wire format) raises there: the thread "
            "ends, the REP socket stays bound, and nothing answers again.",
        expected="Each malformed request is answered with an error (or dropped) and the server keeps serving: "
                 "the next well-formed lookup is answered.",
        actual="None of the 3 malformed requests is answered, the serving thread dies on the first (an "
               "`IndexError` traceback), and the next well-formed lookup has no answer: the scheduler waits in "
               "`recv()` for ever (no answer within 10 s here).",
        fix=FIX.format(diffs="10, 11, 12: requests validated and answered with an error code, one reply per "
                             "request, the serving thread kept alive"),
        log_patterns=(r"Exception in thread", r"^[A-Za-z]*Error: ", r"lookup rpc"),
        files=COMMON + ("bad_requests.py",)),
}


def observed() -> dict:
    try:
        return json.loads(OBSERVED.read_text())
    except (OSError, ValueError):
        return {}


def steps_of(name: str) -> str:
    """The last paragraph of the case's repro.py docstring: what it starts and does."""
    doc = ast.get_docstring(ast.parse((FILES / "scenarios" / f"{name}.py").read_text())) or ""
    return " ".join(doc.split("\n\n")[-1].split())


def write_standalone(report_dir: Path, scenario: str, env: str) -> Path | None:
    """``report_dir/standalone/`` for a lookup case (None for any other scenario)."""
    case = CASES.get(scenario)
    if case is None:
        return None
    return write_folder(Path(report_dir) / "standalone", case, FILES, FILES / "scenarios" / f"{scenario}.py",
                        steps_of(scenario), env, observed().get(scenario, {}))


def node_python() -> tuple[Path, Path]:
    """The conformance env's python and the test tools (pytest) ``pdchaos upstream check`` installs beside it."""
    from harness.family import get_family

    # the release's project, named by the layerwise family (the one that sets up vllm-ascend's stack)
    p = [x for x in get_family("layerwise").upstream_projects() if x.project == "vllm-ascend"][-1]
    return p.python(), p.test_tools()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m families.lookup.ascend_standalone",
                                 description="write the standalone/ folder of every lookup report under REPORTS")
    ap.add_argument("reports", type=Path, help="the reports folder (docs/reports)")
    a = ap.parse_args(argv)
    dirs = sorted(d for d in a.reports.glob("*--upstream") if d.is_dir() and d.name.split("--")[0] in CASES)
    if not dirs:
        print(f"error: no lookup report folder (<scenario>--upstream) under {a.reports}", file=sys.stderr)
        return 2
    env = env_text(*node_python())
    for d in dirs:
        write_standalone(d, d.name.split("--")[0], env)
        print(f"{d.name}: standalone reproduction")
    return 0


if __name__ == "__main__":
    sys.exit(main())
