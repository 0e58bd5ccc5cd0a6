"""A toy second family, kept in the tests: an echo server over ZMQ REQ/REP.

It proves the family seams are real: it plugs into ``pdchaos run`` by adding files only (this
folder, on PYTHONPATH, named by ``family: echo_family`` in a scenario) and brings its own
``topology:`` / ``workload:`` blocks, node kinds, workload, a check (``echo_matches``) and a fault
(``echo_garble``); the generic checks and process faults (``kill`` by role) work on it unchanged.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:  # the family is built on first use; nodes import only .nodes
    if name == "FAMILY":
        from .family import FAMILY

        return FAMILY
    raise AttributeError(name)
