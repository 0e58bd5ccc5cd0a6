"""The pd family's topology without starting vLLM: how each role is started (ports, hosts and
namespace sides with ``link: netns``, engine ids), when a node may be pooled and reused, and the
vllm node's own argument checks (real ``pdchaos node vllm`` processes that exit at once)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.families.pd.topology import PDTopology
from harness.schema import load_scenario

SCENARIOS = Path(__file__).parent.parent / "scenarios" / "pd"


def topology(tmp_path: Path, name: str, pool=None, target: str = "upstream") -> PDTopology:
    sc = load_scenario(SCENARIOS / name)
    return PDTopology(sc, target, tmp_path, lambda rec: None, {"node_pool": pool} if pool else {})


def arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_direct_link_runs_everything_on_loopback(tmp_path: Path) -> None:
    t = topology(tmp_path, "baseline.yaml")
    p, d, proxy = (t.node_spec(r) for r in ("prefill:0", "decode:0", "proxy"))
    assert arg(p.args, "--role") == "prefill" and arg(d.args, "--role") == "decode"
    assert "--host" not in p.args and "--engine-id" not in p.args  # vLLM's random engine id
    assert arg(p.args, "--abort-timeout-s") == "10" and arg(p.args, "--max-num-seqs") == "8"
    assert arg(proxy.args, "--prefill") == f"http://127.0.0.1:{t.ports['prefill:0']}"
    assert arg(proxy.args, "--decode") == f"http://127.0.0.1:{t.ports['decode:0']}"
    assert arg(proxy.args, "--prefill-bootstrap") == f"http://127.0.0.1:{t.bootstrap['prefill:0']}"


def test_netns_link_puts_p_alone_in_namespace_b(tmp_path: Path) -> None:
    t = topology(tmp_path, "partition-prefill-decode.yaml")
    t.netns = SimpleNamespace(ip_a="10.9.8.1", ip_b="10.9.8.2", ns={"a": "pdc-x-a", "b": "pdc-x-b"})
    t.bootstrap_hostport = f"{t.host('prefill:0')}:{t.bootstrap['prefill:0']}"
    p, d, proxy = (t.node_spec(r) for r in ("prefill:0", "decode:0", "proxy"))
    assert (p.side, d.side, proxy.side) == ("b", "a", "a")
    assert arg(p.args, "--host") == "10.9.8.2" and arg(d.args, "--host") == "10.9.8.1"
    # the proxy (beside D) reaches P across the veth; the bootstrap address it hands D too
    assert arg(proxy.args, "--prefill") == f"http://10.9.8.2:{t.ports['prefill:0']}"
    assert arg(proxy.args, "--prefill-bootstrap") == f"http://10.9.8.2:{t.bootstrap['prefill:0']}"
    assert arg(proxy.args, "--decode") == f"http://10.9.8.1:{t.ports['decode:0']}"
    assert t.workload_config()["proxy_url"] == f"http://127.0.0.1:{t.ports['proxy']}"  # a's loopback
    assert t.pool_key("prefill:0") is None  # namespaces die with the run: never pooled


def test_pool_keys_follow_every_start_setting(tmp_path: Path) -> None:
    base = topology(tmp_path / "a", "baseline.yaml").pool_key("prefill:0")
    same = topology(tmp_path / "b", "stop-prefill.yaml").pool_key("prefill:0")
    fixed = topology(tmp_path / "c", "prefill-down-same-engine.yaml")
    recompute = topology(tmp_path / "d", "../pd-long/kill-prefill-recompute.yaml").pool_key("prefill:0")
    assert base == same and base is not None
    assert fixed.pool_key("prefill:0") != base and recompute != base
    assert arg(fixed.node_spec("prefill:0").args, "--engine-id") == "pdchaos-prefill-0"
    assert topology(tmp_path / "e", "baseline.yaml").pool_key("proxy") is None  # cheap: always fresh


def test_a_node_is_reusable_only_healthy_and_drained(tmp_path: Path) -> None:
    t = topology(tmp_path, "baseline.yaml")
    idle = {"num_requests_running": 0, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.0, "metrics_ok": 1}
    assert t.reusable("decode:0", {"alive": True, "counters": idle}) is None
    assert t.reusable("decode:0", {"alive": False, "counters": idle}) == "not healthy"
    assert "waiting" in t.reusable("decode:0", {"alive": True, "counters": {**idle, "num_requests_waiting": 1}})
    assert "KV cache" in t.reusable("prefill:0", {"alive": True, "counters": {**idle, "kv_cache_usage_perc": 1e-4}})
    assert "metrics" in t.reusable("prefill:0", {"alive": True, "counters": {**idle, "metrics_ok": 0}})


def test_the_hardened_target_starts_the_hardened_connector_with_its_deadline(tmp_path: Path) -> None:
    up = topology(tmp_path / "u", "baseline.yaml")
    hard = topology(tmp_path / "h", "baseline.yaml", target="hardened")
    for role in ("prefill:0", "decode:0"):
        assert "--kv-connector" not in up.node_spec(role).args  # vLLM's own MooncakeConnector
        args = hard.node_spec(role).args
        assert arg(args, "--kv-connector") == "HardenedMooncakeConnector"
        assert arg(args, "--kv-load-timeout-ms") == "2000"  # the topology's kv_load_timeout, 2 s by default
    assert up.pool_key("decode:0") != hard.pool_key("decode:0")  # never lend an upstream node to hardened


def test_the_hardened_node_command_and_environment(tmp_path: Path) -> None:
    """The vLLM command carries the connector's name and settings; the node finds the plugin on its
    PYTHONPATH (a dist-info naming connector_patch.vllm_plugin:register, and the package itself)."""
    from harness.families.pd import vllm_node
    from harness.families.pd.plugin_site import DIST, package_dir, plugin_site

    p = vllm_node.argparse.ArgumentParser()
    vllm_node.add_node_arguments(p, "vllm")
    common = ["--role", "decode", "--port", "18001", "--bootstrap-port", "18002", "--server-log", str(tmp_path / "s")]
    a = p.parse_args(common + ["--kv-connector", "HardenedMooncakeConnector", "--kv-load-timeout-ms", "1500"])
    node = vllm_node.VllmNode.__new__(vllm_node.VllmNode)
    node.args, node.role = a, "decode"
    cfg = node.kv_transfer_config()
    assert cfg["kv_connector"] == "HardenedMooncakeConnector" and cfg["kv_role"] == "kv_consumer"
    assert cfg["kv_connector_extra_config"] == {"mooncake_protocol": "tcp", "kv_load_timeout_ms": 1500}
    site = plugin_site()
    assert (site / DIST / "entry_points.txt").read_text().splitlines()[1].endswith("connector_patch.vllm_plugin:register")
    assert (site / "connector_patch").resolve() == package_dir()
    assert plugin_site() == site  # idempotent
    up = p.parse_args(common)
    node.args = up
    assert node.kv_transfer_config()["kv_connector"] == "MooncakeConnector"


@pytest.mark.parametrize("bad, message", [
    (["--engine-id", "a b"], "--engine-id: 1 to 64 letters"),
    (["--engine-id", "x" * 65], "--engine-id: 1 to 64 letters"),
    (["--kv-load-timeout-ms", "500"], "--kv-load-timeout-ms: only HardenedMooncakeConnector"),
    (["--kv-connector", "HardenedMooncakeConnector", "--kv-load-timeout-ms", "0"], "--kv-load-timeout-ms must be"),
])
def test_vllm_node_rejects_bad_engine_ids(tmp_path: Path, bad: list[str], message: str) -> None:
    argv = [sys.executable, "-m", "harness.cli", "node", "vllm", "--role", "prefill", "--port", "18001",
            "--bootstrap-port", "18002", "--server-log", str(tmp_path / "s.log"), *bad]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("bad, message", [
    (["--n", "5"], "--n: at least 20"),
    (["--block", "0"], "--block must be >= 1"),
    (["--kv-load-timeout-ms", "50"], "--kv-load-timeout-ms: at least 100"),
    (["--save", "/nonexistent-dir/x.json"], "--save: folder"),
])
def test_bench_pd_refuses_bad_options_before_starting_anything(bad: list[str], message: str) -> None:
    res = subprocess.run([sys.executable, "-m", "harness.cli", "bench", "pd", *bad], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr
