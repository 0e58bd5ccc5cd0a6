"""``pdchaos setup`` step of the conformance node stack (the step interface of harness/setup.py)."""

from __future__ import annotations

from harness.nodeenv.venv import NodeEnvError
from harness.setup import StepFailed


class AscendStackStep:
    """vLLM 0.23.0 + vllm-ascend 0.23.0.post1 + torch 2.11.0 + the NPU stubs, in the node env
    ``ascend-conf-<hash>`` (the conformance env: real vllm-ascend code on CPU)."""

    name = "ascend-conf-stack"

    def _env(self):
        from .recipe import ascend_conf_env

        return ascend_conf_env()

    def check(self) -> str | None:
        from .recipe import ASCEND, TORCH, VLLM

        env = self._env()
        return f"{TORCH}, {VLLM}, {ASCEND} in {env.path}" if env.installed() else None

    def pieces(self) -> list[tuple[str, bool, str]]:
        env = self._env()
        pending = set(env.pending())
        return [(f"{self.name}/{s.name}", s.name not in pending, f"{s.key} in {env.path}") for s in env.steps]

    def plan(self) -> str:
        env = self._env()
        return (f"{'resume' if env.path.exists() else 'create'} venv {env.path} (~9.5 GB, 3-6 min with a warm "
                f"pip cache); steps: {', '.join(env.pending())}")

    def install(self) -> str:
        env = self._env()
        try:
            return env.ensure()
        except NodeEnvError as exc:
            raise StepFailed(str(exc), "rerun `pdchaos setup --only ascend-conf-stack` (it resumes where it "
                                         f"stopped); full output in {env.log}") from None


def ascend_unavailable() -> str | None:
    """Why the conformance env cannot be used here (not installed), or None."""
    step = AscendStackStep()
    if step.check() is None:
        return f"the conformance node env is not installed ({step.name}): run `pdchaos setup`"
    return None
