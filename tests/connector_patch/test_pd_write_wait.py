"""P's write waiting on a D that takes no bytes, with REAL Mooncake engines (the P/D node env's):
the hardened P's way of writing (connector_patch/pd/write.py ``submit_and_wait``) costs next to no
CPU while it waits; upstream's ``batch_transfer_sync_write`` (what the hardened P did before) is
measured beside it in the same run, as the contrast. Both must land every byte once D goes on.

Found on real nodes under a kubelet (pd-mixed-upstream-decode [hardened] on k8s-local: a freeze
of D that acted after D's pull held P's write 14 s at 1.04 of a core, no_busy_wait failed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodes import run_env_helper

MARKER = "PDCHAOS-WRITE-WAIT "
TIMEOUT_S = 300


@pytest.mark.timeout(TIMEOUT_S + 30)
def test_a_write_waiting_on_a_frozen_decode_sleeps() -> None:
    from stacks.vllm_cpu.recipe import pd_node_env

    env = pd_node_env(out=lambda line: None)
    if not env.installed():
        pytest.skip("the P/D node stack (vLLM, torch, Mooncake) is not installed here: "
                    "run `pdchaos setup --only pd-node-stack`")
    repo = Path(__file__).resolve().parents[2]
    script = repo / "tests" / "helpers" / "mooncake_write_wait.py"
    child_env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    r, _, _ = run_env_helper([str(env.python), str(script), str(repo)], env=child_env, cwd=str(repo),
                             timeout=TIMEOUT_S, marker=MARKER)
    print("write waiting on a stopped receiver (cores of P's process):", r["sync"], r["hardened"], r["hardened_many"])
    for rnd in r["rounds"]:
        # the write waited for the receiver all the while it was stopped, then ended well
        assert rnd["waited_whole_stop"] and rnd["ret"] == 0 and rnd["bytes_landed"], rnd
    assert r["hardened"]["cores_max"] < 0.1 and r["hardened_many"]["cores_max"] < 0.1, r
    # the contrast, measured in the same run: the instrument sees a write that spins (2026-12-07,
    # this machine: sync 0.91-0.96 of a core, hardened 0.010-0.015, 3 rounds each)
    assert r["sync"]["cores_max"] > 0.3, r
