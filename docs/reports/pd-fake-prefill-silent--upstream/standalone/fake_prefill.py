"""A prefill node that takes D's KV pull and never answers it (a P that hangs after the handshake),
for vLLM 0.32.0's MooncakeConnector. Standard library plus pyzmq (which vLLM installs).

It plays what D sees of a prefill node:
  - the bootstrap server, GET http://127.0.0.1:BOOTSTRAP_PORT/query ->
    {"0": {"engine_id": E, "worker_addr": {"0": {"0": "tcp://127.0.0.1:SIDE_PORT"}}}}
    (data-parallel rank -> engine id and {tp rank: {pp rank: side-channel address}});
  - the side channel, a ZMQ ROUTER on SIDE_PORT: D's worker connects a DEALER and sends one frame,
    the msgpack of its transfer metadata; a real P writes the KV into D's memory and answers a
    msgpack status map. This one reads the pull and answers nothing.

    python fake_prefill.py BOOTSTRAP_PORT SIDE_PORT      (stops on SIGTERM or after 600 s)
"""

import http.server
import json
import sys
import threading
import time
import uuid

import zmq


def main():
    bport, sport = int(sys.argv[1]), int(sys.argv[2])
    entry = {"0": {"engine_id": str(uuid.uuid4()), "worker_addr": {"0": {"0": f"tcp://127.0.0.1:{sport}"}}}}

    class Bootstrap(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(entry).encode() if self.path.startswith("/query") else b"{}"
            self.send_response(200 if self.path.startswith("/query") else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", bport), Bootstrap)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"tcp://127.0.0.1:{sport}")
    print(f"fake prefill: bootstrap on {bport}, side channel on {sport}", flush=True)
    pulls, end = 0, time.monotonic() + 600
    while time.monotonic() < end:
        if sock.poll(500):
            frames = sock.recv_multipart()
            pulls += 1
            print(f"fake prefill: pull {pulls} received ({len(frames)} frames); not answering it", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
