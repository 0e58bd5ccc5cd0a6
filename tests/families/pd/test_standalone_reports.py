"""The reports' standalone folders (families/pd/standalone.py): every report has one, nothing in them
imports pd-chaos or names a path of this machine, they are what the generator writes today, and
(the real part, in the CPU nightly) each P/D report's ``run.sh`` reproduces its defect in a venv
holding only the node stack: upstream vLLM 0.32.0 shows it (exit 1), the patched vLLM
(connector_patch/upstream/vllm/0.32.0 applied) does not (exit 0).

The venv is made fresh per target: ``python -m venv`` of the node env's base interpreter, its
site-packages a link to every top-level entry of the node env's site-packages except the CPU shim
(``pdchaos_cpu_shim``; the folder carries its own ``cpu_shim/``), and for ``patched`` the ``vllm``
package of the patched copy (harness/nodeenv/overlay.py). The run gets a clean environment (no
PYTHONPATH, a minimal PATH) and a temporary copy of the folder as its working directory, where
``import harness`` must fail.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from families.pd import standalone as S
from standalone_venv import clean_env, node_env, venv_maker

ROOT = Path(__file__).resolve().parents[3]
REPORTS = ROOT / "docs" / "reports"
REQUIRE_ENV = "PDCHAOS_STANDALONE_REPORTS"
RUN_TIMEOUT_S = 1500.0
OWN_MODULES = {"harness", "families", "nodekit", "stacks", "connector_patch", "reports", "runtimes", "faults",
               "pdchaos", "pdchaos_cpu_shim"}
MACHINE_PATH = re.compile(r"(?<![\w.~$<])/(root|work|tmp|home)/")
PD_REPORTS = sorted(d.name for d in REPORTS.glob("*--upstream") if d.name.split("--")[0] in S.CASES)


@pytest.fixture(scope="module")
def venvs(tmp_path_factory):
    """``venvs(target)``: one fresh venv per target in this module."""
    return venv_maker(tmp_path_factory)


def report_dirs() -> list[Path]:
    return sorted(d for d in REPORTS.glob("*--*") if d.is_dir())


def test_every_pd_case_has_a_report_and_every_report_a_standalone_folder() -> None:
    assert sorted(S.CASES) == sorted(n.split("--")[0] for n in PD_REPORTS)
    assert len(report_dirs()) >= len(PD_REPORTS) > 0
    for d in report_dirs():
        readme = d / "standalone" / "README.md"
        assert readme.is_file(), d.name
        if d.name.split("--")[0] in S.CASES:
            for f in ("run.sh", "lib.sh", "repro.py", "pd_client.py", "make_model.py", "cpu_shim/sitecustomize.py"):
                assert (d / "standalone" / f).is_file(), (d.name, f)
            text = readme.read_text()
            assert "## Your current environment" in text and "vLLM Version" in text, d.name
            assert "**Expected:**" in text and "**Actual:**" in text, d.name


def test_standalone_folders_import_nothing_of_pd_chaos() -> None:
    for d in report_dirs():
        for py in (d / "standalone").rglob("*.py"):
            tree = ast.parse(py.read_text(), str(py))
            for node in ast.walk(tree):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                for n in names:
                    assert n.split(".")[0] not in OWN_MODULES, f"{py.relative_to(ROOT)} imports {n}"


def test_standalone_folders_are_what_the_generator_writes(tmp_path: Path) -> None:
    """Every file but README.md (which holds collect-env's output) byte for byte; README.md from
    the generator with the committed collect-env block."""
    for name in PD_REPORTS:
        committed = REPORTS / name / "standalone"
        text = (committed / "README.md").read_text()
        env = re.search(r"<summary>collect-env</summary>\n\n```text\n(.*?)\n```\n", text, re.S)
        assert env, name
        fresh = S.write_standalone(tmp_path / name, name.split("--")[0], env.group(1))
        files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file()), name
        for rel in files:
            assert (fresh / rel).read_bytes() == (committed / rel).read_bytes(), f"{name}/standalone/{rel} is stale"


def test_no_machine_path_in_the_reports_or_docs() -> None:
    hits = []
    for p in (ROOT / "docs").rglob("*"):
        if not p.is_file() or p.suffix not in (".md", ".jsonl", ".yaml", ".sh", ".py", ".json", ".txt"):
            continue
        in_reports = REPORTS in p.parents
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if (in_reports and MACHINE_PATH.search(line)) or re.search(
                    r"/root/\.(cache/pdchaos|pyenv)|/work/|/tmp/(pdc-|repro)", line):
                hits.append(f"{p.relative_to(ROOT)}:{i}")
    assert not hits, f"{len(hits)} machine paths, first: {hits[:5]}"


def test_scrub_cuts_machine_paths_and_keeps_the_rest() -> None:
    line = "node env `/root/.cache/pdchaos/envs/pd-node-c14b312f4058` and /tmp/pdc-1-x/ctl.sock, /work/main/x"
    out = S.scrub(line)
    assert MACHINE_PATH.search(line) and not MACHINE_PATH.search(out) and "node env" in out and "ctl.sock" not in out
    from reports.repro import machine_paths

    launch = (f"PDCHAOS_FAMILY=pd {sys.executable} -m harness.cli node vllm --server-log /tmp/repro/x/runs/d.log "
              f"--control ipc:///tmp/pdc-1-ab/d-ctl.sock --model {Path.home()}/.cache/pdchaos/models/tiny-llama-v1 "
              f"--config {ROOT}/scenarios/pd/eos-answer.yaml")
    out = machine_paths(launch, ROOT)
    assert MACHINE_PATH.search(launch) and not MACHINE_PATH.search(out), out
    assert out.startswith("PDCHAOS_FAMILY=pd python3 -m harness.cli node vllm --server-log $TMPDIR/repro/x/runs/d.log")
    assert "ipc://$TMPDIR/pdc-1-ab/d-ctl.sock" in out and "--config scenarios/pd/eos-answer.yaml" in out
    assert "~/.cache/pdchaos/models/tiny-llama-v1" in out
    # a venv inside the checkout (the README's fresh-venv set-up) is the harness's Python too
    for py in (f"{ROOT}/.venv/bin/python", "/usr/bin/python3", "/opt/py/bin/python3.11"):
        assert machine_paths(f"PDCHAOS_FAMILY=pd {py} -m harness.cli node vllm", ROOT) == \
            "PDCHAOS_FAMILY=pd python3 -m harness.cli node vllm", py
    assert machine_paths(f"{Path.home()}/.cache/pdchaos/envs/pd-node-x/bin/python -m vllm", ROOT) == \
        "~/.cache/pdchaos/envs/pd-node-x/bin/python -m vllm"  # the node env's Python stays, under ~


# ------------------------------------------------------------------ real runs (the CPU nightly)

@pytest.mark.timeout(RUN_TIMEOUT_S + 900)  # the venv (links, the patched copy) + run.sh's own limit
@pytest.mark.parametrize("target", ["upstream", "patched"])
@pytest.mark.parametrize("report", PD_REPORTS)
def test_standalone_run_shows_the_defect_on_upstream_only(report: str, target: str, venvs, tmp_path: Path) -> None:
    if os.environ.get(REQUIRE_ENV) != "1":
        pytest.skip(f"not applicable: real vLLM servers for minutes per report; runs in the nightly "
                    f"(schedule_nightly_cpu.yaml, {REQUIRE_ENV}=1)")
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
    probe = subprocess.run([str(python), "-c", "import vllm, zmq, msgpack; import pdchaos_cpu_shim"], cwd=work,
                           env=env, capture_output=True, text=True, timeout=300)
    assert "No module named 'pdchaos_cpu_shim'" in probe.stderr, probe.stderr[-500:]
    proc = subprocess.run(["bash", "run.sh", str(python)], cwd=work, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, start_new_session=True)
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT: ")]
    print(f"{report} [{target}] exit {proc.returncode}: {result}", file=sys.stderr)
    assert proc.returncode in (0, 1) and len(result) == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    want_seen = target == "upstream"
    assert proc.returncode == (1 if want_seen else 0), result[0]
    assert result[0].startswith("RESULT: defect seen" if want_seen else "RESULT: defect not seen"), result[0]
