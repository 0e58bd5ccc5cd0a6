"""Send malformed lookup requests to an AscendStore lookup server, in its own wire format.

    python bad_requests.py ipc://.../lookup_rpc_port_N_dp_rank0

What vllm-ascend's LookupKeyClient sends, one ZMQ multipart message per lookup (to a REP socket):

    [token_len: 4-byte big-endian u32, kv_cache_group_ids: msgpack list of int,
     hbm_hit_tokens: 4-byte big-endian u32, block hashes: msgpack list of hex strings]

and the server answers a 4-byte big-endian hit count. This script breaks that message three ways
(one at a time, each from a fresh DEALER socket, waiting up to 1 s for an answer) and prints how many
were answered. Any process that can reach the socket can send such a message: a client of another
version, a stray or buggy client. Needs only pyzmq and msgpack.
"""

import struct
import sys

import msgpack
import zmq

GOOD = [struct.pack(">I", 64), msgpack.packb([0]), struct.pack(">I", 0), msgpack.packb(["01" * 32])]
BAD = {
    "two frames instead of four": GOOD[:2],
    "group ids that are not msgpack": [GOOD[0], b"\xc1", GOOD[2], GOOD[3]],
    "hashes that are not msgpack": [GOOD[0], GOOD[1], GOOD[2], b"\xc1"],
}
REPLY_WAIT_MS = 1000


def main(endpoint: str) -> int:
    ctx = zmq.Context()
    answered = 0
    for what, frames in BAD.items():
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        s.send_multipart([b"", *frames])  # the empty delimiter a REQ socket puts first
        if s.poll(REPLY_WAIT_MS):
            reply = s.recv_multipart()
            answered += 1
            print(f"bad_requests: {what}: answered ({len(reply[-1])} bytes)", flush=True)
        else:
            print(f"bad_requests: {what}: no answer within {REPLY_WAIT_MS} ms", flush=True)
        s.close()
    ctx.term()
    print(f"bad_requests: {answered} of {len(BAD)} answered", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].startswith(("ipc://", "tcp://")):
        sys.exit("usage: python bad_requests.py ipc://PATH")
    sys.exit(main(sys.argv[1]))
