"""The hardened connector patch: the system under test.

The lookup RPC (``lookup/``, ``legacy.py``, ``scheduler.py``) needs pyzmq and msgpack only, and the
pure rules (``pd/``, ``layerwise/``) need nothing: no vLLM, torch or NPU. The connectors
(``vllm_mooncake.py``, ``ascend_store.py``, ``ascend_layerwise.py``) and their plugin
(``vllm_plugin.py``) run inside a vLLM server and import vLLM (and vllm-ascend). Nothing here
imports ``harness`` or ``faults``.
"""
