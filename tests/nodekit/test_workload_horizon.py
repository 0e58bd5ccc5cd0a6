"""The workload's horizon (nodekit/workload.py): the runner may move a workload's end later
when a fault healed too late for the ops ``recovery`` must see; the end never moves back."""

from __future__ import annotations

import threading
import time

import pytest

from nodekit.workload import Horizon, paced, run_workers


def test_horizon_follows_the_runner_never_before_the_duration_and_ignores_garbage(tmp_path, monkeypatch):
    path = tmp_path / "workload.horizon"
    t_end = time.monotonic() + 5.0
    monkeypatch.setattr(Horizon, "REREAD_S", 0.0)
    h = Horizon(t_end, str(path))
    assert h.end() == t_end  # no file yet
    path.write_text("not a number")
    assert h.end() == t_end
    path.write_text("nan")
    assert h.end() == t_end
    path.write_text(f"{t_end + 3:.6f}")
    assert h.end() == pytest.approx(t_end + 3, abs=1e-5)
    path.write_text("hold")  # held by the runner: the workers pause at this end, they do not leave
    assert h.end() == t_end and h.held() is True
    path.write_text(f"{t_end + 1:.6f}")  # then set: it may come back from inf
    assert h.end() == pytest.approx(t_end + 1, abs=1e-5)
    path.write_text(f"{t_end - 10:.6f}")  # never before the duration's end
    assert h.end() == t_end
    assert Horizon(t_end).end() == t_end  # no path: a plain end


def test_paced_workers_run_on_to_the_extended_end(tmp_path, monkeypatch):
    monkeypatch.setattr(Horizon, "REREAD_S", 0.0)
    path = tmp_path / "workload.horizon"
    t0 = time.monotonic()
    h = Horizon(t0 + 0.3, str(path))
    ticks: list[float] = []
    stop = threading.Event()

    def work(i: int, first_at: float) -> None:
        for _ in paced(first_at, h, 0.1, stop):
            ticks.append(time.monotonic() - t0)
            if len(ticks) == 2:
                path.write_text(f"{t0 + 0.8:.6f}")  # the runner extends while the worker runs

    stuck, crashed = run_workers(None, "t", 1, work, t_start=t0, t_end=h, interval=0.1, grace=1.0)
    assert not stuck and not crashed
    assert max(ticks) > 0.6  # past the first end (0.3 s), up to the new one (0.8 s)
    assert max(ticks) <= 0.8 + 0.3  # none due after the new end (a tick comes a moment after its op is due)


def test_plain_end_is_unchanged(tmp_path):
    stop = threading.Event()
    t0 = time.monotonic()
    got = list(paced(t0, t0 + 0.25, 0.1, stop))
    assert got == [0, 1, 2]


class _Topo:
    def __init__(self, run_dir):
        self.horizon_path = run_dir / "workload.horizon"
        self.events: list[dict] = []

    def event(self, what: str, **kw) -> None:
        self.events.append({"what": what, **kw})


def _run_for(tmp_path, checks: str):
    from harness.runner import GRACE_S, _ScenarioRun
    from harness.schema import load_scenario

    p = tmp_path / "s.yaml"
    p.write_text("name: t-horizon\nfamily: lookup\nseed: 1\ntargets: [hardened, legacy]\n"
                 "workload: {duration: 3s, concurrency: 2, rate: 4}\n"
                 "faults:\n  - {type: slow_peer, at: 1s, for: 0.5s, delay: 500ms}\n"
                 "triggers: [{type: ops_in_window, fault: 0}]\n"
                 f"{checks}expect: {{hardened: pass, legacy: pass}}\n")
    run = object.__new__(_ScenarioRun)
    run.sc, run.topo = load_scenario(p), _Topo(tmp_path)
    now = time.monotonic()
    run.horizon, run.op_s = now - 1.0, 2.0  # the duration already ended: a late heal
    run.end_at = run.horizon + run.op_s + 2 * GRACE_S
    return run, now


def test_a_late_heal_extends_the_workload_for_the_recovery_ops(tmp_path):
    from harness.runner import GRACE_S, RELEASE_MARGIN_S

    run, now = _run_for(tmp_path, "checks: {recovery: {within: 2}}\n")
    run.holding = True
    assert run._recovery_gap() == 2 * (2 / 4)  # 2 ops of each worker, one every 0.5 s
    run._release("slow_peer", 0)
    need = float(run.topo.horizon_path.read_text())
    assert need >= now + 1.0 + RELEASE_MARGIN_S
    assert run.horizon == pytest.approx(need, abs=1e-5) and run.end_at == run.horizon + run.op_s + 2 * GRACE_S
    assert run.topo.events[0]["what"] == "workload_extended" and not run.holding


