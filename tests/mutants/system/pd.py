"""The P/D family's system mutants: for each guarantee of the hardened connector
(connector_patch/DESIGN.md, "Hardened Mooncake P/D connector"), the hardened connector with that
guarantee switched off (site/pdchaos_mutants/connectors.py) and the scenarios that claim it.
``pdchaos mutate scenarios/pd/ scenarios/pd-long/prefill-down-same-engine.yaml`` (NoForgetPeer's scenario is in
the nightly's long set) runs each mutant as the ``hardened`` target of its scenarios, on
real nodes, and judges it against hardened's expectations: a deviation kills it.

Pure data (no vLLM): the harness reads it; only the mutant nodes import the site."""

from __future__ import annotations

from pathlib import Path

FAMILY = "pd"
TARGET = "hardened"
SITE = Path(__file__).resolve().parent / "site"
PREFIX = "HardenedMooncakeConnectorMutant"

# (mutant, the guarantee switched off, scenarios that claim it)
MUTANTS = [
    ("NoLoadDeadline", "1. every KV load on D ends within kv_load_timeout_ms", ["pd-fake-prefill-silent"]),
    ("TrustFinish", "1. a FINISH that leaves an asked request unnamed fails it", ["pd-fake-prefill-unknown-reqs"]),
    ("NoParamsCheck", "1. unusable kv_transfer_params: D computes the prompt itself", ["pd-bad-transfer-params"]),
    ("NoPeerMonitor", "2. dead peers found fast (the socket monitor of each pull)", ["pd-kill-prefill-before-pull"]),
    ("NoForgetPeer", "3. after a peer failure D asks the bootstrap server again", ["pd-prefill-down-same-engine"]),
    ("ListenerDies", "6. listeners always answer; threads survive", ["pd-prefill-side-channel-garbage"]),
    ("NoLateAnswer", "4. P answers a pull of a request it will never send at once",
     ["pd-stop-decode-past-abort-timeout"]),
    ("EosFrees", "found: P keeps the prompt's KV for D also when its one token is EOS",
     ["pd-eos-answer"]),
    ("LoudWait", "2. no busy wait: a node that only waits on a peer sleeps (quiet waiting)",
     ["pd-stop-decode", "pd-partition-prefill-decode"]),
    ("SyncWrite", "2. no busy wait: P's write that waits on a D taking no bytes sleeps (write.submit_and_wait)",
     ["pd-stop-decode-mid-write"]),
]


def profile_sets(mutant: str) -> list[str]:
    """The run's ``--set`` values that make the hardened target this mutant."""
    return [f"connectors.hardened.name={PREFIX}{mutant}", f"plugin_path={SITE}"]
