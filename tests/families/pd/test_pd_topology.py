"""The pd family's topology without starting vLLM: how each role is started (ports, hosts and
namespace sides with ``link: netns``, engine ids), when a node may be pooled and reused, and the
vllm node's own argument checks (real ``pdchaos node vllm`` processes that exit at once)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from families.pd.topology import PDTopology
from harness.schema import load_scenario

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios" / "pd"


def topology(tmp_path: Path, name: str, pool=None, target: str = "upstream", profile=None) -> PDTopology:
    sc = load_scenario(SCENARIOS / name)
    return PDTopology(sc, target, tmp_path, lambda rec: None, {"node_pool": pool} if pool else {}, profile)


def profile(name: str, *sets: str):
    """A launch profile as data (what ``pdchaos run --profile NAME --set ...`` hands the runner)."""
    from families.pd.family import FAMILY

    return FAMILY.load_profile(name, list(sets))


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
    fixed = topology(tmp_path / "c", "../pd-long/prefill-down-same-engine.yaml")
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
        assert arg(up.node_spec(role).args, "--kv-connector") == "MooncakeConnector"  # vLLM's own
        assert "--kv-load-timeout-ms" not in up.node_spec(role).args
        args = hard.node_spec(role).args
        assert arg(args, "--kv-connector") == "HardenedMooncakeConnector"
        assert arg(args, "--kv-load-timeout-ms") == "2000"  # the topology's kv_load_timeout, 2 s by default
    assert up.pool_key("decode:0") != hard.pool_key("decode:0")  # never lend an upstream node to hardened


def test_the_hardened_node_command_and_environment(tmp_path: Path) -> None:
    """The vLLM command carries the connector's name and settings; the node finds the plugin on its
    PYTHONPATH (a dist-info naming connector_patch.vllm_plugin:register, and the package itself)."""
    from families.pd import vllm_node
    from families.pd.plugin_site import DIST, package_dir, plugin_site

    p = vllm_node.argparse.ArgumentParser()
    vllm_node.add_node_arguments(p, "vllm")
    common = ["--role", "decode", "--port", "18001", "--bootstrap-port", "18002", "--server-log", str(tmp_path / "s")]
    a = p.parse_args(common + ["--kv-connector", "HardenedMooncakeConnector", "--kv-load-timeout-ms", "1500"])
    node = vllm_node.VllmNode.__new__(vllm_node.VllmNode)
    node.args, node.role, node.kv_extra = a, "decode", None
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


# --------------------------------------------------------------------------- launch profiles (profile.py)

@pytest.fixture
def ascend():
    """Launch profile ascend, as the data a topology is given."""
    return profile("ascend", "model=/models/Qwen3-0.6B")


def test_ascend_profile_starts_vllm_ascend_nodes_on_npus(tmp_path: Path, ascend) -> None:
    up = topology(tmp_path / "u", "baseline.yaml", profile=ascend)
    hard = topology(tmp_path / "h", "baseline.yaml", target="hardened", profile=ascend)
    for t in (up, hard):
        for role, npu in (("prefill:0", "0"), ("decode:0", "1")):
            a = t.node_spec(role).args
            assert arg(a, "--device") == "npu" and arg(a, "--visible-devices") == npu and "--cpu-core" not in a
            assert arg(a, "--vllm-from") == "path" and arg(a, "--model") == "/models/Qwen3-0.6B"
        assert t.workload_config()["model"] == "/models/Qwen3-0.6B"
    p = up.node_spec("prefill:0").args
    assert arg(p, "--kv-connector") == "MooncakeConnectorV1" and arg(p, "--kv-port") == str(up.kv_ports["prefill:0"])
    assert '"prefill":{"dp_size":1,"tp_size":1}' in arg(p, "--kv-extra")
    assert arg(up.node_spec("proxy").args, "--protocol") == "kv-params"
    assert arg(up.node_spec("proxy").args, "--order") == "sequential"
    h = hard.node_spec("decode:0").args
    assert arg(h, "--kv-connector") == "HardenedMooncakeConnector" and "--kv-port" not in h
    assert arg(h, "--kv-extra") == '{"mooncake_protocol":"ascend"}'
    assert arg(hard.node_spec("proxy").args, "--protocol") == "bootstrap"
    assert up.pool_key("decode:0") != hard.pool_key("decode:0")
    # the default (cpu): a node started for one profile is never lent to another
    cpu_key = topology(tmp_path / "c2", "baseline.yaml").pool_key("decode:0")
    assert cpu_key is not None and cpu_key != up.pool_key("decode:0")


def test_ascend_profile_cannot_pair_v1_with_the_bootstrap_protocol(tmp_path: Path, ascend) -> None:
    from harness.errors import HarnessError

    t = topology(tmp_path, "mixed-upstream-decode.yaml", target="hardened", profile=ascend)
    with pytest.raises(HarnessError, match="cannot be paired"):
        t.node_spec("proxy")


def test_profile_files_and_sets(tmp_path: Path) -> None:
    from harness.errors import UsageError
    from families.pd.profile import load_profile

    cpu = load_profile(None)
    assert cpu.name == "cpu" and cpu.device == "cpu" and cpu.vllm == "node-env" and cpu.model is None
    f = tmp_path / "mine.yaml"
    f.write_text("name: mine\ndevice: npu\nvllm: path\nmodel: /m\ndevices: {prefill: '2', decode: '5'}\n"
                 "connectors:\n  upstream: {name: MooncakeConnector, proxy: bootstrap, extra_config: "
                 "{mooncake_protocol: ascend}}\n  hardened: {name: HardenedMooncakeConnector, proxy: bootstrap}\n")
    mine = load_profile(str(f), ["devices.prefill=7", "dtype=float16", "env.HCCL_X=1"])
    assert mine.devices == {"prefill": "7", "decode": "5"} and mine.dtype == "float16" and mine.env == {"HCCL_X": "1"}
    for sets, needle in ((["device=gpu"], "device: Input should be 'cpu' or 'npu'"),
                         (["devices.prefill=0"], "devices: only an NPU profile names devices"),
                         (["vllm=path", "connectors.upstream=x"], "connectors.upstream: Input should be")):
        with pytest.raises(UsageError, match=needle):
            load_profile("cpu", sets)
    with pytest.raises(UsageError, match="cannot read"):
        load_profile(str(tmp_path / "none.yaml"))


@pytest.mark.parametrize("bad, message", [
    (["--device", "npu"], "--visible-devices: the NPU number"),
    (["--device", "npu", "--visible-devices", "0", "--cpu-core", "0"], "--cpu-core: only with --device cpu"),
    (["--visible-devices", "1"], "--visible-devices: only with --device npu"),
    (["--kv-extra", "[1]"], "--kv-extra: expected a JSON object"),
    (["--kv-extra", "{nope"], "--kv-extra: not JSON"),
    (["--env", "1X=2"], "--env '1X': expected NAME=VALUE"),
    (["--kv-port", "70000"], "--kv-port: 70000 is not a TCP port"),
    (["--vllm-from", "bin/vllm"], "--vllm-from: 'bin/vllm' is not node-env, path or the absolute path"),
])
def test_vllm_node_rejects_bad_device_settings(tmp_path: Path, bad: list[str], message: str) -> None:
    argv = [sys.executable, "-m", "harness.cli", "node", "vllm", "--role", "prefill", "--port", "18001",
            "--bootstrap-port", "18002", "--server-log", str(tmp_path / "s.log"), *bad]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_vllm_node_npu_command_and_environment(tmp_path: Path) -> None:
    """On an NPU: vLLM of this Python, one visible NPU, no CPU settings, the profile's kv config."""
    from families.pd import vllm_node

    p = vllm_node.argparse.ArgumentParser()
    vllm_node.add_node_arguments(p, "vllm")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    vllm = tmp_path / "bin" / "vllm"  # the command is built, never run
    vllm.parent.mkdir()
    vllm.write_text("#!/bin/sh\nexit 1\n")
    vllm.chmod(0o755)
    a = p.parse_args(["--role", "prefill", "--port", "18001", "--bootstrap-port", "18002", "--server-log",
                      str(tmp_path / "s"), "--device", "npu", "--visible-devices", "2", "--vllm-from", str(vllm),
                      "--model", str(tmp_path / "m"), "--kv-connector", "MooncakeConnectorV1", "--kv-port", "30000",
                      "--kv-extra", '{"prefill": {"dp_size": 1, "tp_size": 1}}', "--env", "HCCL_BUFFSIZE=256",
                      "--dtype", "float16", "--max-model-len", "4096"])
    node = vllm_node.VllmNode(a)
    cmd, env = node.command(), node.environment()
    assert cmd[0] == str(vllm) and cmd[cmd.index("--dtype") + 1] == "float16" and "4096" in cmd
    kv = vllm_node.json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert kv == {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_load_failure_policy": "fail",
                  "kv_port": 30000, "kv_connector_extra_config": {"prefill": {"dp_size": 1, "tp_size": 1}}}
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "2" and env["HCCL_BUFFSIZE"] == "256"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and "VLLM_CPU_OMP_THREADS_BIND" not in env


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
    (["--n-min", "5"], "--n-min: at least 20"),
    (["--n-min", "50", "--n-max", "40"], "--n-max at least --n-min"),
    (["--batch", "0"], "--batch must be >= 1"),
    (["--half-width", "0"], "--half-width: a fraction"),
    (["--idle-window-s", "0"], "--idle-window-s must be > 0"),
    (["--kv-load-timeout-ms", "50"], "--kv-load-timeout-ms: at least 100"),
    (["--save", "/nonexistent-dir/x.json"], "--save: folder"),
])
def test_bench_pd_refuses_bad_options_before_starting_anything(bad: list[str], message: str) -> None:
    res = subprocess.run([sys.executable, "-m", "harness.cli", "bench", "pd", *bad], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_ascend_store_profile_adds_a_store_master_and_the_pool_settings(tmp_path: Path) -> None:
    """Profile ascend-store: the store master is a role started first, both servers read one
    mooncake.json naming it on loopback and hash alike; a MultiConnector per target."""
    from families.pd.family import FAMILY

    store_profile = profile("ascend-store", "model=/models/Qwen3-0.6B")
    sc = load_scenario(SCENARIOS / "baseline.yaml")
    assert FAMILY.roles(sc.model, store_profile)[0] == "store"
    up = topology(tmp_path / "u", "baseline.yaml", profile=store_profile)
    store = up.node_spec("store")
    assert store.kind == "mooncake-master" and arg(store.args, "--master-from") == "path"
    assert arg(store.args, "--rpc-port") == str(up.store_ports["rpc"])
    p = up.node_spec("prefill:0").args
    envs = [p[i + 1] for i, x in enumerate(p) if x == "--env"]
    assert "PYTHONHASHSEED=0" in envs and f"MOONCAKE_CONFIG_PATH={tmp_path / 'u' / 'mooncake.json'}" in envs
    cfg = json.loads((tmp_path / "u" / "mooncake.json").read_text())
    assert cfg["master_server_address"] == f"127.0.0.1:{up.store_ports['rpc']}"
    assert cfg["metadata_server"] == "P2PHANDSHAKE" and cfg["protocol"] == "ascend"
    extra = json.loads(arg(p, "--kv-extra"))
    assert [c["kv_connector"] for c in extra["connectors"]] == ["MooncakeConnectorV1", "AscendStoreConnector"]
    assert extra["connectors"][0]["kv_port"] == "$KV_PORT"  # the node fills it in
    assert arg(p, "--kv-connector") == "MultiConnector" and up.pool_key("prefill:0") is None
    hard = topology(tmp_path / "h", "baseline.yaml", target="hardened",
                    profile=store_profile).node_spec("decode:0").args
    names = [c["kv_connector"] for c in json.loads(arg(hard, "--kv-extra"))["connectors"]]
    assert names == ["HardenedMooncakeConnector", "HardenedAscendStoreConnector"]
    assert FAMILY.roles(sc.model) == ["prefill:0", "decode:0", "proxy"]  # the default: no store


def test_vllm_node_fills_the_kv_extra_placeholders(tmp_path: Path) -> None:
    from families.pd import vllm_node

    p = vllm_node.argparse.ArgumentParser()
    vllm_node.add_node_arguments(p, "vllm")
    multi = {"connectors": [{"kv_connector": "MooncakeConnectorV1", "kv_role": "$KV_ROLE", "kv_port": "$KV_PORT"},
                            {"kv_connector": "HardenedAscendStoreConnector", "kv_role": "$KV_ROLE",
                             "kv_connector_extra_config": {"lookup_rpc_port": "$LOOKUP_RPC_PORT", "x": "$5"}}]}
    a = p.parse_args(["--role", "decode", "--port", "1", "--bootstrap-port", "2", "--server-log", "s",
                      "--kv-port", "30002", "--kv-connector", "MultiConnector", "--kv-extra", json.dumps(multi)])
    filled = vllm_node.VllmNode._kv_extra(a)
    assert filled["connectors"][0] == {"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer",
                                       "kv_port": 30002}
    assert filled["connectors"][1]["kv_connector_extra_config"] == {"lookup_rpc_port": "1", "x": "$5"}  # --port 1
    node = vllm_node.VllmNode.__new__(vllm_node.VllmNode)
    node.args, node.role, node.kv_extra, node.extra_env = a, "decode", filled, {}
    node.vllm_bin = Path(sys.executable)
    assert "PYTHONPATH" in node.environment()  # a hardened connector nested in the MultiConnector: the plugin
    a.kv_port = None
    with pytest.raises(vllm_node.NodeUsageError, match=r"\$KV_PORT has no value here"):
        vllm_node.VllmNode._kv_extra(a)


def test_profiles_leave_out_what_their_proxy_protocol_cannot_run(tmp_path: Path) -> None:
    """Under a profile whose connector the proxy pairs by kv-params or layerwise, the scenarios
    whose faults act on the bootstrap protocol (or on a phase that protocol lacks) are left out
    with the reason; the default profile leaves out nothing."""
    from harness.plan import split_plan
    from harness.schema import load_all

    scenarios = load_all([str(SCENARIOS)])
    plan = [(sc, t) for sc in scenarios for t in sc.model.targets]
    assert split_plan(plan)[1] == []  # cpu: everything runs
    keep, out = split_plan(plan, {"pd": profile("ascend", "model=/m")})
    why = {(sc.name, t): w for sc, t, w in out}
    assert "fault fake_prefill_peer acts on the proxy's bootstrap protocol" in why[("pd-fake-prefill-error", "upstream")]
    # the hardened P/D connector needs vLLM 0.32; vllm-ascend 0.23 pins 0.23 (issue 30, item 3): every
    # hardened run is left out, with the reason the profile gives
    assert all("supports vLLM 0.32.0 only" in why[(sc.name, "hardened")] for sc, t in plan if t == "hardened")
    assert "toxiproxy sits on P's bootstrap server" in why[("pd-bootstrap-latency", "upstream")]
    assert ("pd-abort-after-prefill", "upstream") not in why  # kv-params has the phase after P
    why = {(sc.name, t): w for sc, t, w in split_plan(plan, {"pd": profile("ascend-layerwise", "model=/m")})[1]}
    assert "abort_after_prefill acts on the proxy's bootstrap/kv-params" in why[("pd-abort-after-prefill", "hardened")]
    assert ("pd-baseline", "upstream") not in why and ("pd-stop-decode", "hardened") not in why
    assert len(keep) + len(out) == len(plan)


def test_random_faults_are_judged_as_drawn(tmp_path: Path) -> None:
    """A fault drawn from random_faults is judged like one written in the file."""
    from harness.plan import split_plan

    f = tmp_path / "rf.yaml"
    f.write_text("name: t-rf\nfamily: pd\nseed: 3\nworkload: {duration: 20s, concurrency: 1, rate: 1}\n"
                 "random_faults:\n  count: 1\n  window: [1s, 6s]\n  length: [1s, 2s]\n  choices:\n"
                 "    - {type: fake_prefill_peer, mode: error, count: 1}\n"
                 "triggers: [{type: ops_in_window, fault: 0}]\n"  # fault 0: the first drawn one
                 "expect: {upstream: pass, hardened: pass}\n")  # never run: only the plan is judged
    sc = load_scenario(f)
    assert sc.model.faults == [] and [x.type for x in sc.faults] == ["fake_prefill_peer"]
    keep, out = split_plan([(sc, "upstream"), (sc, "hardened")], {"pd": profile("ascend-layerwise", "model=/m")})
    assert keep == [] and all("fault fake_prefill_peer" in why for _, _, why in out)
    assert split_plan([(sc, "upstream")]) == ([(sc, "upstream")], [])


def test_bench_pd_reads_the_baseline_scenario_of_this_checkout() -> None:
    """``pdchaos bench pd`` builds its nodes from scenarios/pd/baseline.yaml (found from its own file)."""
    from families.pd import bench

    assert bench.BASELINE == SCENARIOS / "baseline.yaml" and bench.BASELINE.is_file()


@pytest.mark.parametrize("pauses, message", [
    ([{"at": "9s", "for": "3s"}], "after the workload's duration"),
    ([{"at": "1s", "for": "0s"}], "for > 0"),
    ([{"at": "1s"}], "for"),
])
def test_a_pause_outside_the_workload_or_without_length_is_refused(pauses, message) -> None:
    from families.pd.spec import PDWorkloadSpec
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        PDWorkloadSpec.model_validate({"duration": "10s", "pauses": pauses})
    ok = PDWorkloadSpec.model_validate({"duration": "10s", "pauses": [{"at": "2s", "for": "3s"}]})
    assert (ok.pauses[0].at, ok.pauses[0].for_) == (2.0, 3.0)



def test_a_pause_plans_no_ops() -> None:
    """workload_ran wants a quarter of the planned ops: a pause's seconds plan none (no tick is due
    inside it), so pd-bad-transfer-params plans its 10 ticks, not 18."""
    from families.pd.spec import PDWorkloadSpec

    assert PDWorkloadSpec.model_validate({"duration": "18s", "rate": 1}).planned_ops() == 18.0
    w = PDWorkloadSpec.model_validate({"duration": "18s", "rate": 1, "concurrency": 1,
                                       "pauses": [{"at": "3s", "for": "8s"}]})
    assert w.planned_ops() == 10.0
    w = PDWorkloadSpec.model_validate({"duration": "14s", "rate": 4, "concurrency": 4,
                                       "pauses": [{"at": "3s", "for": "4s"}, {"at": "8s", "for": "1s"}]})
    assert w.planned_ops() == 36.0
    w = PDWorkloadSpec.model_validate({"duration": "10s", "rate": 1,
                                       "pauses": [{"at": "2s", "for": "4s"}, {"at": "3s", "for": "1s"}]})
    assert w.planned_ops() == 6.0  # overlapping pauses count once

def test_a_rank_is_found_by_its_worker_title_and_only_that_rank() -> None:
    from families.pd.vllm_node import rank_pids

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", title])
             for title in ("VLLM::Worker_TP1", "VLLM::Worker_TP10", "VLLM::Worker_TP0")]
    try:
        pids = [p.pid for p in procs]
        deadline = time.monotonic() + 10
        while len(rank_pids(pids, 0) + rank_pids(pids, 1)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # each child's title is its own once it has exec'd
        assert rank_pids(pids, 1) == [pids[0]]
        assert rank_pids(pids, 0) == [pids[2]]
        assert rank_pids(pids, 2) == []
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.parametrize("params, message", [({"node": "proxy", "rank": 1}, "pattern"),
                                             ({"node": "prefill:0", "rank": -1}, "greater than"),
                                             ({"node": "prefill:0"}, "rank")])
def test_stop_rank_refuses_a_node_that_is_not_vllm_or_a_bad_rank(params, message) -> None:
    from families.pd.faults import RankParams
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        RankParams.model_validate({"at": "1s", "for": "1s", **params})


def test_store_scenarios_need_a_kv_pool_and_reset_the_server_they_name(tmp_path: Path) -> None:
    """scenarios/pd-store/: the store master is a role only with a KV pool profile; under another
    the scenario is unavailable (named, never run for nothing); a workload reset goes to the
    server it names, through the proxy protocol ``store`` (P first, then D)."""
    from families.pd.family import FAMILY
    from families.pd.workload import check_config

    store_dir = SCENARIOS.parent / "pd-store"
    sc = load_scenario(store_dir / "reset-master-frozen.yaml")
    assert FAMILY.roles(sc) == ["store", "prefill:0", "decode:0", "proxy"]
    assert "has none: run it without --profile (cpu-store)" in FAMILY.unavailable(sc, profile("cpu"))
    # without --profile a KV-pool scenario runs under cpu-store (`pdchaos run scenarios/pd-store/`)
    from families.pd.profile import profile_for

    assert profile_for(sc).name == "cpu-store" and profile_for(sc, profile("cpu")).name == "cpu"
    plain = load_scenario(SCENARIOS / "baseline.yaml")
    assert profile_for(plain).name == "cpu"
    assert FAMILY.unavailable(sc) is None or "not installed" in FAMILY.unavailable(sc)
    t = PDTopology(sc, "hardened", tmp_path, lambda rec: None, {}, profile("cpu-store"))
    cfg = t.workload_config()
    assert cfg["resets"] == [[4.0, f"http://127.0.0.1:{t.ports['decode:0']}"]]
    assert check_config(cfg) is None
    assert check_config({**cfg, "resets": [[1.0, "ftp://x"]]}) == "resets: a server_url is not http://HOST:PORT"
    proxy = t.node_spec("proxy")
    assert arg(proxy.args, "--protocol") == "store" and arg(proxy.args, "--order") == "sequential"


def test_a_reset_after_the_workload_is_refused() -> None:
    from families.pd.spec import PDWorkloadSpec
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="not before the workload's end"):
        PDWorkloadSpec.model_validate({"duration": "10s", "resets": [{"at": "10s"}]})
    ok = PDWorkloadSpec.model_validate({"duration": "10s", "resets": [{"at": "2s", "node": "prefill"}]})
    assert (ok.resets[0].at, ok.resets[0].node) == (2.0, "prefill")
