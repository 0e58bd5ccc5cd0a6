"""The ``standalone/`` folder of a P/D report: the defect reproduced with vLLM alone, no pd-chaos.

``pdchaos repro`` writes it beside the harness view of each report (``write_standalone``), and
``python -m families.pd.standalone docs/reports`` writes it into every existing report folder
without a new harness run. The folder holds, for a maintainer who has only vLLM installed:

* ``README.md`` in the shape of vLLM's bug-report template (Your current environment = ``vllm
  collect-env`` of the node env the reports were made with; Describe the bug; steps; expected vs
  actual in plain words; the vLLM log lines that show it, from a real run of this folder);
* ``run.sh [PYTHON]``: makes the tiny model (``make_model.py``), starts the vLLM servers with the
  exact ``vllm serve`` arguments and ``--kv-transfer-config``, runs ``repro.py`` (the exact
  requests, the fault, and one line ``RESULT: defect seen|not seen: <what, with the number>``),
  prints the matching vLLM log lines and stops every server. Exit 1: defect seen; 0: not seen;
  2: set-up failed. Every step has a time limit; paths are relative to the folder;
* ``pd_client.py`` (what vLLM's example P/D proxy does for one request), ``fake_prefill.py`` where a
  fake peer is needed (the Mooncake side channel's wire format, standard library and pyzmq), and
  ``cpu_shim/`` (a CPU-only host's one-line work-around, not part of any defect: README says why).

Nothing in the folder imports pd-chaos; tests/families/pd/test_standalone_reports.py checks that
and runs each folder for real against upstream (defect seen) and the patched vLLM (not seen).
Reports of other families (layerwise, lookup) get a README that says what their standalone
reproduction needs and that it is not written yet; the store reports get theirs from
families/lookup/store_standalone.py.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
import json
from dataclasses import dataclass
from pathlib import Path

FILES = Path(__file__).with_name("standalone_files")
OBSERVED = FILES / "observed.json"  # scenario -> {"upstream"|"patched": RESULT line, "log_lines": [...]}, from
# real runs of the folders (tests/families/pd/test_standalone_reports.py, recorded by hand)
COMMON = ("lib.sh", "make_model.py", "pd_client.py", "cpu_shim/sitecustomize.py")
COLLECT_ENV_TIMEOUT_S = 300.0
MOONCAKE_PY = ("import importlib.metadata as m; print(', '.join(f\"{d.metadata['Name']}=={d.version}\" "
               "for d in m.distributions() if (d.metadata['Name'] or '').lower().startswith('mooncake')))")


@dataclass(frozen=True)
class Case:
    title: str
    nodes: str  # "D": D alone; "D+fake": D and fake_prefill.py; "P+D": both servers
    repro_args: str  # repro.py's arguments in run.sh's words
    bug: str
    expected: str
    actual: str
    log_patterns: tuple[str, ...]


CASES: dict[str, Case] = {
    "pd-bad-transfer-params": Case(
        title="[Bug]: MooncakeConnector: a decode request with unusable kv_transfer_params waits forever",
        nodes="D",
        repro_args='--decode "http://127.0.0.1:$D"',
        bug="A request reaches the decode instance (kv_consumer) with `kv_transfer_params` that ask for remote "
            "prefill (`do_remote_prefill: true`) but lack `transfer_id` and `remote_bootstrap_addr` (a router "
            "bug, or a client that sends its own params). The connector logs a warning and never schedules a "
            "receive, but the scheduler still keeps the request in WAITING_FOR_REMOTE_KVS with its KV blocks.",
        expected="The request does not hang: it is computed locally (the params are unusable, so there is "
                 "nothing to load) or it fails at once with an error.",
        actual="No answer, ever: the request stays waiting with its KV blocks held, and the engine core "
               "busy-loops meanwhile (about 1.5 cores of a 2-core host in our runs). A client's timeout is the "
               "only thing that ends it, and the blocks stay held after that.",
        log_patterns=(r"Got invalid KVTransferParams", r"Missing transfer_id"),
    ),
    "pd-fake-prefill-silent": Case(
        title="[Bug]: MooncakeConnector: decode waits abort_timeout + 60 s for a prefill node that stopped "
              "answering",
        nodes="D+fake",
        repro_args='--decode "http://127.0.0.1:$D" --bootstrap "http://127.0.0.1:$FB"',
        bug="The prefill instance takes the decode instance's KV pull on its side channel and never answers it "
            "(a hung prefill process). `fake_prefill.py` plays such a prefill node: a bootstrap server that "
            "names its side channel and a ZMQ ROUTER that reads the pull and stays silent.",
        expected="The decode instance gives up the load within a bounded time it can be configured with and "
                 "fails (or recomputes) the request, so the client gets an answer.",
        actual="The decode instance waits for the reply until its DEALER socket's receive timeout, "
               "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT + 60 s (540 s with the default 480 s; 70 s here), with "
               "the request and its KV blocks held and the engine core busy-looping; the client gives up "
               "first (20 s here).",
        log_patterns=(r"fake prefill: pull", r"transfer failed|Resource temporarily unavailable"),
    ),
    "pd-kill-prefill-before-pull": Case(
        title="[Bug]: MooncakeConnector: decode waits abort_timeout + 60 s for a prefill node that was killed",
        nodes="P+D",
        repro_args='--prefill "http://127.0.0.1:$P" --decode "http://127.0.0.1:$D" --bootstrap '
                   '"http://127.0.0.1:$PB" --prefill-pgid "${PIDS[0]}"',
        bug="The prefill instance answers its one-token request and is then killed (SIGKILL: OOM killer, node "
            "loss) before the decode instance pulls the prompt's KV. The decode instance, which already "
            "knows that prefill engine from an earlier request, then pulls from the dead process.",
        expected="The pull fails soon (the peer's port refuses connections) and the request fails or is "
                 "recomputed.",
        actual="The decode instance waits VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT + 60 s (540 s by default; 70 s "
               "here) for the dead peer, holding the request and its blocks and busy-looping; the client "
               "gives up first (20 s here).",
        log_patterns=(r"transfer failed|Resource temporarily unavailable", r"KV load failure"),
    ),
    "pd-prefill-side-channel-garbage": Case(
        title="[Bug]: MooncakeConnector: one malformed message kills the prefill side-channel thread for good",
        nodes="P+D",
        repro_args='--prefill "http://127.0.0.1:$P" --decode "http://127.0.0.1:$D" --bootstrap '
                   '"http://127.0.0.1:$PB"',
        bug="One message of 3 frames reaches the prefill instance's Mooncake side channel (its ROUTER expects "
            "[identity, payload]; a stray client, a port scanner or a peer of another version can send "
            "anything). The sender thread unpacks exactly two frames, raises, logs the error and exits.",
        expected="The malformed message is answered with an error (or dropped) and the side channel keeps "
                 "serving pulls.",
        actual="The side-channel thread is gone while the prefill instance still reports healthy: every "
               "later request's pull is never answered, so every request through P and D hangs until the "
               "decode instance's receive timeout (abort timeout + 60 s).",
        log_patterns=(r"Error in Mooncake sender thread", r"Exiting thread"),
    ),
    "pd-eos-answer": Case(
        title="[Bug]: MooncakeConnector: a prompt whose first token is EOS fails on the decode instance",
        nodes="P+D",
        repro_args='--prefill "http://127.0.0.1:$P" --decode "http://127.0.0.1:$D" --bootstrap '
                   '"http://127.0.0.1:$PB" --abort-timeout-s "$ABORT_TIMEOUT_S"',
        bug="A prompt whose greedy first token is EOS makes the prefill instance's one-token request end as "
            "stopped (not length-capped). The producer keeps the prompt's KV for the decode instance only in "
            "the length-capped case, so it frees the blocks at once, while the router still sends the "
            "request to the decode instance (nothing in P's answer tells it not to). `repro.py` holds a "
            "prompt that does this on the tiny model `make_model.py` makes; any model and a prompt whose "
            "greedy answer is EOS at once do the same.",
        expected="The answer: empty text, finish_reason stop, as the same model gives without disaggregation.",
        actual="The decode instance's pull waits for 'P side ready' until the prefill instance's abort "
               "timeout (VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, 480 s by default; 10 s here) and the request "
               "fails.",
        log_patterns=(r"P side ready", r"KV load failure|failed with an internal error"),
    ),
    "pd-stop-decode-past-abort-timeout": Case(
        title="[Bug]: MooncakeConnector: after a decode stall longer than the abort timeout, decode waits "
              "another abort timeout for KV the prefill node already freed",
        nodes="P+D",
        repro_args='--prefill "http://127.0.0.1:$P" --decode "http://127.0.0.1:$D" --bootstrap '
                   '"http://127.0.0.1:$PB" --decode-pgid "${PIDS[1]}" --abort-timeout-s "$ABORT_TIMEOUT_S"',
        bug="The decode instance stalls (here SIGSTOP for 16 s; in production a long GC pause, swap, a "
            "debugger) for longer than the prefill instance's abort timeout while a request is in flight. "
            "The prefill instance frees the prompt's blocks when its abort timeout ends (busy-looping until "
            "then). When the decode instance resumes and pulls, the prefill side neither serves nor refuses "
            "the pull.",
        expected="The pull of a request the prefill instance already gave up is refused at once, so the "
                 "request fails when the decode instance resumes.",
        actual="The decode instance waits another full abort timeout for 'P side ready' after it resumes and "
               "then fails the request: about freeze + abort timeout (26 s here) instead of the 16 s freeze.",
        log_patterns=(r"P side ready", r"KV load failure"),
    ),
}

# the other families' reports: what a standalone reproduction needs there
# (store-* folders are written by families/lookup/store_standalone.py, lookup-* by
# families/lookup/ascend_standalone.py, the layerwise ones with a run.sh by families/layerwise/standalone.py:
# never here)
WRITTEN_ELSEWHERE = ("store-", "lookup-")
OTHERS = {
    "layerwise-": "vllm-ascend's MooncakeLayerwiseConnector: an Ascend NPU, or on CPU vllm-ascend's own test "
                  "stubs (tests/ut/conftest.py: torch_npu, torch.npu, mooncake.engine) with the connector driven "
                  "in-process",
    "lookup-": "vllm-ascend's AscendStore LookupKeyServer/LookupKeyClient: on CPU vllm-ascend's own test stubs "
               "(tests/ut/conftest.py, plus mooncake.store and MOONCAKE_CONFIG_PATH) with the two driven "
               "in-process over ipc",
}


# ------------------------------------------------------------------ run.sh

def run_sh(name: str, case: Case) -> str:
    head = (f"#!/usr/bin/env bash\n# {case.title.removeprefix('[Bug]: ')}\n# Usage: ./run.sh [PYTHON]   PYTHON (or $VLLM_PYTHON): the python of "
            "the venv that has vLLM (default: python3)\n"
            "# Exit 1: the defect showed; 0: it did not; 2: the set-up failed. README.md says what it shows.\n"
            "set -uo pipefail\n. \"$(dirname \"$0\")/lib.sh\"\nsetup \"$@\"\n\n")
    if case.nodes == "D":
        body = ('D=$(free_port); DB=$(free_port)\n'
                'serve decode kv_consumer "$D" "$DB" 1\nwait_ready decode "$D" 0\n')
    elif case.nodes == "D+fake":
        body = ('D=$(free_port); DB=$(free_port); FB=$(free_port); FS=$(free_port)\n'
                'setsid timeout 900 "$PY" fake_prefill.py "$FB" "$FS" > out/fake_prefill.log 2>&1 < /dev/null &\n'
                'PIDS+=("$!")\n'
                'serve decode kv_consumer "$D" "$DB" 1\nwait_ready decode "$D" 1\n')
    else:
        body = ('P=$(free_port); PB=$(free_port); D=$(free_port); DB=$(free_port)\n'
                'serve prefill kv_producer "$P" "$PB" 0\nserve decode kv_consumer "$D" "$DB" 1\n'
                'wait_ready prefill "$P" 0\nwait_ready decode "$D" 1\n')
    pats = " ".join(f"'{p}'" for p in case.log_patterns)
    tail = (f'\ntimeout 300 "$PY" repro.py {case.repro_args}\nrc=$?\n'
            '[ "$rc" -le 1 ] || rc=2\n'
            f'echo "vLLM log lines (out/*.log):"\nlog_lines {pats}\nexit "$rc"\n')
    return head + body + tail


# ------------------------------------------------------------------ README

def _fence(text: str, lang: str = "") -> str:
    return f"```{lang}\n{text.rstrip()}\n```\n"


def readme(name: str, case: Case, collect_env: str) -> str:
    serve = {"D": ["decode (kv_consumer) on core 1"], "D+fake": ["decode (kv_consumer) on core 1",
                                                                  "`fake_prefill.py` as the prefill node"],
             "P+D": ["prefill (kv_producer) on core 0", "decode (kv_consumer) on core 1"]}[case.nodes]
    what = " ".join(steps_of(name).split())
    seen = observed().get(name, {})
    obs = "".join(f"- {label}: `{seen[t]}`\n" for t, label in (("upstream", "vLLM 0.32.0 as released"),
                                                                ("patched", "with the fix applied")) if t in seen)
    obs = obs or "- (no run recorded yet)\n"
    lines = seen.get("log_lines") or []
    logs = _fence("\n".join(lines), "text") if lines else (
        "None: vLLM logs nothing while the request waits (the failure is logged only when the receive "
        "timeout ends, after `run.sh` has stopped the servers).\n" if "log_lines" in seen else "(none recorded yet)\n")
    return f"""# {case.title}

