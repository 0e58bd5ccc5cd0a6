"""Malformed and unexpected messages reach the decode node's side-channel listener
(KVCacheRecvingLayerThread). It logs each at ERROR and sends nothing back, so the sender (a REQ
socket: the prefill node's DONE/FAILED and metadata senders) waits out its whole timeout on every
try: with vllm-ascend's sender, 3 tries of 1 s for each message.

It starts vllm-ascend's own KVCacheRecvingLayerThread (the decode node's listener, as the layerwise
connector's register_kv_caches starts it) on a free port of 127.0.0.1, then runs
``garbage_sender.py`` against it: four messages it cannot use, each waiting up to 1 s for an answer,
and one well-formed GET_META.
"""

import os
import socket
import subprocess
import sys
import threading

os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")  # the listener binds get_ip()

import ut_stubs  # noqa: E402

ut_stubs.load()  # vllm-ascend's own tests/ut/conftest.py: torch_npu, acl, torch.npu, mooncake.engine

from vllm_ascend.distributed.kv_transfer.kv_p2p import mooncake_layerwise_connector as lw  # noqa: E402


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main() -> int:
    port = free_port()
    listener = lw.KVCacheRecvingLayerThread(
        tp_rank=0, side_channel_port=port, tp_size=1, pd_head_ratio=1, local_engine_id="engine-d",
        metadata=lw.MooncakeAgentMetadata(te_rpc_port=6000, layer_metadata={}), ready_event=threading.Event())
    listener.start()
    if not listener.ready_event.wait(60):
        print("RESULT: set-up failed: the listener did not start in 60 s")
        return 2
    print(f"repro: the decode node's listener serves tcp://127.0.0.1:{port}", flush=True)
    out = subprocess.run([sys.executable, "garbage_sender.py", f"tcp://127.0.0.1:{port}"], capture_output=True,
                         text=True, timeout=120)
    print(out.stdout, end="", flush=True)
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.returncode != 0 or "bad messages answered" not in last:
        print(f"RESULT: set-up failed: garbage_sender.py exit {out.returncode}: {out.stderr.strip()[-300:]}")
        return 2
    answered = int(last.split("garbage_sender: ", 1)[1].split(" of ", 1)[0])
    if "GET_META not answered" in last:
        print("RESULT: defect seen: the listener no longer answers a well-formed GET_META after the bad messages")
        return 1
    if answered < 4:
        print(f"RESULT: defect seen: {4 - answered} of 4 bad messages got no answer within 1 s: their sender "
              f"waits its whole timeout on every try (vllm-ascend's sender: 3 tries of 1 s)")
        return 1
    print("RESULT: defect not seen: all 4 bad messages were answered at once (an error code), and GET_META after them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
