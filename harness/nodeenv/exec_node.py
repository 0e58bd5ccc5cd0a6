"""Run a node's own code in a node env: ``os.execve`` the env's python on a module of this checkout.

A node kind whose code must import a strictly pinned stack (vllm-ascend with its vLLM and torch)
is still started the usual way (``pdchaos node KIND ARGS``, by the runner, in the harness's env);
its ``run_node`` then replaces the process with the node env's python running ``-m MODULE ARGS``.
The pid, the process group, stdout (READY) and the control channel stay what the runner started,
so freezing, killing and probing it work as for any node. The node env sees this checkout through
``PYTHONPATH`` (only its pure-Python packages: ``nodekit``, ``faults``, ``harness``, ``families``,
``connector_patch``; their third-party needs, pyzmq and msgpack, are in the env), never the
harness's site-packages.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

CHECKOUT = Path(__file__).resolve().parent.parent.parent


def env_for(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a node that runs in a node env: the harness's, minus what would point
    Python elsewhere, with this checkout on ``PYTHONPATH`` and the hubs offline."""
    from .venv import child_env

    env = child_env({"PYTHONPATH": str(CHECKOUT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                     "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def exec_module(python: Path, module: str, argv: Sequence[str], extra_env: Mapping[str, str] | None = None) -> None:
    """Replace this process with ``python -m module argv`` (never returns). A missing env is one
    ``error:`` line naming the setup step, exit 2."""
    if not python.exists():
        print(f"error: the node env's python {python} is missing: run `pdchaos setup --only ascend-conf-stack`",
              flush=True)
        sys.stderr.flush()
        os._exit(2)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(str(python), [str(python), "-m", module, *[str(a) for a in argv]], env_for(extra_env))
