"""``server_close``: the lookup server object is closed while its serving thread waits in ``recv``.

That is what an engine shutdown (or a connector torn down and built again) does to worker rank 0's
lookup server. vllm-ascend 0.23.0.post1's ``LookupKeyServer.close()`` closes the REP socket under
the thread blocked in ``recv_multipart``: libzmq asserts (``signaler.cpp``) and the whole process
aborts (exit 134; measured 5 of 6 times, within 1 s of the close returning), taking the worker with it (../shared/pd-on-cpu.md, part B). The hardened server
stops its thread first, then closes.

The fault sends ``close_server`` to the server node (``ascend-lookup-server``), then records one
``server_close`` event: whether the process survived, its exit code if not, and how long the close
took. Healing serves again: a new server object on the same path, or, when the process died, the
node started again. Only vllm-ascend's real servers (targets that run in the conformance env) have
this command.
"""

from __future__ import annotations

import time

from faults.base import OnceFault, register

EXIT_WAIT_S = 3.0
SETTLE_S = 1.5  # how long the process must outlive a close that returned


@register
class ServerClose(OnceFault):
    """The server's ``close()`` is called while its thread waits in ``recv``; healed by serving again."""

    family = "lookup"
    name = "server_close"
    categories = ("timeout", "transport")

    def inject(self) -> None:
        node = self.ctx.node("server")
        t0 = time.monotonic()
        reply, error = None, ""
        try:
            reply = self.ctx.server_control("close_server", timeout_ms=int(EXIT_WAIT_S * 1000))
        except Exception as exc:  # the process died under the call: see below
            error = type(exc).__name__
        # Upstream's abort comes from the serving thread as it wakes up in recv on the closed
        # socket, just after close() returned (measured: within 1 s, 5 of 6 times): watch the
        # process for a while even when the close answered.
        end = time.monotonic() + (SETTLE_S if reply is not None else EXIT_WAIT_S)
        while node.handle.alive and time.monotonic() < end:
            time.sleep(0.05)
        code = node.handle.returncode
        survived = reply is not None and node.handle.alive
        self.ctx.event("server_close", role="server", pid=node.handle.instance, survived=survived, exit_code=code,
                       error=error, close_ms=(reply or {}).get("close_ms"),
                       elapsed_ms=round((time.monotonic() - t0) * 1000, 1))

    def heal(self) -> None:
        node = self.ctx.nodes.get("server")
        if node is None or not node.handle.alive:
            self.ctx.start_node("server")
        else:
            self.ctx.server_control("reopen_server")
