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
