"""``pdchaos setup`` step of the conformance node stack (the step interface of harness/setup.py)."""

from __future__ import annotations

from harness.nodeenv.step import EnvStep
from harness.nodeenv.venv import NodeEnv


class AscendStackStep(EnvStep):
    """vLLM 0.23.0 + vllm-ascend 0.23.0.post1 + torch 2.11.0 + the NPU stubs, in the node env
    ``ascend-conf-<hash>`` (the conformance env: real vllm-ascend code on CPU)."""

    name = "ascend-conf-stack"
    size = "~9 GB, installed from its lock with uv"

    def env(self) -> NodeEnv:
        from .recipe import ascend_conf_env

        return ascend_conf_env()

    def lock_spec(self):
        from .recipe import LOCK

        return LOCK

    def present(self, env: NodeEnv) -> str | None:
        from .recipe import ASCEND, TORCH, VLLM

        return f"{TORCH}, {VLLM}, {ASCEND} in {env.path}" if env.installed() else None


def ascend_unavailable(family: str = "layerwise") -> str | None:
    """Why the conformance env cannot be used here (not installed: the one command that installs
    it, for ``family``'s scenarios), or None."""
    from harness.setup import MissingSetup

    step = AscendStackStep()
    if step.check() is None:
        return MissingSetup(f"the conformance node env is not installed ({step.name})",
                            f"pdchaos setup --family {family}")
    return None
