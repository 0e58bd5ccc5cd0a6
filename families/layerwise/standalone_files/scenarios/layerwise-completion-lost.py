"""P's DONE for a request never reaches the decode node (the link from P to D's listener loses every
byte for 4 s, longer than the ~3.3 s P's sender keeps trying). vllm-ascend's D has no deadline for a
request it waits for: the request stays in WAITING_FOR_REMOTE_KVS for good, its blocks held.

It builds D (vLLM's v1 Scheduler with vllm-ascend's layerwise connector, its listener on
127.0.0.1) and P (the connector's worker side and sending thread) in one process, a stand-in
metaserver that forwards each request D POSTs to P, and a TCP relay on the way from P to D's
listener. A first request goes through (P caches D's metadata); then the relay drops every byte
from P for 4 s and a second request is admitted: P writes its layers and sends DONE into the relay.
It watches that request for 8 s after its admission; D's deadline is set to 2 s
(``layerwise_recv_timeout_s``, a key releases with a deadline read).
"""

import layerwise_pair as lp

WATCH_S = 8.0


def main() -> int:
    engine, d, p, relay = lp.pair(2.0, relay=True)
    first = d.admit()
    if not lp.wait_until(lambda: d.state[first] != "waiting", 30):
        print("RESULT: set-up failed: the first request (no fault) did not finish in 30 s")
        return 2
    lp.say(f"request 1 (no fault): {d.state[first]} in {d.ended[first] - d.started[first]:.2f} s")
    if d.state[first] != "done":
        print(f"RESULT: set-up failed: the first request (no fault) ended {d.state[first]}")
        return 2
    relay.drop_up.set()
    lp.say("the link from P to D's listener drops every byte for 4 s")
    second = d.admit()
    lp.wait_until(lambda: lp.now() - d.started[second] >= 4.0, 10)
    relay.drop_up.clear()
    lp.say(f"the link heals ({relay.dropped['up']} bytes from P were dropped)")
    lp.wait_until(lambda: d.state[second] != "waiting", WATCH_S - 4.0)
    state = d.state[second]
    writes = sum(1 for t, _, mode in engine.writes if mode == "ok")
    lp.say(f"request 2: {state}; P's engine wrote {writes} layer(s) in all; "
           f"D's free blocks {d.free_blocks()} of {d.blocks_initial}")
    d.stop()
    if state == "waiting":
        print(f"RESULT: defect seen: the request whose DONE was lost is still waiting for its KV "
              f"{WATCH_S:.0f} s after its admission (D's deadline: 2 s), its blocks held")
        return 1
    took = d.ended[second] - d.started[second]
    print(f"RESULT: defect not seen: the request whose DONE was lost ended ({state}) after {took:.2f} s")
    return 0


if __name__ == "__main__":
    lp.run(main)
