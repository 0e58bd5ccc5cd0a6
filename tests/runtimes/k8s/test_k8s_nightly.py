"""The nightly cluster job (.github/workflows/schedule_nightly_k8s.yaml), its steps run as Actions
runs them against a real API server here: the kubeconfig step writes the secret to a file and
$GITHUB_ENV, the doctor gate refuses a cluster without Chaos Mesh's controller and passes one with
it, and the clean step ends with nothing left. (The suite step itself needs pods that run: only
its runner does that; its every object is validated in test_k8s_lifecycle.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
WF = REPO / ".github" / "workflows" / "schedule_nightly_k8s.yaml"


@pytest.fixture(scope="module")
def cluster():
    from runtimes.k8s import stack

    if stack.step().check() is None:
        pytest.skip("k8s stack not built: run `pdchaos setup --only k8s`")
    from runtimes.k8s.cluster import LocalCluster

    with LocalCluster() as c:
        c.apply_crds([stack.crd_file("chaos-mesh")])
        yield c


def _step(name: str) -> dict:
    job = yaml.safe_load(WF.read_text())["jobs"]["cluster"]
    return next(s for s in job["steps"] if s.get("id") == name or s.get("name", "").startswith(name))


def _run(step: dict, env: dict, tmp: Path) -> subprocess.CompletedProcess:
    script = tmp / "step.sh"
    script.write_text(step["run"])
    # the job's shell is `bash -el {0}`: a login shell; -e is what matters here
    return subprocess.run(["bash", "-e", str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=150)


@pytest.mark.timeout(300)
def test_the_nightly_cluster_job_s_gate_and_clean_against_a_real_api_server(cluster, tmp_path: Path) -> None:
    gh_env = tmp_path / "github_env"
    gh_env.touch()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PDCHAOS_KUBECONFIG"))}
    base.update({"RUNNER_TEMP": str(tmp_path), "GITHUB_ENV": str(gh_env), "PYTHONPATH": str(REPO),
                 "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    # no secret: one error, exit 1
    res = _run(_step("kubeconfig"), {**base, "KUBECONFIG_TEXT": ""}, tmp_path)
    assert res.returncode == 1 and "no PDCHAOS_KUBECONFIG secret" in res.stdout
    res = _run(_step("kubeconfig"), {**base, "KUBECONFIG_TEXT": Path(cluster.kubeconfig).read_text()}, tmp_path)
    assert res.returncode == 0, res.stderr
    written = dict(line.split("=", 1) for line in gh_env.read_text().splitlines() if "=" in line)
    env = {**base, **written}
    assert Path(env["PDCHAOS_KUBECONFIG"]).read_text() == Path(cluster.kubeconfig).read_text() + "\n"
    assert oct(Path(env["PDCHAOS_KUBECONFIG"]).stat().st_mode & 0o777) == "0o600"  # umask 077

    gate = _step("doctor")
    res = _run(gate, env, tmp_path)
    assert res.returncode == 1 and "required but missing: chaos-mesh-controller" in res.stdout, res.stdout
    # a Chaos Mesh controller Deployment, ready (kwok runs its pod): the gate opens
    from runtimes.k8s.client import Kube

    kube = Kube(cluster.kubeconfig)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "chaos-mesh"}})
    labels = {"app.kubernetes.io/name": "chaos-mesh", "app.kubernetes.io/component": "controller-manager"}
    kube.apply({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "chaos-controller-manager", "namespace": "chaos-mesh", "labels": labels},
                "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels},
                                      "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:0"}]}}}})
    kube.wait("apps/v1", "Deployment", "chaos-mesh",
              lambda items: any((i.get("status") or {}).get("readyReplicas") for i in items), 60, "controller ready")
    res = _run(gate, env, tmp_path)
    assert res.returncode == 0, res.stdout
    assert "ok  chaos-mesh-controller" in res.stdout and "ok  k8s-rbac" in res.stdout

    res = _run(_step("pdchaos clean"), env, tmp_path)
    assert res.returncode == 0 and "clean: nothing left behind" in res.stdout, res.stdout + res.stderr
    kube.delete_namespace("chaos-mesh")