A standalone reproduction: it needs only a venv with vLLM 0.32.0 (CPU build here) and Mooncake
(`mooncake-transfer-engine`), curl and bash. Nothing of the project that found it is needed.

## Your current environment

The output of `python -m vllm.collect_env` in the venv the run below used:

<details>
<summary>collect-env</summary>

{_fence(collect_env, "text")}
</details>

## 🐛 Describe the bug

{case.bug}

**Expected:** {case.expected}

**Actual:** {case.actual}

### How to reproduce

```bash
./run.sh /path/to/venv/bin/python        # or: VLLM_PYTHON=/path/to/venv/bin/python ./run.sh
```

`run.sh` (a time limit on every step; all paths relative to this folder):

1. `make_model.py model`: a tiny random-weight Llama and its tokenizer, made locally, no download
   (identical on every machine);
2. starts {' and '.join(serve)} with `vllm serve model --served-model-name tiny-llama --dtype bfloat16
   --max-model-len 512 --max-num-seqs 8 --enforce-eager --no-enable-prefix-caching --kv-transfer-config
   '{{"kv_connector":"MooncakeConnector","kv_role":...,"kv_load_failure_policy":"fail",
   "kv_connector_extra_config":{{"mooncake_protocol":"tcp","kv_load_timeout_ms":2000}}}}'` and
   `VLLM_HOST_IP=127.0.0.1 VLLM_MOONCAKE_BOOTSTRAP_PORT=<port> VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT=10
   VLLM_CPU_KVCACHE_SPACE=1` (`lib.sh`; `kv_load_timeout_ms` is the option the fix adds: vLLM 0.32.0
   ignores it);
