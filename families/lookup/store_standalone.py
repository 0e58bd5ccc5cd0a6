"""The ``standalone/`` folder of a store report (docs/reports/store-*): the defect of vLLM 0.32.0's
Mooncake store connector reproduced with vLLM and Mooncake alone, no pd-chaos.

The reports come from ``scenarios/store/``, where the harness drives vLLM's own
``LookupKeyServer``/``LookupKeyClient`` over a stand-in store worker. The standalone folder shows
the same defect where a maintainer meets it: real ``vllm serve`` with ``MooncakeStoreConnector``
(``kv_both``) and a real ``mooncake_master``. ``python -m families.lookup.store_standalone
docs/reports`` writes it into every store report folder without a harness run (``pdchaos repro``
writes it too, through the family's ``repro`` module). The folder holds:

* ``README.md`` in the shape of vLLM's bug-report template (``vllm collect-env`` of the node env;
  the bug; expected vs actual in plain words; what a real run of the folder printed and the vLLM
  log lines that show it, recorded by hand in ``store_standalone_files/observed.json``);
* ``run.sh [PYTHON]``: makes the tiny model, starts the master(s) and server(s) with the exact
  commands, runs ``repro.py`` (the requests, the fault, one line ``RESULT: defect seen|not seen:
  ...``), prints the matching log lines and stops everything. Exit 1: seen; 0: not seen; 2: the
  set-up failed;
* ``lib.sh``, ``store_client.py`` (HTTP and /metrics helpers), ``bad_lookup.py`` where the fault is
  a client speaking the admin channel's wire format (pyzmq only), ``make_model.py`` and
  ``cpu_shim/`` (the P/D reports' own files: the same tiny model and CPU-host work-around).

Nothing in the folder imports pd-chaos; tests/families/lookup/test_store_standalone_reports.py
checks that and runs each folder for real on upstream (seen) and patched (not seen).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FILES = Path(__file__).with_name("store_standalone_files")
# the tiny model and the CPU-host work-around are the P/D reports' files, read (never imported) from there
PD_FILES = Path(__file__).resolve().parents[1] / "pd" / "standalone_files"
OBSERVED = FILES / "observed.json"  # scenario -> {"upstream"|"patched": RESULT line, "log_lines": [...]}
OWN = ("lib.sh", "store_client.py")
SHARED = ("make_model.py", "cpu_shim/sitecustomize.py")
COLLECT_ENV_TIMEOUT_S = 300.0
MOONCAKE_PY = ("import importlib.metadata as m; print(', '.join(f\"{d.metadata['Name']}=={d.version}\" "
               "for d in m.distributions() if (d.metadata['Name'] or '').lower().startswith('mooncake')))")
ONE = ('M=$(free_port); MA=$(free_port); S=$(free_port)\n'
       'master master "$M" "$MA"\nserve server "$S" 0 out/master.json\nwait_ready server "$S" 1\n')
TWO = ('MA_RPC=$(free_port); MA_ADMIN=$(free_port); MB_RPC=$(free_port); MB_ADMIN=$(free_port)\n'
       'A=$(free_port); B=$(free_port)\n'
       'master master-a "$MA_RPC" "$MA_ADMIN"\nmaster master-b "$MB_RPC" "$MB_ADMIN"\n'
       '# A is held (SIGSTOP) from the moment its worker has bound the admin channel\'s socket until B is up:\n'
       '# then A\'s scheduler connects after both workers bound, every run (started together, it is a race)\n'
       'serve a "$A" 0 out/master-a.json\nwait_socket a 2\nkill -STOP -- "-${PIDS[2]}"\n'
       'serve b "$B" 1 out/master-b.json\nwait_ready b "$B" 3\nkill -CONT -- "-${PIDS[2]}"\n'
       'wait_ready a "$A" 2\n')


@dataclass(frozen=True)
class Case:
    title: str
    servers: int  # 1: one master and one server; 2: two of each
    repro_args: str  # repro.py's arguments in run.sh's words
    bug: str
    expected: str
    actual: str
    log_patterns: tuple[str, ...]
    extra: tuple[str, ...] = ()  # more files of store_standalone_files/


SERVER = '--server "http://127.0.0.1:$S"'
CASES: dict[str, Case] = {
    "store-malformed-requests": Case(
        title="[Bug]: MooncakeStoreConnector: one malformed message on the LookupKey admin channel kills "
              "LookupKeyServer's thread, and every later request hangs",
        servers=1,
        repro_args=SERVER + ' --rpc-dir "$RPC_DIR"',
        bug="`LookupKeyServer` (worker rank 0) reads the frames of every request on the admin channel without "
            "checking them. One message that is not a well-formed lookup (here `[b\"lookup\"]`, a lookup short "
            "of its three payload frames: a stray client on the host, a scanner, a peer of another version) "
            "raises `IndexError` in its only thread, which ends. The REP socket stays bound, so the scheduler's "
            "next lookup is queued on it and never answered. `bad_lookup.py` sends three such messages.",
        expected="Each malformed message gets an error reply (or is dropped) and the channel keeps serving: "
                 "later requests are answered.",
        actual="The server thread dies on the first message (the other two are never answered); the next "
               "completion request never returns: the scheduler's lookup (blocking by default, "
               "`lookup_async: false`) waits for ever, and the engine with it.",
        log_patterns=(r"Exception in thread", r"IndexError"),
        extra=("bad_lookup.py",),
    ),
    "store-server-freeze": Case(
        title="[Bug]: MooncakeStoreConnector: the scheduler's store lookup has no deadline; a frozen "
              "Mooncake master stops the engine",
        servers=1,
        repro_args=SERVER + ' --master-pgid "${PIDS[0]}"',
        bug="`LookupKeyClient` sends each lookup on one REQ socket and waits in `recv()` with no timeout. "
            "Whatever stops worker rank 0 from answering stops the scheduler: a frozen worker, or, as here, "
            "the Mooncake master it asks (SIGSTOP for 10 s: a stalled host, a long GC pause, a network "
            "partition). Freezing worker rank 0 itself would stop the model too, so the master is frozen: "
            "only the lookup waits on it.",
        expected="The lookup gives up at a deadline (a cache miss) and the request is computed without the "
                 "pool while the master is away.",
        actual="A request sent 1 s into the freeze is answered only after the thaw: the lookup (blocking by "
               "default) holds the scheduler, and every other request, for as long as the master is frozen.",
        log_patterns=(r"[Ll]ookup.*(timeout|error|BACKEND)",),
    ),
    "store-reset-clear-fails": Case(
        title="[Bug]: MooncakeStoreConnector: reset_prefix_cache(reset_external) answers success when the "
              "Mooncake master is gone",
        servers=1,
        repro_args=SERVER + ' --master-pgid "${PIDS[0]}" --master-admin "http://127.0.0.1:$MA"',
        bug="`LookupKeyServer`'s reset calls `store.remove_all(force=True)` and answers `RESP_OK` without "
            "reading its return code. When the master cannot be reached, `remove_all` returns a negative code "
            "and removes nothing, but the reset (`POST /reset_prefix_cache?reset_external=true`, as an RL loop "
            "calls it after a weight update) still answers `{\"success\": true}`. Here the master is killed "
            "after the server saved a prompt's KV to it.",
        expected="`{\"success\": false}`: the pool could not be cleared, so the caller knows the old KV may "
                 "still be served.",
        actual="`{\"success\": true}` with the master dead: the caller believes the pool empty. Had the "
               "master only been unreachable for a while (a partition), every key from before the reset "
               "would still be served after it: KV computed with the old weights.",
        log_patterns=(r"remove_all", r"[Rr]esetting prefix cache"),
    ),
    "store-two-engines": Case(
        title="[Bug]: MooncakeStoreConnector: two engines on one host share the LookupKey socket; one "
              "engine's lookups are answered by the other's worker",
        servers=2,
        repro_args=('--a "http://127.0.0.1:$A" --a-admin "http://127.0.0.1:$MA_ADMIN" --b "http://127.0.0.1:$B" '
                    '--b-admin "http://127.0.0.1:$MB_ADMIN" --rpc-dir "$RPC_DIR"'),
        bug="`get_zmq_rpc_path_lookup` names the admin channel's ipc socket by host name, `lookup_rpc_port` "
            "(default 0) and dp rank only. Two engines on one host with the default settings get the same "
            "path: the second `LookupKeyServer` unlinks the first one's socket file and binds its own, and "
            "every scheduler that connects after that reaches the second engine's worker. Here two servers, "
            "each with its own Mooncake master, start on one host, A's scheduler connecting last.",
        expected="Each engine's scheduler reaches its own worker: a repeat of an engine's own prompt is found "
                 "in its pool, a prompt only the other engine served is not.",
        actual="One engine's lookups are answered by the other engine's worker: its own prompts are never "
               "found in its pool, and a prompt only the other engine served is reported as a hit, which its "
               "worker then cannot load from its own pool (a reset through it would clear the other engine's "
               "pool).",
        log_patterns=(r"KV load failure|[Ff]ailed to (load|get)",),
    ),
}


# ------------------------------------------------------------------ run.sh

def run_sh(case: Case) -> str:
    head = (f"#!/usr/bin/env bash\n# {case.title.removeprefix('[Bug]: ')}\n# Usage: ./run.sh [PYTHON]   PYTHON (or "
            "$VLLM_PYTHON): the python of the venv that has vLLM and Mooncake (default: python3)\n"
            "# Exit 1: the defect showed; 0: it did not; 2: the set-up failed. README.md says what it shows.\n"
            "set -uo pipefail\n. \"$(dirname \"$0\")/lib.sh\"\nsetup \"$@\"\n\n")
    pats = " ".join(f"'{p}'" for p in case.log_patterns)
    tail = (f'\ntimeout 300 "$PY" repro.py {case.repro_args}\nrc=$?\n'
            '[ "$rc" -le 1 ] || rc=2\n'
            f'echo "log lines (out/*.log):"\nlog_lines {pats}\nexit "$rc"\n')
    return head + (ONE if case.servers == 1 else TWO) + tail


# ------------------------------------------------------------------ README

def _fence(text: str, lang: str = "") -> str:
    return f"```{lang}\n{text.rstrip()}\n```\n"


def observed() -> dict:
    try:
        return json.loads(OBSERVED.read_text())
    except (OSError, ValueError):
        return {}


def steps_of(name: str) -> str:
    """The first paragraph of the case's repro.py docstring: what it sends and does."""
    doc = ast.get_docstring(ast.parse((FILES / "scenarios" / f"{name}.py").read_text())) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def readme(name: str, case: Case, collect_env: str) -> str:
    started = ("a `mooncake_master` and one server on core 0" if case.servers == 1 else
               "two `mooncake_master`s and two servers (A on core 0 with the first master, B on core 1 with the "
               "second); A is held (SIGSTOP of its process group) from the moment its worker has bound the admin "
               "channel's socket until B is up, so A's scheduler connects after both workers bound (as a "
               "restarted scheduler or a third engine would); started together, the order is a race, and in our "
               "run both schedulers connected before the other worker bound")
    seen = observed().get(name, {})
    obs = "".join(f"- {label}: `{seen[t]}`\n" for t, label in (("upstream", "vLLM 0.32.0 as released"),
                                                                ("patched", "with the fix applied")) if t in seen)
    obs = obs or "- (no run recorded yet)\n"
    lines = seen.get("log_lines") or []
    logs = _fence("\n".join(lines), "text") if lines else (
        "None: vLLM 0.32.0 logs nothing while it waits.\n" if "log_lines" in seen else "(none recorded yet)\n")
    fault = ("`bad_lookup.py` is the fault: a client of the admin channel speaking its own wire format "
             "(`vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/protocol.py`), pyzmq only.\n\n"
             if "bad_lookup.py" in case.extra else "")
    return f"""# {case.title}

A standalone reproduction: it needs only a venv with vLLM 0.32.0 (CPU build here) and Mooncake
(`mooncake-transfer-engine`, which ships `mooncake_master`), curl and bash. Nothing of the project
that found it is needed.

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
2. starts {started}: `mooncake_master -rpc_address 127.0.0.1 -rpc_port <port> -metrics_host 127.0.0.1
   -metrics_port <port> -enable_http_metadata_server=false -eviction_high_watermark_ratio 0.9
   -eviction_ratio 0.1 -default_kv_lease_ttl 11000 -client_ttl 120` (run as `python -m mooncake.cli`,
   which is what the `mooncake_master` command runs), and `vllm serve model --served-model-name
   tiny-llama --dtype bfloat16 --max-model-len 512 --max-num-seqs 8 --enforce-eager
   --no-enable-prefix-caching --kv-transfer-config
   '{{"kv_connector":"MooncakeStoreConnector","kv_role":"kv_both","kv_connector_extra_config":{{}}}}'`
   with `MOONCAKE_CONFIG_PATH=out/<master>.json` (its master's address, `P2PHANDSHAKE`, `tcp`, a 1 GB
   segment), `VLLM_RPC_BASE_PATH=<a fresh temporary folder>`, `VLLM_SERVER_DEV_MODE=1`,
   `VLLM_HOST_IP=127.0.0.1 VLLM_CPU_KVCACHE_SPACE=1` (`lib.sh`);
3. `repro.py`: the exact requests (text in `store_client.py`) and the fault, then one line `RESULT:
   defect seen: ...` (exit 1) or `RESULT: defect not seen: ...` (exit 0) with what it measured. What it
   does: {steps_of(name)}
4. prints the log lines that show it (logs in `out/`) and stops every process.

{fault}`--no-enable-prefix-caching` makes every prompt go to the pool (the server's own prefix cache
would otherwise answer repeats before the connector is asked); the tokens found there are the
server's `vllm:external_prefix_cache_hits_total`.

`cpu_shim/` is only for a host with no GPU (its `sitecustomize.py` says why); it plays no part in
the bug; on a GPU host remove it from `lib.sh`.

### What we saw

{obs}
Log lines of the run on vLLM 0.32.0 (process ids cut):

{logs}"""


