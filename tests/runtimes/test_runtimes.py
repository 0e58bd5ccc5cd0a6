"""Nodes are handles (harness/runtime.py): the local runtime's handle does what the topology and
the faults ask of a node, the runtimes are found by name, and a fault a runtime cannot do leaves
its scenario out of the plan before anything starts, with the reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.plan import runtime_refusal, split_plan
from harness.runtime import Launch, NodeHandle, load_runtime, runtime_names
from harness.schema import load_all

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]


def test_runtimes_are_found_by_name_and_an_unknown_one_is_one_clear_error() -> None:
    assert {"local", "k8s"} <= set(runtime_names())
    assert load_runtime() is load_runtime("local")
    with pytest.raises(UsageError, match="no such runtime"):
        load_runtime("nope")


def test_a_local_node_is_a_handle_that_freezes_thaws_and_dies(tmp_path: Path) -> None:
    """Start, freeze (seen stopped in /proc), thaw, kill: all through the handle, never a pid."""
    rt = load_runtime("local")
    script = "import time,sys; print('READY', flush=True); time.sleep(60)"
    launch = Launch(role="x", kind="probe", argv=[sys.executable, "-c", script], name="probe",
                    log_path=str(tmp_path / "probe.log"), ready_timeout_s=10)
    h = rt.open("t").start(launch)
    assert isinstance(h, NodeHandle) and h.alive and h.instance
    try:
        assert h.freeze() is True
        h.thaw()
        assert h.alive
        h.kill()
        assert h.gone(2.0) and not h.alive
        assert h.kill() == h.returncode  # idempotent
    finally:
        h.stop(1.0)


def test_a_local_handle_of_a_process_that_never_gets_ready_leaves_nothing(tmp_path: Path) -> None:
    from harness.errors import HarnessError

    launch = Launch(role="x", kind="probe", argv=[sys.executable, "-c", "import time; time.sleep(30)"],
                    name="probe", ready_timeout_s=0.5)
    with pytest.raises(HarnessError, match="not ready within"):
        load_runtime("local").open("t").start(launch)


def _pd(name: str):
    return next(s for s in load_all([str(REPO / "scenarios" / "pd")]) if s.name == name)


def test_the_local_runtime_refuses_nothing_of_the_p_d_suite() -> None:
    scenarios = load_all([str(REPO / "scenarios" / "pd")])
    assert all(runtime_refusal(sc) is None for sc in scenarios)


def test_the_cluster_runtime_refuses_what_it_cannot_do_before_anything_starts() -> None:
    """A Toxiproxy toxic with no Chaos Mesh equivalent is left out with the reason; kill, stop
    (exec), partition and latency (Chaos Mesh) are planned; attach mode refuses restarting a
    user's pod but plans a freeze."""
    fam = _pd("pd-baseline").family
    k8s = fam.load_profile("k8s", [])
    assert "reset_peer" in (runtime_refusal(_pd("pd-bootstrap-reset"), k8s) or "")
    # a toxic on P's bootstrap link only: Chaos Mesh would delay all of P's traffic, another fault
    assert "selects pods, not ports" in (runtime_refusal(_pd("pd-bootstrap-latency"), k8s) or "")
    for name in ("pd-kill-prefill-before-pull", "pd-stop-decode", "pd-partition-prefill-decode",
                 "pd-fake-prefill-silent"):
        assert runtime_refusal(_pd(name), k8s) is None, name
    keep, left = split_plan([(_pd("pd-bootstrap-reset"), "hardened"), (_pd("pd-stop-decode"), "hardened")],
                            {"pd": k8s})
    assert [sc.name for sc, _ in keep] == ["pd-stop-decode"] and "Toxiproxy" in left[0][2]


def test_a_fault_keyed_on_a_phase_is_left_out_of_a_cluster_run_before_anything_starts() -> None:
    """The phase journal runs in processes of this machine: under a cluster profile a scenario that
    keys a fault on a phase is left out with its reason (listed before the run), not skipped as it
    comes (a skip fails --strict, and it is a property of the profile, not of what is installed)."""
    sc = _pd("pd-stop-decode-mid-write")
    k8s = sc.family.load_profile("k8s", [])
    keep, left = split_plan([(sc, "hardened"), (_pd("pd-stop-decode"), "hardened")], {"pd": k8s})
    assert [s.name for s, _ in keep] == ["pd-stop-decode"]
    assert "keyed on a protocol phase" in left[0][2] and "profile k8s" in left[0][2]
    assert split_plan([(sc, "hardened")])[1] == []  # the local runtime runs it


def test_attach_mode_deletes_no_user_pod_and_restarts_a_container_only(tmp_path: Path) -> None:
    from harness.runtime import load_runtime as rt

    fam = _pd("pd-baseline").family
    prof = fam.load_profile("k8s", ["cluster.mode=attach", "cluster.attach.namespace=serving",
                                    "cluster.attach.selectors.prefill:0=role=prefill"])
    assert prof.cluster.mode == "attach"
    # a kill, even as Chaos Mesh's pod-kill, deletes the user's pod; node_down deletes its workload
    assert "deletes nothing it did not create" in rt("k8s").refuses(["kill"], {"topology": (), "kill": ("kill",)}, prof)
    assert "deletes nothing it did not create" in rt("k8s").refuses(["node_down"], {"topology": (), "node_down": ("stop",)},
                                                                       prof)
    # restart (a container-kill: the kubelet starts the container again in its pod) and freeze act inside it
    assert rt("k8s").refuses(["restart"], {"topology": (), "restart": ("restart",)}, prof) is None
    assert rt("k8s").refuses(["stop"], {"topology": (), "stop": ("freeze",)}, prof) is None


@pytest.mark.parametrize("sets, msg", [
    (["cluster.image="], "cluster.image"),
    (["cluster.workload=helm"], "cluster.workload"),
    (["cluster.mode=attach"], "mode attach: name the deployment"),
    (["runtime=nope"], "no such runtime"),
])
def test_a_bad_cluster_profile_is_one_error_naming_the_field(sets, msg) -> None:
    fam = _pd("pd-baseline").family
    with pytest.raises(UsageError, match=msg):
        fam.load_profile("k8s", sets)
