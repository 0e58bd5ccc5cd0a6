"""vLLM general plugin (entry point group ``vllm.general_plugins``): registers the hardened
Mooncake connector with vLLM's KV connector factory under ``HardenedMooncakeConnector``, lazily
(nothing of vLLM's connector is imported until a server selects it by name in
``--kv-transfer-config``). vLLM calls this in every process it starts; registering twice is a no-op.
"""

from __future__ import annotations


def register() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    name = "HardenedMooncakeConnector"
    if name in getattr(KVConnectorFactory, "_registry", {}):
        return
    KVConnectorFactory.register_connector(name, "connector_patch.vllm_mooncake", "HardenedMooncakeConnector")
