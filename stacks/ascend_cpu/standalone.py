"""The ``standalone/`` folder of a report on vllm-ascend's code: the defect with vllm-ascend alone.

What the lookup and layerwise families share (each keeps its cases and files: families/lookup/
ascend_standalone.py, families/layerwise/standalone.py). The folder a vllm-ascend maintainer runs
with only vllm-ascend, its vLLM, pytest and a vllm-ascend source tree of the same release:

* ``README.md`` in the shape of vllm-ascend's bug-report issue form (Your current environment,
  Describe the bug, how to reproduce, expected vs actual in plain words, the log lines of a run);
* ``run.sh [PYTHON [VLLM_ASCEND_SRC]]``: runs ``repro.py`` with a time limit, its output in
  ``out/repro.log``, then prints ``repro.py``'s own lines, its one ``RESULT: defect seen|not seen``
  line and the log lines that show the defect. Exit 1: seen; 0: not seen; 2: the set-up failed;
* ``ut_stubs.py``: loads vllm-ascend's own ``tests/ut/conftest.py`` from ``VLLM_ASCEND_SRC``, the
  stand-ins its unit tests use on a host without an NPU (torch_npu, CANN's acl, torch.npu,
  Mooncake's NPU transfer engine). Nothing else is stubbed, and the README says so;
* the case's ``repro.py`` and the family's other files (a fault script that speaks the connector's
  own wire format where one is needed). Nothing in the folder imports pd-chaos.

Everything in the reproductions runs in one or two Python processes (vllm-ascend's classes, real ZMQ
sockets): no vLLM server, no NPU.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

FILES = Path(__file__).with_name("standalone_files")  # ut_stubs.py
RUN_TIMEOUT_S = 600  # run.sh's limit on repro.py
VERSIONS_PY = ("import importlib.metadata as m, platform, sys; "
               "v = {(x.metadata['Name'] or '').lower().replace('_', '-'): x.version for x in m.distributions()}; "
               "print('OS:', platform.platform()); print('Python:', sys.version.split()[0]); "
               "[print(d + ':', v.get(d, 'not installed')) for d in ('vllm-ascend', 'vllm', 'torch', 'pyzmq', "
               "'msgpack', 'pytest')]")


@dataclass(frozen=True)
class Case:
    title: str  # the title, "[Bug]: ..."
    bug: str
    expected: str
    actual: str
    fix: str  # what the fix is (the upstream diffs that make the patched run), in words
    log_patterns: tuple[str, ...]  # grep -E patterns of out/repro.log that show the defect
    files: tuple[str, ...] = field(default=())  # the family's files (relative to its files folder)


def run_sh(case: Case) -> str:
    pats = "|".join(case.log_patterns)
    return f"""#!/usr/bin/env bash
# {case.title.removeprefix('[Bug]: ')}
# Usage: ./run.sh [PYTHON [VLLM_ASCEND_SRC]]
#   PYTHON (or $VLLM_PYTHON): the python of the venv with vllm-ascend, its vLLM and pytest (default: python3)
#   VLLM_ASCEND_SRC: a vllm-ascend source tree of the installed release (its tests/ut/conftest.py
#   holds the stand-ins vllm-ascend's unit tests use on a host without an NPU)
# Exit 1: the defect showed; 0: it did not; 2: the set-up failed. README.md says what it shows.
set -uo pipefail
cd "$(dirname "$0")"
PY=${{1:-${{VLLM_PYTHON:-python3}}}}
export VLLM_ASCEND_SRC=${{2:-${{VLLM_ASCEND_SRC:-}}}}
if [ ! -f "$VLLM_ASCEND_SRC/tests/ut/conftest.py" ]; then
  echo "error: give a vllm-ascend source tree (with tests/ut/conftest.py) as the second argument or VLLM_ASCEND_SRC" >&2
  exit 2
fi
mkdir -p out
export VLLM_RPC_BASE_PATH=$(mktemp -d)   # where vllm-ascend puts its ipc sockets
trap 'rm -rf "$VLLM_RPC_BASE_PATH"' EXIT
"$PY" -c "{VERSIONS_PY}" > out/versions.txt 2>&1 || {{ echo "error: $PY cannot run" >&2; exit 2; }}
timeout {RUN_TIMEOUT_S} "$PY" repro.py > out/repro.log 2>&1
rc=$?
# a Python error also exits 1: only a RESULT line says what was seen
if [ "$rc" -gt 1 ] || ! grep -qE '^RESULT: defect (seen|not seen)' out/repro.log; then tail -n 30 out/repro.log; rc=2; fi
grep -E '^(repro|RESULT|[a-z_]+): ' out/repro.log | grep -vE '^(INFO|WARNING|ERROR|DEBUG)'
echo "log lines (out/repro.log):"
grep -E '{pats}' out/repro.log | cut -c1-240 | head -n 20
exit "$rc"
"""


def _fence(text: str, lang: str = "") -> str:
    return f"```{lang}\n{text.rstrip()}\n```\n"


def readme(case: Case, what: str, env_text: str, observed: dict) -> str:
    obs = "".join(f"- {label}: `{observed[t]}`\n" for t, label in (
        ("upstream", "vllm-ascend 0.23.0.post1 as released"), ("patched", "with the fix applied"))
        if t in observed) or "- (no run recorded yet)\n"
    lines = observed.get("log_lines") or []
    logs = _fence("\n".join(lines), "text") if lines else (
        "None: vllm-ascend logs nothing while the scheduler waits.\n" if "log_lines" in observed
        else "(none recorded yet)\n")
    files = "".join(f"- `{Path(f).name}`\n" for f in case.files)
    return f"""# {case.title}