3. `repro.py`: the exact requests (text in the file) and the fault, then one line `RESULT: defect
   seen: ...` (exit 1) or `RESULT: defect not seen: ...` (exit 0) with the measured time. What it
   does: {what}
4. prints the vLLM log lines that show it (logs in `out/`) and stops every server.

`pd_client.py` does for one request what vLLM's example proxy
(`examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py`) does: it reads the prefill
engine's id from P's bootstrap server (`GET /query`), sends P the request with `max_tokens=1` and
`kv_transfer_params={{"do_remote_decode": true, "transfer_id": X}}`, and D the request with
`{{"do_remote_prefill": true, "remote_bootstrap_addr": ..., "remote_engine_id": E, "transfer_id": X}}`.

`cpu_shim/` is only for a host with no GPU: vLLM 0.32.0's `MooncakeConnectorWorker.__init__` calls
`torch.accelerator.current_device_index()`, which raises without an accelerator, so the connector
cannot start on a CPU-only host. `run.sh` puts `cpu_shim/` on the servers' `PYTHONPATH`; its
`sitecustomize.py` makes that call return 0 when there is no accelerator. It plays no part in the
bug; on a GPU host remove it from `lib.sh`.

### What we saw

{obs}
vLLM log lines of the run on vLLM 0.32.0 (request ids cut):

