"""vllm-ascend 0.23.0.post1 as an upstream project (harness/upstream.py): the release the conformance
env installs, the sdist it was built from (its ``tests/ut/`` are vllm-ascend's own unit tests, with
their NPU stubs in ``tests/ut/conftest.py``), the diffs of connector_patch/upstream/vllm-ascend/0.23.0.post1/
and which of vllm-ascend's test files cover which patched file. One series for the whole release: it
covers the AscendStore diffs the lookup family runs too (a family names it once; ``pdchaos upstream
check`` proves each release once)."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.upstream import UpstreamProject, UpstreamTestsStep

REPO = Path(__file__).resolve().parents[2]
SDIST_URL = ("https://files.pythonhosted.org/packages/ab/7a/32a1b1f13467fb7372588206fa1ffb735f28dcd8504d562f5c7ccdbd90d0/"
             "vllm_ascend-0.23.0.post1.tar.gz")
SDIST_SHA256 = "a3b9f4a5dd7aa50c37e03d1f35937c4ae5aeacc49b734cac74d59ce5757738e1"
UT = "tests/ut"
STORE = "vllm_ascend/distributed/kv_transfer/kv_pool/ascend_store/"
# vllm-ascend's own tests of each package file (a prefix covers a folder) the series changes
OWN_TESTS = {
    STORE: [f"{UT}/distributed/ascend_store/test_{n}.py" for n in (
        "ascend_store_connector", "backend", "config_data", "coordinator", "kv_transfer", "pool_scheduler",
        "pool_worker")],
    "vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_layerwise_": [
        f"{UT}/kv_offload/test_mooncake_layerwise_connector.py"],
}

# vllm-ascend 0.23.0.post1's .github/PULL_REQUEST_TEMPLATE.md, and the DCO sign-off its contributing guide asks
PR_SECTIONS = (("### What this PR does / why we need it?", ("what", "change", "details")),
               ("### Does this PR introduce _any_ user-facing change?", ("user-facing",)),
               ("### How was this patch tested?", ("tests",)))
PR_FOOTER = "Signed-off-by: NAME <EMAIL>"


def vllm_ascend_project() -> UpstreamProject:
    from connector_patch.upstream import read_series

    from stacks.ascend_cpu.recipe import ASCEND_VERSION, ascend_conf_env

    env = ascend_conf_env(out=lambda line: None)
    return UpstreamProject(
        project="vllm-ascend", version=ASCEND_VERSION, package="vllm_ascend", sdist_url=SDIST_URL,
        sdist_sha256=SDIST_SHA256, python=lambda: env.path / "bin" / "python", site_packages=env.site_packages,
        series=lambda: read_series("vllm-ascend", ASCEND_VERSION), own_tests=OWN_TESTS,
        tools_lock=REPO / "stacks" / "upstream_tests" / f"vllm-ascend-py{sys.version_info[0]}{sys.version_info[1]}.txt",
        env={"VLLM_PLUGINS": "", "VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
             "HF_HUB_OFFLINE": "1"},
        root_files=("pyproject.toml", "setup.cfg"), package_in_tree=True,
        gate_files=(".pre-commit-config.yaml", ".github/PULL_REQUEST_TEMPLATE.md"),
        lint_lock=REPO / "stacks" / "upstream_tests" / "lint" / "ruff-0.14.0.txt",
        pr_sections=PR_SECTIONS, pr_footer=PR_FOOTER)


def upstream_tests_step() -> UpstreamTestsStep:
    from stacks.ascend_cpu.steps import AscendStackStep

    return UpstreamTestsStep(vllm_ascend_project(),
                             lambda: None if AscendStackStep().check() else "ascend-conf-stack")


# ------------------------------------------------------------------ vllm-ascend main (a pinned commit)
# A second series, rebased onto a recent commit of vllm-ascend's main (connector_patch/upstream/vllm-ascend/
# main-<short>/): main is not on PyPI, so its tree is a `git archive` of the pinned commit from a local clone
# (the commit id is the pin: git's own content hash) into the cache, keyed by the commit. Main pairs with a
# newer vLLM than the conformance env's 0.23.0 (its .github/vllm-release-tag.commit: v0.27.1; main's
# tests/ut/conftest.py imports vLLM 0.27-era modules through adapt_patch()): its tests run on the P/D node env
# (torch 2.13.0, the torch vLLM 0.27.1 pins) with vLLM 0.27.1 and torchvision 0.28.0 in the tools folder,
# first on PYTHONPATH after the package, and vllm-ascend's own NPU stubs (tests/ut/conftest.py).
MAIN_COMMIT = "182b75ea84ff13ece27b57391331ef8935410aea"
MAIN_SERIES = f"main-{MAIN_COMMIT[:7]}"
MAIN_VLLM = "0.27.1"
MAIN_GIT_ENV = "PDCHAOS_VLLM_ASCEND_GIT"  # a clone (or bare git dir) of vllm-project/vllm-ascend holding MAIN_COMMIT
MAIN_GIT_DEFAULT = Path("/work/.mirror/vllm-project+vllm-ascend/repo")
MAIN_STORE = "vllm_ascend/distributed/kv_transfer/kv_pool/ascend_store/"
MAIN_OWN_TESTS = {
    MAIN_STORE: [f"{UT}/distributed/ascend_store/test_{n}.py" for n in (
        "ascend_store_connector", "backend", "coordinator", "kv_transfer", "layerwise_cache_layout", "metadata",
        "pool_scheduler", "pool_worker")],
    "vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_layerwise_": [
        f"{UT}/kv_offload/test_mooncake_layerwise_connector.py"],
}
_MAIN_ROOT = ("pyproject.toml",)
_MAIN_GATES = (".pre-commit-config.yaml", ".github/PULL_REQUEST_TEMPLATE.md")


def main_git_dir() -> Path:
    import os

    return Path(os.environ.get(MAIN_GIT_ENV) or MAIN_GIT_DEFAULT)


def main_package_dir() -> Path:
    """Where the pinned commit's ``vllm_ascend/`` is kept (the tree's tests/ are the project's sdist_dir)."""
    from harness.nodeenv.venv import cache_root

    return cache_root() / "upstream" / f"vllm-ascend-{MAIN_SERIES}-package-{MAIN_COMMIT[:12]}"


