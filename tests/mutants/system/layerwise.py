"""The layerwise family's system mutants: for each guarantee of the hardened layerwise connector
(connector_patch/layerwise/ascend_connector.py; issue 21's fixes among them), that connector with the
guarantee switched off (site/pdchaos_mutants/layerwise.py) and the scenarios that claim it.
``pdchaos mutate scenarios/ascend-cpu/`` runs each mutant as the ``hardened`` target of its
scenarios, on the conformance env's nodes, and judges it against hardened's expectations: a
deviation kills it.

Pure data (no vLLM): the harness reads it; only the mutant nodes import the site."""

from __future__ import annotations

from pathlib import Path

FAMILY = "layerwise"
TARGET = "hardened"
SITE = Path(__file__).resolve().parent / "site"
PREFIX = "HardenedMooncakeLayerwiseConnectorMutant"

# (mutant, the guarantee switched off, scenarios that claim it)
MUTANTS = [
    ("NoRecvDeadline", "D fails a request that hears no DONE/FAILED within layerwise_recv_timeout_s",
     ["layerwise-completion-lost"]),
    ("ListenerDies", "D's listener answers every message and survives it", ["layerwise-listener-garbage"]),
    ("UpstreamSender", "a failed write on P fails its requests (D told FAILED), never the sending thread",
     ["layerwise-transfer-error", "layerwise-batched-transfer-error"]),
    ("MetaCheckOnMiss", "issue 21: a request whose metadata query failed is skipped on every later layer, also "
                        "once another request filled the cache (never DONE after a skipped layer)",
     ["layerwise-batched-meta-query-fail"]),
    ("NoPostDeadline", "D's metaserver POST is bounded (metaserver_timeout_s): a hung proxy fails the request",
     ["layerwise-metaserver-fail"]),
    ("ResendPost", "issue 21: D never sends one metaserver POST twice (not idempotent: P could get the request "
                   "twice)", ["layerwise-metaserver-fail"]),
    ("FreeAtDeadline", "issue 21: a request D failed itself keeps its blocks until P cannot write them (P's last word, "
                       "or its write-by time plus the grace)",
     ["layerwise-slow-write", "layerwise-slow-prefill-upstream-proxy"]),
    ("WritePastWriteBy", "issue 21: P never starts a write past the write-by time D sent (D may free the blocks "
                         "after it plus the grace)", ["layerwise-slow-write"]),
    ("StaleFailedAdd", "issue 21: a failed write fails the requests of its own D session only (upstream's sender "
                       "also marks the loop variable left over: another D's request)",
     ["layerwise-two-decodes-transfer-error"]),
]


def profile_sets(mutant: str) -> list[str]:
    """The run's ``--set`` values that make the hardened target this mutant."""
    return [f"hardened_class=pdchaos_mutants.layerwise:{PREFIX}{mutant}", f"plugin_path={SITE}"]
