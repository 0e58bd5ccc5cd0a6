"""Pure rules of the hardened layerwise (decoder-first) connector: no vllm, torch or zmq here.

``connector_patch/layerwise/ascend_connector.py`` puts them into vllm-ascend's real classes.
"""

from .rules import (ACK, DONE, FAILED, GET_META, NACK_FIELDS, NACK_MALFORMED, NACK_UNKNOWN, Message,
                    RecvDeadlines, classify, post_failure)

__all__ = ["ACK", "DONE", "FAILED", "GET_META", "NACK_FIELDS", "NACK_MALFORMED", "NACK_UNKNOWN", "Message",
           "RecvDeadlines", "classify", "post_failure"]
