"""The store reports' standalone folders (families/lookup/store_standalone.py): each store report has
one, it is what the generator writes today, its shell parses, its fault script speaks the admin
channel's wire format to vLLM's own LookupKeyServer (upstream's thread dies on it, the patched
server answers every message), and (the real part, in the CPU nightly) each folder's ``run.sh``
reproduces its defect in a venv holding only the node stack: vLLM 0.32.0 shows it (exit 1), the
patched vLLM (connector_patch/upstream/vllm/0.32.0 applied) does not (exit 0).

The venv is made fresh per target as tests/families/pd/test_standalone_reports.py makes it (the
node env's base interpreter, its site-packages linked entry by entry without the CPU shim, the
patched copy's ``vllm`` for ``patched``); the run gets a clean environment and a temporary copy of
the folder, where ``import harness`` must fail. What pd-chaos must not be imported from the folders
and that no machine path is in docs/ are checked there for every report.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from families.lookup import store_standalone as S
from standalone_venv import clean_env, node_env, patched_overlay, venv_maker

ROOT = Path(__file__).resolve().parents[3]
REPORTS = ROOT / "docs" / "reports"
REQUIRE_ENV = "PDCHAOS_STANDALONE_REPORTS"
RUN_TIMEOUT_S = 1500.0
STORE_REPORTS = sorted(d.name for d in REPORTS.glob("store-*--upstream"))


@pytest.fixture(scope="module")
def venvs(tmp_path_factory):
    """``venvs(target)``: one fresh venv per target in this module."""
    return venv_maker(tmp_path_factory)


@pytest.mark.timeout(60)
def test_every_store_report_has_its_case_and_a_whole_folder() -> None:
    assert sorted(S.CASES) == sorted(n.split("--")[0] for n in STORE_REPORTS) and len(STORE_REPORTS) == 4
    for name in STORE_REPORTS:
        case = S.CASES[name.split("--")[0]]
        folder = REPORTS / name / "standalone"
        for f in ("run.sh", "lib.sh", "repro.py", "store_client.py", "make_model.py", "cpu_shim/sitecustomize.py",
                  *case.extra):
            assert (folder / f).is_file(), (name, f)
        text = (folder / "README.md").read_text()
        assert "## Your current environment" in text and "vLLM Version" in text, name
        assert "**Expected:**" in text and "**Actual:**" in text, name
        assert "MooncakeStoreConnector" in text and "mooncake_master" in text, name


@pytest.mark.timeout(60)
def test_store_folders_are_what_the_generator_writes(tmp_path: Path) -> None:
    """Every file but README.md byte for byte; README.md from the generator with the committed
    collect-env block."""
    for name in STORE_REPORTS:
        committed = REPORTS / name / "standalone"
        text = (committed / "README.md").read_text()
        env = re.search(r"<summary>collect-env</summary>\n\n```text\n(.*?)\n```\n", text, re.S)
        assert env, name
        fresh = S.write_standalone(tmp_path / name, name.split("--")[0], env.group(1))
        files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file()), name
        for rel in files:
            assert (fresh / rel).read_bytes() == (committed / rel).read_bytes(), f"{name}/standalone/{rel} is stale"


@pytest.mark.timeout(60)
def test_run_sh_parses_and_names_its_servers_by_their_process_groups() -> None:
    for name in STORE_REPORTS:
        folder = REPORTS / name / "standalone"
        for sh in ("run.sh", "lib.sh"):
            proc = subprocess.run(["bash", "-n", str(folder / sh)], capture_output=True, text=True, timeout=30)
            assert proc.returncode == 0, (name, sh, proc.stderr)
        run = (folder / "run.sh").read_text()
        # masters first: PIDS[0] is the (first) master's process group, the servers follow
        assert run.index("master master") < run.index("serve "), name
        assert "repro.py" in run and "log_lines" in run, name


# ------------------------------------------------------------------ the fault script on vLLM's own server

DRIVER = r'''
import os, subprocess, sys, types
base, script = sys.argv[1], sys.argv[2]
os.environ["VLLM_RPC_BASE_PATH"] = base
from vllm.config import KVTransferConfig, ParallelConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import MooncakeLookupResult
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import LookupKeyServer


class Worker:  # what LookupKeyServer reads of MooncakeStoreWorker: a lookup that finds nothing
    kv_send_thread = None
    store = None
    token_dbs = [types.SimpleNamespace(metadata=types.SimpleNamespace(model_name="m", cache_prefix="",
                                                                      store_namespace=""))]

    def lookup(self, num_tokens, block_hashes):
        return MooncakeLookupResult(0)


kv = KVTransferConfig(kv_connector="MooncakeStoreConnector", kv_role="kv_both", engine_id="engine-a")
server = LookupKeyServer(Worker(), VllmConfig(parallel_config=ParallelConfig(), kv_transfer_config=kv))
out = subprocess.run([sys.executable, script, base], capture_output=True, text=True, timeout=60)
print(out.stdout + out.stderr, flush=True)
thread = getattr(server, "thread", None)
print("THREAD_ALIVE", None if thread is None else thread.is_alive(), flush=True)
os._exit(out.returncode)  # upstream's REP socket is never closed under its (dead or waiting) thread
'''


@pytest.mark.timeout(600)
@pytest.mark.parametrize("target", ["upstream", "patched"])
def test_bad_lookup_kills_upstreams_server_thread_and_patched_answers_each(target: str, tmp_path: Path) -> None:
    env = node_env()
    if not env.installed():
        pytest.skip("the P/D node env is not installed: pdchaos setup")
    run_env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "VLLM_PLUGINS": "",
               "HF_HUB_OFFLINE": "1"}
    if target == "patched":
        run_env["PYTHONPATH"] = str(patched_overlay())
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"lk-{os.getpid()}-{target}"
    base.mkdir(parents=True, exist_ok=True)  # short: a unix socket's path is at most 107 bytes
    try:
        script = S.FILES / "bad_lookup.py"
        proc = subprocess.run([str(env.bin / "python"), "-c", DRIVER, str(base), str(script)], cwd=tmp_path,
                              env=run_env, capture_output=True, text=True, timeout=540)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = proc.stdout
    lines = [line for line in out.splitlines() if line.startswith("bad_lookup: message")]
    assert proc.returncode == 0 and len(lines) == 3, (out[-2000:], proc.stderr[-2000:])
    if target == "upstream":
        assert all("not answered" in line for line in lines), lines
        assert "THREAD_ALIVE False" in out and "IndexError" in proc.stderr + out, (out[-1000:], proc.stderr[-2000:])
    else:
        assert all(": answered (" in line for line in lines), lines


# ------------------------------------------------------------------ real runs (the CPU nightly)

@pytest.mark.timeout(RUN_TIMEOUT_S + 900)  # the venv (links, the patched copy) + run.sh's own limit
@pytest.mark.parametrize("target", ["upstream", "patched"])
@pytest.mark.parametrize("report", STORE_REPORTS)
def test_store_standalone_run_shows_the_defect_on_upstream_only(report: str, target: str, venvs,
                                                                tmp_path: Path) -> None:
    if os.environ.get(REQUIRE_ENV) != "1":
        pytest.skip(f"not applicable: real vLLM servers and Mooncake masters for minutes per report; runs in "
                    f"the nightly (schedule_nightly_cpu.yaml, {REQUIRE_ENV}=1)")
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") not in ("", "1"):
        pytest.fail("one real run at a time: run this file with -n 0")
    if not node_env().installed():
        pytest.fail("the P/D node stack is not installed: pdchaos setup")
    python = venvs(target)
    work = tmp_path / "standalone"
    shutil.copytree(REPORTS / report / "standalone", work)
    env = clean_env()
    probe = subprocess.run([str(python), "-c", "import harness"], cwd=work, env=env, capture_output=True,
                           text=True, timeout=120)
    assert probe.returncode != 0 and "No module named 'harness'" in probe.stderr
    probe = subprocess.run([str(python), "-c", "import vllm, zmq, mooncake.store; import pdchaos_cpu_shim"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert "No module named 'pdchaos_cpu_shim'" in probe.stderr, probe.stderr[-500:]
    proc = subprocess.run(["bash", "run.sh", str(python)], cwd=work, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, start_new_session=True)
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT: ")]
    print(f"{report} [{target}] exit {proc.returncode}: {result}", file=sys.stderr)
    print(proc.stdout[-4000:], file=sys.stderr)
    assert proc.returncode in (0, 1) and len(result) == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    want_seen = target == "upstream"
    assert proc.returncode == (1 if want_seen else 0), result[0]
    assert result[0].startswith("RESULT: defect seen" if want_seen else "RESULT: defect not seen"), result[0]


@pytest.mark.timeout(400)
def test_pdchaos_repro_writes_the_folder_for_a_store_scenario_only(tmp_path: Path) -> None:
    """The lookup family's repro hook (harness/cli/repro.py calls it after a run): a store scenario
    gets its standalone folder, with collect-env of the node env; a scenario without a recipe none."""
    from types import SimpleNamespace

    from families.lookup import repro

    if not node_env().installed():
        pytest.skip("the P/D node env is not installed: pdchaos setup")
    assert repro.write_standalone(SimpleNamespace(name="server-kill"), tmp_path / "other") is None
    assert not (tmp_path / "other").exists()
    out = repro.write_standalone(SimpleNamespace(name="store-two-engines"), tmp_path / "store")
    assert out == tmp_path / "store" / "standalone"
    assert (out / "run.sh").read_text() == S.run_sh(S.CASES["store-two-engines"])
    text = (out / "README.md").read_text()
    assert "vLLM Version" in text and "mooncake-transfer-engine" in text, text[:2000]
    assert not re.search(r"(?<![\w.~$<])/(root|work|tmp|home)/", text)
