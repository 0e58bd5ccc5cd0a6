"""The lookup family's patched target on the vllm-ascend stack: vllm-ascend's own AscendStore lookup RPC
(``LookupKeyServer`` on worker rank 0, ``LookupKeyClient`` in the scheduler) on a copy of the
conformance env's vllm_ascend with connector_patch/upstream/vllm-ascend/0.23.0.post1/ applied (diffs
10-13), no plugin, claiming what hardened claims. Behind the server sits the harness's stand-in pool
worker (families/lookup/ascend_server.py ``PoolWorkerModel``: the real ``KVPoolWorker`` needs an NPU
and a Mooncake store). One real run is here (the admin reset, which reaches the stand-in's store);
the whole scenarios/ascend-cpu/ suite on patched runs in the CPU nightly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.plan import targets_of
from harness.schema import load_scenario

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(240)



def _cached(shown: str) -> Path:
    """A cache path as the dry run shows it (``~/.cache/pdchaos/...``) where it is on this machine
    (``XDG_CACHE_HOME`` moves the cache)."""
    from harness.nodeenv.venv import cache_root

    return Path(shown.replace("~/.cache/pdchaos", str(cache_root()), 1))

def _ascend_env_or_skip() -> None:
    from stacks.ascend_cpu.steps import AscendStackStep

    if AscendStackStep().check() is None:
        pytest.skip("the conformance env is not installed: pdchaos setup")


def _dry_run(scenario: str) -> tuple[str, dict]:
    res = subprocess.run([sys.executable, "-m", "harness.cli", "run", scenario, "--target", "patched", "--dry-run"],
                         cwd=REPO, capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stderr[-2000:]
    server = next(ln for ln in res.stdout.splitlines() if "node ascend-lookup-server" in ln)
    config = json.loads(next(ln for ln in res.stdout.splitlines() if ln.strip().startswith("config:"))
                        .split("config:", 1)[1])
    return server, config


def test_patched_is_asked_for_and_claims_what_hardened_claims() -> None:
    for name in ("lookup-backend-hang", "lookup-admin-reset", "lookup-malformed-requests"):
        sc = load_scenario(REPO / f"scenarios/ascend-cpu/{name}.yaml")
        assert "patched" not in targets_of(sc) and targets_of(sc, ["patched"])[-1] == "patched"
        assert sc.model.expected("patched") == sc.model.expected("hardened") == "pass"


def test_dry_run_gives_both_ends_the_copy_and_the_release_settings() -> None:
    _ascend_env_or_skip()
    server, config = _dry_run("scenarios/ascend-cpu/lookup-backend-hang.yaml")
    assert "--impl patched" in server and "--upstream-overlay ~/.cache/pdchaos/patched/vllm_ascend-" in server
    # lookup_rpc_timeout_ms = the scenario's deadline; lookup_backend_timeout_ms = its backend_timeout
    assert "--deadline-ms 300" in server and "--backend-timeout-ms 150" in server
    assert config["target"] == "patched" and config["upstream_overlay"].startswith("~/.cache/pdchaos/patched/vllm_ascend-")
    assert config["deadline_ms"] == 300 and config["backend_timeout_ms"] == 150
    overlay = _cached(config["upstream_overlay"]) / "vllm_ascend/distributed/kv_transfer/kv_pool/ascend_store"
    assert (overlay / "lookup_server.py").is_file() and (overlay / "lookup_protocol.py").is_file()


def test_a_scenario_without_backend_timeout_gets_the_release_default_on_patched_only() -> None:
    """The hardened node takes topology.backend_timeout (4 s unless set) as it is; the patched release
    refuses a backend deadline at or above the client's, and defaults it to three quarters of it."""
    _ascend_env_or_skip()
    server, config = _dry_run("scenarios/ascend-cpu/lookup-baseline.yaml")
    assert "--deadline-ms 300" in server and "--backend-timeout-ms 225" in server
    assert config["backend_timeout_ms"] == 225


