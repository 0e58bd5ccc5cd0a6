"""vLLM general plugin (entry point group ``vllm.general_plugins``): registers the hardened
connectors with vLLM's KV connector factory, lazily (nothing of a connector is imported until a
server selects it by name in ``--kv-transfer-config``). vLLM calls this in every process it starts;
registering twice is a no-op.

* ``HardenedMooncakeConnector`` (connector_patch/pd/vllm_connector.py), always;
* ``HardenedMooncakeStoreConnector`` (connector_patch/store/vllm_store.py, the hardened admin channel
  inside vLLM's MooncakeStoreConnector), when this vLLM has that connector;
* when vllm-ascend is installed: ``HardenedAscendStoreConnector`` (connector_patch/lookup/ascend_store.py,
  the hardened lookup RPC inside vllm-ascend's AscendStoreConnector) and
  ``HardenedMooncakeLayerwiseConnector`` (connector_patch/layerwise/ascend_connector.py).
"""

from __future__ import annotations

import importlib.util

CONNECTORS = (("HardenedMooncakeConnector", "connector_patch.pd.vllm_connector", None),
              ("HardenedMooncakeStoreConnector", "connector_patch.store.vllm_store",
               "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store"),
              ("HardenedAscendStoreConnector", "connector_patch.lookup.ascend_store", "vllm_ascend"),
              ("HardenedMooncakeLayerwiseConnector", "connector_patch.layerwise.ascend_connector", "vllm_ascend"))


def _has(module: str) -> bool:
    try:  # a dotted name imports its parents: a missing parent raises instead of returning None
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def register() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    registry = getattr(KVConnectorFactory, "_registry", {})
    for name, module, needs in CONNECTORS:
        if name in registry or (needs is not None and not _has(needs)):
            continue
        KVConnectorFactory.register_connector(name, module, name)
