"""Dependencies point one way: the harness and faults may import connector_patch; connector_patch
imports neither; its pure logic imports no vLLM, torch or zmq; only the modules that run inside a vLLM
or vllm-ascend process (the hardened connectors, their plugin, and the harness's node-env side of the
conformance targets) import vLLM, vllm-ascend or torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parent.parent
VLLM_SIDE = {"connector_patch/vllm_mooncake.py", "connector_patch/vllm_plugin.py",
             "connector_patch/ascend_store.py", "connector_patch/ascend_layerwise.py",
             # run with a node env's python (harness/nodeenv/exec_node.py), never in the harness's
             "stacks/vllm_cpu/build_tiny_model.py", "families/lookup/ascend_server.py",
             "families/lookup/ascend_workload.py", "families/layerwise/engine.py",
             "families/layerwise/stack.py"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


def _files(pkg: str) -> list[Path]:
    return sorted((ROOT / pkg).rglob("*.py"))


def test_connector_patch_imports_neither_harness_nor_faults() -> None:
    bad = {str(p.relative_to(ROOT)): sorted(_imports(p) & {"harness", "faults", "reports"})
           for p in _files("connector_patch")}
    assert not {k: v for k, v in bad.items() if v}


def test_pure_logic_imports_no_vllm_torch_or_zmq() -> None:
    pure = [p for p in _files("connector_patch/pd") + _files("connector_patch/layerwise")]
    assert pure, "connector_patch/pd holds the pure rules"
    bad = {str(p.relative_to(ROOT)): sorted(_imports(p) & {"vllm", "torch", "zmq", "msgspec"}) for p in pure}
    assert not {k: v for k, v in bad.items() if v}


def test_only_the_server_side_modules_import_vllm_or_torch() -> None:
    users = {str(p.relative_to(ROOT)) for pkg in ("connector_patch", "harness", "faults", "reports")
             for p in _files(pkg) if _imports(p) & {"vllm", "torch", "vllm_ascend"}}
    assert users == VLLM_SIDE
