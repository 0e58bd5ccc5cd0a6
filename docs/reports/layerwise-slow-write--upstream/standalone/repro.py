"""P's transfer engine turns slow: every write takes 2.5 s longer (it succeeds, late). vllm-ascend's
decode node has no deadline for a request it waits for: it waits for the late layers, well past the
bound it was given.

It builds D (vLLM's v1 Scheduler with vllm-ascend's layerwise connector, its listener on
127.0.0.1) and P (the connector's worker side and sending thread) in one process, a stand-in
metaserver that forwards each request D POSTs to P, and a stand-in transfer engine (in the place of
Mooncake's NPU engine) whose writes take 2.5 s longer. One request is admitted and watched for 10 s;
D's deadline is set to 2 s (``layerwise_recv_timeout_s``, a key releases with a deadline read). It
also records when D gave the request's blocks back and whether a write of P landed after that.
"""

import layerwise_pair as lp

BOUND_S = 2.0
WATCH_S = 10.0


def main() -> int:
    engine, d, p, _ = lp.pair(2.0)
    engine.delay_s = 2.5
    rid = d.admit()
    lp.wait_until(lambda: d.free_blocks() < d.blocks_initial, 5)
    lp.wait_until(lambda: d.free_blocks() == d.blocks_initial, WATCH_S)
    freed = lp.now()
    lp.wait_until(lambda: d.state[rid] != "waiting", 1.0)
    lp.wait_until(lambda: bool(p.forwards) and len(engine.writes) >= 1, 6)
    lp.wait_until(lambda: False, 3.0)  # a write still in flight lands (or not)
    state = d.state[rid]
    took = d.ended[rid] - d.started[rid] if rid in d.ended else None
    late = [t for t, _, _ in engine.writes if t > freed + 0.05] if d.free_blocks() == d.blocks_initial else []
    lp.say(f"the request: {state}" + (f" after {took:.2f} s" if took is not None else "")
           + f"; P's writes {len(engine.writes)}, landing after D gave the blocks back: {len(late)}")
    d.stop()
    if took is None or took > BOUND_S + 1.0:
        print(f"RESULT: defect seen: D waited for the late layers: the request ended "
              + (f"{state} after {took:.2f} s" if took is not None else f"not at all in {WATCH_S:.0f} s")
              + f" (its deadline: {BOUND_S:.0f} s)")
        return 1
    if late:
        print(f"RESULT: defect seen: {len(late)} write(s) of P landed in blocks D had given back")
        return 1
    print(f"RESULT: defect not seen: the request failed at its deadline ({took:.2f} s), and no write of P landed "
          f"after D gave its blocks back")
    return 0


if __name__ == "__main__":
    lp.run(main)
