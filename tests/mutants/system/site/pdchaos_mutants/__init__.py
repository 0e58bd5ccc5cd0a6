"""System mutants of the hardened P/D connector: a vLLM general plugin that exists only for the
mutation run (``pdchaos mutate scenarios/pd/``, see tests/mutants/system/pd.py). It is never part
of ``connector_patch/`` and never on a node's path otherwise: the run puts this ``site/`` folder on
the mutant nodes' ``PYTHONPATH`` (pd profile field ``plugin_paths``) and selects one mutant by its
connector name (``connectors.hardened.name``). Each mutant is the hardened connector with exactly
one guarantee of connector_patch/DESIGN.md switched off (pdchaos_mutants/connectors.py).

``pdchaos_mutants.layerwise``: the hardened layerwise connector's mutants (tests/mutants/system/
layerwise.py), imported by a layerwise node given ``--hardened-class`` (never through this plugin)."""

from __future__ import annotations

NAMES = ("NoLoadDeadline", "TrustFinish", "NoParamsCheck", "NoPeerMonitor", "NoForgetPeer", "ListenerDies",
         "NoLateAnswer", "EosFrees", "LoudWait", "SyncWrite")
PREFIX = "HardenedMooncakeConnectorMutant"


def register() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    registry = getattr(KVConnectorFactory, "_registry", {})
    for name in NAMES:
        if PREFIX + name not in registry:  # vLLM calls general plugins in every process it starts
            KVConnectorFactory.register_connector(PREFIX + name, f"{__name__}.connectors", PREFIX + name)
