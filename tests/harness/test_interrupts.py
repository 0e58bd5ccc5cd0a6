"""A harness that dies leaves no node behind (the local runtime).

Real ``pdchaos run`` processes of the toy echo family (tests/toy_family/), real node processes,
real signals: SIGINT, SIGTERM and SIGHUP while a node starts (its READY 30 s away, as a vLLM
server's start is minutes) and while the workload runs end the command within seconds through the
normal teardown, exit 128 + the signal and a journal ending ``interrupted``; SIGKILL of the
harness leaves no process of the run alive within a few seconds (each node sees its parent gone
and kills its own group, a child that ignores SIGTERM, like vLLM's EngineCore, included). The
processes looked at are only this test's: found by the test's own folder in their command line,
and the members of those nodes' process groups.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from faults import netns
from nodekit import journal as J

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "toy_family"
PDCHAOS = [sys.executable, "-m", "harness.cli"]

SCENARIO = """
name: NAME
family: echo_family
deadline: 200ms
cap: 90s
targets: [plain]
topology: {ready_delay: READY, stubborn_child: true}
workload: {duration: 40s, concurrency: 1, rate: 20}
triggers: {none: "no fault: a run to interrupt"}
expect: {plain: pass}
"""


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(TOY), str(ROOT), os.environ.get("PYTHONPATH", "")]))


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first); None when gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _live(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def ours(folder: Path, harness: int) -> set[int]:
    """The run's processes now: those whose command line names this test's folder, other than the
    harness itself, and every member of their process groups (a node's children)."""
    mark = str(folder)
    nodes = {p for p in _all_pids() if p != harness and mark in _cmdline(p) and _live(p)}
    groups = {int(st[3]) for p in nodes if (st := _stat(p)) is not None}
    return nodes | {p for p in _all_pids() if (st := _stat(p)) is not None and int(st[3]) in groups - {0}
                    and p != harness and _live(p)}


def wait_for(what, timeout_s: float, step: float = 0.1):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(step)
    return what()


def start_run(tmp_path: Path, name: str, ready_delay: float) -> tuple[subprocess.Popen, Path]:
    sc = tmp_path / f"{name}.yaml"
    sc.write_text(textwrap.dedent(SCENARIO).replace("NAME", name).replace("READY", str(ready_delay)).lstrip())
    runs = tmp_path / "runs"
    proc = subprocess.Popen(PDCHAOS + ["run", str(sc), "--runs-dir", str(runs), "--no-report", "--plain"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    return proc, runs


def node_and_child(tmp_path: Path, proc: subprocess.Popen) -> set[int]:
    """The echo server and its stubborn child, once both run (the child is in the server's group)."""
    def found() -> set[int] | None:
        pids = ours(tmp_path, proc.pid)
        servers = [p for p in pids if "echo-server" in _cmdline(p)]
        children = [p for p in pids if "SIG_IGN" in _cmdline(p)]
        return pids if servers and children else None

    pids = wait_for(found, 30.0)
    assert pids, f"the node never started (harness exit {proc.poll()})"
    return pids


def finish(proc: subprocess.Popen, timeout_s: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def journal_of(runs: Path, name: str) -> list[dict]:
    (path,) = list(runs.glob(f"*/{name}/plain/journal.jsonl"))
    return J.read_journal(path)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_while_a_node_starts_stops_the_run_at_once(tmp_path: Path, sig: signal.Signals) -> None:
    """The node's READY is 30 s away: the command ends within seconds anyway, the node (and its
    child that ignores SIGTERM) stopped, exit 128 + the signal, the journal ending interrupted."""
    proc, runs = start_run(tmp_path, "slow-start", 30)
    try:
        pids = node_and_child(tmp_path, proc)
        t_sig = time.monotonic()
        proc.send_signal(sig)
        out, err = finish(proc, 20)
        took = time.monotonic() - t_sig
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, out + err
    assert took < 10, f"{took:.1f} s to stop: the start was waited for"
    assert f"interrupted ({sig.name})" in err and "Traceback" not in err, err
    assert [p for p in pids if _live(p)] == []
    assert ours(tmp_path, proc.pid) == set()
    recs = journal_of(runs, "slow-start")
    assert recs[-1]["type"] == "end" and recs[-1]["reason"] == "interrupted"
    assert any(r.get("what") == "interrupted" and r.get("by") == sig.name for r in recs)
    assert not list(Path("/tmp").glob(f"pdc-{proc.pid}-*")), "the run's ipc folder is gone"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_while_the_workload_runs_tears_down(tmp_path: Path, sig: signal.Signals) -> None:
    """Mid-run: the ops recorded so far are kept, every process of the run is gone."""
    proc, runs = start_run(tmp_path, "mid-run", 0)
    try:
        pids = node_and_child(tmp_path, proc)
        part = wait_for(lambda: [p for p in runs.glob("*/mid-run/plain/ops.part.jsonl") if p.stat().st_size > 1500],
                        30.0)
        assert part, "the workload never ran"
        pids |= ours(tmp_path, proc.pid)  # the workload too
        proc.send_signal(sig)
        out, err = finish(proc, 20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, out + err
    assert "Traceback" not in err, err
    assert [p for p in pids if _live(p)] == []
    assert ours(tmp_path, proc.pid) == set()
    recs = journal_of(runs, "mid-run")
    assert recs[-1]["reason"] == "interrupted" and J.ops(recs), "ops before the signal are kept"
    started = [r["pid"] for r in recs if r.get("what") == "process_start"]
    assert len(started) == 2 and not [p for p in started if _live(p)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("when", ["start", "run"])
def test_nodes_outlive_a_sigkilled_harness_by_seconds_only(tmp_path: Path, when: str) -> None:
    """SIGKILL: no teardown at all. Each node sees its parent gone and kills its own group (the
    child that ignores SIGTERM and never looks at its parent included) within a few seconds."""
    proc, runs = start_run(tmp_path, f"killed-{when}", 30 if when == "start" else 0)
    try:
        pids = node_and_child(tmp_path, proc)
        if when == "run":
            assert wait_for(lambda: list(runs.glob("*/killed-run/plain/ops.part.jsonl")), 30.0)
            time.sleep(0.5)
            pids |= ours(tmp_path, proc.pid)
            assert len([p for p in pids if "echo-workload" in _cmdline(p)]) == 1
        proc.kill()
        proc.communicate(timeout=10)
        t_kill = time.monotonic()
        left = wait_for(lambda: not [p for p in pids if _live(p)], 8.0)
        took = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert left, f"still alive 8 s after the harness's SIGKILL: {[p for p in pids if _live(p)]}"
    assert took < 7.0
    assert ours(tmp_path, proc.pid) == set()


@pytest.mark.timeout(30)
def test_a_node_whose_runner_died_before_it_looked_stops(tmp_path: Path) -> None:
    """The runner's pid comes in the environment: a node started by a runner that is already gone
    (killed between the fork and the node's first look) stops by itself too."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    env = {**_env(), "PDCHAOS_PARENT_PID": str(gone.pid), "PDCHAOS_FAMILY": "echo_family"}
    sock = tmp_path / "e.sock"
    node = subprocess.Popen(PDCHAOS + ["node", "echo-server", "--endpoint", f"ipc://{sock}"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = node.communicate(timeout=15)
    finally:
        if node.poll() is None:
            node.kill()
            node.communicate()
    assert "Traceback" not in err, err
    assert node.returncode in (0, -signal.SIGKILL), err  # its own group's SIGKILL ends it last


_NETNS_OK, _NETNS_WHY = netns.availability_ip_root()

MAKER = """
import sys, time
from faults.netns import NetnsPair
pair = NetnsPair().create()
pair.partition("a->b", "drop", tag="left-behind")
print(pair.a, pair.b, flush=True)
time.sleep(120)
"""


@pytest.mark.timeout(60)
@pytest.mark.skipif(not _NETNS_OK, reason=f"isolated hosts unavailable: {_NETNS_WHY}")
def test_namespaces_of_a_killed_run_are_swept_and_others_kept(tmp_path: Path, monkeypatch) -> None:
    """A process that made a namespace pair with a partition rule in it is killed outright: the
    sweep removes both namespaces (the rule with them) and their owner records, and names the
    local runtime's clean line; a live owner's pair and a namespace of unknown owner stay. The
    owner records go to a folder of this test's (the runs other tests start sweep the default one:
    to them these namespaces have no owner, and they leave them alone)."""
    from harness.runtime import load_runtime

    monkeypatch.setenv(netns.OWNERS_ENV, str(tmp_path / "owners"))
    maker = subprocess.Popen([sys.executable, "-c", MAKER], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=_env())
    kept = netns.NetnsPair().create()  # this process owns it: alive
    stranger = f"pdc-unowned-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", stranger], check=True, timeout=10)
    try:
        names = maker.stdout.readline().split()
        assert len(names) == 2, "the maker never made its pair"
        assert "left-behind" in " ".join(subprocess.run(["ip", "netns", "exec", names[1], "iptables", "-S"],
                                                        capture_output=True, text=True, timeout=10).stdout.split())
        maker.kill()
        maker.wait(10)
        assert set(names) <= set(netns.list_namespaces())  # SIGKILL: nothing of its teardown ran
        assert netns.owner_alive(names[0]) is False and netns.owner_alive(kept.a) is True
        removed, left = load_runtime("local").clean()
        present = set(netns.list_namespaces())
        assert not set(names) & present
        assert {kept.a, kept.b, stranger} <= present
        assert len(removed) == 1 and names[0] in removed[0] and names[1] in removed[0], removed
        assert any(stranger in line for line in left), left
        assert not any(kept.a in line for line in removed + left)
        assert not (tmp_path / "owners" / names[0]).exists()
    finally:
        if maker.poll() is None:
            maker.kill()
            maker.wait()
        kept.cleanup()
        subprocess.run(["ip", "netns", "del", stranger], timeout=10)
    assert not (tmp_path / "owners" / kept.a).exists(), "a clean teardown removes its owner records"


@pytest.mark.timeout(90)
def test_a_closed_terminal_is_a_clean_stop(tmp_path: Path) -> None:
    """The harness runs on a terminal of its own (a pty, it the session leader) and the terminal
    goes away (its master closed): the kernel's SIGHUP stops the run cleanly, the writes that come
    after (progress, the summary) fail nothing, exit 129, no process of the run left."""
    import pty

    sc = tmp_path / "tty.yaml"
    sc.write_text(textwrap.dedent(SCENARIO).replace("NAME", "tty").replace("READY", "0").lstrip())
    runs = tmp_path / "runs"
    pid, master = pty.fork()
    if pid == 0:  # the child: a new session with the pty as its controlling terminal
        try:
            os.chdir(ROOT)
            os.execve(sys.executable, PDCHAOS + ["run", str(sc), "--runs-dir", str(runs), "--no-report"], _env())
        finally:
            os._exit(127)
    try:
        pids = wait_for(lambda: (lambda p: p if any("SIG_IGN" in _cmdline(x) for x in p) else None)(ours(tmp_path, pid)),
                        30.0)
        assert pids, "the node never started"
        assert wait_for(lambda: list(runs.glob("*/tty/plain/ops.part.jsonl")), 30.0)
        pids |= ours(tmp_path, pid)
        os.close(master)  # the terminal is gone
        master = -1
        end = time.monotonic() + 30
        status = None
        while time.monotonic() < end:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the harness did not end within 30 s of its terminal closing")
    finally:
        if master >= 0:
            os.close(master)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGHUP
    assert [p for p in pids if _live(p)] == []
    recs = journal_of(runs, "tty")
    assert recs[-1]["reason"] == "interrupted"
    assert any(r.get("what") == "interrupted" and r.get("by") == "SIGHUP" for r in recs)


PARTITIONED = """
name: partitioned
family: lookup
seed: 41
deadline: 200ms
cap: 60s
topology: {transport: tcp, link: netns, groups: 2}
workload: {duration: 30s, concurrency: 1, rate: 20}
faults:
  - {type: partition, at: 500ms, for: 25s, direction: both}
triggers: [{type: ops_in_window, fault: 0}]
expect: {hardened: pass, legacy: pass}
"""


def _owned_by(pid: int, d: Path) -> list[str]:
    """The namespaces whose owner record (in the folder ``d``) names ``pid``."""
    return sorted(p.name for p in d.glob("pdc-*") if p.read_text().split()[:1] == [str(pid)]) if d.is_dir() else []


@pytest.mark.timeout(120)
@pytest.mark.skipif(not _NETNS_OK, reason=f"isolated hosts unavailable: {_NETNS_WHY}")
def test_a_run_sigkilled_inside_a_partition_leaves_nothing_after_the_next_run(tmp_path: Path) -> None:
    """A real lookup run on a network-namespace link, SIGKILLed while its partition (iptables DROP
    rules inside the namespaces) is on: its nodes stop by themselves, its two namespaces and their
    rules stay (nothing of its teardown ran), and the next ``pdchaos run`` removes them with one
    line naming them."""
    sc = tmp_path / "partitioned.yaml"
    sc.write_text(textwrap.dedent(PARTITIONED).lstrip())
    runs = tmp_path / "runs"
    owners = tmp_path / "owners"  # this test's own (see the test above)
    env = {**_env(), netns.OWNERS_ENV: str(owners)}
    proc = subprocess.Popen(PDCHAOS + ["run", str(sc), "--runs-dir", str(runs), "--no-report", "--plain",
                                       "--target", "hardened"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env, cwd=ROOT)
    try:
        def partitioned() -> bool:
            for path in runs.glob("*/partitioned/hardened/journal.jsonl"):
                if any(r.get("type") == "fault" and r.get("phase") == "start" for r in J.read_journal(path)):
                    return True
            return False

        assert wait_for(partitioned, 60.0), "the partition never started"
        spaces = _owned_by(proc.pid, owners)
        assert len(spaces) == 2, spaces
        children = {p for p in _all_pids() if (st := _stat(p)) is not None and int(st[1]) == proc.pid}
        assert len(children) >= 2  # the lookup server and the workload (inside the namespaces)
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert wait_for(lambda: not [p for p in children if _live(p)], 8.0), "nodes outlived the harness by 8 s"
    assert set(spaces) <= set(netns.list_namespaces())
    rules = subprocess.run(["ip", "netns", "exec", spaces[0], "iptables", "-S", netns.CHAIN], capture_output=True,
                           text=True, timeout=10).stdout + subprocess.run(
        ["ip", "netns", "exec", spaces[1], "iptables", "-S", netns.CHAIN], capture_output=True, text=True,
        timeout=10).stdout
    assert "DROP" in rules, "the partition's rules were left in the namespaces"
    toy = tmp_path / "next.yaml"
    toy.write_text(textwrap.dedent(SCENARIO).replace("NAME", "next").replace("READY", "0")
                   .replace("duration: 40s", "duration: 300ms").replace("stubborn_child: true", "stubborn_child: false")
                   .lstrip())
    nxt = subprocess.run(PDCHAOS + ["run", str(toy), "--runs-dir", str(tmp_path / "runs2"), "--no-report", "--plain"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert nxt.returncode == 0, nxt.stdout + nxt.stderr
    (line,) = [ln for ln in nxt.stderr.splitlines() if ln.startswith("removed: ")]
    assert all(ns in line for ns in spaces) and "a killed run left" in line, line
    assert not set(spaces) & set(netns.list_namespaces())
    assert _owned_by(proc.pid, owners) == []


TOXIC = """
name: toxic
family: lookup
seed: 43
deadline: 200ms
cap: 60s
topology: {transport: tcp, link: toxiproxy, groups: 2}
workload: {duration: 30s, concurrency: 1, rate: 20}
faults:
  - {type: latency, at: 500ms, for: 25s, latency: 400ms, stream: downstream}
triggers: [{type: ops_in_window, fault: 0}]
expect: {hardened: pass, legacy: pass}
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("toxiproxy-server") is None, reason="toxiproxy-server is not installed")
def test_toxiproxy_and_the_nodes_die_with_a_sigkilled_harness(tmp_path: Path) -> None:
    """A real lookup run through Toxiproxy, SIGKILLed while its latency toxic is on: every child of
    the harness (toxiproxy-server, the lookup server, the workload) is gone within seconds."""
    sc = tmp_path / "toxic.yaml"
    sc.write_text(textwrap.dedent(TOXIC).lstrip())
    runs = tmp_path / "runs"
    proc = subprocess.Popen(PDCHAOS + ["run", str(sc), "--runs-dir", str(runs), "--no-report", "--plain",
                                       "--target", "hardened"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=_env(), cwd=ROOT)
    try:
        def toxic_on() -> bool:
            return any(r.get("type") == "fault" and r.get("phase") == "start"
                       for path in runs.glob("*/toxic/hardened/journal.jsonl") for r in J.read_journal(path))

        assert wait_for(toxic_on, 60.0), "the toxic never started"
        children = {p for p in _all_pids() if (st := _stat(p)) is not None and int(st[1]) == proc.pid}
        assert any("toxiproxy-server" in _cmdline(p) for p in children), [_cmdline(p) for p in children]
        assert len(children) >= 3
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert wait_for(lambda: not [p for p in children if _live(p)], 8.0), \
        [_cmdline(p) for p in children if _live(p)]
