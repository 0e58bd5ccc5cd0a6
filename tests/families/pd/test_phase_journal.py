"""The P/D phase journal's wrapping rules (families/pd/node_instruments/pdchaos_waf/phases.py).

On real vLLM nodes the journal is proven by the runs of scenarios/pd/stop-prefill-serving-pull.yaml
and scenarios/pd-phases/ (docs/interleavings.md: the events of both targets, the fault's lag). Here
the rules that make each event come once per call on either target are checked on two small
classes shaped as vLLM's ``MooncakeConnectorWorker`` and a subclass that, like the hardened worker,
calls some of its functions through ``super()`` and replaces another without it (importing vLLM
here would cost a torch import and tie the test to the node env; the real classes run in the nodes).
Events are read back from the real file the instrument appends to.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from families.pd.node_instruments.pdchaos_waf import phases as P


class Upstream:  # the names and call shapes of vLLM 0.32.0's worker functions the journal wraps
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def send_kv_to_decode(self, identity, sock, meta):  # noqa: ANN001
        self.calls.append("serve")
        await asyncio.to_thread(self._send_blocks, "session", [1], [2], [3])  # upstream: run_in_executor

    def _send_blocks(self, remote_session, src, dst, lengths) -> int:  # noqa: ANN001
        self.calls.append("write")
        return 0

    async def _connect_to_prefiller_bootstrap(self, addr: str) -> None:
        self.calls.append("query")

    async def receive_kv_from_single_worker(self, worker_addr, pull_metas):  # noqa: ANN001
        self.calls.append("pull-upstream")


class Hardened(Upstream):  # as connector_patch/pd/vllm_connector.py's worker
    async def send_kv_to_decode(self, identity, sock, meta):  # noqa: ANN001
        if meta == "dead":  # answered without upstream's code: no pull served
            return
        await super().send_kv_to_decode(identity, sock, meta)

    async def _connect_to_prefiller_bootstrap(self, addr: str) -> None:
        await super()._connect_to_prefiller_bootstrap(addr)

    async def receive_kv_from_single_worker(self, worker_addr, pull_metas):  # noqa: ANN001 - no super()
        self.calls.append("pull-hardened")
        await self._cancel_round(worker_addr, {})

    async def _cancel_round(self, addr, tids):  # noqa: ANN001
        self.calls.append("cancel")

    def _send_blocks(self, remote_session, src, dst, lengths) -> int:  # noqa: ANN001 - chunked, no super() (7a)
        self.calls.append("write-hardened")
        return 0


@pytest.fixture()
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "node.log.phases.jsonl"
    monkeypatch.setenv(P.ENV, str(path))
    P._fd.clear()
    return path


def _events(path: Path, ordered: bool = True) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(set(r) == {"t", "phase", "pid"} for r in rows)  # names, times and pids only
    if ordered:  # one thread: in time order (threads may append out of order: the nemesis sorts by t)
        assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)
    return [r["phase"] for r in rows]


async def _drive(w: Upstream, meta: str = "live") -> None:
    await w.send_kv_to_decode(b"id", None, meta)
    await w._connect_to_prefiller_bootstrap("http://p")
    await w.receive_kv_from_single_worker("tcp://p", {})


@pytest.mark.parametrize("cls, expected", [
    (Upstream, ["p_pull_served", "p_write_started", "p_write_done", "p_pull_answered", "d_bootstrap_query_out",
                "d_pull_out"]),
    (Hardened, ["p_pull_served", "p_write_started", "p_write_done", "p_pull_answered", "d_bootstrap_query_out",
                "d_pull_out", "d_cancel_sent"]),
])
def test_each_event_is_written_once_per_call_on_either_worker(journal: Path, cls: type, expected: list[str]) -> None:
    P.install(Upstream)
    P.install(Upstream)  # twice (two plugins' loads): still one wrapper each
    w = cls()
    asyncio.run(_drive(w))
    assert _events(journal) == expected
    assert "pull-hardened" in w.calls if cls is Hardened else "pull-upstream" in w.calls


def test_a_pull_the_hardened_worker_answers_itself_is_not_served(journal: Path) -> None:
    P.install(Upstream)
    asyncio.run(Hardened().send_kv_to_decode(b"id", None, "dead"))
    assert not journal.exists() or _events(journal) == []


def test_no_file_named_no_events_and_a_broken_file_never_breaks_the_node(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    P.install(Upstream)
    monkeypatch.delenv(P.ENV, raising=False)
    P._fd.clear()
    w = Upstream()
    asyncio.run(_drive(w))
    assert w.calls == ["serve", "write", "query", "pull-upstream"] and not list(tmp_path.iterdir())
    monkeypatch.setenv(P.ENV, str(tmp_path / "no-such-folder" / "x.jsonl"))
    asyncio.run(_drive(w))  # the write fails inside emit: the call goes on
    assert w.calls[-4:] == ["serve", "write", "query", "pull-upstream"]


def test_lines_from_threads_never_interleave(journal: Path) -> None:
    def many() -> None:
        for _ in range(300):
            P.emit("p_write_started")
    threads = [threading.Thread(target=many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert _events(journal, ordered=False).count("p_write_started") == 1200  # every line whole