{logs}"""


def observed() -> dict:
    try:
        return json.loads(OBSERVED.read_text())
    except (OSError, ValueError):
        return {}


def steps_of(name: str) -> str:
    """The first paragraph of the case's repro.py docstring: what it sends and does."""
    doc = ast.get_docstring(ast.parse((FILES / "scenarios" / f"{name}.py").read_text())) or ""
    return doc.split("\n\n", 1)[0]


def other_readme(name: str) -> str:
    need = next((v for k, v in OTHERS.items() if name.startswith(k)), "its own node stack")
    return f"""# Standalone reproduction: not written yet

This report's defect is reproduced today through the project's harness only (see `../README.md`).
A reproduction that needs nothing but the upstream package is not written yet for this family; it
needs {need}.
"""


# ------------------------------------------------------------------ writing

def scrub(text: str) -> str:
    """No machine path in a report: home folders, the project's caches and temporary folders are cut."""
    text = re.sub(r"(/root|/home/[^/\s]+)(/[^\s:'\"]*)?", "<home>", text)
    text = re.sub(r"/(work|tmp)/[^\s:'\"]*", "<path>", text)
    return text


def collect_env(python: Path) -> str:
    """``python -m vllm.collect_env`` of a node env, paths cut; a one-line note when it fails."""
    try:
        out = subprocess.run([str(python), "-m", "vllm.collect_env"], capture_output=True, text=True,
                             timeout=COLLECT_ENV_TIMEOUT_S, env={"PATH": "/usr/bin:/bin", "VLLM_PLUGINS": "",
                                                                "HF_HUB_OFFLINE": "1"})
        text = out.stdout if out.returncode == 0 else f"collect_env failed with exit {out.returncode}"
        text = "\n".join(line for line in text.splitlines() if not line.startswith("VLLM_PLUGINS="))
        mc = subprocess.run([str(python), "-c", MOONCAKE_PY], capture_output=True, text=True, timeout=120)
        if mc.returncode == 0 and mc.stdout.strip():
            text += f"\n(not listed above) {mc.stdout.strip()}"
    except (OSError, subprocess.TimeoutExpired) as e:
        text = f"collect_env could not run: {type(e).__name__}"
    return scrub(text)


