"""The k8s runtime's block of a launch profile (``cluster:``): where and how the node pods run.

The defaults follow the conventions of the deployments this runtime stands in for: one workload
per role labelled ``role: prefill|decode|proxy|store`` (llm-d, SGLang), a LeaderWorkerSet per
vLLM role where its CRD is installed (vllm-ascend's multi-node nightly), plain Deployments
otherwise; NPUs as the extended resource ``huawei.com/ascend-1980`` and the model in a shared
cache volume mounted at ``/root/.cache`` (vllm-ascend's template), ``/dev/shm`` in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

LABEL_RE = r"^[A-Za-z0-9]([-A-Za-z0-9_./]{0,251}[A-Za-z0-9])?$"


# the folder holding pd-chaos's packages: what a profile's host mount `{pdchaos}` names
PDCHAOS_ROOT = str(Path(__file__).resolve().parents[2])

class Attach(BaseModel):
    """Attach mode: the user's own deployment, found by label selectors per role."""

    model_config = ConfigDict(extra="forbid")
    namespace: str = Field(..., pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    selectors: dict[str, str] = Field(default_factory=dict, description="role -> label selector, e.g. "
                                      "prefill:0: role=prefill; a role without one is found by the labels the "
                                      "deployments it stands for use: llm-d.ai/role=ROLE (llm-d), then role=ROLE")
    container: str | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
                                  description="the serving container's name in the user's pods (default: the "
                                              "pod's first container): exec and logs go to it")
    ports: dict[str, dict[str, int]] = Field(default_factory=dict, description="role -> endpoint name -> "
                                             "container port (http, bootstrap), where the pods serve them")


class ClusterSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: str = Field(..., min_length=1, description="the node image: pd-chaos and the node stack installed")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    namespace_prefix: str = Field("pdchaos", pattern=r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$",
                                  description="a run's namespace is PREFIX-RUNID, created and deleted by the run")
    workload: Literal["auto", "lws", "deployment"] = Field(
        "auto", description="auto: a LeaderWorkerSet for the vLLM roles when its CRD is installed, else Deployments")
    npu_resource: str = Field("huawei.com/ascend-1980", pattern=LABEL_RE)
    npu_per_pod: int = Field(0, ge=0, le=16, description="NPUs each vLLM pod requests (0: none, a CPU node)")
    cpu: str = Field("2", pattern=r"^[0-9]+(\.[0-9]+|m)?$")
    memory: str = Field("8Gi", pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)?$")
    model_cache_claim: str | None = Field(None, description="a PersistentVolumeClaim with the model, mounted "
                                          "at model_cache_path (none: an emptyDir)")
    model_cache_path: str = Field("/root/.cache", pattern=r"^/\S*$")
    service_account: str = Field("pdchaos-node", pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
    control_port: int = Field(5599, ge=1024, le=65535, description="each node's control channel in its pod")
    ready_timeout_s: float = Field(600.0, gt=0, le=3600)
    start_fail_s: float = Field(60.0, gt=0, le=3600, description="a node's pod still Pending (unscheduled, "
                                "image not pulled) after this fails the run at once, naming the pod and the reason; "
                                "CrashLoopBackOff, ImagePullBackOff and ErrImagePull fail it at once")
    python: str = Field("python3", min_length=1, description="the interpreter in the pod that runs `-m harness.cli "
                        "node` (python3: the image's; `same`: the harness's own path, where host_mounts bring it)")
    host_mounts: list[str] = Field(default_factory=list, description="host folders every node pod mounts read-only "
                                   "at the same path (a single-node cluster: the locked node env, the model, "
                                   "pd-chaos itself, instead of a multi-GB image)")
    run_dir_from_host: bool = Field(False, description="mount the run folder from the host at the same path "
                                    "(read-write; a single-node cluster): the nodes' logs land in it as they are "
                                    "written, also those of a pod a fault killed")
    shared_host: bool = Field(False, description="the pods share one machine's cores (a single-node cluster on "
                              "this machine): the family pins its nodes to cores as it does locally (vLLM on CPU "
                              "otherwise binds its threads to every core, and P and D starve each other)")
    peers: Literal["service", "pod-ip"] = Field("service", description="how nodes name each other: by their "
                                                 "Services (a cluster with DNS and Service routing), or by the ready "
                                                 "pod's own address (a cluster with neither, such as `pdchaos cluster "
                                                 "up`'s: then a fault that replaces a pod, whose new address its peers "
                                                 "would not learn, is refused)")
    network_actions: list[Literal["partition", "delay", "bandwidth"]] = Field(
        ["partition", "delay", "bandwidth"], description="the NetworkChaos actions the pods' kernel can carry: "
        "delay needs sch_netem, bandwidth sch_tbf, partition iptables and ipset; a scenario whose fault needs "
        "another is refused before anything starts, with this reason")
    attach: Attach | None = Field(None, description="the user's deployment that `pdchaos run --attach` selects nodes in")
    mode: Literal["deploy", "attach"] = Field("deploy", description="deploy: each run makes its own namespace and "
                                              "nodes; attach: the nodes are the pods `attach` selects (--attach)")

    @field_validator("host_mounts")
    @classmethod
    def _expand(cls, paths: list[str]) -> list[str]:
        """``~`` (this user's home), ``{pdchaos}`` (the folder holding pd-chaos's packages) and
        ``{python}`` (the harness interpreter's installation, and its venv when it runs in one)
        become this machine's paths: a profile names no machine's paths."""
        import os
        import sys

        out: list[str] = []
        for p in paths:
            if p == "{python}":
                found = [sys.base_prefix, sys.prefix]
            elif p == "{pdchaos}":
                found = [PDCHAOS_ROOT]
            else:
                found = [os.path.expanduser(p)]
            for f in found:
                f = os.path.normpath(f)
                if not os.path.isabs(f):
                    raise ValueError(f"{p!r}: a host mount is an absolute path (or ~, {{pdchaos}}, {{python}})")
                if f not in out:
                    out.append(f)
        return out

    @model_validator(mode="after")
    def _attach_needs_selectors(self) -> "ClusterSettings":
        if self.mode == "attach" and self.attach is None:
            raise ValueError("mode attach: name the deployment in cluster.attach (namespace, selectors)")
        return self
