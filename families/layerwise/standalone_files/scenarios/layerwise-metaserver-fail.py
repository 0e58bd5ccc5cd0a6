"""The proxy's metaserver fails the decode node's POST: the first POST is never answered (the
metaserver holds the connection 5 s, then closes it), every later one is answered 500.
vllm-ascend's scheduler posts with no timeout (httpx ``timeout=None``: the POST thread waits as long
as the metaserver holds it), ignores the answer's status (a 500 counts as success) and posts the
same request again after any exception, up to 3 times (the proxy could send it to P twice). The
request is never forwarded to P and D waits for it for good.

It builds D (vLLM's v1 Scheduler with vllm-ascend's layerwise connector, its listener on
127.0.0.1) and a stand-in metaserver, admits a request (its POST is the one held) and, 0.5 s later,
a second (answered 500), and watches both for 10 s. D's deadline is set to 2.5 s and the POST's bound
to 1 s (``layerwise_recv_timeout_s``, ``metaserver_timeout_s``: keys releases with those bounds read).
"""

import time

import layerwise_pair as lp

WATCH_S = 10.0


def main() -> int:
    d = lp.Decode(lp.StandInEngine(), lp.bounds(2.5))
    ms = lp.StandInMetaserver(["hang:5", "500"])
    held = d.admit(ms.url)
    time.sleep(0.5)
    refused = d.admit(ms.url)
    lp.wait_until(lambda: all(s != "waiting" for s in d.state.values()) and lp.now() - d.started[held] > 6,
                  WATCH_S)
    for what, rid in (("request 1 (POST held 5 s)", held), ("request 2 (POST answered 500)", refused)):
        state = d.state[rid]
        ended = f" after {d.ended[rid] - d.started[rid]:.2f} s" if rid in d.ended else ""
        lp.say(f"{what}: {state}{ended}; POSTs the metaserver got for it: "
               f"{sum(1 for _, r, _ in ms.posts if rid.startswith(r))}")
    lp.say(f"D's free blocks {d.free_blocks()} of {d.blocks_initial}")
    d.stop()
    waiting = [r for r in (held, refused) if d.state[r] == "waiting"]
    posted_twice = sum(1 for _, r, _ in ms.posts if held.startswith(r)) > 1
    if waiting or posted_twice:
        first = [p for p in ms.posts if held.startswith(p[1])]
        why = []
        if waiting:
            why.append(f"{len(waiting)} of 2 requests still waiting {WATCH_S:.0f} s after admission "
                       f"(D's deadline: 2.5 s)")
        if posted_twice:
            why.append(f"request 1 was POSTed {len(first)} times, the second try {first[1][0] - first[0][0]:.1f} s "
                       f"after the first (its first POST had no timeout)")
        print("RESULT: defect seen: " + "; ".join(why))
        return 1
    took = max(d.ended[r] - d.started[r] for r in (held, refused))
    print(f"RESULT: defect not seen: both requests failed within {took:.2f} s of admission "
          f"(request 2 at its 500), each POSTed once")
    return 0


if __name__ == "__main__":
    lp.run(main)
