"""Which hardened connectors load in this node env's python (run by
tests/connector_patch/test_versions.py in the P/D node env and in the conformance env).
argv: REPO [stubs]. ``stubs``: install pdchaos_npu_stubs first (the conformance env: no NPU here).
Prints one line ``PDCHAOS-VERSIONS-RESULT {json}``: per connector module, the status the version
table gives for what is installed, and what importing the module did (ok, refused with its
message, or another error), and whether a refused module left anything in sys.modules.
"""

from __future__ import annotations

import importlib
import json
import sys

sys.path.insert(0, sys.argv[1])
if "stubs" in sys.argv[2:]:
    import pdchaos_npu_stubs

    pdchaos_npu_stubs.install()
    import vllm_ascend  # noqa: F401

    pdchaos_npu_stubs.after_vllm_ascend()

from connector_patch import versions  # noqa: E402
from connector_patch.vllm_plugin import CONNECTORS  # noqa: E402

out = {"releases": {d: versions.release(d) for d in ("vllm", "vllm_ascend")}, "connectors": {}}
for name, module, _needs in CONNECTORS:
    row = {"status": versions.status(name)}
    try:
        importlib.import_module(module)
        row["import"] = "ok"
    except versions.UnsupportedUpstream as exc:
        row.update({"import": "refused", "message": str(exc), "left_in_sys_modules": module in sys.modules})
    except BaseException as exc:  # noqa: BLE001 - reported, the test decides
        row.update({"import": "error", "message": f"{type(exc).__name__}: {exc}"[:300]})
    out["connectors"][name] = row
# what the hardened P/D connector needs of vLLM (issue 30, item 3): the model runner's mixin asks the
# connector for get_transfer_results, and PullReqMeta carries `failed`
try:
    import dataclasses
    import inspect

    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import mooncake_connector as _mc
    from vllm.v1.worker import kv_connector_model_runner_mixin as _mixin

    out["p2p_facts"] = {"runner_calls_get_transfer_results": "get_transfer_results" in inspect.getsource(_mixin),
                        "pull_req_meta_has_failed": "failed" in {f.name for f in dataclasses.fields(_mc.PullReqMeta)}}
except BaseException as exc:  # noqa: BLE001 - reported, the test decides
    out["p2p_facts"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
print("PDCHAOS-VERSIONS-RESULT " + json.dumps(out), flush=True)
