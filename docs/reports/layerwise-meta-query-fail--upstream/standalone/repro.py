"""The decode node's answers to P's first metadata query are lost (the link from D's listener back to
P drops every byte for 5 s). vllm-ascend's P re-raises the query's error, skips the request for that
layer and asks again on the next layer, each query ~3.3 s (3 tries of 1 s) inside the forward pass;
D is never told. The request either waits on D for good, or, when a later layer's query gets
through, is told DONE with its first layer never written.

It builds D (vLLM's v1 Scheduler with vllm-ascend's layerwise connector, its listener on
127.0.0.1) and P (the connector's worker side and sending thread) in one process, a stand-in
metaserver that forwards each request D POSTs to P, and a TCP relay P reaches D's listener through.
The relay drops D's bytes for the first 5 s; one request is admitted at once and watched for 10 s.
D's deadline is set to 2 s and the query's bound to 1 s (``layerwise_recv_timeout_s``,
``layerwise_meta_timeout_s``: keys releases with those bounds read).
"""

import layerwise_pair as lp

WATCH_S = 10.0


def main() -> int:
    engine, d, p, relay = lp.pair(2.0, relay=True)
    relay.drop_down.set()
    t_fault = lp.now()
    lp.say("the link from D's listener back to P drops every byte for 5 s")
    rid = d.admit()
    lp.wait_until(lambda: lp.now() - t_fault >= 5.0, 6)
    relay.drop_down.clear()
    lp.say(f"the link heals ({relay.dropped['down']} bytes from D were dropped)")
    lp.wait_until(lambda: d.state[rid] != "waiting" and p.forwards, WATCH_S - 5.0)
    lp.wait_until(lambda: bool(p.forwards), 10)
    layers = sorted({layer for _, layer, mode in engine.writes if mode == "ok" and layer >= 0})
    fwd = f"{p.forwards[0][1]:.2f} s" if p.forwards else "not finished"
    state = d.state[rid]
    ended = f" after {d.ended[rid] - d.started[rid]:.2f} s" if rid in d.ended else ""
    lp.say(f"P's forward pass took {fwd}; layers written to D: {len(layers)} of {lp.LAYERS}")
    lp.say(f"the request: {state}{ended}; D's free blocks {d.free_blocks()} of {d.blocks_initial}")
    d.stop()
    if state == "waiting":
        print(f"RESULT: defect seen: the request is still waiting {WATCH_S:.0f} s after admission (D never told "
              f"its metadata query failed); P's forward pass took {fwd}")
        return 1
    if state == "done" and len(layers) < lp.LAYERS:
        print(f"RESULT: defect seen: D completed the request with {lp.LAYERS - len(layers)} of {lp.LAYERS} layers "
              f"never written; P's forward pass took {fwd}")
        return 1
    print(f"RESULT: defect not seen: the request ended ({state}){ended}; P's forward pass took {fwd}")
    return 0


if __name__ == "__main__":
    lp.run(main)
