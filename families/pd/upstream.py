"""vLLM 0.32.0 as an upstream project (harness/upstream.py): the release the P/D node env installs, the
sdist it was built from (its tests/ are vLLM's own tests), the diffs of connector_patch/upstream/vllm/0.32.0/
and which of vLLM's test files cover which patched file."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.upstream import UpstreamProject

REPO = Path(__file__).resolve().parents[2]
SDIST_URL = ("https://files.pythonhosted.org/packages/d5/df/5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/"
             "vllm-0.32.0.tar.gz")
SDIST_SHA256 = "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad"
UNIT = "tests/v1/kv_connector/unit"
# vLLM's own tests of each file the series changes (a prefix covers a folder)
OWN_TESTS = {
    "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py": [
        f"{UNIT}/test_mooncake_connector.py", f"{UNIT}/test_mooncake_connector_hma.py",
        f"{UNIT}/test_mooncake_connector_hybrid_mamba.py", f"{UNIT}/test_mooncake_stats.py"],
    "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/": [
        f"{UNIT}/test_mooncake_store_connector.py", f"{UNIT}/test_mooncake_store_coordinator.py",
        f"{UNIT}/test_mooncake_store_layout.py", f"{UNIT}/test_mooncake_store_scheduler.py",
        f"{UNIT}/test_mooncake_store_worker.py", f"{UNIT}/test_mooncake_store_hma_e2e.py"],
    "vllm/distributed/kv_transfer/kv_connector/utils.py": [f"{UNIT}/test_output_aggregator.py"],
    "vllm/distributed/device_communicators/shm_broadcast.py": ["tests/distributed/test_shm_broadcast.py"],
}
# vLLM 0.32.0's .github/PULL_REQUEST_TEMPLATE.md: its four sections and its checklist (AI assistance: yes)
PR_SECTIONS = (("## Overview", ("what",)), ("## Claims", ("change",)), ("## Validation", ("tests",)),
               ("## Details", ("details",)))
PR_FOOTER = ("<details>\n<summary> Pull Request Checklist </summary>\n\n"
             "- [ ] I used vLLM's `/pr-checklist` skill. (Mandatory for agents, optional for humans).\n"
             "- [x] AI assistance was used during the creation of this PR.\n\n"
             "- [ ] **Design Fit:** Minimizes impact on core components, reuses existing functionality, and "
             "justifies added complexity.\n"
             "- [ ] **Testing and Validation:** Validates the change and ensures any added tests are meaningful and "
             "reliable, with CI coverage or documented CI resource constraints and validation performed outside CI.\n"
             "- [ ] **Code Quality and Style:** Keeps code and comments clear and concise, and updates relevant "
             "documentation and examples.\n"
             "- [ ] **Pull Request Contents:** Includes a brief summary and relevant links, supports claims with "
             "evidence, explains root causes and implementation trade-offs, and follows the contributing guide.\n"
             "</details>")
# OPT-125m's config.json (its published fields), for the P2P tests that build a VllmConfig for
# facebook/opt-125m: written into a test-only HF cache, never downloaded
OPT_125M = {
    "_name_or_path": "facebook/opt-125m", "activation_dropout": 0.0, "activation_function": "relu",
    "architectures": ["OPTForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 2, "do_layer_norm_before": True,
    "dropout": 0.1, "eos_token_id": 2, "ffn_dim": 3072, "hidden_size": 768, "init_std": 0.02, "layerdrop": 0.0,
    "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 12, "num_hidden_layers": 12,
    "pad_token_id": 1, "prefix": "</s>", "torch_dtype": "float16", "transformers_version": "4.21.0.dev0",
    "use_cache": True, "vocab_size": 50272, "word_embed_proj_dim": 768}


def _prepare(tree: Path) -> dict[str, str]:
    """A private HF cache holding OPT-125m's config.json (offline: nothing is downloaded)."""
    import json

    hf = tree / ".hf-home"
    snap = hf / "hub" / "models--facebook--opt-125m" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "config.json").write_text(json.dumps(OPT_125M, indent=1) + "\n")
    refs = hf / "hub" / "models--facebook--opt-125m" / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / "main").write_text("0" * 40)
    return {"HF_HOME": str(hf), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def vllm_project() -> UpstreamProject:
    from connector_patch.upstream import read_series
    from stacks.vllm_cpu.recipe import VLLM_VERSION, pd_node_env

    env = pd_node_env(out=lambda line: None)
    return UpstreamProject(
        project="vllm", version=VLLM_VERSION, package="vllm", sdist_url=SDIST_URL, sdist_sha256=SDIST_SHA256,
        python=lambda: env.path / "bin" / "python", site_packages=env.site_packages,
        series=lambda: read_series("vllm", VLLM_VERSION), own_tests=OWN_TESTS,
        tools_lock=REPO / "stacks" / "upstream_tests" / f"vllm-py{sys.version_info[0]}{sys.version_info[1]}.txt",
        env={"VLLM_TARGET_DEVICE": "cpu", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}, prepare=_prepare,
        gate_files=(".pre-commit-config.yaml", ".buildkite/", "tools/pre_commit/"),
        lint_lock=REPO / "stacks" / "upstream_tests" / "lint" / "ruff-0.14.0.txt",
        tethering="tools/pre_commit/check_test_tethering.py", pr_sections=PR_SECTIONS, pr_footer=PR_FOOTER)
