"""Send malformed and unexpected messages to a layerwise decode node's side-channel listener, in its
own wire format, as the prefill node's sender does: a ZMQ REQ socket, one frame per message, each
a msgpack array whose first element names the message:

    (b"get_meta_msg", request_id)                      -> the decode node's metadata
    (b"done_sending_msg", request_id, count, sender)   -> b"ACK"
    (b"failed_sending_msg", request_id)                -> b"ACK"

    python garbage_sender.py tcp://HOST:PORT

It sends four messages the listener cannot use (bytes that are not msgpack, a msgpack map, an
unknown message name, a DONE without its fields), each from a fresh REQ socket that waits up to 1 s
for an answer, as vllm-ascend's sender waits one try; then one well-formed GET_META. Any process
that reaches the port can send such a message: a peer of another version, a stray client, a port
scanner. Needs only pyzmq and msgpack. The answers' bytes are never printed, only their length.
"""

import sys
import time

import msgpack
import zmq

BAD = {
    "bytes that are not msgpack": b"\xc1\xc1\xc1",
    "a msgpack map, not an array": msgpack.packb({"a": 1}),
    "an unknown message name": msgpack.packb([b"weird_msg", "req-1"]),
    "a DONE without its fields": msgpack.packb([b"done_sending_msg"]),
}
GOOD = msgpack.packb([b"get_meta_msg", "req-1"])
WAIT_MS = 1000


def ask(ctx: zmq.Context, endpoint: str, frame: bytes) -> tuple[float, int | None]:
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    t0 = time.monotonic()
    s.send(frame)
    reply = s.recv() if s.poll(WAIT_MS) else None
    s.close()
    return time.monotonic() - t0, (None if reply is None else len(reply))


def main(endpoint: str) -> int:
    ctx = zmq.Context()
    answered = 0
    for what, frame in BAD.items():
        took, size = ask(ctx, endpoint, frame)
        if size is None:
            print(f"garbage_sender: {what}: no answer within {WAIT_MS} ms", flush=True)
        else:
            answered += 1
            print(f"garbage_sender: {what}: answered in {took * 1000:.1f} ms ({size} bytes)", flush=True)
    took, size = ask(ctx, endpoint, GOOD)
    print(f"garbage_sender: a well-formed GET_META: "
          f"{'no answer' if size is None else f'answered in {took * 1000:.1f} ms ({size} bytes)'}", flush=True)
    print(f"garbage_sender: {answered} of {len(BAD)} bad messages answered; "
          f"GET_META {'answered' if size is not None else 'not answered'}", flush=True)
    ctx.term()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].startswith("tcp://"):
        sys.exit("usage: python garbage_sender.py tcp://HOST:PORT")
    sys.exit(main(sys.argv[1]))