A standalone reproduction for vllm-ascend 0.23.0.post1 (with vLLM 0.23.0). It needs only a venv with
vllm-ascend and its vLLM installed, pytest, and a vllm-ascend source tree of the same release (for
the stubs below). Nothing of the project that found it is needed.

**It runs without an NPU, on vllm-ascend's own unit-test stubs.** `ut_stubs.py` loads vllm-ascend's
`tests/ut/conftest.py` from that source tree: on a host where `npu-smi info` fails, the conftest puts
stand-ins for torch_npu, CANN's `acl`, `torch.npu` and Mooncake's NPU transfer engine into
`sys.modules`, as vllm-ascend's CPU unit-test runner does. Nothing else is stubbed: the classes the
defect is in run unmodified, over real ZMQ sockets, in one or two Python processes (no `vllm serve`,
no model). On an Ascend host the conftest stubs nothing and the same script runs on the real stack.

## Your current environment

vllm-ascend's issue form asks for the output of its `collect_env.py`; this host has no NPU and no
CANN to report, so here are the versions `run.sh` records (`out/versions.txt`) and vLLM's
`python -m vllm.collect_env`, both from the venv of the run below:

<details>
<summary>environment</summary>

{_fence(env_text, "text")}
</details>

## 🐛 Describe the bug

{case.bug}

**Expected:** {case.expected}

**Actual:** {case.actual}

### How to reproduce

```bash
git clone --branch v0.23.0.post1 --depth 1 https://github.com/vllm-project/vllm-ascend vllm-ascend-src
./run.sh /path/to/venv/bin/python vllm-ascend-src     # or: VLLM_PYTHON=... VLLM_ASCEND_SRC=... ./run.sh
```

`run.sh` (a time limit on every step; all paths relative to this folder) runs `repro.py` with
`VLLM_RPC_BASE_PATH` set to a fresh temporary folder, its output in `out/repro.log`, prints its
lines and one line `RESULT: defect seen: ...` (exit 1) or `RESULT: defect not seen: ...` (exit 0)
with the measured time, then the log lines that show the defect. What `repro.py` does: {what}

The other files:

{files}- `ut_stubs.py`: loads vllm-ascend's own unit-test stubs (above).

### What we saw

{obs}
Log lines of the run on vllm-ascend 0.23.0.post1 (paths shortened):

{logs}
### The fix

{case.fix}
"""


def scrub(text: str) -> str:
    """No machine path: home folders, caches and temporary folders are cut."""
    text = re.sub(r"(/root|/home/[^/\s]+)(/[^\s:'\"]*)?", "<home>", text)
    return re.sub(r"/(work|tmp)/[^\s:'\"]*", "<path>", text)


def env_text(python: Path, tools: Path | None = None, timeout_s: float = 300.0) -> str:
    """What the README shows of the venv ``python`` belongs to (with ``tools``, the folder pytest is in,
    on its path): the versions ``run.sh`` records and vLLM's collect-env (paths cut); a line for what
    could not run."""
    env = {"PATH": "/usr/bin:/bin", "VLLM_PLUGINS": "", "HF_HUB_OFFLINE": "1",
           **({"PYTHONPATH": str(tools)} if tools else {})}
    parts = []
    for what, argv in (("versions", [str(python), "-c", VERSIONS_PY]),
                       ("python -m vllm.collect_env", [str(python), "-m", "vllm.collect_env"])):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
            text = out.stdout if out.returncode == 0 else f"{what} failed with exit {out.returncode}"
        except (OSError, subprocess.TimeoutExpired) as e:
            text = f"{what} could not run: {type(e).__name__}"
        text = "\n".join(line for line in text.splitlines() if not line.startswith("VLLM_PLUGINS="))
        parts.append(f"$ {'cat out/versions.txt' if what == 'versions' else what}\n{text.strip()}")
    return scrub("\n\n".join(parts))


def write_folder(out: Path, case: Case, family_files: Path, repro: Path, what: str, env: str,
                 observed: dict) -> Path:
    """``out`` (replaced) with the case's files, ``repro.py``, ``run.sh`` and ``README.md``."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copyfile(FILES / "ut_stubs.py", out / "ut_stubs.py")
    for rel in case.files:
        shutil.copyfile(family_files / rel, out / Path(rel).name)
    shutil.copyfile(repro, out / "repro.py")
    (out / "run.sh").write_text(run_sh(case))
    (out / "run.sh").chmod(0o755)
    (out / "README.md").write_text(readme(case, what, env, observed))
    return out
