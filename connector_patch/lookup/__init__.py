"""Hardened AscendStore lookup RPC (protocol v1). See ``connector_patch/DESIGN.md``."""

from .backend import Backend, MemoryBackend, prefix_hit_tokens
from .client import DEFAULT_TIMEOUT_MS, LookupClient, validate_timeout_ms
from .protocol import PROTOCOL_VERSION, Code, Limits, ProtocolError
from .server import LookupServer

__all__ = [
    "Backend",
    "Code",
    "DEFAULT_TIMEOUT_MS",
    "Limits",
    "LookupClient",
    "LookupServer",
    "MemoryBackend",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "prefix_hit_tokens",
    "validate_timeout_ms",
]
