"""Dependencies point one way: the harness and faults may import connector_patch; connector_patch
imports neither; its pure logic imports no vLLM, torch or zmq; only the two modules that run inside a
vLLM server (the hardened connector and its plugin) import vLLM."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parent.parent
VLLM_SIDE = {"connector_patch/vllm_mooncake.py", "connector_patch/vllm_plugin.py",
             "harness/nodeenv/build_tiny_model.py"}  # a script the harness runs with the node env's python


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
    pure = [p for p in _files("connector_patch/pd")]
    assert pure, "connector_patch/pd holds the pure rules"
    bad = {str(p.relative_to(ROOT)): sorted(_imports(p) & {"vllm", "torch", "zmq", "msgspec"}) for p in pure}
    assert not {k: v for k, v in bad.items() if v}


def test_only_the_server_side_modules_import_vllm_or_torch() -> None:
    users = {str(p.relative_to(ROOT)) for pkg in ("connector_patch", "harness", "faults", "reports")
             for p in _files(pkg) if _imports(p) & {"vllm", "torch"}}
    assert users == VLLM_SIDE
