"""P's transfer engine fails while P pushes a request's layers: for one request it raises, for the
next it returns -1 (a Mooncake engine does either when its session breaks); the third request's
writes succeed. vllm-ascend's sending thread catches the exception and goes on, but never tells D:
that request waits for good. On -1 it tells D FAILED; D's scheduler finishes the request with an
error, but D's connector never reports its load finished, so its blocks are never freed.

It builds D (vLLM's v1 Scheduler with vllm-ascend's layerwise connector, its listener on
127.0.0.1) and P (the connector's worker side and sending thread) in one process with a stand-in
metaserver that forwards each request D POSTs to P, and a stand-in transfer engine (in the place of
Mooncake's NPU engine) told to raise, then to return -1, then to succeed, one request each. It
watches the requests for 8 s after the first one's admission and counts D's free blocks. D's
deadline is set to 4.5 s (``layerwise_recv_timeout_s``).
"""

import layerwise_pair as lp

WATCH_S = 8.0
BLOCKS_EACH = 64 // lp.BLOCK  # a request's prompt: 64 tokens


def main() -> int:
    engine, d, p, _ = lp.pair(4.5)
    rids = []
    for mode in ("raise", "fail", "ok"):
        engine.mode = mode
        rids.append(d.admit())
        if not lp.wait_until(lambda: len(p.forwards) == len(rids), 30):
            print("RESULT: set-up failed: P did not run the request's forward pass in 30 s")
            return 2
        lp.wait_until(lambda: len(engine.writes) >= 2 * len(rids), 5)  # both layers' writes tried
    lp.wait_until(lambda: all(s != "waiting" for s in d.state.values()) or lp.now() - d.started[rids[0]] > WATCH_S,
                  WATCH_S + 2)
    lp.wait_until(lambda: d.free_blocks() == d.blocks_initial, 1.0)
    for what, rid in zip(("engine raised", "engine returned -1", "writes succeeded"), rids):
        ended = f" after {d.ended[rid] - d.started[rid]:.2f} s" if rid in d.ended else ""
        lp.say(f"request ({what}): {d.state[rid]}{ended}")
    waiting = [r for r in rids if d.state[r] == "waiting"]
    held = d.blocks_initial - d.free_blocks()
    leaked = held - BLOCKS_EACH * len(waiting)  # held by no request still waiting
    lp.say(f"D's free blocks {d.free_blocks()} of {d.blocks_initial}: {held} held, {leaked} of them by a request "
           f"that has ended")
    d.stop()
    if waiting or leaked:
        why = []
        if d.state[rids[0]] == "waiting":
            why.append(f"the request whose write raised is still waiting {WATCH_S:.0f} s after admission "
                       f"(D never told)")
        if leaked:
            why.append(f"{leaked} of D's {d.blocks_initial} blocks are never given back by the request that ended "
                       f"with an error")
        print("RESULT: defect seen: " + "; ".join(why or [f"{len(waiting)} request(s) still waiting"]))
        return 1
    print(f"RESULT: defect not seen: both failed requests ended with an error "
          f"({d.ended[rids[0]] - d.started[rids[0]]:.2f} s, {d.ended[rids[1]] - d.started[rids[1]]:.2f} s), "
          f"the third {d.state[rids[2]]}, and all {d.blocks_initial} blocks are back")
    return 0


if __name__ == "__main__":
    lp.run(main)
