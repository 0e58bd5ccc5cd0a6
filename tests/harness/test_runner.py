"""The scenario runner end to end: real node processes, real sockets, real journals.

Small scenarios (1 s of workload) so the file stays fast. Covers: a clean run and its outputs,
offline re-check giving the same verdicts, a target that hangs forever reported as stalled while
the runner still finishes, cleanup after SIGINT to the runner, no leftovers, bad input.
"""

from __future__ import annotations

import json
import os
import socket
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nodekit import journal as J

PDCHAOS = [sys.executable, "-m", "harness.cli"]


def write(tmp: Path, name: str, body: str) -> Path:
    p = tmp / f"{name}.yaml"
    p.write_text(textwrap.dedent(body).lstrip())
    return p


def run_cli(*args: str, timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(PDCHAOS + list(args), capture_output=True, text=True, timeout=timeout, cwd=cwd)


def pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # a zombie of an already-exited child is not "alive"
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split()[2] == "Z":
                    continue
        except OSError:
            continue
        alive.append(pid)
    return alive


def started_pids(run_dir: Path) -> list[int]:
    pids = []
    for _, _, path in J.iter_runs(run_dir):
        for r in J.read_journal(path):
            if r.get("type") == "event" and r.get("what") == "process_start":
                pids.append(r["pid"])
            if r.get("type") == "probe" and r.get("node") == "client" and "pid" in r:
                pids.append(r["pid"])
    return pids


CLEAN = """
name: clean
family: lookup
seed: 3
deadline: 200ms
topology: {transport: TRANSPORT, groups: 2, preload_blocks: 32}
workload: {duration: 1s, concurrency: 2, rate: 80}
triggers: {none: "baseline without faults"}
expect: {hardened: pass, legacy: pass}
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_clean_run_outputs_and_offline_check(tmp_path: Path, transport: str) -> None:
    write(tmp_path, "clean", CLEAN.replace("TRANSPORT", transport))
    runs = tmp_path / "runs"
    proc = run_cli("run", str(tmp_path / "clean.yaml"), "--runs-dir", str(runs), "--no-report", "--plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list(runs.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    verdicts = {(r["scenario"], r["target"]): r["verdict"] for r in summary["results"]}
    assert verdicts == {("clean", "hardened"): "pass", ("clean", "legacy"): "pass"}
    for target in ("hardened", "legacy"):
        recs = J.read_journal(run_dir / "clean" / target / "journal.jsonl")
        ops = J.ops(recs)
        assert len(ops) >= 50  # 80 ops/s for 1 s
        assert all(o["phase"] == "ok" and o["value"] == o["expected"] for o in ops)
        assert {o["kind"] for o in ops} >= {"full", "partial", "miss"}
        assert any(o["expected"] > 0 for o in ops) and any(o["expected"] == 0 for o in ops)
    junit = (run_dir / "junit.xml").read_text()
    assert junit.count("<testcase") == 2 and "<failure" not in junit
    # offline re-check: the same verdicts from the journals alone
    check = run_cli("check", str(run_dir))
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("(same as saved)") == 2
    # nothing left behind
    assert pids_alive(started_pids(run_dir)) == []
    for _, _, path in J.iter_runs(run_dir):
        for r in J.read_journal(path):
            assert not (r.get("type") == "event" and r.get("what") == "leftovers"), r


HANG = """
family: lookup
name: silent-peer-forever
seed: 5
deadline: 200ms
cap: 20s
topology: {transport: ipc}
workload: {duration: 1500ms, concurrency: 1, rate: 20}
faults:
  - {type: silent_peer, at: 300ms, for: 500ms}
triggers: [{type: ops_in_window, fault: 0}]
expect:
  hardened: pass
  # its one worker waits forever: the op never returns (no_stall, bounded_return), no op follows
  # the window (recovery), and the hung call's thread is left behind (no_leaks)
  legacy: {verdict: stall, failing: [bounded_return, no_leaks, no_stall, recovery]}
"""


@pytest.mark.timeout(90)
def test_legacy_hangs_forever_is_reported_stalled(tmp_path: Path) -> None:
    write(tmp_path, "hang", HANG)
    runs = tmp_path / "runs"
    t = time.monotonic()
    proc = run_cli("run", str(tmp_path / "hang.yaml"), "--runs-dir", str(runs), "--no-report", "--plain",
                   "--target", "legacy")
    elapsed = time.monotonic() - t
    assert proc.returncode == 0, proc.stdout + proc.stderr  # stall was the expected verdict
    assert elapsed < 20
    (run_dir,) = list(runs.iterdir())
    recs = J.read_journal(run_dir / "silent-peer-forever" / "legacy" / "journal.jsonl")
    stalled = [o for o in J.ops(recs) if o["outcome"] == "stalled"]
    # one worker: its request went to the silent peer, which was then replaced; the legacy REQ
    # socket waits for that reply forever
    assert len(stalled) == 1
    final = [r for r in recs if r.get("type") == "probe" and r.get("node") == "client" and r.get("when") == "final"]
    assert final and final[0]["stuck_workers"] == 1  # the workload left its hung call behind and exited
    # the harness takes the nodes' final probes at teardown, after every heal: the after-the-run
    # checks judge only such probes (harness/checks.py final_too_early)
    heal = max(r["t"] for r in recs if r.get("type") == "fault" and r.get("phase") == "stop")
    nodes_final = [r for r in recs if r.get("type") == "probe" and r.get("when") == "final" and r.get("node") != "client"]
    assert nodes_final and all(r["t"] > heal for r in nodes_final)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["results"][0]["verdict"] == "stall"
    assert pids_alive(started_pids(run_dir)) == []


def wait_until_running(runs: Path, timeout_s: float = 20.0) -> Path:
    """The journal of the long-run scenario, once its workload has recorded some ops."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        parts = list(runs.glob("*/long-run/hardened/ops.part.jsonl"))
        if parts and parts[0].stat().st_size > 2000:
            return parts[0].parent / "journal.jsonl"
        time.sleep(0.1)
    raise AssertionError("the run never started")


SLOW = """
name: long-run
family: lookup
seed: 9
deadline: 200ms
cap: 60s
workload: {duration: 30s, concurrency: 1, rate: 20}
triggers: {none: "no fault: a long run to interrupt"}
expect: {hardened: pass, legacy: pass}
"""


@pytest.mark.timeout(60)
def test_sigint_to_runner_tears_everything_down(tmp_path: Path) -> None:
    write(tmp_path, "long", SLOW)
    runs = tmp_path / "runs"
    proc = subprocess.Popen(PDCHAOS + ["run", str(tmp_path / "long.yaml"), "--runs-dir", str(runs), "--no-report",
                                       "--plain"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        journal = wait_until_running(runs)
        pids = [r["pid"] for r in J.read_journal(journal) if r.get("what") == "process_start"]
        assert pids
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    assert pids_alive(pids) == []
    run_dir = journal.parent.parent.parent
    assert pids_alive(started_pids(run_dir)) == []
    assert list(Path("/tmp").glob(f"pdc-{proc.pid}-*")) == []  # this runner's ipc folder is gone
    recs = J.read_journal(journal)
    assert recs[-1]["type"] == "end" and recs[-1]["reason"] == "interrupted"
    assert J.ops(recs), "ops recorded before the interrupt were kept"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("body,expect", [
    ("name: x\nfamily: lookup\nworkload: {duration: -1s}\n", "workload.duration: expected a duration"),
    ("name: x\nfamily: lookup\nfaults:\n  - {type: no_such_fault, at: 1s, for: 1s}\n", "unknown fault type 'no_such_fault'"),
    ("name: x\nfamily: lookup\nworkload: {duration: 2s}\ncap: 1s\n", "cap must be longer"),
    ("name: x\nfamily: lookup\nbogus: 1\n", "bogus: unknown field"),
    ("name: x\nfamily: lookup\nchecks: {nonsense: {}}\n", "checks.nonsense"),
    ("name: [unclosed\n", "invalid YAML"),
    ("name: x\nworkload: {duration: 2s}\n", "family: missing: every scenario names its system under test"),
    ("name: x\nfamily: lookup\ntopology: {link: toxiproxy}\n", "needs transport: tcp"),
    ("name: x\nfamily: lookup\ntriggers:\n  - {type: no_such_trigger}\n",
     "unknown trigger type 'no_such_trigger'; known: ops_completed, ops_in_window"),
    ("name: x\nfamily: lookup\nfaults:\n  - {type: server_kill, at: 1s, for: 1s}\ntriggers:\n"
     "  - {type: ops_in_window, fault: 1}\n", "triggers[0] (ops_in_window): fault 1 is not an entry of faults"),
    # issue 43, item 6: every scenario declares its triggers; a scenario with faults cannot say none
    ("name: x\nfamily: lookup\nfaults:\n  - {type: server_kill, at: 1s, for: 1s}\n",
     "triggers: missing: a scenario with faults names the events its claim rests on"),
    ("name: x\nfamily: lookup\nfaults:\n  - {type: server_kill, at: 1s, for: 1s}\ntriggers: []\n",
     "triggers: missing: a scenario with faults names the events its claim rests on"),
    ("name: x\nfamily: lookup\nfaults:\n  - {type: server_kill, at: 1s, for: 1s}\ntriggers: {none: baseline}\n",
     "triggers: a scenario with faults cannot say none ('baseline')"),
    ("name: x\nfamily: lookup\n", "triggers: missing: name the events this scenario's claim rests on, or say"),
    ("name: x\nfamily: lookup\ntriggers: {none: \"  \"}\n", "triggers.none: a reason is required: say why the claim rests on no event"),
    ("name: x\nfamily: lookup\ntriggers: {none: \"\"}\n", "triggers.none: String should have at least 1 character"),
    ("name: x\nfamily: lookup\ntriggers: {none: a, why: b}\n", "triggers.why: unknown field"),
    ("name: x\nfamily: pd\nworkload: {duration: 4s, rate: 1, lead_prompts: [7]}\n",
     "lead_prompts[0] = 7: not a prompt of this run"),
])
def test_bad_scenario_is_one_clear_error_and_nothing_starts(tmp_path: Path, body: str, expect: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(body)
    runs = tmp_path / "runs"
    proc = run_cli("run", str(p), "--runs-dir", str(runs))
    assert proc.returncode == 2
    assert expect in proc.stderr, proc.stderr
    assert str(p) in proc.stderr and "Traceback" not in proc.stderr
    assert not runs.exists(), "nothing may start on invalid input"


@pytest.mark.timeout(30)
def test_error_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nfamily: lookup\nseed: 1\nworkload:\n  duration: 2s\n  rate: -5\n")
    proc = run_cli("validate", str(p))
    assert proc.returncode == 2
    assert f"{p}:6: workload.rate" in proc.stderr, proc.stderr


@pytest.mark.timeout(30)
def test_schema_list_validate(tmp_path: Path) -> None:
    schema = run_cli("schema")
    assert schema.returncode == 0
    doc = json.loads(schema.stdout)
    branches = doc.get("oneOf", [doc])  # one branch per family, selected by `family`
    assert len(branches) >= 2
    for b in branches:
        assert "faults" in b["properties"] and "workload" in b["properties"] and "family" in b["properties"]
    assert {b["properties"]["family"]["default"] for b in branches} >= {"lookup", "pd"}
    write(tmp_path, "clean", CLEAN.replace("TRANSPORT", "ipc"))
    listed = run_cli("list", str(tmp_path))
    assert listed.returncode == 0 and "clean" in listed.stdout
    assert run_cli("validate", str(tmp_path)).returncode == 0
    assert run_cli("run", str(tmp_path / "nope.yaml")).returncode == 2


@pytest.mark.timeout(60)
def test_nodes_die_with_a_crashed_runner_and_the_next_run_sweeps(tmp_path: Path) -> None:
    """SIGKILL to the runner (no teardown at all): its nodes notice and exit, and the next run
    removes the ipc folder the dead runner left."""
    write(tmp_path, "long", SLOW)
    runs = tmp_path / "runs"
    proc = subprocess.Popen(PDCHAOS + ["run", str(tmp_path / "long.yaml"), "--runs-dir", str(runs), "--no-report",
                                       "--plain"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        journal = wait_until_running(runs)
        pids = [r["pid"] for r in J.read_journal(journal) if r.get("what") == "process_start"]
        assert len(pids) >= 2  # server and workload
        proc.kill()
        proc.wait(5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 5
    while pids_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids_alive(pids) == []
    # the killed runner's ipc folder may still be there (nothing of it could remove it; another
    # runner on this machine may already have swept it), but its nodes removed their sockets
    stale = list(Path("/tmp").glob(f"pdc-{proc.pid}-*"))
    assert not [p for d in stale for p in d.iterdir() if p.suffix == ".sock"], "nodes removed their sockets"
    write(tmp_path, "clean", CLEAN.replace("TRANSPORT", "ipc").replace("duration: 1s", "duration: 300ms"))
    again = run_cli("run", str(tmp_path / "clean.yaml"), "--runs-dir", str(tmp_path / "runs2"), "--no-report",
                    "--target", "hardened")
    assert again.returncode == 0, again.stdout + again.stderr
    assert not list(Path("/tmp").glob(f"pdc-{proc.pid}-*"))


@pytest.mark.timeout(120)
def test_pytest_plugin_collects_scenarios_and_reports_deviations(tmp_path: Path) -> None:
    """`pytest --pdchaos FILE`: one item per target; a target that deviates fails with its checks."""
    ok = write(tmp_path, "fine", CLEAN.replace("TRANSPORT", "ipc").replace("duration: 1s", "duration: 500ms"))
    # expecting a failure from a target that passes is a deviation the plugin must report as a failure
    bad = write(tmp_path, "wrong", CLEAN.replace("TRANSPORT", "ipc").replace("duration: 1s", "duration: 500ms")
                .replace("name: clean", "name: wrong-expectation")
                .replace("expect: {hardened: pass, legacy: pass}",
                         "expect: {hardened: {verdict: fail, failing: [bounded_return]}}\ntargets: [hardened]"))
    proc = subprocess.run([sys.executable, "-m", "pytest", "--pdchaos", str(ok), str(bad), "-q", "-p", "no:cacheprovider",
                           "--pdchaos-runs-dir", str(tmp_path / "runs"), "--junitxml", str(tmp_path / "j.xml"),
                           "-o", "testpaths=", "--rootdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=110, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "2 passed" in out and "1 failed" in out, out
    assert "verdict pass, expected fail[bounded_return]" in out and "bounded_return did not fail" in out, out
    junit = (tmp_path / "j.xml").read_text()
    assert junit.count("<testcase") == 3
    assert list((tmp_path / "runs").glob("*/summary.json"))


@pytest.mark.timeout(60)
def test_tcp_port_and_ipc_files_are_free_after_a_run(tmp_path: Path) -> None:
    import socket

    write(tmp_path, "clean", CLEAN.replace("TRANSPORT", "tcp").replace("duration: 1s", "duration: 300ms"))
    runs = tmp_path / "runs"
    proc = run_cli("run", str(tmp_path / "clean.yaml"), "--runs-dir", str(runs), "--no-report", "--target", "hardened")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list(runs.iterdir())
    cfg = json.loads((run_dir / "clean" / "hardened" / "workload.json").read_text())
    port = int(cfg["endpoint"].rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))  # nothing still listens on the server's port


@pytest.mark.timeout(30)
def test_free_tcp_ports_are_not_handed_out_twice(monkeypatch) -> None:
    """One topology asks for many ports before any node binds: a port handed out lately is never
    handed out again, even when the kernel offers it again (here: it always offers the same two)."""
    from harness import topology as T

    offered = iter([40001, 40001, 40002, 40001, 40002, 40003] + [40003] * 300)

    class FakeSocket:
        def __init__(self, *a):
            self.port = next(offered)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def bind(self, addr):
            pass

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(T, "_PORTS_GIVEN", {})
    monkeypatch.setattr(T.socket, "socket", FakeSocket)
    monkeypatch.setattr(T, "_ephemeral_low", lambda: T._PORT_LOW + 512)  # no room below: bind(0)
    assert [T.free_tcp_port() for _ in range(3)] == [40001, 40002, 40003]
    with pytest.raises(T.HarnessError, match="no free TCP port"):
        T.free_tcp_port()
    monkeypatch.undo()
    real = [T.free_tcp_port() for _ in range(300)]
    assert len(set(real)) == 300


@pytest.mark.timeout(30)
def test_free_tcp_ports_lie_outside_the_ephemeral_range(monkeypatch) -> None:
    """A port the kernel may give to an outgoing connection can be taken before the node binds it
    (CI saw it): handed-out ports lie below the ephemeral range, with room for derived ports, and a
    port something already listens on is never handed out."""
    monkeypatch.delenv("PDCHAOS_PORT_SLICE", raising=False)  # the whole range (pytest workers set a slice)
    from harness import topology as T

    low = T._ephemeral_low()
    ports = [T.free_tcp_port() for _ in range(200)]
    assert all(T._PORT_LOW <= p < low - T._PORT_MARGIN for p in ports), (low, min(ports), max(ports))
    held = []
    # a range of its own, inside the kernel's ephemeral range, where no harness process (the other
    # pytest worker's nodes included) is handed ports: holding these cannot take one from them
    monkeypatch.setattr(T, "_PORT_LOW", low + 2048)
    monkeypatch.setattr(T, "_ephemeral_low", lambda: T._PORT_LOW + 1024 + T._PORT_MARGIN + 4)
    for port in range(T._PORT_LOW, T._PORT_LOW + 1024):  # all but four ports of the range taken
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
            held.append(s)
        except OSError:
            s.close()
    try:
        monkeypatch.setattr(T, "_PORTS_GIVEN", {})
        # the four ports left lie in the kernel's ephemeral range, so another process's outgoing
        # connection may hold one for a moment (CI saw it): every port handed out is one of the four,
        # none twice, and once they are gone the harness says so instead of handing out a held one
        got = []
        with pytest.raises(T.HarnessError, match="no free TCP port"):
            for _ in range(5):
                got.append(T.free_tcp_port())
        assert set(got) <= set(range(T._PORT_LOW + 1024, T._PORT_LOW + 1028))
        assert len(set(got)) == len(got) >= 1
    finally:
        for s in held:
            s.close()


def test_each_port_slice_hands_out_ports_of_its_own_part_only(monkeypatch) -> None:
    """Two harness processes on one machine (pytest's two workers) never pick the same port: each
    takes ports from its own part of the range, derived ports (port + rank) included."""
    import harness.topology as T

    monkeypatch.setattr(T, "_PORTS_GIVEN", {})
    got = {}
    for i in (0, 1):
        monkeypatch.setenv("PDCHAOS_PORT_SLICE", f"{i}/2")
        got[i] = [T.free_tcp_port() for _ in range(100)]
    assert max(got[0]) + T._PORT_MARGIN <= min(got[1])
    for bad in ("2/2", "x", "1/0", "-1/2"):
        monkeypatch.setenv("PDCHAOS_PORT_SLICE", bad)
        with pytest.raises(T.HarnessError, match="PDCHAOS_PORT_SLICE"):
            T.free_tcp_port()


def test_a_pytest_call_that_collects_scenarios_runs_them_one_at_a_time() -> None:
    """pyproject.toml runs tests/ in two xdist workers; `pytest scenarios/...` (the plugin's use)
    gets -n 0: its items must not share the machine (harness/pytest_plugin.py)."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-m", "pytest", "scenarios/network/", "--pdchaos-target", "none-such",
                          "-p", "no:cacheprovider"], cwd=root, capture_output=True, text=True, timeout=110)
    assert "collected 0 items" in out.stdout and "workers" not in out.stdout, out.stdout[-2000:]
    from harness.pytest_plugin import _collects_scenarios

    assert _collects_scenarios(["scenarios/lookup"]) and _collects_scenarios(["--pdchaos", "x.yaml"])
    assert _collects_scenarios(["scenarios/pd/baseline.yaml::pd-baseline[hardened]"])
    assert not _collects_scenarios(["tests/harness/test_runner.py", "-k", "x"]) and not _collects_scenarios([])
