"""vLLM loads the hardened connector through its own extension points: the node env's Python, with
the plugin folder on PYTHONPATH (as a hardened node is started), runs vLLM's own general-plugin
loader, and vLLM's KV connector factory then resolves ``HardenedMooncakeConnector`` to a subclass
of vLLM's MooncakeConnector. Nothing of vLLM is edited or monkeypatched."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

pytestmark = pytest.mark.timeout(300)

PROBE = r"""
import json
from importlib.metadata import entry_points
from vllm.plugins import load_general_plugins
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import MooncakeConnector
eps = sorted(f"{e.name}={e.value}" for e in entry_points(group="vllm.general_plugins"))
load_general_plugins()
load_general_plugins()  # vLLM may call it in several places: registering twice must be harmless
cls = KVConnectorFactory._registry["HardenedMooncakeConnector"]()
import connector_patch
print("RESULT " + json.dumps({"eps": eps, "cls": f"{cls.__module__}.{cls.__name__}",
                              "sub": issubclass(cls, MooncakeConnector), "pkg": connector_patch.__file__}))
"""


def test_vllm_finds_and_registers_the_hardened_connector() -> None:
    from families.pd.plugin_site import package_dir, plugin_site
    from stacks.vllm_cpu.recipe import pd_node_env

    env = pd_node_env(out=lambda line: None)
    if not env.installed():
        pytest.skip("the P/D node stack is not installed here: run `pdchaos setup --only pd-node-stack`")
    child = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "PYTHONPATH")}
    child.update({"PYTHONPATH": str(plugin_site()), "HF_HUB_OFFLINE": "1", "PYTHONNOUSERSITE": "1"})
    r = subprocess.run([str(env.python), "-c", PROBE], capture_output=True, text=True, timeout=280, env=child,
                       cwd="/")
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, r.stderr[-2000:]
    out = json.loads(line[len("RESULT "):])
    assert "pdchaos_hardened_mooncake=connector_patch.vllm_plugin:register" in out["eps"]
    assert out["cls"] == "connector_patch.pd.vllm_connector.HardenedMooncakeConnector" and out["sub"] is True
    assert os.path.realpath(out["pkg"]).startswith(str(package_dir()))  # this checkout's code
