"""The endpoint rule of a node in a pod (nodekit/nodeio.py): with PDCHAOS_POD (set by the k8s
runtime's manifests) a node listens on its pod's addresses and names peers by their Services;
without it, loopback only; a public address never."""

from __future__ import annotations

import pytest

from nodekit.nodeio import NodeUsageError, check_endpoint

pytestmark = pytest.mark.timeout(10)
POD_ONLY = ["tcp://0.0.0.0:5599", "tcp://10.88.0.5:8000", "tcp://proxy.pdchaos-r1.svc:8080",
            "tcp://prefill-0.pdchaos-r1.svc.cluster.local:8998"]
NEVER = ["tcp://8.8.8.8:53", "tcp://example.com:80", "tcp://proxy.svc:80"]


@pytest.mark.parametrize("ep", POD_ONLY)
def test_pod_addresses_only_in_a_pod(ep, monkeypatch):
    monkeypatch.delenv("PDCHAOS_POD", raising=False)
    monkeypatch.delenv("PDCHAOS_NETNS", raising=False)
    with pytest.raises(NodeUsageError, match="--x: "):
        check_endpoint(ep, "--x")
    monkeypatch.setenv("PDCHAOS_POD", "1")
    assert check_endpoint(ep, "--x") == ep


@pytest.mark.parametrize("ep", NEVER)
def test_never_a_public_address_or_a_bare_name(ep, monkeypatch):
    monkeypatch.setenv("PDCHAOS_POD", "1")
    with pytest.raises(NodeUsageError, match="--x: "):
        check_endpoint(ep, "--x")