def test_a_heal_in_time_leaves_the_duration_s_end(tmp_path):
    run, now = _run_for(tmp_path, "checks: {recovery: {within: 2}}\n")
    run.horizon = now + 100  # the duration ends well after the heal
    run.holding = True
    run._release("slow_peer", 0)
    assert float(run.topo.horizon_path.read_text()) == pytest.approx(now + 100, abs=1e-5)
    assert not run.topo.events  # not extended


def test_no_hold_when_recovery_is_off(tmp_path):
    run, _ = _run_for(tmp_path, "checks: {recovery: {enabled: false}}\n")
    assert run._recovery_gap() is None  # execute() then neither holds the end open nor moves it


def test_held_workers_pause_at_the_duration_and_go_on_after_the_release(tmp_path, monkeypatch):
    monkeypatch.setattr(Horizon, "REREAD_S", 0.0)
    path = tmp_path / "workload.horizon"
    path.write_text("hold")  # the runner holds the workers before the start signal
    t0 = time.monotonic()
    h = Horizon(t0 + 0.2, str(path))
    ticks: list[float] = []
    released: list[float] = []

    def release() -> None:
        time.sleep(0.8)  # the last heal comes well after the duration's end
        released.append(time.monotonic())
        path.write_text(f"{released[0] + 0.35:.6f}")

    threading.Thread(target=release, daemon=True).start()

    def work(i: int, first_at: float) -> None:
        for _ in paced(first_at, h, 0.1, threading.Event()):
            ticks.append(time.monotonic())

    stuck, crashed = run_workers(None, "t", 1, work, t_start=t0, t_end=h, interval=0.1, grace=0.5)
    assert not stuck and not crashed
    before = [t for t in ticks if t < released[0]]
    after = [t for t in ticks if t >= released[0]]
    assert before and max(before) - t0 <= 0.2 + 0.3  # paused at the duration's end (0.2 s), no op while held
    assert len(after) >= 3  # then paced again from the release: ops at once, +0.1, +0.2, ...
    assert max(after) <= released[0] + 0.35 + 0.3  # and none due past the end the runner set


def test_a_stop_ends_a_pause(tmp_path):
    path = tmp_path / "workload.horizon"
    path.write_text("hold")
    stop = threading.Event()
    h = Horizon(time.monotonic() - 1.0, str(path))
    threading.Timer(0.2, stop.set).start()
    assert list(paced(time.monotonic() - 1.0, h, 0.1, stop)) == []  # held at once, then stopped: no op


def test_pd_a_replaced_decode_taints_prefill_only():
    from types import SimpleNamespace

    from families.pd.topology import PDTopology

    t = SimpleNamespace(nodes={"prefill:0": 1, "decode:0": 2, "proxy": 3})
    assert PDTopology.stale_peers(t, "decode:0") == ["prefill:0"]  # P's transfer engine knew the old D
    assert PDTopology.stale_peers(t, "prefill:0") == []
    assert PDTopology.stale_peers(t, "proxy") == []


def test_retire_taints_the_stale_peers():
    from types import SimpleNamespace

    from harness.topology import BaseTopology

    tainted = []
    proc = SimpleNamespace(alive=False, pid=1, instance=1, kill=lambda: None, stop=lambda s: None, returncode=0)
    t = SimpleNamespace(nodes={"decode:0": SimpleNamespace(client=None, handle=proc, frozen=False, kind="vllm")},
                        _retired=[], stale_peers=lambda role: ["prefill:0"],
                        taint=lambda role, why: tainted.append((role, why)), event=lambda *a, **k: None)
    BaseTopology._retire(t, "decode:0", "kill")
    assert tainted and tainted[0][0] == "prefill:0" and "killed" in tainted[0][1]


def test_no_op_is_due_inside_a_pause_and_pacing_goes_on_after_it():
    t0 = time.monotonic()
    ticks = [time.monotonic() - t0 for _ in paced(t0, t0 + 1.0, 0.1, threading.Event(), [(t0 + 0.25, t0 + 0.62)])]
    assert len(ticks) == 6  # 0, 0.1, 0.2, then 0.7, 0.8, 0.9: 0.3 .. 0.6 fall in the pause
    assert not any(0.25 <= x < 0.62 for x in ticks)
    assert ticks[3] >= 0.62


def test_a_worker_behind_schedule_starts_no_op_inside_a_pause():
    """Issue 30, item 15: each failing pull took its 2 s deadline at a 1 s interval, so a worker
    came for a tick due before the pause only once the pause had begun and started it there (39
    requests inside an 8 s pause, measured with 8 workers). The tick is skipped like those due in it."""
    t0 = time.monotonic()
    started = []
    for k in paced(t0, t0 + 1.2, 0.1, threading.Event(), [(t0 + 0.25, t0 + 0.7)]):
        started.append(time.monotonic() - t0)
        if k == 1:
            time.sleep(0.3)  # the call of tick 1 (due 0.1) overruns: tick 2 (due 0.2) is late
    assert not any(0.25 <= x < 0.7 for x in started), started
    assert started[2] >= 0.7 and len(started) >= 6  # paced again after the pause: 0.7 .. 1.1
