"""vllm-ascend's own unit-test stubs, loaded from a vllm-ascend checkout: nothing else is stubbed.

A host without an Ascend NPU has no torch_npu, no CANN (acl) and no NPU build of Mooncake's
transfer engine, so ``import vllm_ascend`` fails there. vllm-ascend's unit tests run on such hosts
(its CPU runner) through ``tests/ut/conftest.py``, which puts stand-ins for exactly those modules in
``sys.modules`` when ``npu-smi info`` fails. This file runs that conftest, from the checkout named by
``VLLM_ASCEND_SRC`` (the vllm-ascend source tree of the release installed: its ``tests/`` folder),
as a module of its own name: the vllm_ascend package imported afterwards is the installed one. On a
host with an NPU the conftest stubs nothing. It needs pytest (the conftest imports it).
"""

from __future__ import annotations

import importlib.util
import os
import sys


def load() -> None:
    src = os.environ.get("VLLM_ASCEND_SRC", "")
    path = os.path.join(src, "tests", "ut", "conftest.py")
    if not src or not os.path.isfile(path):
        sys.exit(f"error: VLLM_ASCEND_SRC={src!r} is not a vllm-ascend source tree with tests/ut/conftest.py")
    spec = importlib.util.spec_from_file_location("vllm_ascend_ut_conftest", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
