"""Send malformed requests to vLLM's Mooncake store admin channel (the LookupKey ZMQ socket that
worker rank 0 serves for the scheduler), as a stray or buggy client on the same host could.

    python bad_lookup.py RPC_DIR     (RPC_DIR: the server's VLLM_RPC_BASE_PATH)

The channel is ZMQ REQ/REP over ipc at RPC_DIR/lookup_rpc_...; a well-formed lookup is the frames
[b"lookup", num_tokens (u32 big-endian), hash_len (u16 big-endian), the block hashes], a reset the
one frame [b"reset"] (vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/protocol.py).
This script sends, each on a socket of its own and waiting up to 3 s for the reply:

  1. [b"lookup"]                          a lookup short of its three payload frames
  2. [b"lookup", b"\\x00", b"\\x00", b""]   a lookup whose int frames have the wrong width
  3. [b"bogus"]                           an unknown tag

and prints one line per message: answered (the reply's length) or not answered. Exit 0 when the
socket was found, 2 when not. pyzmq only.
"""
import glob
import os
import sys

import zmq

MESSAGES = [("a lookup short of its payload frames", [b"lookup"]),
            ("a lookup with int frames of the wrong width", [b"lookup", b"\x00", b"\x00", b""]),
            ("an unknown tag", [b"bogus"])]
REPLY_WAIT_MS = 3000


def main():
    if len(sys.argv) != 2:
        print("usage: python bad_lookup.py RPC_DIR", file=sys.stderr)
        return 2
    paths = sorted(glob.glob(os.path.join(sys.argv[1], "lookup_rpc_*")))
    if len(paths) != 1:
        print(f"error: expected one lookup socket in {sys.argv[1]}, found {len(paths)}", file=sys.stderr)
        return 2
    ctx = zmq.Context()
    for i, (what, frames) in enumerate(MESSAGES, 1):
        sock = ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect("ipc://" + paths[0])
        sock.send_multipart(frames)
        if sock.poll(REPLY_WAIT_MS, zmq.POLLIN):
            reply = sock.recv_multipart()
            print(f"bad_lookup: message {i} ({what}): answered ({sum(map(len, reply))} bytes)", flush=True)
        else:
            print(f"bad_lookup: message {i} ({what}): not answered within {REPLY_WAIT_MS / 1000:g} s", flush=True)
        sock.close(0)
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