@pytest.mark.parametrize("argv,word", [
    (["--impl", "patched"], "--upstream-overlay"),
    (["--impl", "hardened", "--upstream-overlay", "/tmp"], "--upstream-overlay"),
    (["--impl", "patched", "--upstream-overlay", "rel/dir"], "--upstream-overlay"),
])
def test_the_server_node_refuses_an_overlay_without_patched_or_that_is_not_one(argv: list[str], word: str,
                                                                                tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "harness.cli", "node", "ascend-lookup-server", "--endpoint",
                          f"ipc://{tmp_path}/lookup_rpc_port_5100_dp_rank0", *argv], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and word in res.stderr and "Traceback" not in res.stderr, res.stderr[-1000:]


def test_the_patched_server_refuses_a_backend_deadline_the_release_refuses(tmp_path: Path) -> None:
    _ascend_env_or_skip()
    overlay = _cached(_dry_run("scenarios/ascend-cpu/lookup-baseline.yaml")[1]["upstream_overlay"])
    res = subprocess.run([sys.executable, "-m", "harness.cli", "node", "ascend-lookup-server", "--endpoint",
                          f"ipc://{tmp_path}/lookup_rpc_port_5100_dp_rank0", "--impl", "patched", "--upstream-overlay",
                          str(overlay), "--deadline-ms", "300", "--backend-timeout-ms", "300"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--backend-timeout-ms (300)" in res.stderr and "Traceback" not in res.stderr


def _stand_in(keys: list[str]):
    from connector_patch.lookup import MemoryBackend
    from families.lookup.ascend_server import PoolWorkerModel
    from families.lookup.server_node import FaultyBackend

    memory = MemoryBackend(block_size=16, groups=1)
    memory.put(keys)
    faulty = FaultyBackend(memory)
    return PoolWorkerModel(faulty, groups=2), faulty, memory


def test_the_stand_in_pool_worker_raises_a_store_failure_only_when_asked() -> None:
    worker, faulty, memory = _stand_in(["ab" * 32])
    try:
        assert worker.lookup_scheduler(16, ["ab" * 32], [0]) == 16
        faulty.set("raise")
        assert worker.lookup_scheduler(16, ["ab" * 32], [0]) == 0  # upstream: a store failure is a miss
        with pytest.raises(RuntimeError, match="injected backend failure"):
            worker.lookup_scheduler(16, ["ab" * 32], [0], raise_on_error=True)  # the patched server asks for it
        assert len(worker.kv_cache_config.kv_cache_groups) == 2
        assert (worker.tp_size, worker.pp_size, worker.pcp_size) == (1, 1, 1)
    finally:
        faulty.close()


def test_the_stand_in_store_removes_this_models_keys_only_by_a_pattern_that_names_it() -> None:
    import re

    worker, faulty, memory = _stand_in(["ab" * 32, "cd" * 32])
    store = worker.m_store.store
    try:
        assert store.remove_by_regex("^" + re.escape("other-model") + "@", force=True) == 0 and len(memory) == 2
        faulty.set("clear_fails")
        with pytest.raises(RuntimeError):
            store.remove_by_regex("^" + re.escape(worker.model_name) + "@", force=True)
        assert len(memory) == 2  # a failed remove removes nothing
        faulty.set("none")
        assert store.remove_by_regex("^" + re.escape(worker.model_name) + "@", force=True) == 2 and len(memory) == 0
    finally:
        faulty.close()


def test_a_real_reset_scenario_on_the_patched_target_is_as_hardened(tmp_path: Path) -> None:
    """Both ends are vllm-ascend's code with the diffs: lookups within the deadline, then diff 13's
    reset (drain, then remove_by_regex of this model's keys on the stand-in's store), after which
    every lookup is a miss; judged by the same checks as hardened."""
    _ascend_env_or_skip()
    res = subprocess.run([sys.executable, "-m", "harness.cli", "run", "scenarios/ascend-cpu/lookup-admin-reset.yaml",
                          "--target", "patched", "--plain", "--runs-dir", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=220)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "lookup-admin-reset [patched] pass (expected pass) as expected" in res.stdout
    run = next(tmp_path.glob("*/lookup-admin-reset/patched"))
    ops = [json.loads(ln) for ln in (run / "journal.jsonl").read_text().splitlines()]
    server = [r for r in ops if r.get("type") == "probe" and r.get("node") == "server" and r.get("when") == "final"]
    assert server and server[0]["counters"]["resets"] == 1  # diff 13's server counted the reset it answered
    assert "patched lookup server of vllm-ascend serving" in "".join(p.read_text() for p in run.glob("logs/*"))
