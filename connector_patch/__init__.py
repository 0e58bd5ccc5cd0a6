"""The hardened connector patch: the system under test, one folder per connector.

- ``pd/``: the hardened Mooncake P/D connector: pure rules (ledger, settle, settings, terminal,
  drain; no vLLM, torch or zmq) and the vLLM subclass (``pd/vllm_connector.py``).
- ``lookup/``: the AscendStore lookup RPC (protocol v1: client, server, backend; pyzmq and msgpack
  only), the model of today's code (``lookup/legacy.py``), the scheduler shim
  (``lookup/scheduler.py``) and the vllm-ascend subclasses (``lookup/ascend_store.py``).
- ``layerwise/``: the decoder-first layerwise connector: pure rules and the vllm-ascend subclass
  (``layerwise/ascend_connector.py``).
- ``vllm_plugin.py``: the vLLM general plugin that registers the connectors with vLLM's factory.

Only the subclasses and the plugin import vLLM (and vllm-ascend). Nothing here imports anything
else of this project (tests/harness/test_layering.py).
"""
