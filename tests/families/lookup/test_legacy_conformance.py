"""The legacy model earns its place only while it behaves like the real code it models.

``legacy`` (connector_patch/lookup/legacy.py) is a light model of vllm-ascend's lookup RPC: it starts in
well under a second and needs no 9 GB node env, so the lookup suite runs every fault against it.
``upstream`` is vllm-ascend 0.23.0.post1's real LookupKeyServer and LookupKeyClient, in the
conformance env. Every scenario of scenarios/lookup/ that names both targets is run here on both,
and each check's verdict must be the same for the two: a scenario where the model and the real code
part ways fails this test, naming the scenario and the checks that differ.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = ROOT / "scenarios" / "lookup"


def _both() -> list[Path]:
    out = []
    for path in sorted(SCENARIOS.glob("*.yaml")):
        targets = (yaml.safe_load(path.read_text()) or {}).get("targets") or []
        if "legacy" in targets and "upstream" in targets:
            out.append(path)
    return out


def _conformance_env_missing() -> str | None:
    from stacks.ascend_cpu.steps import ascend_unavailable

    return ascend_unavailable()


def test_scenarios_name_both_targets() -> None:
    """The comparison has something to compare: the lookup scenarios whose timing suits a node that
    imports torch and vLLM at start (no server restart or peer swap) name both targets."""
    names = {p.stem for p in _both()}
    assert {"baseline", "backend-hang", "backend-raise", "server-freeze", "malformed-requests"} <= names


@pytest.mark.timeout(900)
def test_legacy_model_and_vllm_ascend_agree(tmp_path: Path) -> None:
    why = _conformance_env_missing()
    if why:
        pytest.skip(why)
    files = [str(p) for p in _both()]
    res = subprocess.run([sys.executable, "-m", "harness.cli", "run", *files, "--target", "legacy", "--target",
                          "upstream", "--plain", "--runs-dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=840)
    summaries = list(tmp_path.glob("*/summary.json"))
    assert len(summaries) == 1, res.stdout[-2000:] + res.stderr[-2000:]
    results = json.loads(summaries[0].read_text())["results"]
    by = {(r["scenario"], r["target"]): r for r in results}
    differ = []
    for path in _both():
        name = yaml.safe_load(path.read_text())["name"]
        legacy, upstream = by[(name, "legacy")], by[(name, "upstream")]
        checks_l = {c["name"]: c["ok"] for c in legacy["checks"]}
        checks_u = {c["name"]: c["ok"] for c in upstream["checks"]}
        apart = sorted(n for n in checks_l.keys() & checks_u.keys() if checks_l[n] != checks_u[n])
        if legacy["verdict"] != upstream["verdict"] or apart:
            differ.append(f"{name}: legacy {legacy['verdict']}, upstream {upstream['verdict']}; checks apart: "
                          f"{', '.join(apart) or 'none'}")
    assert not differ, "the legacy model and vllm-ascend's code part ways:\n" + "\n".join(differ)
    assert res.returncode == 0, res.stdout[-3000:]