def write_standalone(report_dir: Path, scenario: str, env_text: str) -> Path:
    """Write ``report_dir/standalone/`` for ``scenario``; its path."""
    out = Path(report_dir) / "standalone"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    case = CASES.get(scenario)
    if case is None:
        (out / "README.md").write_text(other_readme(scenario))
        return out
    for rel in COMMON + (("fake_prefill.py",) if case.nodes == "D+fake" else ()):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(FILES / rel, out / rel)
    shutil.copyfile(FILES / "scenarios" / f"{scenario}.py", out / "repro.py")
    (out / "run.sh").write_text(run_sh(scenario, case))
    (out / "run.sh").chmod(0o755)
    (out / "README.md").write_text(readme(scenario, case, env_text))
    return out


def node_python() -> Path:
    from stacks.vllm_cpu.recipe import pd_node_env

    return pd_node_env(out=lambda line: None).bin / "python"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m families.pd.standalone",
                                 description="write the standalone/ folder of every report under REPORTS")
    ap.add_argument("reports", type=Path, help="the reports folder (docs/reports)")
    a = ap.parse_args(argv)
    dirs = sorted(d for d in a.reports.glob("*--*") if d.is_dir())
    if not dirs:
        print(f"error: no report folder (<scenario>--<target>) under {a.reports}", file=sys.stderr)
        return 2
    env_text = collect_env(node_python()) if any(d.name.split("--")[0] in CASES for d in dirs) else ""
    for d in dirs:
        scenario = d.name.split("--")[0]
        if scenario not in CASES and (scenario.startswith(WRITTEN_ELSEWHERE) or (d / "standalone" / "run.sh").is_file()):
            continue
        write_standalone(d, scenario, env_text)
        print(f"{d.name}: {'standalone reproduction' if scenario in CASES else 'what it needs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
