"""``pdchaos repro``: one scenario, one target, through the normal runner, into a report folder.

Real runs of cheap scenarios (the lookup family's server kill against its legacy model: ~5 s; the
toy echo family's generic kill: its default target and the generic fault as a command), bad input
(one line, exit 2, no traceback, nothing started), a harness error (non-zero, no README), and the
pieces of the folder that must never hold a prompt, a key or a request id.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.main import main as pdchaos
from harness.outputs import Result
from reports.repro import excerpt_record, journal_excerpt, withhold_ids

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "toy_family"
PDCHAOS = [sys.executable, "-m", "harness.cli"]
SERVER_KILL = ROOT / "scenarios" / "lookup" / "server-kill.yaml"


def cli(*args: str, timeout: float = 120, toy: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if toy:
        env["PYTHONPATH"] = os.pathsep.join([str(TOY), env.get("PYTHONPATH", "")])
    return subprocess.run(PDCHAOS + list(args), capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


SECTIONS = ("## Environment", "## How the harness started each node", "## Steps", "## Expected vs actual",
            "## Incident timeline", "## Plots", "## Journal excerpt")


@pytest.mark.timeout(150)
def test_repro_of_a_cheap_scenario_writes_a_self_contained_folder(tmp_path: Path) -> None:
    out = tmp_path / "repro"
    r = cli("repro", str(SERVER_KILL), "--target", "legacy", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    # legacy's two honest outcomes (the scenario's expectation): a late answer, or one still pending
    # at the end on a loaded machine
    verdict = "fail" if "fail (as expected)" in r.stdout else "stall"
    assert f"{verdict} (as expected)" in r.stdout
    readme = (out / "README.md").read_text()
    positions = [readme.index(s) for s in SECTIONS]
    assert positions == sorted(positions)
    # environment: the node envs' versions (or that none is installed), the hardware, the OS
    for word in ("- CPU: ", "- cores: ", "- memory: ", "- OS: ", "- kernel: ", "- pd-chaos: "):
        assert word in readme
    assert re.search(r"- (node env `[^`]+`: |not installed in any node env)", readme) or "node env" in readme
    # every node as the harness started it: the server twice (killed, started again), the workload once
    launches = re.findall(r"^- `([^`]+)` at (-?[\d.]+) s:", readme, re.MULTILINE)
    assert [role for role, _ in launches] == ["server", "workload", "server"]
    assert readme.count("PDCHAOS_FAMILY=lookup ") == 3 and "-m harness.cli node legacy-server" in readme
    # the harness's paths, with no path of this machine (reports.repro.machine_paths)
    from reports.repro import machine_paths

    assert machine_paths(str(out / "runs")) in readme and str(out / "runs") not in readme
    # steps: the scenario YAML and the one command
    assert (out / "scenario.yaml").read_text() == SERVER_KILL.read_text()
    assert machine_paths(f"pdchaos repro {SERVER_KILL} --target legacy --out {out}") in readme
    assert "```yaml\nname: server-kill\n" in readme
    # expected vs actual: the claim (hardened must hold every check) next to what legacy did, measured
    assert f"**legacy** (this run): verdict **{verdict}**, failing: `bounded_return`" in readme
    assert "**hardened** (the claim): the scenario expects pass." in readme
    row = next(ln for ln in readme.splitlines() if ln.startswith("| `bounded_return` |"))
    assert "| must hold | VIOLATED: " in row and "worst_ms " in row and "(id withheld)" in row
    assert not re.search(r"\bop \d+\b", readme)
    # the incident timeline of item 1, the plot, the excerpt
    assert "server_kill injected at 0.80 s, healed at" in readme and "recovered after server_kill" in readme
    assert "![plots/server-kill--legacy.png](plots/server-kill--legacy.png)" in readme
    assert (out / "plots" / "server-kill--legacy.png").stat().st_size > 1000
    assert (out / "report.html").is_file()
    excerpt = [json.loads(line) for line in (out / "journal-excerpt.jsonl").open()]
    assert excerpt[0]["type"] == "meta" and excerpt[-1]["type"] == "end"
    ops = [e for e in excerpt if e["type"] == "op"]
    assert ops and all("id" not in e and "value" not in e and "expected" not in e and "process" not in e for e in ops)
    assert not any(e.get("type") == "probe" and e.get("when") == "sample" for e in excerpt)
    # nothing secret of the run (the preloaded keys) anywhere in the folder but the run itself
    (run_dir,) = (out / "runs").iterdir()
    keys = [ln.strip() for ln in (run_dir / "server-kill" / "legacy" / "preload.txt").read_text().split()
            if len(ln.strip()) >= 16]
    assert keys
    for f in [out / "README.md", out / "journal-excerpt.jsonl", out / "scenario.yaml"]:
        text = f.read_text().lower()
        assert not any(k.lower() in text for k in keys), f
        assert not re.search(r"[0-9a-f]{32,}", text), f
    # the repro's run is an ordinary run folder: pdchaos check re-judges it offline
    again = cli("check", str(run_dir))
    assert again.returncode == 0, again.stdout + again.stderr


@pytest.mark.timeout(120)
def test_repro_picks_the_baseline_when_there_is_no_upstream_and_says_a_generic_fault_as_a_command(
        tmp_path: Path) -> None:
    out = tmp_path / "toy"
    r = cli("repro", str(TOY / "yaml" / "echo-kill.yaml"), "--out", str(out), toy=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "repro of echo-kill [plain]" in r.stdout  # no upstream target: the family's baseline
    readme = (out / "README.md").read_text()
    assert "- fault kill at 0.5 s for 0.3 s: the node server is killed, then started again" in readme
    assert "kill -KILL <pid of server>" in readme
    assert "the family names no step" not in readme


@pytest.mark.parametrize("args, message", [
    (["no-such-scenario"], "unknown scenario 'no-such-scenario'"),
    ([str(SERVER_KILL), "--target", "nope"], "--target 'nope': unknown for scenario server-kill; its targets: "
                                            "hardened, legacy"),
    ([str(ROOT / "scenarios" / "lookup")], "a folder; pdchaos repro runs one scenario"),
    ([str(SERVER_KILL), "--target", "legacy", "--out", str(SERVER_KILL)], "exists and is not an empty folder"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, capsys, tmp_path: Path) -> None:
    rc = pdchaos(["repro", *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_scenario_is_found_by_its_name(monkeypatch, tmp_path: Path) -> None:
    from harness.cli.repro import find_scenario

    assert find_scenario("server-kill").resolve() == SERVER_KILL.resolve()
    assert find_scenario(str(SERVER_KILL)) == SERVER_KILL


def test_a_harness_error_is_an_error_never_a_report(monkeypatch, tmp_path: Path, capsys) -> None:
    import harness.cli.repro as R

    def failing_run(sc, target, runs, profiles):  # noqa: ARG001
        runs.mkdir(parents=True)
        res = Result(sc.name, str(sc.path), target, f"{sc.name}/{target}", "error", "pass",
                     reason="topology: OSError: no free port")
        return runs / "r1", res, False
    monkeypatch.setattr(R, "run_one", failing_run)
    out = tmp_path / "out"
    rc = pdchaos(["repro", str(SERVER_KILL), "--target", "legacy", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.startswith("harness error: server-kill [legacy]: the run ended in a harness error: topology: OSError")
    assert not (out / "README.md").exists()


# ------------------------------------------------------------------ what the folder may hold

def test_the_excerpt_keeps_only_what_the_log_policy_allows() -> None:
    t0 = 10.0
    op = {"type": "op", "id": 42, "process": 1, "f": "complete", "phase": "fail", "t": 12.5, "outcome": "http_502",
          "code": "aborted", "error_phase": "decode", "status": 502, "elapsed_ms": 91.5, "value": "some output text",
          "expected": "some output text", "value_ids": "840e9d480ee7832dc91c8ddd", "prompt_index": 3}
    assert excerpt_record(op, t0) == {"type": "op", "t_s": 2.5, "f": "complete", "phase": "fail",
                                      "outcome": "http_502", "code": "aborted", "status": 502,
                                      "error_phase": "decode", "elapsed_ms": 91.5}
    ev = {"type": "event", "what": "side_channel_garbage", "t": 11.0, "role": "prefill:0", "pid": 4242,
          "frame": "9f86d081884c7d659a2feaa0c55ad015", "log": "/runs/x/01.log", "argv": ["python3", "-m"],
          "answers": {"garbage": 1}, "mode": "garbage"}
    assert excerpt_record(ev, t0) == {"type": "event", "t_s": 1.0, "what": "side_channel_garbage",
                                      "role": "prefill:0", "answers.garbage": 1.0, "mode": "garbage"}
    sample = {"type": "probe", "when": "sample", "t": 11.0, "node": "decode:0", "counters": {"x": 1}}
    assert excerpt_record(sample, t0) is None
    # a record still holding a secret of the run (a prompt the family names) is dropped whole
    recs = [{"type": "meta", "t0": t0, "scenario": "s"},
            {"type": "event", "what": "note", "t": 11.0, "mode": "the secret prompt"}]
    assert [e["type"] for e in journal_excerpt(recs, ["the secret prompt"])] == ["meta"]


def test_check_messages_withhold_op_ids() -> None:
    assert withhold_ids("1 of 2 ops over deadline; op 81 took 503 ms") == \
        "1 of 2 ops over deadline; op (id withheld) took 503 ms"
    assert withhold_ids("late ops [3, 4, 5]") == "late ops (id withheld)"
    assert "9f86d081884c7d659a2feaa0c55ad015" not in withhold_ids("key 9f86d081884c7d659a2feaa0c55ad015 leaked")


def test_the_family_hook_gives_the_requests_without_a_prompt(tmp_path: Path) -> None:
    from harness.family import get_family
    from harness.schema import load_scenario

    sc = load_scenario(ROOT / "scenarios" / "pd" / "fake-prefill-silent.yaml")
    (tmp_path / "workload.json").write_text(json.dumps({
        "proxy_url": "http://127.0.0.1:21569", "model": "/models/tiny", "prompt_tokens": 200, "output_tokens": 16,
        "request_timeout_s": 20.0, "rate": 1.0, "concurrency": 1, "duration_s": 12.0,
        "prompts_path": str(tmp_path / "prompts.json")}))
    steps = sc.family.repro_steps(sc, "upstream", tmp_path)
    cmds = [c for _, c in steps if c]
    assert len(cmds) == 1 and cmds[0].startswith("curl -sS -m 20 -X POST http://127.0.0.1:21569/v1/completions")
    assert "<any text of about 200 tokens>" in cmds[0] and '"max_tokens": 16' in cmds[0]
    assert any("fake_prefill_peer at 0.5 s for 6.5 s" in what and "mode silent" in what for what, _ in steps)
    # a family without a repro module names no step
    assert get_family("lookup").repro_steps(sc, "legacy", tmp_path) == []
