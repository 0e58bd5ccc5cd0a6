"""The run-wide services the runner lends to every topology of a run (``services``): one
toxiproxy-server when a scenario needs it (started here, with its measurement floor), and the
node pool (harness/pool.py)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path


def _needs_toxiproxy(sc) -> bool:
    from faults.base import load_registry

    registry = load_registry(sc.family.name)
    return "toxiproxy" in sc.family.requirements(sc) or any("toxiproxy" in registry[f.type].requires
                                                            for f in sc.faults)


def start_toxiproxy(scenarios, stack: ExitStack, run_dir: Path | None = None, *, always: bool = False):
    """One toxiproxy-server for the whole run, only if a scenario needs it and it is installed.

    ``always``: started whenever it is installed, for a run whose scenarios are not known when it
    starts (``pdchaos explore`` draws them as it goes; a drawn toxic must find the server up).

    With ``run_dir``, the measurement floor (what the proxy adds with no toxic, and a latency
    toxic configured vs measured) is measured once, before any scenario, and written to
    ``<run_dir>/toxiproxy_floor.json`` (harness/floor.py); when toxiproxy-server is missing the
    file says so. A failed measurement is recorded there and never fails the run."""
    if not always and not any(_needs_toxiproxy(s) for s in scenarios):
        return None
    from . import floor
    from .errors import HarnessError

    try:
        from faults.toxiproxy import ToxiproxyError, ToxiproxyServer, find_server_binary
    except ImportError as exc:
        if run_dir is not None:
            floor.write_unmeasured(run_dir, f"toxiproxy client library missing: {exc}")
        return None
    if find_server_binary() is None:
        if run_dir is not None:
            floor.write_unmeasured(run_dir, "toxiproxy-server is not installed (see `pdchaos doctor`)")
        return None
    try:
        server = stack.enter_context(ToxiproxyServer())
    except ToxiproxyError as exc:  # one line, exit 2 (HarnessError), not a traceback
        raise HarnessError(f"toxiproxy-server did not start: {exc}") from None
    api = server.client()
    if run_dir is not None:
        floor.measure_and_write(api, run_dir)
    return api
