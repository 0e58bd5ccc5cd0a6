"""Hardened admin channel of vLLM's MooncakeStoreConnector (lookup and reset). See ``connector_patch/DESIGN.md``.

Pure: pyzmq and msgpack only, like the lookup package whose client and server it reuses."""

from .client import StoreLookupClient
from .protocol import STORE, StoreRequest, StoreResult

__all__ = ["STORE", "StoreLookupClient", "StoreRequest", "StoreResult"]
