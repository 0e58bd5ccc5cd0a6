"""The hardened connector patch: the system under test.

Standalone: needs pyzmq and msgpack only (no vLLM, torch or NPU). Nothing here imports ``harness``
or ``faults``.
"""
