"""The standalone folders of the reports on vllm-ascend's code (families/lookup/ascend_standalone.py,
families/layerwise/standalone.py, stacks/ascend_cpu/standalone.py): each lookup and layerwise report
has one (none keeps the "not written yet" README), nothing in it imports pd-chaos, it is what the
generator writes today, its README says plainly that it runs on vllm-ascend's own unit-test stubs,
and (the real part, in the CPU nightly: PDCHAOS_STANDALONE_REPORTS=1) its ``run.sh`` shows the
defect on vllm-ascend 0.23.0.post1 (exit 1) and not with the upstream diffs applied (exit 0).

The venv is made fresh per target: ``python -m venv`` of the conformance env's base interpreter, its
site-packages a link to every top-level entry of the conformance env's site-packages but pd-chaos's
own (``pdchaos_npu_stubs``: the folder uses vllm-ascend's own stubs instead), plus pytest and its
dependencies from the test tools ``pdchaos upstream check`` uses (vllm-ascend's conftest imports
pytest; its patches import torchvision), and for ``patched`` the ``vllm_ascend`` package of the patched copy. ``VLLM_ASCEND_SRC`` is
the release's sdist tree (its ``tests/``). The run gets a clean environment and a temporary copy of
the folder, where ``import harness`` must fail. Each run is in-process (no vLLM server): about a
minute, mostly ``import vllm``.
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

from families.layerwise import standalone as LW
from families.lookup import ascend_standalone as S
from standalone_venv import venv_maker

ROOT = Path(__file__).resolve().parents[3]
REPORTS = ROOT / "docs" / "reports"
REQUIRE_ENV = "PDCHAOS_STANDALONE_REPORTS"
RUN_TIMEOUT_S = 900.0
OWN_MODULES = {"harness", "families", "nodekit", "stacks", "connector_patch", "reports", "runtimes", "faults",
               "pdchaos", "pdchaos_npu_stubs"}
LOOKUP_REPORTS = sorted(d.name for d in REPORTS.glob("lookup-*--upstream"))
# every layerwise report has a standalone case (families/layerwise/standalone.py)
LAYERWISE_REPORTS = sorted(d.name for d in REPORTS.glob("layerwise-*--upstream"))
ASCEND_REPORTS = LOOKUP_REPORTS + LAYERWISE_REPORTS


def module_of(report: str):
    return S if report.startswith("lookup-") else LW


def test_every_lookup_report_has_a_standalone_reproduction() -> None:
    assert LOOKUP_REPORTS and sorted(n.split("--")[0] for n in LOOKUP_REPORTS) == sorted(S.CASES)
    assert LAYERWISE_REPORTS and sorted(n.split("--")[0] for n in LAYERWISE_REPORTS) == sorted(LW.CASES)
    for name in ASCEND_REPORTS:
        folder = REPORTS / name / "standalone"
        for f in ("README.md", "run.sh", "repro.py", "ut_stubs.py", *module_of(name).CASES[name.split("--")[0]].files):
            assert (folder / f).is_file(), (name, f)
        text = (folder / "README.md").read_text()
        assert "vllm-ascend's own unit-test stubs" in text and "tests/ut/conftest.py" in text, name
        assert "## Your current environment" in text and "vllm-ascend:" in text, name
        assert "**Expected:**" in text and "**Actual:**" in text and "RESULT: defect seen" in text, name
        for word in ("failures_explained", "bounded_return", "pdchaos", "pd-chaos", "not written yet", "TBD"):
            assert word not in text, (name, word)


def test_ascend_standalone_folders_import_nothing_of_pd_chaos() -> None:
    for name in ASCEND_REPORTS:
        for py in (REPORTS / name / "standalone").rglob("*.py"):
            for node in ast.walk(ast.parse(py.read_text(), str(py))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                for n in names:
                    assert n.split(".")[0] not in OWN_MODULES, f"{py.relative_to(ROOT)} imports {n}"


def test_ascend_standalone_folders_are_what_the_generator_writes(tmp_path: Path) -> None:
    for name in ASCEND_REPORTS:
        committed = REPORTS / name / "standalone"
        env = re.search(r"<summary>environment</summary>\n\n```text\n(.*?)\n```\n", (committed / "README.md").read_text(),
                        re.S)
        assert env, name
        fresh = module_of(name).write_standalone(tmp_path / name, name.split("--")[0], env.group(1))
        files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file()), name
        for rel in files:
            assert (fresh / rel).read_bytes() == (committed / rel).read_bytes(), f"{name}/standalone/{rel} is stale"


def test_write_standalone_leaves_other_scenarios_alone(tmp_path: Path) -> None:
    assert S.write_standalone(tmp_path, "store-server-freeze", "") is None
    assert LW.write_standalone(tmp_path, "lookup-server-freeze", "") is None
    assert not (tmp_path / "standalone").exists()


def test_run_sh_refuses_a_missing_source_tree(tmp_path: Path) -> None:
    work = tmp_path / "standalone"
    shutil.copytree(REPORTS / LOOKUP_REPORTS[0] / "standalone", work)
    proc = subprocess.run(["bash", "run.sh", sys.executable, str(tmp_path / "nowhere")], cwd=work, capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "tests/ut/conftest.py" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------ real runs (the CPU nightly)

def project():
    from families.layerwise.upstream import vllm_ascend_project

    return vllm_ascend_project()


def fresh_venv(dest: Path, target: str) -> Path:
    """A venv with vllm-ascend's stack, pytest and nothing of pd-chaos; its python."""
    p = project()
    base = subprocess.run([str(p.python()), "-c", "import sys; print(sys._base_executable)"],
                          capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    subprocess.run([base, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=300,
                   env={"PATH": "/usr/bin:/bin"})
    site = next(dest.glob("lib/python3*/site-packages"))
    overlay = None
    if target == "patched":
        from harness.nodeenv.overlay import series_overlay

        overlay = series_overlay(p.site_packages(), "vllm_ascend", p.series, "the patched target")
    entries = {e.name: e for e in p.site_packages().iterdir()}
    for e in p.test_tools().iterdir():  # pytest & co. (a flat --target folder), never over the stack's own
        if e.name not in entries and e.name not in ("bin", ".complete"):
            entries[e.name] = e
    for name, entry in entries.items():
        if name.startswith(("pdchaos", "__pycache__")) or name.endswith(".pth"):
            continue
        src = overlay / "vllm_ascend" if (overlay is not None and name == "vllm_ascend") else entry
        (site / name).symlink_to(src)
    return dest / "bin" / "python"


@pytest.fixture(scope="module")
def venvs(tmp_path_factory):
    """``venvs(target)``: one fresh venv (vllm-ascend's stack) per target in this module."""
    return venv_maker(tmp_path_factory, fresh_venv)


def clean_env() -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
            "TMPDIR": os.environ.get("TMPDIR", "/tmp")}


def run_folder(report: str, target: str, python: Path, tmp_path: Path) -> tuple[int, str, str]:
    work = tmp_path / "standalone"
    shutil.copytree(REPORTS / report / "standalone", work)
    env = clean_env()
    probe = subprocess.run([str(python), "-c", "import harness"], cwd=work, env=env, capture_output=True, text=True,
                           timeout=120)
    assert probe.returncode != 0 and "No module named 'harness'" in probe.stderr
    probe = subprocess.run([str(python), "-c", "import pytest, zmq, msgpack; import pdchaos_npu_stubs"], cwd=work,
                           env=env, capture_output=True, text=True, timeout=300)
    assert "No module named 'pdchaos_npu_stubs'" in probe.stderr, probe.stderr[-500:]
    proc = subprocess.run(["bash", "run.sh", str(python), str(project().sdist_dir())], cwd=work, env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, start_new_session=True)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.timeout(RUN_TIMEOUT_S + 600)  # the venv (links, the patched copy) + run.sh's own limit
@pytest.mark.parametrize("target", ["upstream", "patched"])
@pytest.mark.parametrize("report", ASCEND_REPORTS)
def test_ascend_standalone_run_shows_the_defect_on_upstream_only(report: str, target: str, venvs,
                                                                 tmp_path: Path) -> None:
    if os.environ.get(REQUIRE_ENV) != "1":
        pytest.skip(f"not applicable: a minute of vllm-ascend imports per run; runs in the nightly "
                    f"(schedule_nightly_cpu.yaml, {REQUIRE_ENV}=1)")
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") not in ("", "1"):
        pytest.fail("one real run at a time: run this file with -n 0")
    p = project()
    if not p.ready() or not p.python().is_file():
        pytest.fail("vllm-ascend's stack or its test tree is missing: pdchaos setup --family layerwise")
    rc, out, err = run_folder(report, target, venvs(target), tmp_path)
    result = [line for line in out.splitlines() if line.startswith("RESULT: ")]
    print(f"{report} [{target}] exit {rc}: {result}", file=sys.stderr)
    assert rc in (0, 1) and len(result) == 1, out[-3000:] + err[-2000:]
    want_seen = target == "upstream"
    assert rc == (1 if want_seen else 0), result[0]
    assert result[0].startswith("RESULT: defect seen" if want_seen else "RESULT: defect not seen"), result[0]