def vllm_ascend_main_project() -> UpstreamProject:
    from connector_patch.upstream import read_series

    from stacks.vllm_cpu.recipe import pd_node_env

    env = pd_node_env(out=lambda line: None)
    return UpstreamProject(
        project="vllm-ascend", version=MAIN_SERIES, package="vllm_ascend",
        sdist_url=f"git archive {MAIN_COMMIT} of github.com/vllm-project/vllm-ascend (${MAIN_GIT_ENV})",
        sdist_sha256=MAIN_COMMIT, python=lambda: env.path / "bin" / "python", site_packages=main_package_dir,
        series=lambda: read_series("vllm-ascend", MAIN_SERIES), own_tests=MAIN_OWN_TESTS,
        tools_lock=REPO / "stacks" / "upstream_tests"
        / f"vllm-ascend-main-py{sys.version_info[0]}{sys.version_info[1]}.txt",
        env={"VLLM_PLUGINS": "", "VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
             "HF_HUB_OFFLINE": "1"},
        root_files=_MAIN_ROOT, package_in_tree=True, gate_files=_MAIN_GATES,
        lint_lock=REPO / "stacks" / "upstream_tests" / "lint" / "ruff-0.14.0.txt",
        pr_sections=PR_SECTIONS, pr_footer=PR_FOOTER)


def archive_main(p: UpstreamProject, timeout_s: float = 300.0) -> None:
    """The pinned commit's tests/ (with its root and gate files) into ``p.sdist_dir()`` and its
    ``vllm_ascend/`` into :func:`main_package_dir`, from ``git archive`` of a local clone. Idempotent."""
    import shutil
    import subprocess
    import tempfile

    from harness.errors import HarnessError
    from harness.nodeenv.overlay import publish

    git = main_git_dir()
    parts = [(p.sdist_dir(), ["tests", *_MAIN_ROOT, *_MAIN_GATES]), (main_package_dir(), ["vllm_ascend"])]
    for final, paths in parts:
        if (final / ".complete").is_file():
            continue
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".archive-", dir=final.parent))
        try:
            cmd = ["git", "--git-dir", str(git), "archive", "--format=tar", MAIN_COMMIT, "--", *paths]
            try:
                with open(tmp / "t.tar", "wb") as f:
                    res = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise HarnessError(f"{p.label}: git archive took longer than {timeout_s:g} s") from None
            if res.returncode != 0:
                first = next((ln for ln in res.stderr.splitlines() if ln.strip()), "no output")
                raise HarnessError(f"{p.label}: git archive of {MAIN_COMMIT[:12]} from {git} failed ({first[:160]}); "
                                   f"set {MAIN_GIT_ENV} to a clone of vllm-project/vllm-ascend that has the commit")
            res = subprocess.run(["tar", "-xf", "t.tar", "-C", ".", "--one-top-level=src"], cwd=tmp,
                                 capture_output=True, text=True, timeout=timeout_s)
            if res.returncode != 0:
                raise HarnessError(f"{p.label}: unpacking the archive failed: {res.stderr.strip()[:160]}")
            publish(tmp / "src", final, f"git archive {MAIN_COMMIT}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class MainTestsStep(UpstreamTestsStep):
    """``pdchaos setup --only upstream-tests-vllm-ascend-main``: the pinned main commit's tree (git
    archive, see :func:`archive_main`), the test tools with vLLM 0.27.1, and ruff."""

    def __init__(self):
        from stacks.vllm_cpu.steps import PdStackStep

        super().__init__(vllm_ascend_main_project(), lambda: None if PdStackStep().check() else "pd-node-stack")
        self.name = "upstream-tests-vllm-ascend-main"

    def check(self) -> str | None:
        found = super().check()
        return found if found is not None and (main_package_dir() / ".complete").is_file() else None

    def plan(self) -> str:
        p = self.project
        return (f"git archive {MAIN_COMMIT[:12]} from {main_git_dir()}, install {p.tools_lock.name} "
                f"(vLLM {MAIN_VLLM} beside the P/D node env) and {p.lint_lock.name if p.lint_lock else ''}")

    def install(self) -> None:
        from harness.errors import HarnessError
        from harness.setup import StepFailed

        from harness.upstream import install_tools

        missing = self._needs()
        if missing is not None:
            raise StepFailed("the P/D node env is not installed", f"pdchaos setup --only {missing} --only {self.name}")
        try:
            archive_main(self.project)
            install_tools(self.project)
            if self.project.lint_lock is not None:
                install_tools(self.project, lint=True)
        except (HarnessError, OSError) as e:
            raise StepFailed(str(e), f"pdchaos setup --only {self.name}") from None