# ------------------------------------------------------------------ writing

def scrub(text: str) -> str:
    """No machine path in a report: home folders, the project's caches and temporary folders are cut."""
    text = re.sub(r"(/root|/home/[^/\s]+)(/[^\s:'\"]*)?", "<home>", text)
    return re.sub(r"/(work|tmp)/[^\s:'\"]*", "<path>", text)


def collect_env(python: Path) -> str:
    """``python -m vllm.collect_env`` of a node env (and its Mooncake version), paths cut."""
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
    """Write ``report_dir/standalone/`` for the store ``scenario`` (one of CASES); its path."""
    case = CASES[scenario]
    out = Path(report_dir) / "standalone"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for base, rel in [(FILES, r) for r in OWN + case.extra] + [(PD_FILES, r) for r in SHARED]:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(base / rel, out / rel)
    shutil.copyfile(FILES / "scenarios" / f"{scenario}.py", out / "repro.py")
    (out / "run.sh").write_text(run_sh(case))
    (out / "run.sh").chmod(0o755)
    (out / "README.md").write_text(readme(scenario, case, env_text))
    return out


def node_python() -> Path:
    from stacks.vllm_cpu.recipe import pd_node_env

    return pd_node_env(out=lambda line: None).bin / "python"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m families.lookup.store_standalone",
                                 description="write the standalone/ folder of every store report under REPORTS")
    ap.add_argument("reports", type=Path, help="the reports folder (docs/reports)")
    a = ap.parse_args(argv)
    dirs = sorted(d for d in a.reports.glob("store-*--*") if d.is_dir() and d.name.split("--")[0] in CASES)
    if not dirs:
        print(f"error: no store report folder (store-<name>--<target>) under {a.reports}", file=sys.stderr)
        return 2
    env_text = collect_env(node_python())
    for d in dirs:
        write_standalone(d, d.name.split("--")[0], env_text)
        print(f"{d.name}: standalone reproduction")
    return 0


if __name__ == "__main__":
    sys.exit(main())
