"""The lookup family's vllm-store stack (vLLM's store admin channel) from the harness's side: the
store-dialect bad requests each draw their code from the hardened protocol, the store fake peer
speaks both formats (real processes, the real hardened client), the stand-in worker's remove and
send queue behave as the scenarios claim, and scenario rules refuse what cannot work. The real
upstream/hardened servers and clients run in scenarios/store (CI) and tests/connector_patch/
test_store_vllm.py."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from connector_patch.lookup import MemoryBackend
from connector_patch.lookup.protocol import Limits, ProtocolError
from connector_patch.store import protocol as store
from connector_patch.store.client import StoreLookupClient
from families.lookup.fault_store import EXPECTED_STORE_CODE, STORE_REQUEST_KINDS, bad_store_requests
from families.lookup.server_node import FaultyBackend
from harness.schema import load_scenario
from nodes import Node

REPO = Path(__file__).resolve().parents[3]
STORE_DIR = REPO / "scenarios" / "store"
PRELOADED = [bytes([i]) * 32 for i in range(1, 9)]


@pytest.mark.parametrize("kind", STORE_REQUEST_KINDS)
def test_each_bad_store_request_draws_its_code(kind: str) -> None:
    frames_list = bad_store_requests(kind)
    assert frames_list
    for frames in frames_list:
        assert not store.is_reset(frames)
        with pytest.raises(ProtocolError) as err:
            store.decode_request(frames, Limits())
        assert err.value.code == EXPECTED_STORE_CODE[kind], (kind, len(frames))


def test_the_first_bad_request_is_one_upstream_dies_on() -> None:
    """Upstream's thread dies on a lookup short of frames (it reads frames 1-3 it was never sent):
    the default plan starts with those, so its verdict does not hang on the order."""
    assert STORE_REQUEST_KINDS[0] == "frame_count"
    assert [len(f) for f in bad_store_requests("frame_count")][:3] == [1, 2, 3]


def test_stand_in_remove_reports_failure_and_removes_nothing() -> None:
    from families.lookup.store_server import _StoreModel

    memory = MemoryBackend(block_size=16)
    memory.put([h.hex() for h in PRELOADED])
    faulty = FaultyBackend(memory)
    model = _StoreModel(faulty)
    faulty.set("clear_fails")
    assert model.remove_all(force=True) == -1 and len(memory) == len(PRELOADED)
    faulty.set("none")
    assert model.remove_all(force=True) == len(PRELOADED) and len(memory) == 0


def test_stand_in_send_queue_holds_puts_until_released() -> None:
    from connector_patch.lookup.backend import drain_queue
    from families.lookup.store_server import _Puts

    memory = MemoryBackend(block_size=16)
    puts = _Puts(memory)
    try:
        puts.queue_puts(3, 60.0)
        t0 = time.monotonic()
        assert drain_queue(puts.request_queue, 0.3) is False  # stuck: a bounded drain gives up
        assert 0.25 <= time.monotonic() - t0 < 2.0
        puts.release.set()
        assert drain_queue(puts.request_queue, 5.0) is True and len(memory) == 3
    finally:
        puts.closed.set()
        puts.release.set()


@pytest.fixture(scope="module")
def store_peers():
    d = tempfile.mkdtemp(prefix="pdc")
    with open(os.path.join(d, "preload.txt"), "w") as fh:
        fh.write("".join(h.hex() + "\n" for h in PRELOADED))
    nodes = {}
    try:
        for mode in ("slow", "legacy"):
            ep = f"ipc://{d}/{mode}"
            nodes[mode] = (ep, Node("fake-peer", ["--mode", mode, "--dialect", "store", "--endpoint", ep,
                                                  "--preload", os.path.join(d, "preload.txt")], d))
        for _, node in nodes.values():
            node.wait_ready()
        yield {m: ep for m, (ep, _) in nodes.items()}
    finally:
        for _, node in nodes.values():
            node.send(signal.SIGTERM)
        codes = [node.stop() for _, node in nodes.values()]
        shutil.rmtree(d, ignore_errors=True)
    assert codes == [0] * len(codes)


def test_store_fake_peer_answers_in_v1_envelopes_when_slow(store_peers) -> None:
    client = StoreLookupClient(store_peers["slow"], 500)
    try:
        assert client.lookup(128, PRELOADED[:5] + [b"\xee" * 32] * 3).hit_tokens == 80
        assert client.last_outcome == "ok"
        assert client.lookup(64, [b"\xee" * 32] * 4).hit_tokens == 0 and client.last_outcome == "ok"
        assert client.reset() is True
        assert client.lookup(128, PRELOADED).hit_tokens == 0  # cleared
    finally:
        client.close()


def test_store_fake_peer_legacy_is_upstreams_raw_format_refused_by_the_hardened_client(store_peers) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.RCVTIMEO, 2000)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(store_peers["legacy"])
    try:
        sock.send_multipart(store.encode_request(128, PRELOADED))
        assert sock.recv() == (128).to_bytes(4, "big")  # upstream's raw hit
    finally:
        sock.close(linger=0)
        ctx.term()
    client = StoreLookupClient(store_peers["legacy"], 500)
    try:
        t0 = time.monotonic()
        assert client.lookup(128, PRELOADED).hit_tokens == 0  # refused, a miss
        assert (client.last_outcome, client.last_code) == ("protocol", "LEGACY_REPLY")
        assert time.monotonic() - t0 < 0.5
        assert client.reset() is False and client.last_code == "LEGACY_REPLY"
    finally:
        client.close()


def _scenario(tmp_path: Path, **changes) -> Path:
    import yaml

    data = yaml.safe_load((STORE_DIR / "baseline.yaml").read_text())
    for key, value in changes.items():
        data[key] = value
    if data.get("faults"):  # a fault scenario names what its claim rests on (the baseline says none)
        data["triggers"] = [{"type": "ops_in_window", "fault": i} for i in range(len(data["faults"]))]
    data.pop("doc", None)
    data["expect"] = {t: "pass" for t in data["targets"]}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("changes, message", [
    ({"workload": {"duration": "3s", "concurrency": 2, "rate": 40}}, "set hbm: 0 and multigroup: 0"),
    ({"faults": [{"type": "malformed_requests", "at": "1s", "for": "1s"}]}, "use malformed_store_requests"),
    ({"topology": {"stack": "vllm-store", "transport": "tcp"}}, "needs transport: ipc, link: direct"),
    ({"topology": {"stack": "vllm-ascend", "twin": True}}, "twin: a second engine"),
    ({"topology": {"stack": "vllm-ascend"}, "targets": ["hardened"],
      "faults": [{"type": "stuck_puts", "at": "1s", "for": "1s"}]}, "needs topology.stack: vllm-store"),
    ({"targets": ["legacy"]}, "with topology.stack: vllm-store use upstream"),
])
def test_scenario_rules_name_what_cannot_work(tmp_path: Path, changes: dict, message: str) -> None:
    with pytest.raises(Exception) as err:
        load_scenario(_scenario(tmp_path, **changes))
    assert message in str(err.value)


def test_store_reset_is_allowed_for_upstream_and_paths_follow_the_target(tmp_path: Path) -> None:
    """Upstream's store channel has a reset (unlike AscendStore's today); upstream derives one
    path for every engine on the host, the hardened connector one per engine."""
    from families.lookup.topology import LookupTopology

    sc = load_scenario(STORE_DIR / "two-engines.yaml")
    assert load_scenario(STORE_DIR / "reset-clear-fails.yaml").workload.reset_at == 1.5
    paths = {}
    for target in ("upstream", "hardened"):
        d = tmp_path / target
        d.mkdir()
        t = LookupTopology(sc, target, d, lambda rec: None, {})
        try:
            server, twin = t.node_spec("server"), t.node_spec("twin")
            assert server.kind == twin.kind == "store-lookup-server"
            paths[target] = (server.endpoints["lookup"], twin.endpoints["lookup"])
            assert t.workload_config()["engine_id"] == "pdchaos-engine-a"
            assert (d / "twin-preload.txt").read_text() != (d / "preload.txt").read_text()
        finally:
            t.close()
    assert paths["upstream"][0] == paths["upstream"][1]
    assert paths["hardened"][0] != paths["hardened"][1]
